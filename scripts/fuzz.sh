#!/usr/bin/env bash
# Fuzz the daemon side of the shared-memory rings (tests/ring/fuzz_ring_consumer.cc) and the GGUF reader with the
# model mapping and tokenizer rebuilt from it (tests/weights/fuzz_gguf.cc) and the chat-template engine
# (tests/generation/fuzz_jinja.cc) and the tokenizer.json parser with BPE encode/decode
# (tests/tokenizer/fuzz_tokenizer_json.cc) and the JPEG/PNG decoder with CLIP preprocessing (tests/image/fuzz_image.cc)
# and the audio decoder with the log-mel front end (tests/audio/fuzz_audio.cc) and the speech parsers — Whisper
# config.json, journal checkpoints, generation_config.json with a resumed window (tests/speech/fuzz_speech.cc) —
# with libFuzzer, ASan and UBSan.
#
#   scripts/fuzz.sh [--time SECONDS] [--runs N] [--target ring|gguf|jinja|tokenizer|image|audio|speech|all] [-- extra libFuzzer flags]
#
# Sets up (once) and updates the clang build dir build-fuzz (-Dfuzz=true, ASan+UBSan, -fsanitize=fuzzer-no-link on
# everything the targets link), builds only the fuzz targets (-j1 unless TANDEM_FUZZ_JOBS; never the LibTorch parts), runs each one bounded
# by time (default 60 s each) and/or executions, and prints the number of executions. The growing corpora live in
# build-fuzz/fuzz-corpus/ring_consumer (seeded from tests/ring/corpus/) and build-fuzz/fuzz-corpus/gguf (seeded from
# build-fuzz/fuzz-seeds/gguf, written by fuzz_gguf_make_corpus) and build-fuzz/fuzz-corpus/jinja (seeded with the family
# chat templates by fuzz_jinja_make_corpus), build-fuzz/fuzz-corpus/tokenizer (seeded by
# fuzz_tokenizer_make_corpus: generated tokenizer.json files, texts, merge lists), build-fuzz/fuzz-corpus/image (seeded
# by fuzz_image_make_corpus: small PNGs and JPEGs of every kind), build-fuzz/fuzz-corpus/audio (seeded by
# fuzz_audio_make_corpus: small WAV, FLAC, Ogg Vorbis/Opus, MP3 and AIFF files), build-fuzz/fuzz-corpus/speech (seeded
# by fuzz_speech_make_corpus: written Whisper configs, generation configs, checkpoints), crashes in
# build-fuzz/fuzz-artifacts/.
#
# Exit status: 0 = no finding, 77 = skipped (clang or libFuzzer missing: apt-get install clang libclang-rt-14-dev),
# anything else = a crash, leak, timeout or sanitizer report (see the log), or a build failure.
# Environment: TANDEM_FUZZ_BUILD_DIR overrides the build dir; CXX_FUZZ the compiler (default clang++);
# TANDEM_FUZZ_JOBS the build's parallel jobs (default 1; the meson fuzz tests, which run alone, use 2).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${TANDEM_FUZZ_BUILD_DIR:-$root/build-fuzz}
cxx=${CXX_FUZZ:-clang++}
time_s=""
runs=""
target_sel=all
extra=()

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }  # the header comment

while [ $# -gt 0 ]; do
  case "$1" in
    --time) time_s=${2:?--time needs SECONDS}; shift 2 ;;
    --runs) runs=${2:?--runs needs N}; shift 2 ;;
    --target) target_sel=${2:?--target needs ring, gguf, jinja, tokenizer, image, audio, speech, http or all}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "fuzz.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
