#!/usr/bin/env bash
# Tandem's CPU engine and a natively built llama.cpp on the very same GGUF files, in one run on one machine:
# prefill of 128 tokens and decode, tokens/s at 1 and 2 threads, and their ratios (the table in docs/kernels.md).
# Tandem's figures come from bench_engine (Prefill128 / Decode, which writes the files on first use); llama.cpp's
# from llama-bench -p 128 -n 64 on each file right after, type by type, ROUNDS rounds (default 2), each side's best
# round kept. Both compute on the CPU only.
#
#   bash bench/engine/llamacpp_native_side_by_side.sh LLAMA_CPP_BIN [TYPES]
# LLAMA_CPP_BIN: the bin directory of a llama.cpp built on this machine with -DGGML_NATIVE=ON (the recipe is in
# ../shared/TOOLCHAIN.md: fetch the repository, cmake -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF, build llama-bench;
# an 8-minute build on 2 cores, kept outside the repository). TYPES: a space-separated subset of
# "F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K_M IQ4_NL IQ4_XS Q2_K Q3_K_M" (default: all).
# Environment: TANDEM_BUILD (default build/), TANDEM_KERNELS (Tandem's kernel path, default the best this CPU has),
# MODELS (default /tmp/tandem-bench-models), ROUNDS (default 2).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:?usage: llamacpp_native_side_by_side.sh LLAMA_CPP_BIN [TYPES]}
types=${2:-F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K_M IQ4_NL IQ4_XS Q2_K Q3_K_M}
build=${TANDEM_BUILD:-$here/../../build}
models=${MODELS:-/tmp/tandem-bench-models}
[ -x "$bin/llama-bench" ] || { echo "no $bin/llama-bench" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# bench_engine measures f32 on the Hugging Face directory; llama.cpp needs it as a GGUF file (same weights). Each
# type is measured by bench_engine and right after by llama-bench, ROUNDS times in turn (default 2), and each side's
# best round is kept: on a shared machine whose speed drifts by 20 % over minutes, a ratio is only meaningful
# between measurements taken close together.
rounds=${ROUNDS:-2}
for t in $types; do
  tag=$t; [ "$t" = F32 ] && tag=f32
  if [ "$t" = F32 ] && [ ! -f "$models/134m-F32.gguf" ]; then
    "$build/bench/engine/bench_engine" --models "$models" --benchmark_filter='^Load/134m/f32$' >/dev/null 2>&1 || true
    "$build/tools/tandem-quantize" --threads 2 "$models/134m-F32" "$models/134m-F32.gguf" F32 >/dev/null
  fi
  for r in $(seq "$rounds"); do
    "$build/bench/engine/bench_engine" --models "$models" \
      --benchmark_filter="^(Prefill128|Decode)/134m/$tag/" \
      --benchmark_out="$tmp/tandem-$t-$r.json" --benchmark_out_format=json >"$tmp/tandem.txt" 2>&1 ||
      { cat "$tmp/tandem.txt"; exit 1; }
    f="$models/134m-$t.gguf"
    [ -f "$f" ] || { echo "skip $t: $f missing" >&2; continue; }
    "$bin/llama-bench" -m "$f" -p 128 -n 64 -t 1,2 -r 3 -o json >"$tmp/llama-$t-$r.json" 2>/dev/null
  done
done

python3 - "$tmp" "$types" <<'PY'
import json, os, re, sys
tmp, types = sys.argv[1], sys.argv[2].split()
tandem = {}
for name in sorted(os.listdir(tmp)):
    if not (name.startswith("tandem-") and name.endswith(".json")):
        continue
    for b in json.load(open(os.path.join(tmp, name)))["benchmarks"]:
        m = re.match(r"(Prefill128|Decode)/134m/([^/]+)/threads:(\d+)", b["name"])
        if m and "tok/s" in b:
            key = (m[1], m[2].upper(), int(m[3]))
            tandem[key] = max(tandem.get(key, 0.0), b["tok/s"])
print("134m shape (bench_engine's); tokens/s at 1 / 2 threads, each side's best of %s rounds taken in turn; "
      "ratio = Tandem / llama.cpp" % os.environ.get("ROUNDS", "2"))
print("| weights | Tandem prefill 128 | llama.cpp prefill 128 | ratio | Tandem decode | llama.cpp decode | ratio |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for t in types:
    paths = [os.path.join(tmp, n) for n in sorted(os.listdir(tmp)) if n.startswith(f"llama-{t}-") and n.endswith(".json")]
    if not paths:
        continue
    llama = {}
    for path in paths:
        for r in json.load(open(path)):
            kind = "Prefill128" if r["n_prompt"] > 0 else "Decode"
            llama[(kind, r["n_threads"])] = max(llama.get((kind, r["n_threads"]), 0.0), r["avg_ts"])
    row = [t]
    for kind in ("Prefill128", "Decode"):
        ours = [tandem.get((kind, t, n)) for n in (1, 2)]
        theirs = [llama.get((kind, n)) for n in (1, 2)]
        fmt = lambda v: "-" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.1f}"
        row.append(" / ".join(fmt(v) for v in ours))
        row.append(" / ".join(fmt(v) for v in theirs))
        row.append(" / ".join("-" if a is None or b is None else f"{a / b:.2f}" for a, b in zip(ours, theirs)))
    print("| " + " | ".join(row) + " |")
PY
echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p'); Tandem kernels: ${TANDEM_KERNELS:-best detected}"
