#!/usr/bin/env bash
# End-to-end checks of the command-line tools: train a model for a few steps, generate from it (CPU and a
# simulated accelerator, hybrid), resume from a checkpoint, and the typed errors / exit codes of bad input.
# usage: cli_smoke.sh TANDEM_TRAIN TANDEM_GENERATE TANDEM_MKMODEL
set -u
train=$1 generate=$2 mkmodel=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
check() {  # check NAME EXPECTED_RC COMMAND...
  local name=$1 want=$2
  shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" != "$want" ]; then
    echo "FAIL $name: exit $rc, wanted $want"; sed 's/^/  | /' "$tmp/err" | tail -5; fails=$((fails + 1))
  else
    echo "ok   $name"
  fi
}
grep_err() {  # grep_err NAME PATTERN
  if grep -q -- "$2" "$tmp/err"; then echo "ok   $1"; else echo "FAIL $1: stderr lacks '$2'"; sed 's/^/  | /' "$tmp/err" | tail -5; fails=$((fails + 1)); fi
}

head -c 20000 /usr/share/common-licenses/GPL-3 >"$tmp/corpus.txt"
check "train 4 steps" 0 "$train" --out "$tmp/m" --corpus "$tmp/corpus.txt" --preset test --steps 4 --seq-len 32 \
  --batch 4 --threads 1 --eval-every 0 --sample-tokens 0 --quiet
for f in config.json model.safetensors tokenizer.model training.json; do
  [ -s "$tmp/m/$f" ] && echo "ok   wrote $f" || { echo "FAIL train did not write $f"; fails=$((fails + 1)); }
done

check "generate cpu" 0 "$generate" --model "$tmp/m" --prompt "This program" --max-tokens 8 --ids
grep_err "stats line" "generated: 8 tokens"
ids=$(sed -n 's/^ids: //p' "$tmp/err" | tr ' ' ',')
cp "$tmp/out" "$tmp/cpu.txt"
check "generate sim hybrid" 0 "$generate" --model "$tmp/m" --prompt "This program" --max-tokens 8 --device sim:512M \
  --accel-layers 1
cmp -s "$tmp/out" "$tmp/cpu.txt" && echo "ok   hybrid output equals cpu output" ||
  { echo "FAIL hybrid output differs"; fails=$((fails + 1)); }
first4=$(echo "$ids" | cut -d, -f1-4)
check "resume from checkpoint" 0 "$generate" --model "$tmp/m" --prompt "This program" --max-tokens 8 --resume "$first4" --ids
resumed=$(sed -n 's/^ids: //p' "$tmp/err" | tr ' ' ',')
[ "$resumed" = "$ids" ] && echo "ok   resumed ids equal uninterrupted ids" ||
  { echo "FAIL resumed ids $resumed != $ids"; fails=$((fails + 1)); }

check "device too small" 1 "$generate" --model "$tmp/m" --prompt x --device sim:1M
grep_err "typed OOM" "OutOfMemory"
check "missing model" 1 "$generate" --model "$tmp/nope" --prompt x
grep_err "typed not found" "NotFound"
check "bad number" 2 "$generate" --model "$tmp/m" --max-tokens 12x
check "out of range" 2 "$generate" --model "$tmp/m" --top-p 1.5
check "unknown flag" 2 "$generate" --model "$tmp/m" --frobnicate
check "bad device" 2 "$generate" --model "$tmp/m" --device tpu
check "mkmodel bad preset" 2 "$mkmodel" --out "$tmp/x" --preset huge
check "train no corpus" 1 "$train" --out "$tmp/t" --corpus "$tmp/does-not-exist"

echo "cli smoke: $fails failure(s)"
[ "$fails" = 0 ]