if [ -z "$time_s" ] && [ -z "$runs" ]; then time_s=60; fi
case "$target_sel" in ring|gguf|jinja|tokenizer|image|audio|speech|http|all) ;; *) echo "fuzz.sh: --target must be ring, gguf, jinja, tokenizer, image, audio, speech, http or all" >&2; exit 2 ;; esac
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
# Only the fuzz targets and what they link (core, ring, daemon options; weights, kernels, tokenizer); ninja re-runs
# meson itself when needed.
ninja_targets=()
case "$target_sel" in
  ring) ninja_targets=(tests/ring/fuzz_ring_consumer) ;;
  gguf) ninja_targets=(tests/weights/fuzz_gguf tests/weights/fuzz_gguf_make_corpus) ;;
  jinja) ninja_targets=(tests/generation/fuzz_jinja tests/generation/fuzz_jinja_make_corpus) ;;
  tokenizer) ninja_targets=(tests/tokenizer/fuzz_tokenizer_json tests/tokenizer/fuzz_tokenizer_make_corpus) ;;
  image) ninja_targets=(tests/image/fuzz_image tests/image/fuzz_image_make_corpus) ;;
  audio) ninja_targets=(tests/audio/fuzz_audio tests/audio/fuzz_audio_make_corpus) ;;
  speech) ninja_targets=(tests/speech/fuzz_speech tests/speech/fuzz_speech_make_corpus) ;;
  http) ninja_targets=(tests/http/fuzz_http_request) ;;
  all) ninja_targets=(tests/ring/fuzz_ring_consumer tests/weights/fuzz_gguf tests/weights/fuzz_gguf_make_corpus
       tests/generation/fuzz_jinja tests/generation/fuzz_jinja_make_corpus
       tests/tokenizer/fuzz_tokenizer_json tests/tokenizer/fuzz_tokenizer_make_corpus
       tests/image/fuzz_image tests/image/fuzz_image_make_corpus
       tests/audio/fuzz_audio tests/audio/fuzz_audio_make_corpus
       tests/speech/fuzz_speech tests/speech/fuzz_speech_make_corpus tests/http/fuzz_http_request) ;;
esac
ninja -C "$build" -j"${TANDEM_FUZZ_JOBS:-1}" "${ninja_targets[@]}" >"$build/fuzz-build.log" 2>&1 \
  || { tail -50 "$build/fuzz-build.log" >&2; echo "fuzz.sh: build failed (log: $build/fuzz-build.log)" >&2; exit 1; }

# --- run -----------------------------------------------------------------------------------------------------------
artifacts="$build/fuzz-artifacts/"
mkdir -p "$artifacts"

# run_target NAME BINARY MAX_LEN CORPUS SEED_DIR: one bounded libFuzzer run; returns its exit status.
run_target() {
  local name=$1 target=$2 max_len=$3 corpus=$4 seeds=$5
  if [ ! -x "$target" ]; then
    echo "fuzz.sh: $target was not built (meson warning in $build/meson-logs?)" >&2
    return 1
  fi
  mkdir -p "$corpus"
  local args=(-timeout=10 -rss_limit_mb=2048 -max_len="$max_len" -print_final_stats=1 -artifact_prefix="$artifacts")
  [ -n "$time_s" ] && args+=(-max_total_time="$time_s")
  [ -n "$runs" ] && args+=(-runs="$runs")
  local log="$build/fuzz-run-$name.log"
  echo "fuzz.sh: $target ${args[*]} ${extra[*]:-} $corpus $seeds"
  local start end rc execs
  start=$(date +%s)
  set +e
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1:${ASAN_OPTIONS:-}" \
  UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:${UBSAN_OPTIONS:-}" \
    "$target" "${args[@]}" "${extra[@]}" "$corpus" "$seeds" >"$log" 2>&1
  rc=$?
  set -e
  end=$(date +%s)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  if [ -z "$execs" ]; then
    execs=$(grep -o '#[0-9]\+' "$log" | tail -1 | tr -d '#' || true)
  fi
  if [ $rc -ne 0 ]; then
    tail -60 "$log"
    echo "fuzz.sh: $name FAILED (exit $rc) after ${execs:-?} executions in $((end - start)) s; log: $log; artifacts: $artifacts"
    return $rc
  fi
  grep -E '^(stat::|Done )' "$log" || true
  echo "fuzz.sh: $name OK: ${execs:-?} executions in $((end - start)) s, no crash/leak/sanitizer report (corpus: $(ls "$corpus" | wc -l) units)"
  return 0
}

status=0
if [ "$target_sel" = ring ] || [ "$target_sel" = all ]; then
  run_target ring "$build/tests/ring/fuzz_ring_consumer" 8192 "$build/fuzz-corpus/ring_consumer" \
    "$root/tests/ring/corpus" || status=$?
