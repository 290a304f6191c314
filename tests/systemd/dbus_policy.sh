#!/usr/bin/env bash
# Behaviour of dbus/io.tandem.Tandem1.conf on a private system-type bus (tests/systemd/system-bus.conf.in), run by
# an ordinary user (root is not needed; run as root, it also checks other users' rights with runuser):
#   * the owner named by the policy can own io.tandem.Tandem1 (the policy is copied with user "tandem" replaced by
#     the user running the test); with the owner replaced by another user, RequestName is refused;
#   * with a stand-in service owning the name (tandem_test_bus_echo answers every call), an ordinary caller may call
#     io.tandem.Tandem1, io.tandem.Tandem1.Model, Introspect, Peer and Properties Get/GetAll, and is refused
#     Properties.Set, io.tandem.Tandem1.Testing and any other interface; root and group "tandem-admin" may also
#     use Set and Testing (checked when run as root: group "tandem-admin" is mapped to nobody's group);
#   * broadcast signals from the service are received (gdbus monitor);
#   * the bus stays reachable from a new network namespace (unshare -n, what PrivateNetwork=yes does), because its
#     socket is a path in the file system; an abstract-namespace socket is not (which shows the namespace is real).
# usage: dbus_policy.sh POLICY BUS_CONF_IN [ECHO_HELPER]
# Exit 77 (skip) without dbus-daemon or busctl.
set -u
policy=$1 bus_conf_in=$2 echo_bin=${3:-}
name=io.tandem.Tandem1
path=/io/tandem/Tandem1

for tool in dbus-daemon busctl; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not found"; exit 77; }
done

tmp=$(mktemp -d)
chmod 0755 "$tmp"  # when run as root, the other users' callers must reach the sockets
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
skip() { echo "skip $*"; }
show() { sed 's/^/  | /' "$@"; }

me=$(id -un)
root=no
[ "$(id -u)" = 0 ] && root=yes
# A user other than the one running the test (the owner in the refusing policy).
other=
for u in nobody daemon; do
  if [ "$u" != "$me" ] && id "$u" >/dev/null 2>&1; then other=$u; break; fi
done
[ -n "$other" ] || other=tandem-test-no-such-user

# start_bus DIR OWNER ADMIN_GROUP [LISTEN]: a private bus with the policy for OWNER / ADMIN_GROUP; sets $addr.
start_bus() {
  local dir=$tmp/$1 owner=$2 admin=$3 listen=${4:-unix:path=$tmp/$1/bus.sock} i
  mkdir -p "$dir/policy.d" "$dir/services"
  chmod 0755 "$dir"
  sed -e "s/user=\"tandem\"/user=\"$owner\"/" -e "s/group=\"tandem-admin\"/group=\"$admin\"/" "$policy" \
    >"$dir/policy.d/io.tandem.Tandem1.conf"
  sed -e "s|@LISTEN@|$listen|" -e "s|@POLICY_DIR@|$dir/policy.d|" -e "s|@SERVICE_DIR@|$dir/services|" \
    "$bus_conf_in" >"$dir/bus.conf"
  dbus-daemon --config-file="$dir/bus.conf" --nofork --print-address=3 3>"$dir/address" 2>"$dir/bus.log" &
  pids+=($!)
  for i in $(seq 50); do
    [ -s "$dir/address" ] && break
    sleep 0.1
  done
  addr=$(head -n 1 "$dir/address")
  if [ -z "$addr" ]; then
    fail "private bus $1 did not start:"; show "$dir/bus.log"
    return 1
  fi
  echo "     bus $1: owner policy for '$owner', admin group '$admin', $addr"
}

# as USER CMD...: run CMD as USER (the current user directly; others only when running as root)
as() {
  local user=$1
  shift
  if [ "$user" = "$me" ]; then "$@"; else runuser -u "$user" -- "$@"; fi
}

