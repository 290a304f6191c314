// llama.cpp's view of one GGUF file, for the architecture tests' reference data (a developer's tool, not run by the
// suite): the step-0 log-probabilities of the 5 likeliest tokens after a prompt given as token ids (probabilities
// at temperature 1 with no top-k / top-p cut: the softmax of the logits), and the greedy continuation.
// llama.cpp comes from the npm package node-llama-cpp (its prebuilt CPU build; the version is printed).
//   node reference.mjs MODEL.gguf 3,17,99,... STEPS
import {getLlama} from "node-llama-cpp";
const [,, modelPath, idsArg, stepsArg] = process.argv;
const ids = idsArg.split(",").map(Number), steps = Number(stepsArg || 8);
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath});
const out = {model: modelPath, llama_cpp: llama.llamaCppRelease, prompt_ids: ids};
{
  const ctx = await model.createContext({contextSize: 256, threads: 1});
  const seq = ctx.getSequence();
  for await (const r of seq.evaluateWithMetadata(ids, {probabilities: true}, {temperature: 1, topK: 0, topP: 1, minP: 0})) {
    out.top5_step0 = [...r.probabilities.entries()].slice(0, 5).map(([t, p]) => [t, Math.log(p)]);
    break;
  }
  await ctx.dispose();
}
{
  const ctx = await model.createContext({contextSize: 256, threads: 1});
  const seq = ctx.getSequence();
  out.greedy_ids = [];
  for await (const t of seq.evaluate(ids, {temperature: 0, yieldEogToken: true})) {
    out.greedy_ids.push(t);
    if (out.greedy_ids.length >= steps) break;
  }
  await ctx.dispose();
}
console.log(JSON.stringify(out));
await model.dispose();
