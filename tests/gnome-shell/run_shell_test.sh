#!/usr/bin/env bash
# The Tandem extension in a real GNOME Shell 43 (Debian 12), headless, against a real tandemd on a private bus that
# serves as the system bus. Usage (as root, or as any user):
#   run_shell_test.sh TANDEMD TANDEMCTL MKMODEL [SHOTS_DIR]
# As root, the Shell, tandemd and every check run as user nobody (an ordinary user: as root the Shell shows a
# "privileged user" notification in every screenshot). Through org.gnome.Shell.Eval (--unsafe-mode) it checks the
# indicator in the normal, degraded (device lost) and unavailable (tandemd stopped) cases, that the toggle's hold
# shows in tandemd's Holds, that a degraded-mode notification was sent, and that disabling the extension removes
# it; it takes screenshots of the open menu (normal, degraded, stopped; cropped and full screen) and copies them to
# SHOTS_DIR when given (the work directory is then kept too). Any error of the extension in the Shell's log fails the test. Exit 77 without gnome-shell.
# Recipe and traps: ../shared/TOOLCHAIN.md, "GNOME Shell 43 headless". meson test gnome_shell_headless runs it
# when gnome-shell is installed; scripts/setup.sh installs it (about 160 packages, 413 MB), so CI runs it.
TANDEMD=$1 TANDEMCTL=$2 MKMODEL=$3 SHOTS=${4:-}
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../.." && pwd)
if ! command -v gnome-shell >/dev/null 2>&1 || ! command -v dbus-run-session >/dev/null 2>&1; then
  echo "SKIP: gnome-shell is not installed (apt-get install --no-install-recommends gnome-shell)"
  exit 77
fi
# Keep the work directory (shell log, screenshots) when screenshots are asked for; lib.sh removes it otherwise.
if [ -n "$SHOTS" ]; then export TANDEM_IT_KEEP=1; fi
source "$SRC/tests/daemon/integration/lib.sh"
tandem_model
tandem_bus
# tandemd runs as the test user; its admin group is that user's primary group, so the user may hold the GPU and
# call Testing.
if [ "$(id -u)" = 0 ]; then RUN_UID=65534 RUN_GID=65534; else RUN_UID=$(id -u) RUN_GID=$(id -g); fi
ADMIN_GROUP=$(getent group "$RUN_GID" | cut -d: -f1)
tandem_config
sed -i "s/^admin_group = .*/admin_group = \"$ADMIN_GROUP\"/; s/^submit_group = .*/submit_group = \"$ADMIN_GROUP\"/" \
  "$T_DIR/tandemd.toml"
mkdir -p "$T_DIR/home/.local/share/gnome-shell/extensions" "$T_DIR/run" "$T_DIR/shots"
sh "$SRC/clients/gnome-shell/build.sh" legacy "$T_DIR/home/.local/share/gnome-shell/extensions" >/dev/null
cp "$HERE/shell_driver.sh" "$T_DIR/"
if [ -f "$T_MODEL/model.safetensors" ]; then chmod -R a+rX "$T_MODEL"; fi
chmod 0700 "$T_DIR/run"
chown -R "$RUN_UID:$RUN_GID" "$T_DIR"
chmod 755 "$T_DIR"

run_as() {
  if [ "$(id -u)" = 0 ]; then setpriv --reuid="$RUN_UID" --regid="$RUN_GID" --clear-groups -- "$@"; else "$@"; fi
}
rc=0
run_as env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="$T_DIR/home" XDG_RUNTIME_DIR="$T_DIR/run" \
  USER=tester LOGNAME=tester LANG=C.UTF-8 \
  DBUS_SYSTEM_BUS_ADDRESS="$T_ADDR" T_DIR="$T_DIR" TANDEMD="$TANDEMD" TANDEMCTL="$TANDEMCTL" \
  dbus-run-session -- bash "$T_DIR/shell_driver.sh" || rc=$?
if [ -n "$SHOTS" ]; then
  mkdir -p "$SHOTS" && cp "$T_DIR"/shots/*.png "$SHOTS/" 2>/dev/null && echo "screenshots: $SHOTS"
fi
if [ "$rc" != 0 ]; then
  echo "--- gnome-shell log (tail) ---" >&2; tail -n 40 "$T_DIR/shell.log" >&2 || true
  echo "gnome_shell_headless: FAILED" >&2
  exit 1
fi
echo "gnome_shell_headless: ok"