# request_name WHO WANT(owned|denied): RequestName on $addr as WHO.
request_name() {
  local who=$1 want=$2 out rc
  out=$(as "$who" busctl --address="$addr" call org.freedesktop.DBus /org/freedesktop/DBus org.freedesktop.DBus \
    RequestName su "$name" 0 2>&1)
  rc=$?
  if [ "$want" = owned ] && [ "$rc" = 0 ] && [ "$out" = "u 1" ]; then
    ok "$who may own $name"
  elif [ "$want" = denied ] && [ "$rc" != 0 ] && grep -q 'Access denied' <<<"$out"; then
    ok "$who may not own $name (Access denied)"
  else
    fail "RequestName as $who: wanted $want, got exit $rc:"; show <<<"$out"
  fi
}

# expect WHO WANT(allowed|denied) OBJECT INTERFACE MEMBER [SIGNATURE ARGS...]: one method call as WHO.
expect() {
  local who=$1 want=$2 object=$3 iface=$4 member=$5 out rc
  shift 5
  out=$(as "$who" busctl --address="$addr" --timeout=5 call "$name" "$object" "$iface" "$member" "$@" 2>&1)
  rc=$?
  if [ "$want" = allowed ] && [ "$rc" = 0 ]; then
    ok "$who may call $iface.$member"
  elif [ "$want" = denied ] && [ "$rc" != 0 ] && grep -q 'Access denied' <<<"$out"; then
    ok "$who may not call $iface.$member (Access denied)"
  else
    fail "$iface.$member as $who: wanted $want, got exit $rc:"; show <<<"$out"
  fi
}

# --- the owner named by the policy can own the name; nobody else can ------------------------------------------------
if [ "$root" = yes ]; then admin_group=$(id -gn nobody 2>/dev/null || echo tandem-admin); else admin_group=tandem-admin; fi
start_bus own "$me" "$admin_group" || exit 1
request_name "$me" owned
[ "$root" = yes ] && id daemon >/dev/null 2>&1 && request_name daemon denied

# --- calls, with a stand-in service owning the name -------------------------------------------------------------------
# The ordinary caller: another user when root, else the current user unless it is in the admin group.
plain=
if [ "$root" = yes ]; then
  id daemon >/dev/null 2>&1 && ! id -Gn daemon | tr ' ' '\n' | grep -qx "$admin_group" && plain=daemon
elif ! id -Gn | tr ' ' '\n' | grep -qx "$admin_group"; then
  plain=$me
fi

service_up=no
if [ -n "$echo_bin" ] && [ -x "$echo_bin" ]; then
  "$echo_bin" "$addr" "$name" 60 >"$tmp/echo.out" 2>"$tmp/echo.err" &
  pids+=($!)
  for i in $(seq 50); do
    grep -q . "$tmp/echo.out" && break
    sleep 0.1
  done
  if grep -qx "owned $name" "$tmp/echo.out"; then
    service_up=yes; ok "stand-in service owns $name as $me"
  else
    fail "stand-in service could not own $name:"; show "$tmp/echo.out" "$tmp/echo.err"
  fi
else
  skip "calls and signals: no stand-in service (tandem_test_bus_echo needs libsystemd)"
fi

