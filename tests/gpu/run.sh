#!/bin/bash
# On the GPU machine (docs/cuda.md, "Running on the GPU machine"): runs the CUDA build that tests/gpu/pack.sh made
# here (.gpu/bundle.tar.xz, built against that machine's own CUDA LibTorch headers and symbol tables) — the CUDA
# device test, the engine on the GPU (LLM per weight type and dtype, CLIP, Whisper, readings and give-back, the
# forward's peak against admission), tandem-validate's game scenario against a CUDA tandemd with the ballast as the
# game, the residency bench (restores through the pinned staging buffer, and without it) and decode speed GPU vs
# CPU. One call, under 8 minutes; every step has its own timeout and the log says which failed.
#
#   device run, carry [".gpu"]:  bash tests/gpu/run.sh
#
# Output in $OUT (else /tmp/gpu-run): run.log, game-report.md, game.tgz (the campaign without its models).
# Exit: 0 every step passed, 1 a step failed, 77 no GPU. Nothing here changes the GPU's settings.
set -u
out=${OUT:-/tmp/gpu-run}
mkdir -p "$out"
exec > >(tee "$out/run.log") 2>&1
t0=$(date +%s)
say() { echo "[$(($(date +%s) - t0))s] == $*"; }
rc=0
step() {  # step SECONDS NAME CMD...: runs CMD with a timeout; a failure marks the run failed
  local limit=$1 name=$2
  shift 2
  say "$name"
  timeout --kill-after=10 "$limit" "$@"
  local r=$?
  [ "$r" -eq 0 ] || { say "!! $name failed (exit $r$([ "$r" -eq 124 ] && echo ", timed out after ${limit}s"))"; rc=1; }
}

nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,memory.free --format=csv || { say "no GPU"; exit 77; }
if [ ! -f .gpu/bundle.tar.xz ] || [ ! -f .gpu/bundle.env ]; then
  say "no .gpu/bundle.tar.xz (tests/gpu/pack.sh here, carry .gpu)"
  exit 1
fi
source_dir=$(sed -n 's/^source_dir=//p' .gpu/bundle.env)
b=$(sed -n 's/^build_dir=//p' .gpu/bundle.env)
mkdir -p "$b" && tar -C "$b" -xJf .gpu/bundle.tar.xz
[ -e "$source_dir" ] || { mkdir -p "$(dirname "$source_dir")" && ln -s "$PWD" "$source_dir"; }
td=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')
export LD_LIBRARY_PATH="$b/lib:$td/lib" PATH="$b/bin:$PATH"
missing=$(for f in "$b"/tools/* "$b"/src/daemon/tandemd "$b"/tests/*/* "$b"/bench/engine/* "$b"/bin/*; do
  ldd "$f" | grep "not found" | sed "s#^#$f: #"; done)
[ -z "$missing" ] || { echo "$missing"; say "libraries missing"; exit 1; }

step 60 "CUDA device test" "$b/tests/device/test_device_cuda"
step 30 "ballast --leave 1G" "$b/tools/tandem-gpu-ballast" --leave 1G --seconds 1
step 300 "engine on the GPU" "$b/tests/engine/test_engine_cuda"
step 60 "CLIP on the GPU" "$b/tests/engine/test_engine_clip" --gtest_filter='*Cuda*'
step 60 "Whisper on the GPU" "$b/tests/engine/test_engine_whisper_device" --gtest_filter='*Cuda*'
step 180 "tandem-validate game on a CUDA tandemd" "$b/tools/tandem-validate" --spawn --device cuda \
  config/validation/game.toml --out /tmp/gpu-game --quiet
cp /tmp/gpu-game/report.md "$out/game-report.md" 2>/dev/null
tar -C /tmp -czf "$out/game.tgz" --exclude='*.safetensors' --exclude='*.gguf' gpu-game 2>/dev/null
step 60 "a 134m model" "$b/tools/tandem-mkmodel" --out /tmp/gpu-134m --preset 134m
step 120 "residency bench (restore through the pinned staging buffer)" "$b/bench/engine/bench_residency" \
  --model /tmp/gpu-134m --device cuda --rounds 3 --threads 8
step 120 "residency bench, staging off (the driver's pageable copy)" env TANDEM_PINNED_STAGING=0 \
  "$b/bench/engine/bench_residency" --model /tmp/gpu-134m --device cuda --rounds 3 --threads 8
for d in cpu cuda; do
  step 60 "decode, 134m, $d" "$b/tools/tandem-generate" --model /tmp/gpu-134m --device "$d" --threads 8 \
    --max-tokens 128 --no-eos --prompt "Once upon a time"
done
nvidia-smi --query-gpu=memory.used,memory.free --format=csv
say "done: exit $rc"
exit "$rc"
