#!/usr/bin/env bash
# The package test (issue 8, docs/packaging.md): builds the Debian packages from a copy of this tree, runs lintian,
# installs them on THIS machine, checks the installed files, the user, the directories and the unit, creates a tiny
# model with the installed tandem-setup-default-model, starts the INSTALLED tandemd as the user tandem on a private
# system-type D-Bus bus that includes the INSTALLED policy file (simulated accelerator), runs `tandemctl status` and
# one generation through it as root, stops it with SIGTERM (exit 0), purges the packages and checks that nothing
# is left behind. Prints the figures for docs/packaging.md and ends with "package test: N passed, N failed".
#
# Run as root on Debian 12 after scripts/setup.sh (.ci/run calls it after scripts/test.sh). The unit tests are not
# run again in the package build (DEB_BUILD_OPTIONS=nocheck). Exit 0: all passed; 1: a check failed; 77: skipped
# (not root). It refuses to run when tandemd is already installed (it would purge it at the end).
#   TANDEM_PKG_KEEP=1   keep the work directory (/tmp/tandem-pkg.*: the .deb files, logs)
#   TANDEM_PKG_JOBS=N   parallel jobs of the package build (default 2)
#   TANDEM_PKG_DEBS=DIR skip the build: test the .deb/.changes/.buildinfo files in DIR (e.g. a kept work directory)
#   TANDEM_PKG_OUT=DIR  copy the built .deb/.changes/.buildinfo files into DIR (.ci/run: tests/system/run.sh then
#                       installs the same packages under a real systemd instead of building them again)
set -uo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD

if [ "$(id -u)" != 0 ]; then
  echo "test-package.sh: skipped: needs root (it installs and purges the packages)" >&2
  exit 77
fi
if dpkg-query -W -f='${Status}\n' tandemd tandem-client tandem-dev 2>/dev/null | grep -qv "not-installed$"; then
  echo "test-package.sh: tandemd, tandem-client or tandem-dev is installed (or its configuration is left); this" \
    "test would purge it." >&2
  echo "package test: 0 passed, 1 failed"
  exit 1
fi

