#!/usr/bin/env bash
# Inside dbus-run-session, as the test user (run_shell_test.sh prepares everything): tandemd, a headless GNOME
# Shell 43 with the Tandem extension, and the checks through org.gnome.Shell.Eval.
set -uo pipefail
UUID=tandem@tandem.io
ADDR=$DBUS_SYSTEM_BUS_ADDRESS
LOG=$T_DIR/shell.log
FAILS=0
SHELL_PID="" DAEMON_PID=""
fail() { echo "FAIL: $*" >&2; FAILS=$((FAILS + 1)); }
note() { echo "# [${SECONDS}s] $*"; }
cleanup() {
  [ -n "$SHELL_PID" ] && kill "$SHELL_PID" 2>/dev/null
  [ -n "$DAEMON_PID" ] && kill -KILL "$DAEMON_PID" 2>/dev/null
  wait 2>/dev/null
}
trap cleanup EXIT

# ev JS: org.gnome.Shell.Eval; prints the result (JSON text); non-zero when the Shell reports an exception.
ev() {
  gdbus call --session --dest org.gnome.Shell --object-path /org/gnome/Shell --method org.gnome.Shell.Eval "$1" 2>&1 |
    python3 -c '
import ast, sys
s = sys.stdin.read().strip()
if not s.startswith("("):
    print(s); sys.exit(2)
ok = s.startswith("(true")
print(ast.literal_eval(s[s.index(",") + 1:-1].strip()))
sys.exit(0 if ok else 1)'
}
# view FIELD: a field of the indicator's current view (presentation.js present()), as JSON.
EXT="Main.extensionManager.lookup('$UUID')"
view() { ev "JSON.stringify($EXT.stateObj._ui.view.$1)" | python3 -c 'import json,sys; print(json.loads(json.loads(sys.stdin.read())))' 2>/dev/null; }
# wait_view SECONDS FIELD VALUE
wait_view() {
  local end=$((SECONDS + $1)) got=""
  while [ "$SECONDS" -le "$end" ]; do
    got=$(view "$2")
    [ "$got" = "$3" ] && return 0
    sleep 0.2
  done
  fail "view.$2 is '$got', want '$3' (after $1 s)"
  return 1
}
shot_menu() {  # shot_menu NAME: the quick settings menu with the Tandem toggle's menu open
  # No overview (the headless Shell starts in it) and no banners of earlier notifications in the picture.
  ev "Main.overview.hide(); Main.messageTray.getSources().forEach(s => s.destroy()); true" >/dev/null
  sleep 0.5
  ev "Main.panel.statusArea.quickSettings.menu.open(); $EXT.stateObj._ui.indicator.toggle.menu.open(); true" >/dev/null ||
    fail "could not open the menu"
  sleep 1.5
  local box
  # The area: the quick settings menu's box and the top bar above it (the panel icon).
  box=$(ev "const a = Main.panel.statusArea.quickSettings.menu.box; const [x, y] = a.get_transformed_position(); \
const [w, h] = a.get_transformed_size(); const x0 = Math.max(0, Math.floor(x) - 24); \
const t = $EXT.stateObj._ui.indicator.toggle.menu.actor; const [, ty] = t.get_transformed_position(); \
const bottom = Math.max(y + h, ty + t.get_transformed_size()[1]); \
[x0, 0, Math.min(global.stage.width - x0, Math.ceil(w) + 48), Math.min(global.stage.height, Math.ceil(bottom) + 24)].join(' ')" |
    tr -d '"')
  read -r x y w h <<<"$box"
  gdbus call --session --dest org.gnome.Shell --object-path /org/gnome/Shell/Screenshot \
    --method org.gnome.Shell.Screenshot.Screenshot false false "$T_DIR/shots/$1-full.png" >/dev/null ||
    fail "screenshot $1-full"
  gdbus call --session --dest org.gnome.Shell --object-path /org/gnome/Shell/Screenshot \
    --method org.gnome.Shell.Screenshot.ScreenshotArea "$x" "$y" "$w" "$h" false "$T_DIR/shots/$1.png" >/dev/null ||
    fail "screenshot $1 ($box)"
  note "screenshot $T_DIR/shots/$1.png ($box)"
  ev "Main.panel.statusArea.quickSettings.menu.close(); true" >/dev/null
  sleep 0.5
}
holds() { busctl --address="$ADDR" --json=short get-property io.tandem.Tandem1 /io/tandem/Tandem1 io.tandem.Tandem1 Holds; }
btest() { busctl --address="$ADDR" call io.tandem.Tandem1 /io/tandem/Tandem1 io.tandem.Tandem1.Testing "$@"; }
start_daemon() {
  "$TANDEMD" --config "$T_DIR/tandemd.toml" --testing --log-stderr >>"$T_DIR/tandemd.log" 2>&1 &
  DAEMON_PID=$!
  for _ in $(seq 1 300); do busctl --address="$ADDR" status io.tandem.Tandem1 >/dev/null 2>&1 && return 0; sleep 0.1; done
  fail "tandemd did not start"; return 1
}

