#!/usr/bin/env bash
# Static checks of tandemd's system integration (docs/systemd.md):
#   1. `systemd-analyze verify` on the configured unit. verify exits 0 on unknown keys and bad values and only prints
#      them, so ANY output fails the check. verify also requires every Exec*= binary to exist: the unit is copied with
#      the configured tandemd path (<prefix>/sbin/tandemd, not installed at test time) replaced by a stand-in script
#      (verify never runs it, so the real binary would prove nothing more).
#   2. `systemd-analyze security --offline=true`: prints the table and the exposure score; fails above MAX_EXPOSURE
#      or if any check fails other than the ones accepted (and justified) in docs/systemd.md.
#   3. The D-Bus policy parses strictly (dbus-daemon <include>, whose errors are fatal, unlike <includedir>) and
#      draws no warning once its user/group names exist; xmllint too if present.
#   4. The activation file is accepted by dbus-daemon (ListActivatableNames on a private system-type bus) and agrees
#      with the unit: Name = BusName, User = User, Exec = ExecStart's binary, SystemdService = this unit.
# usage: verify_unit.sh UNIT POLICY ACTIVATION BUS_CONF_IN
# Exit 77 (skip) without systemd-analyze.
set -u
unit=$1 policy=$2 activation=$3 bus_conf_in=$4

# The accepted exposure, measured with systemd 252 (Debian bookworm); see docs/systemd.md "Exposure".
max_exposure=0.5
accepted_fails=(
  'RootDirectory=/RootImage='         # the daemon needs the host's libraries, CUDA driver and model files
  'PrivateDevices='                   # would hide /dev/nvidia*; DevicePolicy=closed + DeviceAllow instead
  'DeviceAllow='                      # the NVIDIA nodes (and char-rtc:r, added by ProtectClock=yes)
  'MemoryDenyWriteExecute='           # oneDNN (inside LibTorch) JIT-compiles CPU kernels
  'RestrictAddressFamilies=~AF_UNIX'  # the D-Bus system bus and sd_notify are AF_UNIX sockets
  'ProcSubset='                       # the host-memory guard reads /proc/meminfo
  'SystemCallFilter=~@resources'      # self-only without capabilities; libraries set affinity/NUMA policy
)

command -v systemd-analyze >/dev/null || { echo "SKIP: systemd-analyze not found"; exit 77; }

