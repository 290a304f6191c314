#!/usr/bin/env bash
# Text embedding models (BERT family) through the real daemon, next to the LLM on one simulated GPU: a NomicBertModel
# directory ("nomic": rotary, SwiGLU, mean pooling) and a BertModel GGUF file ("bge": llama.cpp's bert layout, Q8_0,
# CLS pooling), both written by tandem-mkmodel (random weights, a generated WordPiece vocabulary).
#   - ListModels: kind embedding, dim 64, the text modality only;
#   - Embed (tandemctl embed and gdbus): unit vectors of dim 64, a repeated text gives the same vector, nomic's task
#     prefixes change it;
#   - a text longer than the 64 positions is cut (truncated: 1) or refused with truncate=false; an image to a text
#     encoder → NotSupported;
#   - a GPU fault: Embed runs on the CPU, the vectors agree with the GPU's.
TANDEMD=$1 TANDEMCTL=$2 MKMODEL=$3
source "$(dirname "$0")/lib.sh"

NOMIC="$T_DIR/nomic"
BGE="$T_DIR/bge-q8_0.gguf"
"$MKMODEL" --out "$NOMIC" --preset nomic-test >/dev/null
"$MKMODEL" --out "$BGE" --preset bert-test --format gguf --type Q8_0 >/dev/null
tandem_setup "
[[model]]
name = \"nomic\"
dir = \"$NOMIC\"
replica_mode = \"mmap\"
cpu_threads = 1
gpu_threads = 1

[[model]]
name = \"bge\"
dir = \"$BGE\"
replica_mode = \"mmap\"
cpu_threads = 1
gpu_threads = 1
"

models=$(bcall ListModels)
for m in nomic bge; do
  row=$(echo "$models" | jq -c --arg m "$m" '.data[0][] | select(.name.data == $m)')
  [ "$(echo "$row" | jq -r .kind.data)" = embedding ] || fail "$m: not an embedding model: ${row:0:400}"
  [ "$(echo "$row" | jq -r .dim.data)" = 64 ] || fail "$m: dim $(echo "$row" | jq -r .dim.data), expected 64"
done
grep -q "embedding model nomic: CPU replica ready .*nomic-bert text encoder, dim 64, mean pooling" "$T_LOG" ||
  fail "no load line for nomic's text encoder"
grep -q "embedding model bge: CPU replica ready .*bert text encoder, dim 64, cls pooling" "$T_LOG" ||
  fail "no load line for bge's text encoder"
note "ListModels: nomic (NomicBertModel directory) and bge (bert GGUF, Q8_0) are embedding models of dim 64"

ctl() { "$TANDEMCTL" --json embed "$@"; }
norms() { jq -r '.vectors[] | (map(. * .) | add | sqrt)'; }
rounded() { jq -c ".vectors[$1] | map(. * 1e5 | round)"; }
gembed() { gcall Embed "$1" "$2" "@ah []" "@aay []" "${3:-@a{sv\} {\}}"; }

for m in nomic bge; do
  out=$(ctl --model "$m" "search_query: what is a red flower" "search_document: the flower is red" \
        "search_query: what is a red flower")
  [ "$(echo "$out" | jq '.vectors | length')" = 3 ] || fail "$m: $(echo "$out" | head -c 300)"
  [ "$(echo "$out" | jq -c '[.vectors[] | length] | unique')" = "[64]" ] || fail "$m: vectors not of dim 64"
  for v in $(echo "$out" | norms); do
    awk -v v="$v" 'BEGIN { exit !(v > 0.999 && v < 1.001) }' || fail "$m: a vector of norm $v"
  done
  [ "$(echo "$out" | rounded 0)" = "$(echo "$out" | rounded 2)" ] || fail "$m: the same text gave two vectors"
  [ "$(echo "$out" | rounded 0)" != "$(echo "$out" | rounded 1)" ] || fail "$m: two texts gave one vector"
  route=$(echo "$out" | jq -r .result.route)
  note "$m: 3 texts -> 3 unit vectors of dim 64 on $route; repeated text equal, different texts differ"
done

# Truncation: 64 positions ([CLS] and [SEP] included).
long=$(printf 'word %.0s' $(seq 1 200))
out=$(ctl --model bge "$long")
[ "$(echo "$out" | jq -r .result.truncated)" = 1 ] || fail "a 200-word text was not counted truncated: ${out:0:300}"
expect_err InvalidArgument gembed bge "['$long']" "{'truncate': <false>}" >/dev/null
note "a 200-word text is cut to 64 tokens (truncated: 1), refused with truncate=false"

# An image to a text encoder.
printf '\x89PNG\r\n\x1a\n' > "$T_DIR/x.png"
out=$("$TANDEMCTL" --json embed --model nomic --image "$T_DIR/x.png" 2>/dev/null) && fail "an image was accepted by nomic"
[ "$(echo "$out" | jq -r .error.name)" = io.tandem.Tandem1.Error.NotSupported ] || fail "image to nomic: $out"
case "$(echo "$out" | jq -r .error.message)" in *"no image tower"*) ;; *) fail "image to nomic: $out";; esac
note "an image to the text encoder -> NotSupported (no image tower)"

# A GPU fault: the breaker opens, Embed runs on the CPU with the same vectors (to rounding: ATen vs Tandem's kernels).
gpu=$(ctl --model nomic "a quiet river at night")
[ "$(echo "$gpu" | jq -r .result.route)" = gpu ] || fail "nomic did not run on the GPU first: ${gpu:0:300}"
btest LoseDevice
cpu=""
for _ in $(seq 1 50); do
  cpu=$(ctl --model nomic "a quiet river at night" 2>/dev/null) && [ "$(echo "$cpu" | jq -r .result.route)" = cpu ] && break
  sleep 0.1
done
[ "$(echo "$cpu" | jq -r .result.route)" = cpu ] || fail "after the device loss Embed did not run on the CPU: ${cpu:0:300}"
dot=$(jq -n --argjson a "$(echo "$gpu" | jq -c '.vectors[0]')" --argjson b "$(echo "$cpu" | jq -c '.vectors[0]')" \
  '[range(0; $a | length) as $i | $a[$i] * $b[$i]] | add')
awk -v d="$dot" 'BEGIN { exit !(d > 0.9999) }' || fail "GPU and CPU vectors differ: cosine $dot"
btest RecoverDevice
note "device lost: Embed on the CPU, cosine to the GPU's vector $dot"

kill -0 "$T_DAEMON_PID" || fail "daemon died"
echo "it_embed_text: ok"
