#!/bin/bash
# Here, after tests/gpu/probe.sh ran on the GPU machine: makes PREFIX/{include,lib}, a CUDA LibTorch to build
# against — the GPU machine's own headers, and for each of its five C++ libraries a stub with the same SONAME and
# the same symbols (tests/gpu/mkstub.py). Binaries linked against the stubs load the real libraries there.
#
#   tests/gpu/stub-torch.sh PROBE_FILES_DIR PREFIX
#   meson setup BUILD -Dtorch_dir=PREFIX -Dcuda=enabled && tests/gpu/pack.sh BUILD
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 PROBE_FILES_DIR PREFIX" >&2; exit 2; }
files=$1 prefix=$2
here=$(cd "$(dirname "$0")" && pwd)
compgen -G "$files/inc.tar.xz.part*" >/dev/null || { echo "$files: no inc.tar.xz.part* (run tests/gpu/probe.sh there)" >&2; exit 1; }
[ -f "$files/syms.tar.xz" ] || { echo "$files: no syms.tar.xz" >&2; exit 1; }
rm -rf "$prefix" && mkdir -p "$prefix/lib" "$prefix/syms"
cat "$files"/inc.tar.xz.part* | tar -C "$prefix" -xJf -
tar -C "$prefix/syms" -xJf "$files/syms.tar.xz"
for n in libtorch libtorch_cpu libtorch_cuda libc10 libc10_cuda; do
  python3 "$here/mkstub.py" "$prefix/syms/$n.so.txt" "$prefix/syms/$n.s"
  gcc -shared -nostdlib -Wl,-soname,"$n.so" -o "$prefix/lib/$n.so" "$prefix/syms/$n.s"
done
echo "$prefix: $(find "$prefix/include" -type f | wc -l) headers; stubs: $(ls "$prefix/lib")"
