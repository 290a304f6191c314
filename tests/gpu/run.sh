#!/bin/bash
# The one script for a GPU machine (docs/cuda.md, TOOLCHAIN.md "The GPU machine"): builds the engine, the devices and
# their tests against the CUDA LibTorch inside the machine's PyTorch and the CUDA runtime, runs them, and records
# nvidia-smi. Budget: under 5 minutes; every step has its own timeout.
#
# NOT YET RUN ON A GPU: written and checked (bash -n, shellcheck) on a build machine without one. Expect to fix
# details on its first run; the log says which step failed.
#
# Before: on a build machine, tests/gpu/fetch-debs.sh (downloads the -dev packages this machine lacks into
# .gpu-debs/, ignored by git, so the device tool's run must name it: carry [".gpu-debs"]). Then, on the GPU machine,
# from the repository root:
#
#   tests/gpu/run.sh            # the log goes to $OUT/gpu-run.log when OUT is set, else build-gpu/gpu-run.log
#
# Environment: BUILD (default build-gpu), CUDA_HOME (default: from nvcc, else /usr/local/cuda), PYTHON (python3),
# JOBS (default: nproc), SUITES (default "device engine": meson test suites to run).
# Exit: 0 all selected tests passed; 1 a step failed; 77 no GPU (nvidia-smi fails and no CUDA device opens).
# Nothing here changes the GPU's settings: nvidia-smi is only queried.
set -uo pipefail

cd "$(dirname "$0")/../.." || exit 1
root=$(pwd)
build=${BUILD:-build-gpu}
debs="$root/.gpu-debs"
prefix="$debs/root"
jobs=${JOBS:-$(nproc)}
py=${PYTHON:-python3}
suites=${SUITES:-device engine}
outdir=${OUT:-$root/$build}
mkdir -p "$outdir" "$build"
log="$outdir/gpu-run.log"
: >"$log"
start=$(date +%s)

say() { printf '[%4ss] %s\n' "$(($(date +%s) - start))" "$*" | tee -a "$log"; }
# run SECONDS DESCRIPTION CMD...: runs CMD with a timeout, its output into the log (and the terminal).
run() {
  local limit=$1 what=$2
  shift 2
  say "== $what"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    say "!! $what failed (exit $rc$([ "$rc" -eq 124 ] && echo ', timed out after '"$limit"'s'))"
  fi
  return "$rc"
}
die() {
  say "FAILED: $*"
  exit 1
}

# --- 1. the machine ------------------------------------------------------------------------------------------------
say "tandem GPU run: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?') on $(uname -n), $jobs jobs"
if ! run 30 "nvidia-smi" nvidia-smi; then
  say "nvidia-smi failed: no GPU or no driver here"
  nogpu=1
else
  nogpu=0
  run 30 "nvidia-smi (query)" nvidia-smi \
    --query-gpu=index,name,driver_version,memory.total,memory.used,memory.free,ecc.errors.uncorrected.volatile.total \
    --format=csv || true
fi
for tool in c++ meson ninja "$py"; do
  command -v "$tool" >/dev/null || die "$tool not found"
done
# shellcheck disable=SC2016  # expanded by the inner bash
run 10 "versions" bash -c 'c++ --version | head -n 1; echo "meson $(meson --version)"; echo "ninja $(ninja --version)"; command -v pkg-config || echo "no pkg-config (falling back to CMake/compiler paths)"; command -v cmake || true'

if [ -z "${CUDA_HOME:-}" ]; then
  if command -v nvcc >/dev/null; then CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  else CUDA_HOME=/usr/local/cuda; fi
fi
[ -e "$CUDA_HOME/include/cuda_runtime_api.h" ] || die "no cuda_runtime_api.h under CUDA_HOME=$CUDA_HOME"
say "CUDA_HOME=$CUDA_HOME"

# --- 2. the CUDA LibTorch inside PyTorch --------------------------------------------------------------------------
torch_dir=$(timeout 120 "$py" -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>>"$log") ||
  die "python cannot import torch"
