#!/usr/bin/env bash
# The test command: installs what the build needs (Debian 12, as root), builds, runs every test suite, and ends
# with one line "N passed, N failed" taken from meson's summary. Exit status is meson's.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${TANDEM_BUILD:-build}

if [ "$(id -u)" = 0 ]; then
  bash scripts/setup.sh || exit 1
else
  echo "test.sh: not root, skipping package installation (scripts/setup.sh)" >&2
fi
bash scripts/build.sh || { echo "0 passed, 1 failed"; exit 1; }

log=$(mktemp)
# The tests' temporary files go into one directory of their own, which must be empty when they are done: a test
# that leaves files behind fills the disk of a machine that runs the suite again and again (a run writes several
# GB of model files), so what is left is a failure, listed, and removed.
scratch=$(mktemp -d /tmp/tandem-tests.XXXXXX)
# Like /tmp itself (world-writable, sticky): tests run clients as other users (tests/systemd/dbus_policy.sh's
# "nobody" and "daemon" reach a bus socket made under it).
chmod 1777 "$scratch"
TMPDIR=$scratch meson test -C "$BUILD" --print-errorlogs --num-processes "${TANDEM_TEST_JOBS:-2}" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
leftover=$(find "$scratch" -mindepth 1 -maxdepth 1 | wc -l)
if [ "$leftover" != 0 ]; then
  echo "FAIL: the tests left ${leftover} entries in their TMPDIR ($(du -sh "$scratch" | cut -f1)):"
  find "$scratch" -mindepth 1 -maxdepth 1 -printf '  %f\n' | sort | head -40
  [ "$rc" = 0 ] && rc=1
fi
rm -rf "$scratch"
ok=$(sed -n 's/^Ok:[[:space:]]*\([0-9]*\).*/\1/p' "$log" | tail -1)
fail=$(sed -n 's/^Fail:[[:space:]]*\([0-9]*\).*/\1/p' "$log" | tail -1)
timeout=$(sed -n 's/^Timeout:[[:space:]]*\([0-9]*\).*/\1/p' "$log" | tail -1)
unexp=$(sed -n 's/^Unexpected Pass:[[:space:]]*\([0-9]*\).*/\1/p' "$log" | tail -1)
skipped=$(sed -n 's/^Skipped:[[:space:]]*\([0-9]*\).*/\1/p' "$log" | tail -1)
rm -f "$log"
failed=$(( ${fail:-0} + ${timeout:-0} + ${unexp:-0} + (leftover != 0 ? 1 : 0) ))
if [ -z "$ok" ]; then
  echo "0 passed, 1 failed"
  exit 1
fi
echo "${ok} passed, ${failed} failed, ${skipped:-0} skipped"
exit "$rc"
