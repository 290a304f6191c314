#!/usr/bin/env bash
# llama.cpp's llama-embedding on the bert-base files bench_bert writes (/tmp/tandem-bench-models/bert-base-*.gguf):
# texts/s for batch 1 and 32 passages of 128 tokens ([CLS] + 126 words of the generated vocabulary, one token each,
# + [SEP]) at 1 and 2 threads, from its "prompt eval time" line. Run bench_bert first (it writes the files), then:
#   bench/engine/bert_side_by_side.sh /work/llama.cpp/build/bin
# llama.cpp evaluates a batch of texts as one sequence set in one graph (its attention spans the whole batch, masked
# per text), so its batch-32 figure is not 32 times its batch-1 figure.
set -eu
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$tmp" <<'PY'
import random, sys
words = ("the of and to in is was for on that with as by at from it his an are were which be this has had not but or "
         "have they their one first also new after who its been two her more time when there all other can into would "
         "only some years most may over many these such used than them three people about so where no then between "
         "during world city search query document passage embedding model text vector server gpu cpu memory home music "
         "photo cat dog house water light night day red blue green small large fast slow good bad").split()
random.seed(1)
text = lambda: " ".join(random.choice(words) for _ in range(126))
open(sys.argv[1] + "/b1.txt", "w").write(text() + "\n")
open(sys.argv[1] + "/b32.txt", "w").write("\n".join(text() for _ in range(32)) + "\n")
PY
for type in F32 F16 Q8_0; do
  f=/tmp/tandem-bench-models/bert-base-$type.gguf
  [ -f "$f" ] || { echo "no $f: run bench_bert first"; exit 1; }
  for t in 1 2; do
    for b in 1 32; do
      ms=$("$bin/llama-embedding" -m "$f" -f "$tmp/b$b.txt" -c 4096 -b 4096 -ub 4096 -t "$t" --embd-output-format json \
             2>&1 >/dev/null | sed -n 's/.*prompt eval time = *\([0-9.]*\) ms.*/\1/p')
      awk -v ms="$ms" -v b="$b" -v ty="$type" -v t="$t" \
        'BEGIN { printf "llama.cpp bert-base %s t%d batch %d x 128 tokens: %.1f ms, %.2f texts/s\n", ty, t, b, ms, b * 1000 / ms }'
    done
  done
done
