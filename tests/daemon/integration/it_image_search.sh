#!/usr/bin/env bash
# Embeddings through the real daemon, next to the LLM on one simulated GPU: a CLIP model (tandem-mkmodel --preset
# clip-test: random weights, a trained CLIP tokenizer) served as "clip".
#   - ListModels shows its kind, dim and modalities; Submit refuses it; Embed refuses the LLM;
#   - Embed (tandemctl embed, gdbus): texts, an image passed as a file descriptor and the same image as bytes (equal vectors),
#     unit-length vectors, the result keys; an idempotency key gives the same vectors and existing=true;
#   - untrusted input: a non-image file, a pipe, a truncated PNG, a PNG whose header claims too many pixels, a file
#     over max_image_bytes, too many inputs, an unknown option, an empty call → InvalidArgument naming the input,
#     and the daemon serves on;
#   - tandemctl index / search on a folder of rendered pictures: every file indexed, an image query finds itself
#     first (score 1), incremental re-index (unchanged / updated / removed / a corrupt file failed and remembered);
#   - a GPU fault: the breaker opens and Embed runs on the CPU (route cpu, degraded), then back on the GPU.
TANDEMD=$1 TANDEMCTL=$2 MKMODEL=$3
source "$(dirname "$0")/lib.sh"

tandem_clip_model
tandem_setup "
[[model]]
name = \"clip\"
dir = \"$CLIP\"
replica_mode = \"mmap\"
cpu_threads = 1
gpu_threads = 1

[embedding]
max_inputs = 8
max_image_bytes = \"64KiB\"
max_image_pixels = 1000000
"
export XDG_CACHE_HOME="$T_DIR/cache"

# --- the model's kind --------------------------------------------------------------------------------------------
models=$(bcall ListModels)
kind=$(echo "$models" | jq -r '.data[0][] | select(.name.data == "clip") | .kind.data')
dim=$(echo "$models" | jq -r '.data[0][] | select(.name.data == "clip") | .dim.data')
[ "$kind" = embedding ] || fail "clip: kind '$kind' (ListModels: ${models:0:600})"
[ "$dim" = 16 ] || fail "clip: dim '$dim', expected clip-test's projection 16"
kind=$(echo "$models" | jq -r '.data[0][] | select(.name.data == "default") | .kind.data')
[ "$kind" = llm ] || fail "default: kind '$kind'"
note "ListModels: clip is an embedding model of dim $dim, default an llm"
# gembed MODEL TEXTS-GVARIANT [OPTIONS-GVARIANT]: Embed through gdbus (which names the D-Bus error on failure).
gembed() { gcall Embed "$1" "$2" "@ah []" "@aay []" "${3:-@a{sv\} {\}}"; }
expect_err NotSupported gcall Submit clip "hello" "@a(ss) []" "@a{sv} {}" >/dev/null
expect_err NotSupported gembed default "['hello']" >/dev/null
expect_err UnknownModel gembed nope "['hello']" >/dev/null
note "Submit refuses the embedding model, Embed the LLM and unknown models"

# --- Embed over busctl --------------------------------------------------------------------------------------------
PHOTOS="$T_DIR/photos"
mkdir -p "$PHOTOS/sub"
python3 - "$PHOTOS" <<'PY'
import struct, sys, zlib
d = sys.argv[1]
colours = {"red": (220, 30, 30), "green": (30, 180, 40), "blue": (30, 60, 220), "yellow": (230, 210, 30)}
i = 0
for name, rgb in colours.items():
    for size in (24, 40, 56):
        # a square of the colour on white, at a size-dependent place: every file differs
        w = h = size
        rows = []
        for y in range(h):
            row = b""
            for x in range(w):
                inside = size // 4 <= x < 3 * size // 4 and size // 5 <= y < 4 * size // 5
                row += bytes(rgb) if inside else b"\xfa\xfa\xfa"
            rows.append(b"\x00" + row)
        def chunk(t, dd): return struct.pack(">I", len(dd)) + t + dd + struct.pack(">I", zlib.crc32(t + dd) & 0xffffffff)
        data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) \
            + chunk(b"IDAT", zlib.compress(b"".join(rows))) + chunk(b"IEND", b"")
        sub = "sub/" if i % 3 == 0 else ""
        open(f"{d}/{sub}{i:02d}-{name}-{size}.png", "wb").write(data)
        i += 1
