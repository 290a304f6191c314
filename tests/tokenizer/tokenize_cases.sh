#!/usr/bin/env bash
# tandem-tokenize --cases on llama.cpp's four vocabulary files reproduces their .out ids (whitespace aside).
# Usage: tokenize_cases.sh TOOL VOCAB_DIR. Exit 77 (skipped) when VOCAB_DIR (../shared/models/vocab) is absent.
set -euo pipefail
tool=$1
dir=$2
if [ ! -d "$dir" ]; then echo "SKIP: $dir is absent (../shared/models/vocab)"; exit 77; fi
status=0
for v in gpt-2 deepseek-coder llama-spm phi-3; do
  f="$dir/ggml-vocab-$v.gguf"
  out=$("$tool" --model "$f" --cases --no-bos < "$f.inp")
  if diff -w <(printf '%s\n' "$out") "$f.out" >/dev/null; then
    echo "$v: $(wc -l < "$f.out") cases match"
  else
    echo "$v: output differs from $f.out"; status=1
  fi
done
# A usage error is 2, a model that does not load is 1.
set +e
"$tool" >/dev/null 2>&1; [ $? -eq 2 ] || { echo "usage error: wrong exit status"; status=1; }
"$tool" --model /nonexistent/model </dev/null >/dev/null 2>&1; [ $? -eq 1 ] || { echo "bad model: wrong exit status"; status=1; }
exit $status