tmp=$(mktemp -d)
bus_pid=
cleanup() {
  [ -n "$bus_pid" ] && kill "$bus_pid" 2>/dev/null && wait "$bus_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fails=0
ok() { echo "ok   $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
show() { sed 's/^/  | /' "$@"; }

# --- 1. systemd-analyze verify ----------------------------------------------------------------------------------------
unit_value() {  # unit_value KEY: the first KEY= value in the unit
  sed -n "s/^$1=//p" "$unit" | head -n 1
}
exec_bin=$(unit_value ExecStart | cut -d' ' -f1)
case "$exec_bin" in
  /*/tandemd) ok "ExecStart runs $exec_bin" ;;
  *) fail "ExecStart binary '$exec_bin' is not an absolute path to tandemd" ;;
esac
mkdir -p "$tmp/sbin" "$tmp/units"
printf '#!/bin/sh\n# stand-in for tandemd: systemd-analyze verify only checks that Exec*= binaries exist\nexit 0\n' \
  >"$tmp/sbin/tandemd"
chmod 0755 "$tmp/sbin/tandemd"
while IFS= read -r line || [ -n "$line" ]; do
  printf '%s\n' "${line//"$exec_bin"/"$tmp/sbin/tandemd"}"
done <"$unit" >"$tmp/units/tandemd.service"
# Requires=dbus.socket: on a machine without the dbus package, give verify a stand-in socket unit to load.
have_dbus_socket=no
while IFS= read -r dir; do
  [ -e "$dir/dbus.socket" ] && have_dbus_socket=yes
done < <(systemd-analyze unit-paths 2>/dev/null)
if [ "$have_dbus_socket" = no ]; then
  printf '[Socket]\nListenStream=/run/dbus/system_bus_socket\n' >"$tmp/units/dbus.socket"
  export SYSTEMD_UNIT_PATH="$tmp/units:"
  echo "note dbus.socket not installed here: verifying against a stand-in dbus.socket"
fi
systemd-analyze verify --man=no "$tmp/units/tandemd.service" >"$tmp/verify.out" 2>"$tmp/verify.err"
rc=$?
if [ "$rc" = 0 ] && [ ! -s "$tmp/verify.err" ] && [ ! -s "$tmp/verify.out" ]; then
  ok "systemd-analyze verify: exit 0, no output"
else
  fail "systemd-analyze verify: exit $rc, output:"
  show "$tmp/verify.out" "$tmp/verify.err"
fi

# --- 2. systemd-analyze security ----------------------------------------------------------------------------------------
if systemd-analyze security --offline=true --no-pager "$tmp/units/tandemd.service" >"$tmp/sec.out" 2>"$tmp/sec.err"
then :; fi
source "$(dirname "$0")/exposure.sh"
check_exposure tandemd.service

# --- 3. D-Bus policy ------------------------------------------------------------------------------------------------------
if command -v xmllint >/dev/null; then
  if xmllint --noout --nonet "$policy" 2>"$tmp/xml.err"; then ok "xmllint: policy is well-formed XML"
  else fail "xmllint: policy is not well-formed:"; show "$tmp/xml.err"; fi
else
  echo "note xmllint not found: dbus-daemon's own parser is the check"
fi

wait_for_address() {  # wait_for_address FILE: up to 5 s for dbus-daemon to print its address
  local i
  for i in $(seq 50); do
    [ -s "$1" ] && return 0
    kill -0 "$bus_pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
stop_bus() {
  [ -n "$bus_pid" ] && kill "$bus_pid" 2>/dev/null && wait "$bus_pid" 2>/dev/null
  bus_pid=
}
# dbus-daemon (not run as root) warns that it cannot raise its fd limit: not about our files.
policy_warnings() { grep -v -e 'Failed to set fd limit' "$1"; }

if command -v dbus-daemon >/dev/null; then
  me=$(id -un) mygroup=$(id -gn)
  sed -e "s/user=\"tandem\"/user=\"$me\"/" -e "s/group=\"tandem-admin\"/group=\"$mygroup\"/" "$policy" \
    >"$tmp/policy.conf"
  cat >"$tmp/strict.conf" <<EOF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=$tmp/strict.sock</listen>
  <auth>EXTERNAL</auth>
  <include>$tmp/policy.conf</include>
</busconfig>
EOF
  dbus-daemon --config-file="$tmp/strict.conf" --nofork --print-address=3 3>"$tmp/strict.addr" 2>"$tmp/strict.err" &
  bus_pid=$!
  if wait_for_address "$tmp/strict.addr"; then
    if policy_warnings "$tmp/strict.err" >/dev/null; then
      fail "dbus-daemon warns about the policy:"; policy_warnings "$tmp/strict.err" | show
    else
      ok "dbus-daemon loads the policy with <include> (strict), no warning"
    fi
  else
    fail "dbus-daemon rejects the policy:"; show "$tmp/strict.err"
  fi
  stop_bus

  # --- 4. activation file -----------------------------------------------------------------------------------------------
  mkdir -p "$tmp/services" "$tmp/empty.d"
  cp "$activation" "$tmp/services/io.tandem.Tandem1.service"
  sed -e "s|@LISTEN@|unix:path=$tmp/act.sock|" -e "s|@POLICY_DIR@|$tmp/empty.d|" -e "s|@SERVICE_DIR@|$tmp/services|" \
    "$bus_conf_in" >"$tmp/act.conf"
  dbus-daemon --config-file="$tmp/act.conf" --nofork --print-address=3 3>"$tmp/act.addr" 2>"$tmp/act.err" &
  bus_pid=$!
  if wait_for_address "$tmp/act.addr"; then
    names=$(dbus-send --bus="$(head -n 1 "$tmp/act.addr")" --print-reply --dest=org.freedesktop.DBus \
      /org/freedesktop/DBus org.freedesktop.DBus.ListActivatableNames 2>&1)
    if grep -q '"io.tandem.Tandem1"' <<<"$names"; then
      ok "dbus-daemon accepts the activation file (io.tandem.Tandem1 is activatable)"
    else
      fail "io.tandem.Tandem1 is not activatable with the activation file:"; show <<<"$names"; show "$tmp/act.err"
    fi
  else
    fail "private bus for the activation check did not start:"; show "$tmp/act.err"
  fi
  stop_bus
else
  echo "note dbus-daemon not found: the policy and activation files are not parsed"
fi

act_value() { sed -n "s/^$1=//p" "$activation" | head -n 1; }
[ "$(sed -n '/^[[:space:]]*[^#[:space:]]/{p;q}' "$activation")" = "[D-BUS Service]" ] \
  && ok "activation file starts with [D-BUS Service]" || fail "activation file lacks the [D-BUS Service] group"
check_same() {  # check_same WHAT A B
  if [ "$2" = "$3" ]; then ok "$1: $2"; else fail "$1 differ: '$2' vs '$3'"; fi
}
check_same "bus name (unit BusName / activation Name)" "$(unit_value BusName)" "$(act_value Name)"
check_same "user (unit User / activation User)" "$(unit_value User)" "$(act_value User)"
check_same "binary (unit ExecStart / activation Exec)" "$exec_bin" "$(act_value Exec | cut -d' ' -f1)"
check_same "systemd unit (activation SystemdService)" "tandemd.service" "$(act_value SystemdService)"
owner=$(sed -n 's/.*<policy user="\([^"]*\)">.*/\1/p' "$policy" | head -n 1)
grep -q "<allow own=\"$(unit_value BusName)\"/>" "$policy" || fail "policy does not allow owning $(unit_value BusName)"
check_same "owner (unit User / first <policy user=...> in the policy)" "$(unit_value User)" "$owner"

echo
if [ "$fails" = 0 ]; then echo "all checks passed"; else echo "$fails check(s) failed"; fi
[ "$fails" = 0 ]