rm -f "$XDG_RUNTIME_DIR/gnome-shell-disable-extensions"
start_daemon || exit 1
note "tandemd up"
t0=$SECONDS
gnome-shell --headless --virtual-monitor 1024x768 --wayland --no-x11 --unsafe-mode >"$LOG" 2>&1 &
SHELL_PID=$!
for _ in $(seq 1 900); do
  [ "$(ev 'Main.layoutManager._startingUp' 2>/dev/null)" = false ] && break
  kill -0 "$SHELL_PID" 2>/dev/null || { fail "gnome-shell exited"; exit 1; }
  sleep 0.1
done
note "gnome-shell $(gnome-shell --version | cut -d' ' -f3) up after $((SECONDS - t0)) s"
OVERLAY="Main.panel.statusArea.quickSettings.menu._overlay.get_children().length"
overlay0=$(ev "$OVERLAY")
ev "Main.extensionManager.enableExtension('$UUID')" >/dev/null
for _ in $(seq 1 50); do [ "$(ev "$EXT.state")" = 1 ] && break; sleep 0.1; done
st=$(ev "$EXT.state")
[ "$st" = 1 ] || fail "extension state $st (1 = enabled); error: $(ev "$EXT.error")"
note "extension enabled (state $st)"

# --- normal ---------------------------------------------------------------------------------------------------------
wait_view 20 state normal
[ "$(view panelVisible)" = True ] || fail "normal: the panel icon is not visible"
[ "$(view iconName)" = tandem-normal-symbolic ] || fail "normal: icon $(view iconName)"
[ "$(ev "$EXT.stateObj._ui.indicator.toggle.label")" = '"Tandem"' ] ||
  fail "normal: Shell 43 toggle label $(ev "$EXT.stateObj._ui.indicator.toggle.label")"
[ "$(ev "$EXT.stateObj._ui.indicator.toggle.menu._headerSubtitle.text")" = '"On the GPU"' ] ||
  fail "normal: menu header subtitle $(ev "$EXT.stateObj._ui.indicator.toggle.menu._headerSubtitle.text")"
[ "$(ev "$EXT.stateObj._ui.indicator._icon.visible")" = true ] || fail "normal: the panel icon actor is hidden"
[ "$(ev "Main.panel.statusArea.quickSettings._indicators.get_children().includes($EXT.stateObj._ui.indicator)")" = true ] ||
  fail "the indicator is not in the quick settings indicators"
note "normal: $(view subtitle) / $(view headline)"
shot_menu normal

# --- the toggle: a hold in tandemd's Holds, made by the Shell's connection -------------------------------------------
ev "$EXT.stateObj._ui.indicator.toggle.emit('clicked', 1); true" >/dev/null
wait_view 10 checked True
h=$(holds)
echo "$h" | grep -q '"org.gnome.Shell"' || fail "the toggle's hold is not in tandemd's Holds: $h"
wait_view 5 subtitle "Kept off the GPU"
note "toggle on: Holds = $h"
ev "$EXT.stateObj._ui.indicator.toggle.emit('clicked', 1); true" >/dev/null
wait_view 10 checked False
[ "$(holds)" = '{"type":"a(sssx)","data":[]}' ] || fail "the hold stayed after the toggle went off: $(holds)"
wait_view 10 state normal

