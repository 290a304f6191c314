#!/bin/bash
# Here: packs a CUDA build (meson -Dtorch_dir=PREFIX -Dcuda=enabled, PREFIX from tests/gpu/stub-torch.sh) for the
# GPU machine: the binaries tests/gpu/run.sh runs, stripped, with the Debian shared libraries they need that are not
# glibc/libstdc++ (the GPU machine runs Ubuntu 24.04: other sonames), and dbus-daemon, into .gpu/bundle.tar.xz; plus
# .gpu/bundle.env, the paths compiled into the tests (source and build directory). With --device-only: the CUDA
# device test and the ballast alone, into .gpu/bin (no LibTorch needed: any build with the CUDA runtime).
#
#   tests/gpu/pack.sh [--device-only] BUILD         then the device run: carry [".gpu"], bash tests/gpu/run.sh
#
# .gpu/ is listed in .git/info/exclude (this checkout only): an ignored path travels only when `carry` names it.
set -euo pipefail
device_only=0
if [ "${1:-}" = --device-only ]; then device_only=1; shift; fi
[ $# -eq 1 ] || { echo "usage: $0 [--device-only] BUILD" >&2; exit 2; }
build=$(cd "$1" && pwd)
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
exclude="$root/$(git -C "$root" rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")" "$root/.gpu"
grep -qxF '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"

if [ "$device_only" = 1 ]; then
  mkdir -p "$root/.gpu/bin"
  strip -o "$root/.gpu/bin/test_device_cuda" "$build/tests/device/test_device_cuda"
  strip -o "$root/.gpu/bin/tandem-gpu-ballast" "$build/tools/tandem-gpu-ballast"
  echo "$build/tools/tandem-gpu-ballast" >"$root/.gpu/bin/ballast-path"
  ls -la "$root/.gpu/bin"
  exit 0
fi

bins="tools/tandem-generate tools/tandem-mkmodel tools/tandem-validate tools/tandem-gpu-ballast src/daemon/tandemd
  tests/engine/test_engine_cuda tests/engine/test_engine_clip tests/engine/test_engine_whisper_device
  bench/engine/bench_residency tests/device/test_device_cuda"
for b in $bins; do
  [ -x "$build/$b" ] || { echo "$build/$b is not built: ninja -C $build $bins" >&2; exit 1; }
  readelf -d "$build/$b" | grep -q 'libtorch_cuda.so\|libcudart' ||
    case $b in tools/tandem-validate | tools/tandem-mkmodel | tools/tandem-gpu-ballast | tests/device/*) ;;
      *) echo "$b: not linked against libtorch_cuda.so (not a CUDA LibTorch build?)" >&2; exit 1 ;; esac
done
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for b in $bins; do mkdir -p "$stage/$(dirname "$b")" && strip -o "$stage/$b" "$build/$b"; done
mkdir -p "$stage/lib" "$stage/bin"
cp /usr/bin/dbus-daemon "$stage/bin/"
for f in /usr/bin/dbus-daemon $(for b in $bins; do echo "$build/$b"; done); do ldd "$f"; done |
  awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux-x86-64|libtorch[a-z_]*|libc10[a-z_]*|libgomp)\.so' |
  while read -r l; do cp -L "$l" "$stage/lib/"; done
tar -C "$stage" -cf - . | xz -T0 -6 >"$root/.gpu/bundle.tar.xz"
src_dir=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["directories"]["source"])' \
  "$build/meson-info/meson-info.json")
printf 'source_dir=%s\nbuild_dir=%s\n' "$src_dir" "$build" >"$root/.gpu/bundle.env"
ls -la "$root/.gpu/bundle.tar.xz"
cat "$root/.gpu/bundle.env"
