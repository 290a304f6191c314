#!/usr/bin/env bash
# The GNOME Shell indicator's model and presentation in plain gjs, against a real tandemd on a private bus
# (test_indicator_model.js says what is checked). Usage: run_model_test.sh TANDEMD TANDEMCTL MKMODEL
# Exit 77 (skipped) when gjs is not installed.
TANDEMD=$1 TANDEMCTL=$2 MKMODEL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../.." && pwd)
if ! command -v gjs >/dev/null 2>&1; then
  echo "SKIP: gjs is not installed (apt-get install --no-install-recommends gjs; scripts/setup.sh does)"
  exit 77
fi
source "$SRC/tests/daemon/integration/lib.sh"
# tandemd is started and stopped by the gjs test; lib.sh's teardown calls this.
tandem_kill_bg() {
  local pid
  pid=$(cat "$T_DIR/daemon.pid" 2>/dev/null) || return 0
  if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
}
tandem_model
tandem_bus
tandem_config
# The extension as each GNOME generation gets it (clients/gnome-shell/build.sh).
sh "$SRC/clients/gnome-shell/build.sh" esm "$T_DIR/esm" >/dev/null
sh "$SRC/clients/gnome-shell/build.sh" legacy "$T_DIR/legacy" >/dev/null
chmod -R a+rX "$T_DIR"
export EXT_DIR="$T_DIR/esm/tandem@tandem.io" LEGACY_DIR="$T_DIR/legacy/tandem@tandem.io"
export TANDEMD TANDEMCTL T_DIR TANDEM_CONFIG="$T_DIR/tandemd.toml" DBUS_SYSTEM_BUS_ADDRESS="$T_ADDR"
# A user who may not hold the GPU: nobody (the test bus lets everyone talk; [auth] admin_group is a group nobody
# is not in). Needs root to switch users.
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
  cp "$HERE/probe_hold.js" "$T_DIR/esm/probe_hold.js" && chmod a+r "$T_DIR/esm/probe_hold.js"
  export PROBE_AS_NOBODY="setpriv --reuid=65534 --regid=65534 --clear-groups env HOME=$T_DIR \
USER=nobody LOGNAME=nobody EXT_DIR=$EXT_DIR DBUS_SYSTEM_BUS_ADDRESS=$T_ADDR gjs -m $T_DIR/esm/probe_hold.js"
fi
# The test imports the extension's modules statically, from next to itself.
cp "$HERE/test_indicator_model.js" "$T_DIR/esm/"
rc=0
gjs -m "$T_DIR/esm/test_indicator_model.js" || rc=$?
if [ "$rc" != 0 ]; then
  echo "--- tandemd logs (tail) ---" >&2
  tail -n 30 "$T_DIR"/tandemd.*.log >&2 || true
  exit 1
fi
echo "gnome_shell_model: ok"
