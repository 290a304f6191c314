// llama.cpp's tokenizer (node-llama-cpp's prebuilt CPU build) on the pieces tokenizer_bench --dump-mixed wrote:
// encode MB/s over all pieces, 1 thread, special-token spellings as text. One JSON line.
// Used by llamacpp_side_by_side.sh; arguments: VOCAB.gguf PIECES_FILE.
import {getLlama} from "node-llama-cpp";
import {readFileSync} from "node:fs";
const [,, modelPath, piecesPath] = process.argv;
const pieces = readFileSync(piecesPath, "utf8").split("\0").filter((p) => p.length > 0);
const bytes = pieces.reduce((n, p) => n + Buffer.byteLength(p, "utf8"), 0);
const llama = await getLlama({gpu: false, build: "never"});
const model = await llama.loadModel({modelPath, vocabOnly: true});
model.tokenize(pieces[0]);  // warm up
const t0 = performance.now();
let tokens = 0;
for (const p of pieces) tokens += model.tokenize(p, false).length;
const s = (performance.now() - t0) / 1000;
console.log(JSON.stringify({vocab: modelPath, mb: bytes / 1e6, encode_mb_s: bytes / 1e6 / s, tokens}));
await model.dispose();
