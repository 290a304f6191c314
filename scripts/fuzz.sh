#!/usr/bin/env bash
# Fuzz the daemon side of the shared-memory rings (tests/ring/fuzz_ring_consumer.cc) with libFuzzer, ASan and UBSan.
#
#   scripts/fuzz.sh [--time SECONDS] [--runs N] [-- extra libFuzzer flags]
#
# Sets up (once) and updates the clang build dir build-fuzz (-Dfuzz=true, ASan+UBSan, -fsanitize=fuzzer-no-link on
# everything the target links), builds only the fuzz target (-j1; never the LibTorch parts), runs it bounded by time
# (default 60 s) and/or executions, and prints the number of executions. The growing corpus lives in
# build-fuzz/fuzz-corpus/ring_consumer (seeded from tests/ring/corpus/), crashes in build-fuzz/fuzz-artifacts/.
#
# Exit status: 0 = no finding, 77 = skipped (clang or libFuzzer missing: apt-get install clang libclang-rt-14-dev),
# anything else = a crash, leak, timeout or sanitizer report (see the log), or a build failure.
# Environment: TANDEM_FUZZ_BUILD_DIR overrides the build dir; CXX_FUZZ the compiler (default clang++).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${TANDEM_FUZZ_BUILD_DIR:-$root/build-fuzz}
cxx=${CXX_FUZZ:-clang++}
time_s=""
runs=""
extra=()

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --time) time_s=${2:?--time needs SECONDS}; shift 2 ;;
    --runs) runs=${2:?--runs needs N}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "fuzz.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
if [ -z "$time_s" ] && [ -z "$runs" ]; then time_s=60; fi
for v in "$time_s" "$runs"; do
  if [ -n "$v" ] && ! [[ "$v" =~ ^[0-9]+$ ]]; then echo "fuzz.sh: '$v' is not a number" >&2; exit 2; fi
done

# --- prerequisites: clang with libFuzzer (else: skipped, exit 77) ---------------------------------------------------
if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "fuzz.sh: SKIP: $cxx not found (apt-get install clang libclang-rt-14-dev)"
  exit 77
fi
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf '#include <cstddef>\n#include <cstdint>\nextern "C" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }\n' \
  > "$probe/p.cc"
if ! "$cxx" -fsanitize=fuzzer,address,undefined "$probe/p.cc" -o "$probe/p" >"$probe/log" 2>&1; then
  echo "fuzz.sh: SKIP: $cxx cannot link -fsanitize=fuzzer,address,undefined (apt-get install libclang-rt-14-dev):"
  sed 's/^/  /' "$probe/log" | head -5
  exit 77
fi
for tool in meson ninja; do
  command -v "$tool" >/dev/null 2>&1 || { echo "fuzz.sh: SKIP: $tool not found"; exit 77; }
done

# One fuzz run at a time per build dir (the meson test and a person may start it together).
mkdir -p "$build"
if command -v flock >/dev/null 2>&1; then
  exec 9>"$build/.fuzz.lock"
  flock 9
fi

# --- build dir -----------------------------------------------------------------------------------------------------
if [ ! -f "$build/build.ninja" ]; then
  echo "fuzz.sh: setting up $build ($cxx, ASan+UBSan, libFuzzer)"
  CXX="$cxx" meson setup "$build" "$root" \
    -Dfuzz=true -Dtests=true -Dbenchmarks=false -Dcuda=disabled \
    -Dbuildtype=debugoptimized -Db_ndebug=false \
    -Db_sanitize=address,undefined -Db_lundef=false \
    -Dcpp_args="-fsanitize=fuzzer-no-link -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
    >"$build/fuzz-setup.log" 2>&1 || { cat "$build/fuzz-setup.log" >&2; exit 1; }
fi
# Only the fuzz target and what it links (core, ring, daemon options); ninja re-runs meson itself when needed.
ninja -C "$build" -j1 tests/ring/fuzz_ring_consumer >"$build/fuzz-build.log" 2>&1 \
  || { tail -50 "$build/fuzz-build.log" >&2; echo "fuzz.sh: build failed (log: $build/fuzz-build.log)" >&2; exit 1; }
target="$build/tests/ring/fuzz_ring_consumer"
if [ ! -x "$target" ]; then
  echo "fuzz.sh: $target was not built (meson warning in $build/meson-logs?)" >&2
  exit 1
fi

# --- run -----------------------------------------------------------------------------------------------------------
corpus="$build/fuzz-corpus/ring_consumer"
artifacts="$build/fuzz-artifacts/"
mkdir -p "$corpus" "$artifacts"
args=(-timeout=10 -rss_limit_mb=2048 -max_len=8192 -print_final_stats=1 -artifact_prefix="$artifacts")
[ -n "$time_s" ] && args+=(-max_total_time="$time_s")
[ -n "$runs" ] && args+=(-runs="$runs")
log="$build/fuzz-run.log"
echo "fuzz.sh: $target ${args[*]} ${extra[*]:-} $corpus $root/tests/ring/corpus"
start=$(date +%s)
set +e
ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1:${ASAN_OPTIONS:-}" \
UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:${UBSAN_OPTIONS:-}" \
  "$target" "${args[@]}" "${extra[@]}" "$corpus" "$root/tests/ring/corpus" >"$log" 2>&1
rc=$?
set -e
end=$(date +%s)
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
if [ -z "$execs" ]; then
  execs=$(grep -o '#[0-9]\+' "$log" | tail -1 | tr -d '#' || true)
fi
if [ $rc -ne 0 ]; then
  tail -60 "$log"
  echo "fuzz.sh: FAILED (exit $rc) after ${execs:-?} executions in $((end - start)) s; log: $log; artifacts: $artifacts"
  exit $rc
fi
grep -E '^(stat::|Done )' "$log" || true
echo "fuzz.sh: OK: ${execs:-?} executions in $((end - start)) s, no crash/leak/sanitizer report (corpus: $(ls "$corpus" | wc -l) units)"