# a PNG header claiming 2000 x 2000 pixels (over max_image_pixels) with no data
hdr = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + struct.pack(">IIBBBBB", 2000, 2000, 8, 2, 0, 0, 0)
hdr += struct.pack(">I", zlib.crc32(b"IHDR" + hdr[16:29]) & 0xffffffff)
open(f"{d}/../huge-header.png", "wb").write(hdr)
PY
IMG=$(find "$PHOTOS" -name "*-blue-40.png")
# tandemctl embed passes --image files as file descriptors (busctl cannot); --json prints {"vectors", "result"}, or
# on failure {"event":"error","error":{"name":"io.tandem.Tandem1.Error.X",...}} with exit status 4.
ctl_embed() { "$TANDEMCTL" --json embed --model clip "$@"; }
# ctl_refused NAME TEXT ARGS...: the call fails with that D-Bus error, and its message holds TEXT.
ctl_refused() {
  local want=$1 text=$2 out rc=0; shift 2
  out=$(ctl_embed "$@" 2>/dev/null) || rc=$?
  [ "$rc" = 4 ] || fail "tandemctl embed $*: exit $rc, expected 4 (${out:0:300})"
  [ "$(echo "$out" | jq -r .error.name)" = "io.tandem.Tandem1.Error.$want" ] || fail "tandemctl embed $*: $out"
  case "$(echo "$out" | jq -r .error.message)" in *"$text"*) ;; *) fail "tandemctl embed $*: no '$text' in $out";; esac
}
# norms: one line per vector of a {"vectors"} document, its L2 norm
norms() { jq -r '.vectors[] | (map(. * .) | add | sqrt)'; }

out=$(ctl_embed --image "$IMG" "a blue square" "a red circle")
n=$(echo "$out" | jq '.vectors | length')
[ "$n" = 3 ] || fail "Embed: $n vectors for 3 inputs: ${out:0:400}"
for v in $(echo "$out" | norms); do
  awk -v v="$v" 'BEGIN { exit !(v > 0.999 && v < 1.001) }' || fail "Embed: a vector of norm $v (not L2-normalised)"
done
[ "$(echo "$out" | jq -c '[.vectors[] | length] | unique')" = "[16]" ] || fail "Embed: vectors not of dim 16"
route=$(echo "$out" | jq -r .result.route); job=$(echo "$out" | jq -r .result.job_id)
[ "$route" = gpu ] || fail "Embed result: route=$route: $out"
inputs=$(bcall GetJob t "$job" | jfield inputs); images=$(bcall GetJob t "$job" | jfield images)
[ "$inputs" = 3 ] && [ "$images" = 1 ] || fail "GetJob $job: inputs=$inputs images=$images"
[ "$(bcall GetJob t "$job" | jfield state)" = completed ] || fail "embedding job $job is not completed"
note "Embed: 2 texts + 1 image fd → 3 unit vectors of dim 16 on the GPU (job $job)"

# The same image as bytes: the same vector as through the fd.
out2=$(ctl_embed --image-bytes "$IMG")
v_fd=$(echo "$out" | jq -c '.vectors[2] | map(. * 1e5 | round)')
v_bytes=$(echo "$out2" | jq -c '.vectors[0] | map(. * 1e5 | round)')
[ "$v_fd" = "$v_bytes" ] || fail "the image as fd and as bytes gave different vectors: $v_fd vs $v_bytes"
note "the image as bytes gives the vector it gave as a file descriptor"

# An idempotency key: the second call returns the held vectors (existing=true), the same job.
k1=$(ctl_embed --key it-key-1 "a yellow square")
k2=$(ctl_embed --key it-key-1 "a yellow square")
[ "$(echo "$k1" | jq .result.job_id)" = "$(echo "$k2" | jq .result.job_id)" ] || fail "idempotency key: two jobs"
[ "$(echo "$k2" | jq .result.existing)" = true ] || fail "idempotency key: the second answer is not existing=true"
[ "$(echo "$k1" | jq -c .vectors)" = "$(echo "$k2" | jq -c .vectors)" ] || fail "idempotency key: other vectors"
expect_err Duplicate gembed clip "['another text']" "{'idempotency_key': <'it-key-1'>}" >/dev/null
note "idempotency key: the same job and vectors (existing=true); other inputs under the key → Duplicate"

# --- untrusted input ----------------------------------------------------------------------------------------------
printf 'this is not an image' > "$T_DIR/text.png"
head -c $(( $(stat -c %s "$IMG") / 2 )) "$IMG" > "$T_DIR/truncated.png"
head -c 70000 /dev/urandom > "$T_DIR/big.png"
# gimage FILE: the file as a GVariant byte array (gembed_image sends it as `images`).
gimage() { python3 -c 'import sys; d = open(sys.argv[1], "rb").read(); print("[byte " + ", ".join(map(str, d)) + "]" if d else "@ay []")' "$1"; }
gembed_image() { gcall Embed clip "@as []" "@ah []" "[$(gimage "$1")]" "@a{sv} {}"; }
ctl_refused InvalidArgument "image_fds[0]" --image "$T_DIR/text.png"
ctl_refused InvalidArgument "max_image_bytes" --image "$T_DIR/big.png"
ctl_refused InvalidArgument "regular file" --image <(cat "$IMG")
ctl_refused InvalidArgument "image_fds[1]" --image "$IMG" --image "$T_DIR/truncated.png"
expect_err InvalidArgument gembed_image "$T_DIR/text.png" >/dev/null
expect_err InvalidArgument gembed_image "$T_DIR/truncated.png" >/dev/null
e=$(expect_err InvalidArgument gembed_image "$T_DIR/huge-header.png")
case "$e" in *pixels*) ;; *) fail "a PNG of 2000 x 2000 pixels: $e";; esac
printf '\x89PN' > "$T_DIR/three.bin"
expect_err InvalidArgument gembed_image "$T_DIR/three.bin" >/dev/null
e=$(expect_err InvalidArgument gembed clip "['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i']")
case "$e" in *"at most 8 inputs"*) ;; *) fail "too many inputs: $e";; esac
expect_err InvalidArgument gembed clip "@as []" >/dev/null
expect_err InvalidArgument gembed clip "['x']" "{'colour': <'red'>}" >/dev/null
kill -0 "$T_DAEMON_PID" || fail "the daemon died on bad input"
ctl_embed "still serving" >/dev/null || fail "Embed after bad input"
note "bad input (not an image, truncated, too many pixels, too large, a pipe, too many inputs, no input, an unknown option, 3 bytes) → InvalidArgument; serving on"