fi
if { [ "$target_sel" = gguf ] || [ "$target_sel" = all ]; } && [ $status -eq 0 ]; then
  seeds="$build/fuzz-seeds/gguf"
  rm -rf "$seeds" && mkdir -p "$seeds"
  "$build/tests/weights/fuzz_gguf_make_corpus" "$seeds" || { echo "fuzz.sh: writing the GGUF seeds failed" >&2; exit 1; }
  run_target gguf "$build/tests/weights/fuzz_gguf" 32768 "$build/fuzz-corpus/gguf" "$seeds" || status=$?
fi
if { [ "$target_sel" = jinja ] || [ "$target_sel" = all ]; } && [ $status -eq 0 ]; then
  seeds="$build/fuzz-seeds/jinja"
  rm -rf "$seeds" && mkdir -p "$seeds"
  "$build/tests/generation/fuzz_jinja_make_corpus" "$seeds" || { echo "fuzz.sh: writing the jinja seeds failed" >&2; exit 1; }
  run_target jinja "$build/tests/generation/fuzz_jinja" 16384 "$build/fuzz-corpus/jinja" "$seeds" || status=$?
fi
if { [ "$target_sel" = tokenizer ] || [ "$target_sel" = all ]; } && [ $status -eq 0 ]; then
  seeds="$build/fuzz-seeds/tokenizer"
  rm -rf "$seeds" && mkdir -p "$seeds"
  "$build/tests/tokenizer/fuzz_tokenizer_make_corpus" "$seeds" >/dev/null \
    || { echo "fuzz.sh: writing the tokenizer seeds failed" >&2; exit 1; }
  run_target tokenizer "$build/tests/tokenizer/fuzz_tokenizer_json" 65536 "$build/fuzz-corpus/tokenizer" "$seeds" \
    || status=$?
fi
if { [ "$target_sel" = image ] || [ "$target_sel" = all ]; } && [ $status -eq 0 ]; then
  seeds="$build/fuzz-seeds/image"
  rm -rf "$seeds" && mkdir -p "$seeds"
  "$build/tests/image/fuzz_image_make_corpus" "$seeds" || { echo "fuzz.sh: writing the image seeds failed" >&2; exit 1; }
  run_target image "$build/tests/image/fuzz_image" 32768 "$build/fuzz-corpus/image" "$seeds" || status=$?
fi
if { [ "$target_sel" = audio ] || [ "$target_sel" = all ]; } && [ $status -eq 0 ]; then
  seeds="$build/fuzz-seeds/audio"
  rm -rf "$seeds" && mkdir -p "$seeds"
  "$build/tests/audio/fuzz_audio_make_corpus" "$seeds" || { echo "fuzz.sh: writing the audio seeds failed" >&2; exit 1; }
  # libsndfile's own leak on malformed Ogg Vorbis headers is suppressed (tests/audio/lsan.supp says why).
  LSAN_OPTIONS="suppressions=$root/tests/audio/lsan.supp:${LSAN_OPTIONS:-}" \
    run_target audio "$build/tests/audio/fuzz_audio" 65536 "$build/fuzz-corpus/audio" "$seeds" || status=$?
fi
if { [ "$target_sel" = speech ] || [ "$target_sel" = all ]; } && [ $status -eq 0 ]; then
  seeds="$build/fuzz-seeds/speech"
  rm -rf "$seeds" && mkdir -p "$seeds"
  "$build/tests/speech/fuzz_speech_make_corpus" "$seeds" || { echo "fuzz.sh: writing the speech seeds failed" >&2; exit 1; }
  run_target speech "$build/tests/speech/fuzz_speech" 16384 "$build/fuzz-corpus/speech" "$seeds" || status=$?
fi
if { [ "$target_sel" = http ] || [ "$target_sel" = all ]; } && [ $status -eq 0 ]; then
  # tandem-http's request mapping: JSON bodies of every endpoint, multipart uploads, Wyoming streams (seeds checked in).
  run_target http "$build/tests/http/fuzz_http_request" 65536 "$build/fuzz-corpus/http" "$root/tests/http/corpus" \
    || status=$?
fi
exit $status