if [ "$service_up" = yes ]; then
  if [ -n "$plain" ]; then
    expect "$plain" allowed "$path" io.tandem.Tandem1 ListModels
    expect "$plain" allowed "$path" io.tandem.Tandem1 Cancel t 1
    expect "$plain" allowed "$path/models/tiny" io.tandem.Tandem1.Model Name
    expect "$plain" allowed "$path" org.freedesktop.DBus.Introspectable Introspect
    expect "$plain" allowed "$path" org.freedesktop.DBus.Peer Ping
    expect "$plain" allowed "$path" org.freedesktop.DBus.Properties Get ss io.tandem.Tandem1 State
    expect "$plain" allowed "$path" org.freedesktop.DBus.Properties GetAll s io.tandem.Tandem1
    expect "$plain" denied "$path" org.freedesktop.DBus.Properties Set ssv io.tandem.Tandem1 Policy a{sv} 0
    expect "$plain" denied "$path" io.tandem.Tandem1.Testing LoseDevice
    expect "$plain" denied "$path" io.tandem.Tandem1.Testing GetCounters
    expect "$plain" denied "$path" org.freedesktop.DBus.ObjectManager GetManagedObjects
    expect "$plain" denied "$path" org.example.Unlisted Anything
  else
    skip "ordinary caller: $me is in group $admin_group"
  fi
  if [ "$root" = yes ]; then
    expect root allowed "$path" org.freedesktop.DBus.Properties Set ssv io.tandem.Tandem1 Policy a{sv} 0
    expect root allowed "$path" io.tandem.Tandem1.Testing LoseDevice
    expect root denied "$path" org.example.Unlisted Anything
    if [ "$admin_group" != tandem-admin ]; then
      expect nobody allowed "$path" org.freedesktop.DBus.Properties Set ssv io.tandem.Tandem1 Policy a{sv} 0
      expect nobody allowed "$path" io.tandem.Tandem1.Testing LoseDevice
    fi
  else
    skip "admin callers (root, group tandem-admin): run the test as root to check them"
  fi

  # Signals: a broadcast from the service reaches an ordinary caller's match rule.
  listener=${plain:-$me}
  if command -v gdbus >/dev/null; then
    # Started directly (not through `as`, a shell function) so that $! is the process to stop.
    if [ "$listener" = "$me" ]; then
      timeout 10 gdbus monitor --address "$addr" --dest "$name" >"$tmp/monitor.out" 2>&1 &
    else
      runuser -u "$listener" -- timeout 10 gdbus monitor --address "$addr" --dest "$name" >"$tmp/monitor.out" 2>&1 &
    fi
    monitor_pid=$!
    pids+=("$monitor_pid")
    got=no
    for i in $(seq 30); do
      sleep 0.2
      as "$listener" busctl --address="$addr" call "$name" "$path" io.tandem.Tandem1 ListModels >/dev/null 2>&1
      grep -q 'io.tandem.Tandem1.DegradedModeChanged' "$tmp/monitor.out" && { got=yes; break; }
    done
    if [ "$got" = yes ]; then ok "$listener receives io.tandem.Tandem1.DegradedModeChanged"
    else fail "no DegradedModeChanged signal reached $listener:"; show "$tmp/monitor.out"; fi
    kill "$monitor_pid" 2>/dev/null
    wait "$monitor_pid" 2>/dev/null
  else
    skip "signals: gdbus not found"
  fi

  # PrivateNetwork=yes: a new network namespace (users mapped to themselves, as PrivateUsers=yes does).
  if command -v unshare >/dev/null && as "$listener" unshare -c -n true 2>/dev/null; then
    out=$(as "$listener" unshare -c -n busctl --address="$addr" call "$name" "$path" io.tandem.Tandem1 ListModels 2>&1)
    if [ $? = 0 ]; then ok "the bus's path socket is reachable from a new network namespace"
    else fail "the bus is not reachable from a new network namespace:"; show <<<"$out"; fi
    if start_bus abstract "$me" "$admin_group" "unix:abstract=tandem-test-$$-$RANDOM"; then
      if as "$listener" busctl --address="$addr" call org.freedesktop.DBus /org/freedesktop/DBus \
           org.freedesktop.DBus GetId >/dev/null 2>&1 &&
         ! as "$listener" unshare -c -n busctl --address="$addr" call org.freedesktop.DBus /org/freedesktop/DBus \
           org.freedesktop.DBus GetId >/dev/null 2>&1; then
        ok "an abstract socket is not reachable from the new network namespace (the namespace is real)"
      else
        fail "abstract-socket control: reachable from the new namespace, or not at all from the host one"
      fi
    fi
  else
    skip "network namespace: unshare -c -n is not permitted here"
  fi
fi

# --- a policy naming another owner refuses the current user ------------------------------------------------------------
start_bus other "$other" "$admin_group" || exit 1
request_name "$me" denied
if [ -n "$echo_bin" ] && [ -x "$echo_bin" ]; then
  out=$("$echo_bin" "$addr" "$name" 1 2>&1)
  if [ $? = 3 ] && grep -q "^denied $name" <<<"$out"; then ok "stand-in service may not own $name as $me"
  else fail "stand-in service with owner policy '$other': wanted denied, got:"; show <<<"$out"; fi
fi
if [ "$root" = yes ] && [ "$other" != tandem-test-no-such-user ]; then
  request_name "$other" owned  # the refusal above is the owner rule, not a broken policy
fi

echo
if [ "$fails" = 0 ]; then echo "all checks passed"; else echo "$fails check(s) failed"; fi
[ "$fails" = 0 ]