# --- tandemctl index / search -------------------------------------------------------------------------------------
cp "$T_DIR/text.png" "$PHOTOS/corrupt.png"
"$TANDEMCTL" --json index "$PHOTOS" > "$T_DIR/index1.json" || fail "index: exit $? ($(tail -3 "$T_DIR/index1.json"))"
sum=$(tail -1 "$T_DIR/index1.json")
[ "$(echo "$sum" | jq .added)" = 12 ] && [ "$(echo "$sum" | jq .failed)" = 1 ] \
  || fail "first index: expected 12 added and 1 failed: $sum"
note "index: 12 images added, the corrupt one failed ($(echo "$sum" | jq -c '{added, failed, images_per_s}'))"
res=$("$TANDEMCTL" --json search -n 3 --image "$IMG")
top=$(echo "$res" | jq -r '.results[0].path'); score=$(echo "$res" | jq -r '.results[0].score')
[ "$(realpath "$top")" = "$(realpath "$IMG")" ] || fail "image search: top result $top, expected $IMG: $res"
awk -v s="$score" 'BEGIN { exit !(s > 0.999) }' || fail "image search: self score $score"
[ "$(echo "$res" | jq '.results | length')" = 3 ] || fail "image search: not 3 results"
echo "$res" | jq -e '[.results[].score] as $s | $s == ($s | sort | reverse)' >/dev/null || fail "unsorted: $res"
res=$("$TANDEMCTL" --json search -n 5 "a blue square")
[ "$(echo "$res" | jq '.results | length')" = 5 ] || fail "text search: not 5 results: $res"
"$TANDEMCTL" search -n 2 "a blue square" | grep -q "\.png" || fail "text search: no paths printed"
note "search: an indexed image finds itself first (score $score); a text query ranks 5"

sleep 0.02
touch "$(find "$PHOTOS" -name '*-red-24.png')"   # in sub/: the recursion
rm "$(find "$PHOTOS" -name '*-green-56.png')"
"$TANDEMCTL" --json index "$PHOTOS" > "$T_DIR/index2.json" || fail "re-index: exit $?"
sum=$(tail -1 "$T_DIR/index2.json")
[ "$(echo "$sum" | jq .updated)" = 1 ] && [ "$(echo "$sum" | jq .removed)" = 1 ] && [ "$(echo "$sum" | jq .unchanged)" = 10 ] \
  && [ "$(echo "$sum" | jq .added)" = 0 ] || fail "re-index: expected 1 updated, 1 removed, 10 unchanged: $sum"
note "re-index: 1 updated, 1 removed, 10 unchanged, the corrupt file not retried"

# --- a GPU fault: Embed runs on the CPU, degraded; then back on the GPU --------------------------------------------
btest LoseDevice >/dev/null
out=""
for _ in $(seq 1 50); do
  out=$(ctl_embed "a green square") || fail "Embed during the fault failed: $out"
  [ "$(echo "$out" | jq -r .result.route)" = cpu ] && break
  sleep 0.1
done
[ "$(echo "$out" | jq -r .result.route)" = cpu ] || fail "Embed during a device loss: ${out:0:300}"
[ "$(echo "$out" | jq -r .result.degraded)" = true ] || fail "Embed on the CPU during a device loss is not degraded"
note "device lost: Embed answered on the CPU, degraded"
btest RecoverDevice >/dev/null
for _ in $(seq 1 100); do
  out=$(ctl_embed "a green square")
  [ "$(echo "$out" | jq -r .result.route)" = gpu ] && break
  sleep 0.1
done
[ "$(echo "$out" | jq -r .result.route)" = gpu ] || fail "Embed did not return to the GPU after recovery: ${out:0:300}"
note "recovered: Embed back on the GPU"
kill -0 "$T_DAEMON_PID" || fail "daemon died"
echo "it_image_search: ok"
