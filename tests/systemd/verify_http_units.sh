#!/usr/bin/env bash
# Checks of tandem-http's system integration (tandem-http(8)), the sibling of verify_unit.sh:
#   1. The units agree with each other and with the rest: the service is Type=notify, runs tandem-http with
#      --config and --bus system as user tandem-http in group tandem, Requires= and is After= its socket and has
#      no [Install] section (socket activation only); the socket listens on tandem-http's default address (from
#      `tandem-http --help`), Accept=no, WantedBy=sockets.target; sysusers.d declares tandem-http with that group as
#      its primary group, and the group exists there.
#   2. `systemd-analyze verify` on both units: ANY output fails (verify exits 0 on unknown keys and bad values).
#      ExecStart's binary is replaced by a stand-in script, as in verify_unit.sh.
#   3. `systemd-analyze security --offline=true` on the service: exposure at most MAX_EXPOSURE, and no failed check
#      other than the accepted ones.
#   4. The example configuration: `tandem-http --check-config` accepts it as installed (all commented) and with
#      every "#key = value" line uncommented (so every key shown exists, with a valid default), and the man page
#      documents every key.
#   5. Socket activation into a private network namespace, what PrivateNetwork=yes does to the service:
#      systemd-socket-activate binds loopback TCP and unix sockets here, `unshare --net` moves tandem-http into a
#      new network namespace, and both sockets still answer HTTP (503 from GET /health: no tandemd). A socket on
#      0.0.0.0 without API keys makes tandem-http refuse to start. Skipped (with a note) without unshare's
#      namespaces or systemd-socket-activate.
#   6. tandem-wyoming.socket: the same service by Service=, FileDescriptorName=wyoming (how tandem-http tells it
#      apart), loopback 127.0.0.1:10300 by default; verified with the others.
# usage: verify_http_units.sh SERVICE SOCKET SYSUSERS CONFIG MANPAGE TANDEM_HTTP WYOMING_SOCKET
# Exit 77 (skip) without systemd-analyze.
set -u
service=$1 socket=$2 sysusers=$3 config=$4 manpage=$5 bin=$6 wsocket=$7

# The accepted exposure, measured with systemd 252 (Debian bookworm); see the unit's comments.
max_exposure=0.2
accepted_fails=(
  'RootDirectory=/RootImage='         # the gateway uses the host's libraries
  'RestrictAddressFamilies=~AF_UNIX'  # the D-Bus system bus and sd_notify are AF_UNIX sockets
  'DeviceAllow='                      # char-rtc:r, which ProtectClock=yes adds
)

command -v systemd-analyze >/dev/null || { echo "SKIP: systemd-analyze not found"; exit 77; }

