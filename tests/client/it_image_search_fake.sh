#!/usr/bin/env bash
# tandemctl index / search end to end over D-Bus, against tests/client/fake_embed_service (ListModels + Embed as
# dbus/io.tandem.Tandem1.xml says, word vectors instead of a model) on a private bus: batches of fds, a bad file
# found one by one and remembered, Busy retried, incremental runs, text->image and image->image search, --json, a
# corrupt index and another model's index. The same against the real tandemd: tests/daemon/integration/it_image_search.sh.
# Usage: it_image_search_fake.sh TANDEMCTL FAKE_EMBED_SERVICE
TANDEMCTL=$1
FAKE=$2
source "$(dirname "$0")/../daemon/integration/lib.sh"
FAKE_PID=""
tandem_kill_bg() { if [ -n "$FAKE_PID" ]; then kill "$FAKE_PID" 2>/dev/null || true; wait "$FAKE_PID" 2>/dev/null || true; FAKE_PID=""; fi; }
T_LOG="$T_DIR/fake.log"
start_fake() {  # env assignments as arguments
  tandem_kill_bg
  env DBUS_SESSION_BUS_ADDRESS="$T_ADDR" FAKE_CALLS="$T_DIR/calls" "$@" "$FAKE" >>"$T_LOG" 2>&1 &
  FAKE_PID=$!
  for _ in $(seq 1 100); do busctl --address="$T_ADDR" status io.tandem.Tandem1 >/dev/null 2>&1 && return 0; sleep 0.05; done
  fail "the fake service did not start"
}
tandem_bus
start_fake
CTL() { "$TANDEMCTL" "$@"; }

P="$T_DIR/pics"
IDX="$T_DIR/cache/index.sqlite3"
mkdir -p "$P/sub" "$P/more"
img() { printf '\x89PNG\r\n\x1a\n%s' "$2" > "$1"; }
jpg() { printf '\xff\xd8\xff%s' "$2" > "$1"; }
img "$P/red.png" red
jpg "$P/sub/blue.JPG" blue
img "$P/sub/green.png" green
for i in $(seq 1 9); do img "$P/more/n$i.png" "word$i"; done
printf 'not an image' > "$P/more/broken.jpg"
printf 'ignored' > "$P/notes.txt"
ln -s "$P/red.png" "$P/link.png"

note "first run: 13 images in batches of 4, one broken"
: > "$T_DIR/calls"
out=$(CTL index "$P" --index "$IDX" --batch 4 2>"$T_DIR/err") || fail "index failed: $(cat "$T_DIR/err")"
echo "$out"
grep -q "added 12, updated 0, unchanged 0, removed 0, failed 1" <<<"$out" || fail "first summary: $out"
grep -q "skipped $P/more/broken.jpg: input 0: not a JPEG or PNG file" "$T_DIR/err" || fail "the broken file is not named: $(cat "$T_DIR/err")"
# 4 batches of <= 4; the one with broken.jpg again as 4 single calls.
[ "$(wc -l < "$T_DIR/calls")" = 8 ] || fail "expected 8 Embed calls, got: $(tr '\n' ' ' < "$T_DIR/calls")"

note "second run: nothing to do, the broken file is not retried"
: > "$T_DIR/calls"
out=$(CTL index "$P" --index "$IDX" 2>/dev/null)
grep -q "added 0, updated 0, unchanged 12, removed 0, failed 0 (+1 known failures not retried)" <<<"$out" || fail "second summary: $out"
[ ! -s "$T_DIR/calls" ] || fail "the second run called Embed"

note "search by text and by image"
out=$(CTL search red --index "$IDX" -n 3)
echo "$out"
[ "$(sed -n 2p <<<"$out" | awk '{print $1, $2, $3}')" = "1 1.0000 $P/red.png" ] || fail "red first: $out"
[ "$(wc -l <<<"$out")" = 4 ] || fail "-n 3: $out"
jpg "$T_DIR/query.jpg" blue
out=$(CTL search --image "$T_DIR/query.jpg" --index "$IDX" --json)
[ "$(jq -r '.results[0].path' <<<"$out")" = "$P/sub/blue.JPG" ] || fail "image->image: $out"
[ "$(jq -r '.results | length' <<<"$out")" = 10 ] || fail "default -n 10: $out"
[ "$(jq -r '.model' <<<"$out")" = fake-clip ] || fail "model: $out"

note "changes: modify, fix the broken file, remove, add; Busy once"
sleep 0.01
img "$P/red.png" "redder"
img "$P/more/broken.jpg" "fixed"
rm "$P/sub/green.png"
img "$P/new.png" new
start_fake FAKE_BUSY_FIRST=1
out=$(CTL --json index "$P" --index "$IDX" 2>/dev/null | tail -1)
[ "$(jq -c '[.added, .updated, .unchanged, .removed, .failed]' <<<"$out")" = "[1,2,10,1,0]" ] || fail "third summary: $out"
[ "$(jq -r '.indexed' <<<"$out")" = 13 ] || fail "indexed: $out"

note "max_inputs smaller than the batch: the batch is halved"
for i in $(seq 1 6); do img "$P/extra$i.png" "extra$i"; done
start_fake FAKE_MAX_INPUTS=2
out=$(CTL index "$P" --index "$IDX" --batch 8 2>"$T_DIR/err")
grep -q "added 6," <<<"$out" || fail "with max_inputs 2: $out $(cat "$T_DIR/err")"
grep -q "batches of 4 from now on" "$T_DIR/err" || fail "no note about the batch size: $(cat "$T_DIR/err")"

note "another model's index: incompatible, --rebuild"
start_fake FAKE_FINGERPRINT=fp-2
rc=0; CTL search red --index "$IDX" 2>"$T_DIR/err" || rc=$?
[ "$rc" = 5 ] || fail "search on another model's index: exit $rc"
grep -q "was built with model fake-clip (fingerprint fp-1)" "$T_DIR/err" || fail "message: $(cat "$T_DIR/err")"
grep -q -- "--rebuild" "$T_DIR/err" || fail "no rebuild hint: $(cat "$T_DIR/err")"
out=$(CTL index "$P" --index "$IDX" --rebuild 2>/dev/null)
grep -q "added 19, updated 0, unchanged 0" <<<"$out" || fail "rebuild: $out"

note "a corrupt index file"
head -c 5000 /dev/urandom > "$T_DIR/junk.sqlite3"
rc=0; CTL search red --index "$T_DIR/junk.sqlite3" 2>"$T_DIR/err" || rc=$?
[ "$rc" = 5 ] || fail "corrupt index: exit $rc"
grep -q "junk.sqlite3 is not a valid image index" "$T_DIR/err" || fail "message: $(cat "$T_DIR/err")"
rc=0; CTL search red --index "$T_DIR/none.sqlite3" 2>"$T_DIR/err" || rc=$?
[ "$rc" = 5 ] && grep -q "run 'tandemctl index DIR' first" "$T_DIR/err" || fail "missing index: $rc $(cat "$T_DIR/err")"

note "default index location: XDG_CACHE_HOME"
XDG_CACHE_HOME="$T_DIR/xdg" CTL index "$P" >/dev/null 2>&1 || fail "index with the default location"
[ -f "$T_DIR/xdg/tandem/image-index.sqlite3" ] || fail "no index under XDG_CACHE_HOME"

note "usage errors"
expect_usage() { local rc=0; CTL "$@" 2>/dev/null || rc=$?; [ "$rc" = 1 ] || fail "tandemctl $*: exit $rc, not 1"; }
expect_usage search
expect_usage search red --image x
expect_usage index
expect_usage search red -n 0
echo "PASS"