run 120 "torch" "$py" -c 'import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      "devices", torch.cuda.device_count(), "cxx11 abi", torch.compiled_with_cxx11_abi())
if not torch.compiled_with_cxx11_abi(): print("WARNING: meson.build compiles with -D_GLIBCXX_USE_CXX11_ABI=1")' || true
if [ ! -d "$torch_dir/include" ] || [ ! -d "$torch_dir/lib" ]; then die "no include/ and lib/ in $torch_dir"; fi
say "torch_dir=$torch_dir"
# The torch libraries find their CUDA libraries through their own RUNPATH; ours need torch's lib/ at run time.
export LD_LIBRARY_PATH="$torch_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# --- 3. test dependencies from .gpu-debs ---------------------------------------------------------------------------
shopt -s nullglob
deb_files=("$debs"/*.deb)
shopt -u nullglob
if [ "${#deb_files[@]}" -eq 0 ]; then
  say "no .deb files in $debs: relying on this machine's own gtest/gmock/nlohmann_json"
else
  rm -rf "$prefix" && mkdir -p "$prefix"
  # dpkg-deb where there is one; else a .deb is an ar archive holding data.tar.{xz,zst,gz}.
  unpack_deb() {
    if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$1" "$prefix"; return; fi
    local member
    member=$(ar t "$1" | grep '^data\.tar') || return 1
    local z
    case "$member" in *.xz) z=--xz ;; *.zst) z=--zstd ;; *.gz) z=--gzip ;; *) z= ;; esac
    ar p "$1" "$member" | tar -x ${z:+"$z"} -f - -C "$prefix"
  }
  for d in "${deb_files[@]}"; do
    unpack_deb "$d" 2>>"$log" || die "cannot unpack $d"
  done
  say "unpacked ${#deb_files[@]} packages into $prefix"
  multiarch=x86_64-linux-gnu
  libdir="$prefix/usr/lib/$multiarch"
  src="$prefix/usr/src/googletest"
  # Rebuild GoogleTest/GoogleMock with this machine's compiler (the Debian .a files need Debian's libstdc++).
  if [ -d "$src/googletest/src" ]; then
    gt_inc=(-I"$src/googletest/include" -I"$src/googletest" -I"$src/googlemock/include" -I"$src/googlemock")
    objs="$prefix/obj" && mkdir -p "$objs"
    compile() { c++ -std=c++17 -O1 -fPIC -DGTEST_HAS_PTHREAD=1 "${gt_inc[@]}" -c "$1" -o "$2"; }
    pids=()
    compile "$src/googletest/src/gtest-all.cc" "$objs/gtest.o" & pids+=($!)
    compile "$src/googletest/src/gtest_main.cc" "$objs/gtest_main.o" & pids+=($!)
    compile "$src/googlemock/src/gmock-all.cc" "$objs/gmock.o" & pids+=($!)
    compile "$src/googlemock/src/gmock_main.cc" "$objs/gmock_main.o" & pids+=($!)
    for p in "${pids[@]}"; do wait "$p" || die "compiling GoogleTest from $src"; done
    mkdir -p "$libdir"
    for l in gtest gtest_main gmock gmock_main; do
      rm -f "$libdir/lib$l.a"
      ar rcs "$libdir/lib$l.a" "$objs/$l.o" 2>>"$log" || die "ar lib$l.a"
    done
    say "rebuilt libgtest/libgmock with $(c++ -dumpfullversion 2>/dev/null || echo c++)"
  fi
  # pkg-config files name /usr: point them at the prefix.
  for pc in "$libdir"/pkgconfig/*.pc "$prefix"/usr/share/pkgconfig/*.pc; do
    [ -f "$pc" ] && sed -i -E "s#^(prefix|exec_prefix|libdir|includedir)=/usr#\\1=$prefix/usr#" "$pc"
  done
  export PKG_CONFIG_PATH="$libdir/pkgconfig:$prefix/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  # Without pkg-config, meson falls back to CMake configs and to the compiler's own search paths.
  export CMAKE_PREFIX_PATH="$prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export LIBRARY_PATH="$libdir${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export CPLUS_INCLUDE_PATH="$prefix/usr/include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
fi

# --- 4. configure and build only what the GPU checks need ----------------------------------------------------------
setup_args=(-Dtorch_dir="$torch_dir" -Dcuda=enabled -Dcudart_dir="$CUDA_HOME" -Dtests=true -Dbenchmarks=false
  -Dbuildtype=debugoptimized)
if [ -f "$build/build.ninja" ]; then
  run 120 "meson configure" meson setup --reconfigure "$build" "${setup_args[@]}" || die "meson setup"
else
  run 120 "meson setup" meson setup "$build" "${setup_args[@]}" || die "meson setup"
fi
run 180 "build the CUDA device, its test and the ballast" \
  ninja -C "$build" -j"$jobs" tools/tandem-gpu-ballast tests/device/test_device_cuda || die "build"
run 20 "link check" bash -c "ldd '$build/tools/tandem-gpu-ballast' | grep -E 'cuda|not found' ||
  echo 'tandem-gpu-ballast: cudart linked statically'"

# --- 5. run ---------------------------------------------------------------------------------------------------------
run 30 "ballast smoke" bash -c "'$build/tools/tandem-gpu-ballast' --bytes 256M --seconds 1; echo \"exit \$?\""
rc=0
# meson test first builds exactly what the selected suites need (the engine and its tests: the LibTorch TUs).
suite_args=()
for s in $suites; do suite_args+=(--suite "$s"); done
run 270 "meson test (suites: $suites)" meson test -C "$build" --print-errorlogs --num-processes 4 \
  "${suite_args[@]}" || rc=1
cp -f "$build/meson-logs/testlog.txt" "$outdir/testlog.txt" 2>/dev/null || true
# The gtest binaries print skips: a GPU run where the CUDA tests skipped is not a GPU check.
if grep -q "no GPU: " "$build/meson-logs/testlog.txt" 2>/dev/null; then
  say "WARNING: CUDA device tests were skipped (no GPU seen by the CUDA runtime)"
  [ "$nogpu" -eq 1 ] && [ "$rc" -eq 0 ] && rc=77
fi
run 30 "nvidia-smi (after)" nvidia-smi || true
say "done: exit $rc, $(($(date +%s) - start)) s; log $log"
exit "$rc"