tmp=$(mktemp -d)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fails=0
ok() { echo "ok   $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
note() { echo "note $*"; }
show() { sed 's/^/  | /' "$@"; }
check_same() {  # check_same WHAT EXPECTED ACTUAL
  if [ "$2" = "$3" ]; then ok "$1: $3"; else fail "$1: expected '$2', got '$3'"; fi
}
# unit_values FILE KEY: every KEY= value of the unit, one per line (comments are not assignments).
unit_values() { sed -n "s/^$2=//p" "$1"; }
unit_value() { unit_values "$1" "$2" | head -n 1; }

# --- 1. the units agree -------------------------------------------------------------------------------------------------
exec_line=$(unit_value "$service" ExecStart)
exec_bin=${exec_line%% *}
case "$exec_bin" in
  /*/tandem-http) ok "ExecStart runs $exec_bin" ;;
  *) fail "ExecStart binary '$exec_bin' is not an absolute path to tandem-http" ;;
esac
case " $exec_line " in
  *" --bus system "*) ok "ExecStart passes --bus system" ;;
  *) fail "ExecStart does not pass --bus system: $exec_line" ;;
esac
case " $exec_line " in
  *" --config "*) ok "ExecStart passes --config" ;;
  *) fail "ExecStart does not name its configuration file: $exec_line" ;;
esac
check_same "service Type" notify "$(unit_value "$service" Type)"
check_same "service User" tandem-http "$(unit_value "$service" User)"
check_same "service Group (tandemd's default [auth] submit_group)" tandem "$(unit_value "$service" Group)"
unit_values "$service" Requires | tr ' ' '\n' | grep -qx tandem-http.socket \
  && ok "service Requires=tandem-http.socket (it never runs without its sockets)" \
  || fail "service does not Require tandem-http.socket (PrivateNetwork=yes needs the passed sockets)"
unit_values "$service" After | tr ' ' '\n' | grep -qx tandem-http.socket \
  && ok "service is After=tandem-http.socket" || fail "service is not After=tandem-http.socket"
grep -qi '^\[Install\]' "$service" \
  && fail "service has an [Install] section (it is socket-activated only)" \
  || ok "service has no [Install] section (socket-activated only)"

listen=$(unit_values "$socket" ListenStream)
# "... default listen 127.0.0.1:11435. Under systemd ..." in the usage text.
default_listen=$("$bin" --help 2>/dev/null | grep -o 'default listen [^ ]*' | sed 's/^default listen //; s/\.$//')
check_same "socket ListenStream (tandem-http's default listen)" "$default_listen" "$listen"
accept=$(unit_value "$socket" Accept)
case "${accept:-no}" in
  no | false | 0) ok "socket Accept=${accept:-no} (one gateway process gets the listening sockets)" ;;
  *) fail "socket Accept=$accept: tandem-http expects listening sockets" ;;
esac
check_same "socket WantedBy" sockets.target "$(unit_value "$socket" WantedBy)"
[ "$(basename "$service")" = tandem-http.service ] && [ "$(basename "$socket")" = tandem-http.socket ] \
  && ok "unit names pair up (tandem-http.socket starts tandem-http.service)" \
  || fail "unit names do not pair up: $(basename "$socket") / $(basename "$service")"

# sysusers.d: "u tandem-http -:GROUP ..." and GROUP is made there (by a u line of the same name or a g line).
su_id=$(awk '$1 == "u" && $2 == "tandem-http" { print $3 }' "$sysusers")
check_same "sysusers.d: tandem-http's ID field (primary group = the unit's Group=)" \
  "-:$(unit_value "$service" Group)" "$su_id"
group=$(unit_value "$service" Group)
awk -v g="$group" '($1 == "u" || $1 == "g") && $2 == g { found = 1 } END { exit !found }' "$sysusers" \
  && ok "sysusers.d creates group $group" || fail "sysusers.d does not create group $group"
if command -v systemd-sysusers >/dev/null; then
  mkdir -p "$tmp/sysroot/etc"
  cp "$sysusers" "$tmp/sysroot/tandemd.conf"
  if systemd-sysusers --root="$tmp/sysroot" "$tmp/sysroot/tandemd.conf" >"$tmp/sysusers.out" 2>&1 &&
    gid=$(awk -F: -v g="$group" '$1 == g { print $3 }' "$tmp/sysroot/etc/group") && [ -n "$gid" ] &&
    [ "$(awk -F: '$1 == "tandem-http" { print $4 }' "$tmp/sysroot/etc/passwd")" = "$gid" ]; then
    ok "systemd-sysusers (into an empty root) makes tandem-http with primary group $group ($gid)"
  else
    fail "systemd-sysusers did not make tandem-http in group $group:"; show "$tmp/sysusers.out"
    show "$tmp/sysroot/etc/passwd" "$tmp/sysroot/etc/group" 2>/dev/null
  fi
fi

# --- 2. systemd-analyze verify -----------------------------------------------------------------------------------------
mkdir -p "$tmp/bin" "$tmp/units"
printf '#!/bin/sh\n# stand-in for tandem-http: systemd-analyze verify only checks that Exec*= binaries exist\nexit 0\n' \
  >"$tmp/bin/tandem-http"
chmod 0755 "$tmp/bin/tandem-http"
while IFS= read -r line || [ -n "$line" ]; do
  printf '%s\n' "${line//"$exec_bin"/"$tmp/bin/tandem-http"}"
done <"$service" >"$tmp/units/tandem-http.service"
cp "$socket" "$tmp/units/tandem-http.socket"
cp "$wsocket" "$tmp/units/tandem-wyoming.socket"
check_same "wyoming socket Service=" tandem-http.service "$(unit_value "$wsocket" Service)"
check_same "wyoming socket FileDescriptorName=" wyoming "$(unit_value "$wsocket" FileDescriptorName)"
check_same "wyoming socket ListenStream" 127.0.0.1:10300 "$(unit_values "$wsocket" ListenStream)"
have_dbus_socket=no
while IFS= read -r dir; do
  [ -e "$dir/dbus.socket" ] && have_dbus_socket=yes
done < <(systemd-analyze unit-paths 2>/dev/null)
if [ "$have_dbus_socket" = no ]; then
  printf '[Socket]\nListenStream=/run/dbus/system_bus_socket\n' >"$tmp/units/dbus.socket"
  export SYSTEMD_UNIT_PATH="$tmp/units:"
  note "dbus.socket not installed here: verifying against a stand-in dbus.socket"
fi
systemd-analyze verify --man=no "$tmp/units/tandem-http.socket" "$tmp/units/tandem-wyoming.socket" "$tmp/units/tandem-http.service" \
  >"$tmp/verify.out" 2>"$tmp/verify.err"
rc=$?
if [ "$rc" = 0 ] && [ ! -s "$tmp/verify.err" ] && [ ! -s "$tmp/verify.out" ]; then
  ok "systemd-analyze verify tandem-http.socket tandem-wyoming.socket tandem-http.service: exit 0, no output"
else
  fail "systemd-analyze verify: exit $rc, output:"
  show "$tmp/verify.out" "$tmp/verify.err"
fi

# --- 3. systemd-analyze security ----------------------------------------------------------------------------------------
systemd-analyze security --offline=true --no-pager "$tmp/units/tandem-http.service" >"$tmp/sec.out" 2>"$tmp/sec.err"
source "$(dirname "$0")/exposure.sh"
check_exposure tandem-http.service

# --- 4. the example configuration ---------------------------------------------------------------------------------------
if "$bin" --check-config --config "$config" >"$tmp/check.out" 2>&1; then
  ok "tandem-http --check-config accepts $(basename "$config") as installed"
else
  fail "tandem-http --check-config rejects $(basename "$config"):"; show "$tmp/check.out"
fi
sed -E 's/^#([a-z_]+ = )/\1/' "$config" >"$tmp/uncommented.toml"
keys=$(sed -n -E 's/^([a-z_]+) = .*/\1/p' "$tmp/uncommented.toml")
if [ -z "$keys" ]; then
  fail "no '#key = value' line in $(basename "$config")"
elif "$bin" --check-config --config "$tmp/uncommented.toml" >"$tmp/check2.out" 2>&1; then
  ok "tandem-http --check-config accepts every key uncommented ($(wc -w <<<"$keys") keys)"
else
  fail "tandem-http --check-config rejects the uncommented configuration:"; show "$tmp/check2.out"
fi
missing=()
for k in $keys; do grep -q "^\.BR $k \" (" "$manpage" || missing+=("$k"); done
if [ "${#missing[@]}" = 0 ]; then ok "$(basename "$manpage") documents every key"
else fail "$(basename "$manpage") does not document: ${missing[*]}"; fi

# --- 5. socket activation into a private network namespace --------------------------------------------------------------
# http_get_tcp PORT PATH: the response (headers and body) of a GET, through bash's /dev/tcp.
http_get_tcp() {
  local out
  out=$(timeout 10 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf "GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n" "$2" >&3
    cat <&3' http-get "$1" "$2" 2>&1)
  printf '%s\n' "$out"
}
# http_get_unix PATH URLPATH: the same over a unix socket (curl, else socat, else nothing).
http_get_unix() {
  if command -v curl >/dev/null; then
    timeout 10 curl -sS -i --unix-socket "$1" "http://localhost$2" 2>&1
  elif command -v socat >/dev/null; then
    printf 'GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n' "$2" |
      timeout 10 socat -t 5 - "UNIX-CONNECT:$1" 2>&1
  else
    return 2
  fi
}
netns_cmd=()
if ! command -v systemd-socket-activate >/dev/null; then
  note "systemd-socket-activate not found: socket activation into a private network namespace not checked"
elif unshare --net true 2>/dev/null; then
  netns_cmd=(unshare --net)
elif unshare --user --map-root-user --net true 2>/dev/null; then
  netns_cmd=(unshare --user --map-root-user --net)
else
  note "cannot create a network namespace here (unshare --net): socket activation into one not checked"
fi
# start_activated ADDR... -- ARGS...: systemd-socket-activate on ADDRs, running tandem-http ARGS in a new network
# namespace (unshare execs it: same PID, so LISTEN_PID matches). Sets $act_pid.
start_activated() {
  local l=()
  while [ "$1" != -- ]; do l+=(-l "$1"); shift; done
  shift
  systemd-socket-activate "${l[@]}" "${netns_cmd[@]}" "$bin" "$@" >"$tmp/act.log" 2>&1 &
  act_pid=$!
  pids+=("$act_pid")
}
if [ "${#netns_cmd[@]}" -gt 0 ]; then
  printf '[tandem]\nbus = "address=unix:path=%s/no-bus"\n' "$tmp" >"$tmp/gw.toml"
  served=no
  for _ in 1 2 3 4 5; do
    port=$((20000 + RANDOM % 40000))
    start_activated "127.0.0.1:$port" "$tmp/http.sock" -- --config "$tmp/gw.toml"
    for _ in $(seq 50); do
      grep -q "Listening on" "$tmp/act.log" 2>/dev/null && [ -S "$tmp/http.sock" ] && break
      kill -0 "$act_pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -0 "$act_pid" 2>/dev/null && { served=yes; break; }
    wait "$act_pid" 2>/dev/null
    pids=()
    rm -f "$tmp/http.sock"  # the port was taken: another one
  done
  if [ "$served" = no ]; then
    fail "systemd-socket-activate did not start:"; show "$tmp/act.log"
  else
    resp=$(http_get_tcp "$port" /health)
    if grep -q '^HTTP/1.1 503' <<<"$resp" && grep -qi '^Server: tandem-http' <<<"$resp"; then
      ok "TCP socket passed into a private network namespace answers (GET /health: 503, no tandemd)"
    else
      fail "no HTTP answer on the passed TCP socket 127.0.0.1:$port:"; show <<<"$resp"; show "$tmp/act.log"
    fi
    my_ns=$(readlink /proc/self/ns/net) its_ns=$(readlink "/proc/$act_pid/ns/net" 2>/dev/null)
    if [ -n "$its_ns" ] && [ "$my_ns" != "$its_ns" ]; then
      ok "tandem-http runs in another network namespace ($its_ns, this test: $my_ns)"
    else
      fail "tandem-http is not in another network namespace ('$its_ns' vs '$my_ns')"
    fi
    if resp=$(http_get_unix "$tmp/http.sock" /health); then
      if grep -q '^HTTP/1.1 503' <<<"$resp"; then
        ok "unix socket passed into a private network namespace answers (GET /health: 503)"
      else
        fail "no HTTP answer on the passed unix socket:"; show <<<"$resp"
      fi
    else
      note "neither curl nor socat: the passed unix socket is not checked"
    fi
    kill "$act_pid" 2>/dev/null
    wait "$act_pid" 2>/dev/null
    pids=()
  fi

  # A socket that is not loopback, no keys: refused at start (systemd-socket-activate execs it at the first
  # connection; it must exit 1 with the reason, having served nothing).
  port=$((20000 + RANDOM % 40000))
  start_activated "0.0.0.0:$port" -- --config "$tmp/gw.toml"
  for _ in $(seq 50); do grep -q "Listening on" "$tmp/act.log" 2>/dev/null && break; sleep 0.1; done
  resp=$(http_get_tcp "$port" /health)
  for _ in $(seq 50); do kill -0 "$act_pid" 2>/dev/null || break; sleep 0.1; done
  kill "$act_pid" 2>/dev/null  # still running only if it did not refuse: the check below fails then
  wait "$act_pid" 2>/dev/null
  rc=$?
  pids=()
  if [ "$rc" = 1 ] && grep -q "refusing to serve a non-loopback address without API keys" "$tmp/act.log" &&
    ! grep -q '^HTTP/' <<<"$resp"; then
    ok "a passed 0.0.0.0 socket without API keys: tandem-http refuses to start (exit 1), nothing served"
  elif grep -q "Address already in use\|Failed to" "$tmp/act.log"; then
    note "port $port was taken: the non-loopback refusal is not checked"
  else
    fail "a passed 0.0.0.0 socket without API keys was not refused (exit $rc):"; show "$tmp/act.log"
    show <<<"$resp"
  fi
fi

echo
if [ "$fails" = 0 ]; then echo "all checks passed"; else echo "$fails check(s) failed"; fi
[ "$fails" = 0 ]
