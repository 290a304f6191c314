#!/bin/bash
# On the GPU machine, first call of a session that has no CUDA LibTorch prefix here yet (docs/cuda.md, "Running on
# the GPU machine"): records the machine and brings back what building against its CUDA LibTorch needs — the torch
# package's include/ (tar.xz, in 15 MiB parts) and the dynamic symbol tables of its five C++ libraries — and, when
# .gpu/bin holds them (tests/gpu/pack.sh --device-only), runs the CUDA device test and the ballast.
#
#   device run, carry [".gpu"]:  bash tests/gpu/probe.sh
#   here, afterwards:            tests/gpu/stub-torch.sh /work/.device/N /work/torch-cuda
#
# Output in $OUT (else /tmp/gpu-probe): probe.log, inc.tar.xz.partNN, syms.tar.xz, torch-dynamic.txt.
# Nothing here changes the GPU's settings: nvidia-smi is only queried.
set -u
out=${OUT:-/tmp/gpu-probe}
mkdir -p "$out"
exec > >(tee "$out/probe.log") 2>&1
t0=$(date +%s)
say() { echo "[$(($(date +%s) - t0))s] == $*"; }

say machine
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,memory.free --format=csv
head -n 2 /etc/os-release
ldd --version | head -n 1
for b in c++ pkg-config dbus-daemon meson ninja nvcc python3; do printf '%s: %s\n' "$b" "$(command -v "$b")"; done

td=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))') || { echo "python3 cannot import torch"; exit 1; }
say "torch_dir=$td"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available",
  torch.cuda.is_available(), "cxx11 abi", torch.compiled_with_cxx11_abi())'
for l in "$td"/lib/*.so*; do
  readelf -d "$l" 2>/dev/null | grep -E "SONAME|NEEDED|RUNPATH" | sed "s#^#$(basename "$l"): #"
done >"$out/torch-dynamic.txt"

say "symbol tables"
syms=$(mktemp -d)
for n in libtorch.so libtorch_cpu.so libtorch_cuda.so libc10.so libc10_cuda.so; do
  # type bind size name, defined symbols only
  readelf --dyn-syms -W "$td/lib/$n" | awk 'NR > 3 && $7 != "UND" && $8 != "" {print $4, $5, $3, $8}' >"$syms/$n.txt"
  wc -l "$syms/$n.txt"
done
tar -C "$syms" -cJf "$out/syms.tar.xz" .

say headers
tar -C "$td" -cf - include | xz -T0 -6 | split -b 15M -d - "$out/inc.tar.xz.part"
ls -la "$out"

if [ -x .gpu/bin/test_device_cuda ]; then
  say "CUDA device test"
  ballast=$(cat .gpu/bin/ballast-path 2>/dev/null)
  if [ -n "$ballast" ]; then mkdir -p "$(dirname "$ballast")" && cp .gpu/bin/tandem-gpu-ballast "$ballast"; fi
  timeout 200 .gpu/bin/test_device_cuda
  echo "test_device_cuda exit $?"
fi
say finished