# --- degraded: device lost ---------------------------------------------------------------------------------------------
btest LoseDevice >/dev/null || fail "LoseDevice"
wait_view 10 state degraded
case $(view subtitle) in "On the CPU, "*) ;; *) fail "degraded: subtitle '$(view subtitle)'";; esac
[ "$(view iconName)" = tandem-degraded-symbolic ] || fail "degraded: icon $(view iconName)"
[ "$(ev "$EXT.stateObj._ui.indicator.toggle.label")" = '"On the CPU"' ] ||
  fail "degraded: Shell 43 toggle label $(ev "$EXT.stateObj._ui.indicator.toggle.label")"
case $(view headline) in *"because the GPU is not available"*) ;; *) fail "degraded: headline '$(view headline)'";; esac
sleep 0.5
n=$(ev "JSON.stringify($EXT.stateObj._ui.lastNotification)")
case $n in *"Tandem is running on the CPU"*) ;; *) fail "no degraded-mode notification: $n";; esac
note "degraded: $(view subtitle) / $(view headline) / notification $n"
shot_menu degraded
btest RecoverDevice >/dev/null || fail "RecoverDevice"
wait_view 30 state normal

# --- unavailable: tandemd stopped ------------------------------------------------------------------------------------
kill -TERM "$DAEMON_PID"; wait "$DAEMON_PID" 2>/dev/null; DAEMON_PID=""
wait_view 10 state absent
[ "$(view subtitle)" = "Not running" ] || fail "stopped: subtitle '$(view subtitle)'"
[ "$(view panelVisible)" = False ] || fail "stopped: the panel icon is still visible"
[ "$(ev "$EXT.stateObj._ui.indicator.toggle.reactive")" = false ] || fail "stopped: the toggle is not greyed"
[ "$(ev "$EXT.stateObj._ui.indicator.toggle.label")" = '"Tandem off"' ] ||
  fail "stopped: Shell 43 toggle label $(ev "$EXT.stateObj._ui.indicator.toggle.label")"
note "stopped: $(view subtitle)"
shot_menu stopped
start_daemon
wait_view 20 state normal
note "tandemd back: $(view subtitle)"

# --- disable: the indicator leaves the panel -------------------------------------------------------------------------
ev "globalThis._tandemInd = $EXT.stateObj._ui.indicator; true" >/dev/null
ev "Main.extensionManager.disableExtension('$UUID')" >/dev/null
sleep 0.5
[ "$(ev "$EXT.state")" = 2 ] || fail "extension state after disable: $(ev "$EXT.state") (2 = disabled)"
[ "$(ev "Main.panel.statusArea.quickSettings._indicators.get_children().includes(globalThis._tandemInd)")" = false ] ||
  fail "the indicator is still in the panel after disable"
ev "delete globalThis._tandemInd; true" >/dev/null
[ "$(ev "$OVERLAY")" = "$overlay0" ] || fail "the toggle's menu stayed in the quick settings overlay after disable"
# Enabled again (the GObject classes are registered once per Shell process): back as before.
ev "Main.extensionManager.enableExtension('$UUID')" >/dev/null
sleep 0.5
[ "$(ev "$EXT.state")" = 1 ] || fail "extension state after re-enabling: $(ev "$EXT.state"); error: $(ev "$EXT.error")"
wait_view 10 state normal
ev "Main.extensionManager.disableExtension('$UUID')" >/dev/null
note "disabled, enabled again, disabled: indicator and menu removed each time"

# --- the Shell's log: no error from the extension ----------------------------------------------------------------------
if grep -nE "tandem@tandem.io|tandem:|tandem/|indicator\.js|tandemClient\.js|presentation\.js" "$LOG" |
    grep -iE "error|warning|exception|critical" ; then
  fail "the extension logged errors (above)"
fi
note "shell log: $(wc -l <"$LOG") lines, none from the extension"
[ "$FAILS" = 0 ]
