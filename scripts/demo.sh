#!/usr/bin/env bash
# The main job on an embedded default: installs packages (as root), builds, makes the bundled default model
# (a small Llama-architecture model trained for a few minutes on the license texts every Debian machine ships,
# with the real Llama 2 tokenizer) and generates text from it with the engine CLI.
#   bash scripts/demo.sh ["your prompt"]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${TANDEM_BUILD:-build}
MODEL=${TANDEM_MODEL:-$BUILD/models/default}
PROMPT=${1:-"This program is free software; you can"}

if [ "$(id -u)" = 0 ]; then bash scripts/setup.sh; fi
bash scripts/build.sh

if [ ! -f "$MODEL/model.safetensors" ]; then
  if [ -x "$BUILD/tools/tandem-train" ]; then
    echo "demo: training the default model into $MODEL (a few minutes, once)"
    "$BUILD/tools/tandem-train" --out "$MODEL"
  else
    echo "demo: tandem-train not built; writing an untrained default model (its output is noise)"
    "$BUILD/tools/tandem-mkmodel" --out "$MODEL" --preset tiny
  fi
fi

echo "demo: prompt: $PROMPT"
echo "demo: greedy"
"$BUILD/tools/tandem-generate" --model "$MODEL" --prompt "$PROMPT" --max-tokens 48
echo
echo "demo: sampled (temperature 0.8, top-k 40, repetition penalty 1.1, seed 7), 2 threads"
"$BUILD/tools/tandem-generate" --model "$MODEL" --prompt "$PROMPT" --max-tokens 48 \
  --temperature 0.8 --top-k 40 --repeat-penalty 1.1 --seed 7 --threads 2
