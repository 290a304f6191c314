// llama.cpp (node-llama-cpp's prebuilt CPU build) on one GGUF file: prompt and greedy decode tokens/s, one JSON line.
// Used by llamacpp_side_by_side.sh; arguments: MODEL.gguf THREADS TOKENS.
import {getLlama} from "node-llama-cpp";
const [,, modelPath, threadsArg, nTok] = process.argv;
const threads = Number(threadsArg || 1), n = Number(nTok || 64);
const llama = await getLlama({gpu: false, build: "never"});
const model = await llama.loadModel({modelPath});
const ctx = await model.createContext({contextSize: 512, threads, batchSize: 512});
const seq = ctx.getSequence();
const prompt = model.tokenize("The quick brown fox jumps over the lazy dog while the farmer counts his sheep in the morning light. ".repeat(6)).slice(0, 128);
let t0 = performance.now();
let count = 0, tPrefillEnd = 0;
for await (const tok of seq.evaluate(prompt, {temperature: 0})) {
  if (count === 0) tPrefillEnd = performance.now();
  if (++count > n) break;
}
const t1 = performance.now();
const prefill = (tPrefillEnd - t0) / 1000, decode = (t1 - tPrefillEnd) / 1000;
console.log(JSON.stringify({model: modelPath, threads, prefill_tok_s: 128 / prefill, decode_tok_s: (count - 1) / decode}));
await ctx.dispose(); await model.dispose();