PASS=0
FAIL=0
ok() { PASS=$((PASS + 1)); echo "ok   $*"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL $*"; }
check() {  # check NAME COMMAND... : passes when COMMAND exits 0
  local name=$1
  shift
  if "$@" >/dev/null 2>&1; then ok "$name"; else bad "$name"; fi
}
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

WORK=$(mktemp -d /tmp/tandem-pkg.XXXXXX)
chmod 0755 "$WORK"  # the daemon (user tandem) reaches the bus socket and its drop-in through it
VERSION=$(dpkg-parsechangelog -l "$SRC/debian/changelog" -S Version)
ARCH=$(dpkg --print-architecture)
BUS_PID=""
DAEMON_PID=""
INSTALLED=0
PACKAGES=(tandemd tandem-client tandem-dev)

cleanup() {
  if [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
    kill -KILL "$DAEMON_PID" 2>/dev/null
    wait "$DAEMON_PID" 2>/dev/null
  fi
  if [ -n "$BUS_PID" ]; then kill "$BUS_PID" 2>/dev/null; fi
  if [ "$INSTALLED" = 1 ]; then  # a step failed before the purge: leave the machine as it was
    DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq "${PACKAGES[@]}" >/dev/null 2>&1
  fi
  if [ "${TANDEM_PKG_KEEP:-0}" = 1 ]; then echo "test-package.sh: kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
finish() {
  echo "package test: $PASS passed, $FAIL failed"
  [ "$FAIL" = 0 ]
  exit $?
}
abort() {  # a failed step that the following steps depend on
  bad "$*"
  finish
}

# --- 1. build ------------------------------------------------------------------------------------------------------
# In a copy: dpkg-buildpackage writes the .deb files to the parent directory and build trees next to debian/.
BUILD_DIR="$WORK/tandem-$VERSION"
if [ -n "${TANDEM_PKG_DEBS:-}" ]; then
  echo "== build: skipped, testing the packages in $TANDEM_PKG_DEBS"
  cp "$TANDEM_PKG_DEBS"/*.deb "$TANDEM_PKG_DEBS"/*.changes "$TANDEM_PKG_DEBS"/*.buildinfo "$WORK/"
  BUILD_S="n/a (prebuilt packages)"
else
  echo "== build (dpkg-buildpackage in $WORK)"
  mkdir "$BUILD_DIR"
  for entry in "$SRC"/* "$SRC"/.gitignore; do
    case ${entry##*/} in build | build-* | obj-*) continue ;; esac
    cp -a "$entry" "$BUILD_DIR/"
  done
  t0=$(now)
  (cd "$BUILD_DIR" &&
    DEB_BUILD_OPTIONS="nocheck parallel=${TANDEM_PKG_JOBS:-2}" dpkg-buildpackage -us -uc -b) >"$WORK/build.log" 2>&1
  build_rc=$?
  BUILD_S=$(secs "$t0" "$(now)")
  if [ "$build_rc" != 0 ]; then
    tail -40 "$WORK/build.log"
    abort "dpkg-buildpackage (exit $build_rc; log above)"
  fi
  ok "dpkg-buildpackage -us -uc -b (${BUILD_S} s)"
fi
for p in "${PACKAGES[@]}"; do
  a=$ARCH
  [ "$p" = tandem-dev ] && a=all
  [ -f "$WORK/${p}_${VERSION}_${a}.deb" ] || abort "built ${p}_${VERSION}_${a}.deb"
done
ok "built ${PACKAGES[*]}"
if [ -n "${TANDEM_PKG_OUT:-}" ]; then
  mkdir -p "$TANDEM_PKG_OUT" && cp "$WORK"/*.deb "$WORK"/*.changes "$WORK"/*.buildinfo "$TANDEM_PKG_OUT/" &&
    echo "   (copied the packages to $TANDEM_PKG_OUT)"
fi

# --- 2. lintian ----------------------------------------------------------------------------------------------------
echo "== lintian"
# lintian's scratch files (mldbm-elf-*) go into $WORK, which is removed at the end, not into /tmp for good.
mkdir -p "$WORK/lintian-tmp"
TMPDIR="$WORK/lintian-tmp" lintian --display-info "$WORK/tandem_${VERSION}_${ARCH}.changes" >"$WORK/lintian.out" 2>"$WORK/lintian.err"
sed 's/^/  | /' "$WORK/lintian.out"
if grep -qE '^[EW]: ' "$WORK/lintian.out"; then
  bad "lintian: errors or warnings (above)"
else
  ok "lintian: no errors or warnings ($(grep -c '^I: ' "$WORK/lintian.out") info tags, $(grep -c '^[EWIPX]: ' "$WORK/lintian.out") tags in all)"
fi

# --- 3. sizes; then the build tree goes, so the installed tools cannot lean on it -----------------------------------
declare -A DEB_KB INST_KB
for f in "$WORK"/*.deb; do
  p=$(dpkg-deb -f "$f" Package)
  DEB_KB[$p]=$(du -k "$f" | cut -f1)
  INST_KB[$p]=$(dpkg-deb -f "$f" Installed-Size)
done
rm -rf "$BUILD_DIR"

# --- 4. install ----------------------------------------------------------------------------------------------------
echo "== install"
T_INSTALL=$(now)
INSTALLED=1
(cd "$WORK" && DEBIAN_FRONTEND=noninteractive apt-get install -y \
  "./tandemd_${VERSION}_${ARCH}.deb" "./tandem-client_${VERSION}_${ARCH}.deb" "./tandem-dev_${VERSION}_all.deb") \
  >"$WORK/install.log" 2>&1
install_rc=$?
INSTALL_S=$(secs "$T_INSTALL" "$(now)")
grep "^tandemd:" "$WORK/install.log" | sed 's/^/  | /'
if [ "$install_rc" != 0 ]; then
  tail -30 "$WORK/install.log"
  abort "apt-get install ./tandemd_*.deb ./tandem-client_*.deb ./tandem-dev_*.deb (exit $install_rc)"
fi
ok "apt-get install of the three packages (${INSTALL_S} s)"
check "postinst says how to finish the setup (no model yet, nothing started)" \
  grep -q "tandem-setup-default-model" "$WORK/install.log"

# --- 5. installed files, user, directories, unit -------------------------------------------------------------------
echo "== installed layout"
for f in /usr/sbin/tandemd /usr/sbin/tandem-setup-default-model /usr/bin/tandemctl /usr/bin/tandem-mkmodel \
  /usr/bin/tandem-train /usr/bin/tandem-generate; do
  check "executable $f" test -x "$f"
done
for f in /lib/systemd/system/tandemd.service \
  /usr/share/dbus-1/system.d/io.tandem.Tandem1.conf \
  /usr/share/dbus-1/system-services/io.tandem.Tandem1.service \
  /usr/share/dbus-1/interfaces/io.tandem.Tandem1.xml \
  /usr/share/dbus-1/interfaces/io.tandem.Tandem1.Model.xml \
  /usr/share/dbus-1/interfaces/io.tandem.Tandem1.Testing.xml \
  /usr/lib/sysusers.d/tandemd.conf /usr/lib/tmpfiles.d/tandemd.conf \
  /usr/share/bash-completion/completions/tandemctl \
  /usr/share/tandem/tokenizer/llama2/tokenizer.model \
  /usr/share/doc/tandemd/examples/cpu-only.toml /usr/share/doc/tandemd/examples/tandemd.d/10-cpu-only.toml \
  /usr/share/man/man8/tandemd.8.gz /usr/share/man/man5/tandemd.toml.5.gz /usr/share/man/man1/tandemctl.1.gz \
  /usr/share/man/man8/tandem-setup-default-model.8.gz /usr/share/man/man1/tandem-mkmodel.1.gz; do
  check "file $f" test -f "$f"
done
check "directory /etc/tandem/tandemd.d" test -d /etc/tandem/tandemd.d
check "/etc/tandem/tandemd.toml is a conffile" \
  sh -c "dpkg-query -W -f='\${Conffiles}' tandemd | grep -q '^ /etc/tandem/tandemd.toml '"
check "shipped configuration is valid (tandemd --check-config)" /usr/sbin/tandemd --check-config
check "tandemd depends on libtorch and libopenblas0-pthread" \
  sh -c "dpkg-query -W -f='\${Depends}' tandemd | grep -q 'libtorch1.13' &&
         dpkg-query -W -f='\${Depends}' tandemd | grep -q 'libopenblas0-pthread'"
check "tandemctl does not link LibTorch" sh -c "! ldd /usr/bin/tandemctl | grep -q torch"
check "user tandem: home /var/lib/tandem, no login shell" \
  sh -c "getent passwd tandem | awk -F: '\$6 == \"/var/lib/tandem\" && \$7 ~ /nologin\$/ { f = 1 } END { exit !f }'"
check "group tandem" getent group tandem
check "group tandem-admin" getent group tandem-admin
check "/var/lib/tandem 0700 tandem:tandem" sh -c '[ "$(stat -c "%a %U %G" /var/lib/tandem)" = "700 tandem tandem" ]'
check "/var/lib/tandem/models 0750 tandem:tandem" \
  sh -c '[ "$(stat -c "%a %U %G" /var/lib/tandem/models)" = "750 tandem tandem" ]'
check "unit enabled (multi-user.target.wants)" test -L /etc/systemd/system/multi-user.target.wants/tandemd.service
systemd-analyze verify /lib/systemd/system/tandemd.service >"$WORK/verify.out" 2>"$WORK/verify.err"
verify_rc=$?
if [ "$verify_rc" = 0 ] && [ ! -s "$WORK/verify.err" ]; then
  ok "systemd-analyze verify /lib/systemd/system/tandemd.service: exit 0, no stderr"
else
  sed 's/^/  | /' "$WORK/verify.err"
  bad "systemd-analyze verify (exit $verify_rc, stderr above)"
fi
systemd-analyze security --offline=true --no-pager /lib/systemd/system/tandemd.service >"$WORK/security.out" 2>&1
EXPOSURE=$(sed -n 's/.*Overall exposure level for tandemd.service: \([0-9.]*\).*/\1/p' "$WORK/security.out")
EXPOSURE_LINE=$(grep "Overall exposure level" "$WORK/security.out" | sed 's/\x1b\[[0-9;]*m//g')
if [ -n "$EXPOSURE" ] && awk -v s="$EXPOSURE" 'BEGIN { exit !(s <= 2.0) }'; then
  ok "systemd-analyze security --offline=true: ${EXPOSURE_LINE#→ }"
else
  bad "systemd-analyze security: exposure '$EXPOSURE' (must be <= 2.0)"
fi

# --- 6. the default model (untrained: seconds) ---------------------------------------------------------------------
echo "== default model"
T_MODEL=$(now)
if /usr/sbin/tandem-setup-default-model --untrained >"$WORK/model.log" 2>&1; then
  MODEL_S=$(secs "$T_MODEL" "$(now)")
  ok "tandem-setup-default-model --untrained (${MODEL_S} s)"
else
  sed 's/^/  | /' "$WORK/model.log"
  abort "tandem-setup-default-model --untrained"
fi
M=/var/lib/tandem/models/default
check "model files owned by tandem" sh -c "[ \"\$(stat -c %U $M/model.safetensors)\" = tandem ] &&
  [ \"\$(stat -c %U $M)\" = tandem ]"
check "model uses the installed tokenizer" cmp -s $M/tokenizer.model /usr/share/tandem/tokenizer/llama2/tokenizer.model
check "second run keeps the model (exit 0, no --force)" \
  sh -c "/usr/sbin/tandem-setup-default-model --untrained | grep -q 'already holds a model'"

# --- 7. private system-type bus with the installed policy ----------------------------------------------------------
echo "== tandemd as user tandem on a private system bus"
SOCK="$WORK/system_bus_socket"
ADDR="unix:path=$SOCK"
cat >"$WORK/bus.conf" <<CONF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<!-- The default policy of /usr/share/dbus-1/system.conf, our socket, and the INSTALLED policy of tandemd. -->
<busconfig>
  <type>system</type>
  <listen>$ADDR</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Introspectable"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Properties"/>
  </policy>
  <include>/usr/share/dbus-1/system.d/io.tandem.Tandem1.conf</include>
</busconfig>
CONF
BUS_PID=$(dbus-daemon --config-file="$WORK/bus.conf" --fork --print-pid=1 2>"$WORK/bus.err")
if [ -z "$BUS_PID" ] || [ -s "$WORK/bus.err" ]; then
  sed 's/^/  | /' "$WORK/bus.err"
  abort "private system bus with the installed policy"
fi
ok "private system bus (pid $BUS_PID) includes /usr/share/dbus-1/system.d/io.tandem.Tandem1.conf"
# The installed policy is in force: another user may not own the daemon's name.
if setpriv --reuid=nobody --regid=nogroup --clear-groups busctl --address="$ADDR" call org.freedesktop.DBus \
  /org/freedesktop/DBus org.freedesktop.DBus RequestName su io.tandem.Tandem1 4 >"$WORK/own.out" 2>&1; then
  bad "user nobody could own io.tandem.Tandem1 (the installed policy is not in force)"
else
  check "policy: user nobody may not own io.tandem.Tandem1" grep -qi "not allowed\|denied" "$WORK/own.out"
fi

mkdir -m 0755 "$WORK/tandemd.d"
cat >"$WORK/tandemd.d/90-package-test.toml" <<CONF
# scripts/test-package.sh: the installed /etc/tandem/tandemd.toml plus this drop-in.
[bus]
kind = "address"
address = "$ADDR"
[device]
kind = "simulated"
sim_capacity = "2GiB"
CONF
chmod 0644 "$WORK/tandemd.d/90-package-test.toml"
# As the unit runs it: user and group tandem, no capabilities, umask 0077, one BLAS thread.
T_START=$(now)
(umask 0077 && exec setpriv --reuid=tandem --regid=tandem --init-groups --inh-caps=-all --no-new-privs \
  env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 \
  /usr/sbin/tandemd --config /etc/tandem/tandemd.toml --dropin-dir "$WORK/tandemd.d" --log-stderr) \
  2>"$WORK/tandemd.log" &
DAEMON_PID=$!
CTL=(/usr/bin/tandemctl --address "$ADDR")
up=0
for _ in $(seq 1 600); do
  if "${CTL[@]}" status >/dev/null 2>&1; then up=1; break; fi
  kill -0 "$DAEMON_PID" 2>/dev/null || break
  sleep 0.1
done
READY_S=$(secs "$T_START" "$(now)")
if [ "$up" != 1 ]; then
  tail -20 "$WORK/tandemd.log" | sed 's/^/  | /'
  abort "installed tandemd (user tandem) answers on the private bus"
fi
ok "installed tandemd runs as user $(ps -o user= -p "$DAEMON_PID") and owns io.tandem.Tandem1 (${READY_S} s after start)"
"${CTL[@]}" status >"$WORK/status.out" 2>&1
status_rc=$?
sed 's/^/  | /' "$WORK/status.out"
if [ "$status_rc" = 0 ]; then ok "tandemctl --address ... status"; else bad "tandemctl status (exit $status_rc)"; fi

# One generation as root (uid 0 is an admin, so it may submit). The first byte on stdout is the first token.
rm -f "$WORK/first-token"
{
  "${CTL[@]}" run --max-tokens 16 --seed 1 "This program is free software" 2>"$WORK/run.err"
  echo $? >"$WORK/run.rc"
} | {
  if IFS= read -r -n 1 c; then
    now >"$WORK/first-token"
    printf '%s' "$c"
    cat
  fi
} >"$WORK/run.out"
run_rc=$(cat "$WORK/run.rc" 2>/dev/null || echo 1)
sed 's/^/  | /' "$WORK/run.err"
echo "  | text: $(tr '\n' ' ' <"$WORK/run.out" | cut -c1-100)"
if [ "$run_rc" = 0 ] && [ -s "$WORK/first-token" ] && grep -q "completed" "$WORK/run.err"; then
  FIRST_TOKEN_S=$(secs "$T_INSTALL" "$(cat "$WORK/first-token")")
  ok "tandemctl run: one generation completed"
else
  FIRST_TOKEN_S="n/a"
  bad "tandemctl run (exit $run_rc)"
fi

kill -TERM "$DAEMON_PID"
wait "$DAEMON_PID"
stop_rc=$?
DAEMON_PID=""
if [ "$stop_rc" = 0 ]; then ok "SIGTERM: tandemd exited 0"; else bad "SIGTERM: tandemd exited $stop_rc"; fi
kill "$BUS_PID" 2>/dev/null
BUS_PID=""
check "journal written in /var/lib/tandem as tandem, mode 0600" \
  sh -c '[ "$(stat -c "%a %U" /var/lib/tandem/journal)" = "600 tandem" ]'

# --- 8. remove keeps the state, purge removes it -------------------------------------------------------------------
echo "== remove, then purge"
for p in "${PACKAGES[@]}"; do dpkg-query -L "$p"; done | sort -u >"$WORK/files.list"
DEBIAN_FRONTEND=noninteractive apt-get remove -y tandemd >"$WORK/remove.log" 2>&1
check "apt-get remove tandemd" sh -c "dpkg-query -W -f='\${Status}' tandemd | grep -q 'config-files'"
check "after remove: configuration, models and journal are kept" \
  test -f /etc/tandem/tandemd.toml -a -f /var/lib/tandem/models/default/config.json -a -f /var/lib/tandem/journal
check "after remove: the daemon binary is gone" test ! -e /usr/sbin/tandemd
DEBIAN_FRONTEND=noninteractive apt-get purge -y "${PACKAGES[@]}" >"$WORK/purge.log" 2>&1
purge_rc=$?
INSTALLED=0
if [ "$purge_rc" = 0 ]; then ok "apt-get purge -y ${PACKAGES[*]}"; else tail -20 "$WORK/purge.log"; bad "apt-get purge (exit $purge_rc)"; fi
left=()
while IFS= read -r f; do
  [ -n "$f" ] || continue
  if [ -d "$f" ]; then
    # A directory counts only if it is ours and nothing else owns it (not /usr/bin, /etc, /lib -> usr/lib, ...).
    if [[ "$f" == *tandem* ]] && ! dpkg-query -S "$f" >/dev/null 2>&1; then left+=("$f/"); fi
  elif [ -e "$f" ] || [ -L "$f" ]; then
    left+=("$f")
  fi
done <"$WORK/files.list"
for d in /etc/tandem /var/lib/tandem /var/cache/tandem /run/tandem; do [ -e "$d" ] && left+=("$d"); done
while IFS= read -r f; do left+=("$f"); done < <(find /etc/systemd /var/lib/systemd -name 'tandemd*' 2>/dev/null)
if [ "${#left[@]}" = 0 ]; then
  ok "nothing left behind: package files, /etc/tandem, /var/lib/tandem, unit enablement"
else
  printf '  | left: %s\n' "${left[@]}"
  bad "files left after purge"
fi
check "dpkg knows none of the packages any more" \
  sh -c "! dpkg-query -W -f='\${Status}\n' ${PACKAGES[*]} 2>/dev/null | grep -qv '^unknown\|not-installed'"
if getent passwd tandem >/dev/null; then
  echo "note: the system user tandem and the groups tandem, tandem-admin stay after purge (Debian keeps system users)"
fi

# --- figures -------------------------------------------------------------------------------------------------------
echo "== figures"
for p in "${PACKAGES[@]}"; do
  echo "  package $p: ${DEB_KB[$p]:-?} KiB .deb, Installed-Size ${INST_KB[$p]:-?} KiB"
done
if [[ "$BUILD_S" =~ ^[0-9.]+$ ]]; then BUILD_S="$BUILD_S s"; fi
echo "  build (dpkg-buildpackage -b, nocheck, parallel=${TANDEM_PKG_JOBS:-2}): ${BUILD_S}"
echo "  lintian: $(grep -c '^E: ' "$WORK/lintian.out") errors, $(grep -c '^W: ' "$WORK/lintian.out") warnings, $(grep -c '^I: ' "$WORK/lintian.out") info"
echo "  security exposure (systemd-analyze security --offline=true): ${EXPOSURE:-?}"
echo "  install -> first token: ${FIRST_TOKEN_S} s (apt-get install ${INSTALL_S} s, untrained model ${MODEL_S:-?} s, daemon start -> name ${READY_S} s)"
finish
