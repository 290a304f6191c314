# shellcheck shell=bash
# A throw-away systemd machine for tests (issue 20): a cached Debian 12 root made with debootstrap, an overlay over
# it per run, and systemd booted as PID 1 of new PID, mount, UTS and IPC namespaces over that overlay with
# pivot_root (../shared/TOOLCHAIN.md, "Real systemd in a container"). Sourced by tests/system/run.sh; the same file
# is also the container's first process (`container.sh --pid1 ...`, run by unshare), which mounts and execs systemd.
#
# What the container shares with the host, and what it cannot touch:
#   * the network namespace (apt may fetch a missing dependency) and the kernel;
#   * /sys (read-only, except the cgroup hierarchies), in which systemd manages only its own subtree: before it
#     starts, PID 1 moves into CT_CGROUP (`/tandem-systest-<id>`) in every hierarchy, and systemd takes
#     that as its root cgroup;
#   * NOT the host's file systems: after pivot_root the old root is detached, /tmp and /run are new tmpfs mounts,
#     /dev is a tmpfs with bind-mounted pseudo devices, /proc/sys is read-only, and every mount lives only in the
#     container's mount namespace, so the kernel drops them all when its last process dies.
# systemd's boot is kept away from the host in the cached root too: units that would change kernel settings or
# touch hardware (sysctl, modules, binfmt, gettys, the audit socket) are masked.

CT_SUITE=bookworm
CT_MIRROR=${TANDEM_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CT_SECURITY_MIRROR=${TANDEM_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
CT_CACHE=${TANDEM_SYSROOT_CACHE:-/var/cache/tandem-systemd-root}
CT_MAX_AGE_DAYS=${TANDEM_SYSROOT_MAX_AGE_DAYS:-14}
# Bump when the recipe below changes: a cached root with another recipe is rebuilt.
CT_RECIPE=4
CT_MASK=(getty@.service serial-getty@.service console-getty.service container-getty@.service getty.target
  getty-static.service systemd-sysctl.service systemd-modules-load.service systemd-binfmt.service
  proc-sys-fs-binfmt_misc.automount proc-sys-fs-binfmt_misc.mount systemd-journald-audit.socket
  systemd-networkd.service systemd-networkd.socket systemd-networkd-wait-online.service apt-daily.timer
  apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer modprobe@.service)

CT_PID=""      # host PID of the container's systemd
CT_REAPER=""   # PID of the reaper that powers the container off if this script is killed
CT_WORK=""     # per-run directory: overlay upper/work dirs, the mount point, logs
CT_ROOT=""     # the overlay mount point (visible only inside the container's mount namespace)
CT_CGROUP=""   # cgroup path (relative to each hierarchy) that the container's systemd uses as its root
CT_BOOT_T0=""
CT_BOOT_S=""   # seconds from unshare to the end of the boot (is-system-running)
CT_CACHE_BUILT_S=""  # seconds spent building the cached root in this run ("" = reused)

ct_now() { date +%s.%N; }
ct_secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# Can this machine run the container at all? Prints the reason and returns 1 if not.
ct_supported() {
  if [ "$(id -u)" != 0 ]; then echo "needs root"; return 1; fi
  local t
  for t in unshare nsenter pivot_root; do
    command -v "$t" >/dev/null || { echo "no $t (util-linux)"; return 1; }
  done
  if ! unshare --pid --fork --mount --uts --ipc --propagation private true 2>/dev/null; then
    echo "cannot create PID/mount/UTS/IPC namespaces (unshare failed)"
    return 1
  fi
  if ! grep -qw overlay /proc/filesystems && ! modprobe overlay 2>/dev/null; then
    echo "no overlayfs in this kernel"
    return 1
  fi
  if [ ! -d /sys/fs/cgroup ] || ! grep -q cgroup /proc/mounts; then
    echo "no cgroup file system mounted"
    return 1
  fi
  return 0
}

# The packages under test in DIR (not the -dbgsym ones, nor other packages built from the same source).
ct_debs() { ls "$1"/tandemd_*.deb "$1"/tandem-client_*.deb "$1"/tandem-dev_*.deb 2>/dev/null; }

# The cache key: recipe, suite, mirror, and the dependency fields of the packages under test (their dependencies
# are pre-installed in the cached root, so that a run installs only the three .deb files).
ct_cache_key() {
  local debs=$1 f
  {
    echo "recipe=$CT_RECIPE suite=$CT_SUITE variant=minbase include=systemd,systemd-sysv,dbus mirror=$CT_MIRROR $CT_SECURITY_MIRROR"
    for f in $(ct_debs "$debs"); do
      echo "$(dpkg-deb -f "$f" Package): $(dpkg-deb -f "$f" Depends) | $(dpkg-deb -f "$f" Pre-Depends)"
    done | sort
  } | sha256sum | cut -c1-16
}

# The dependency lines of the .deb files in DIR, minus the packages themselves (for `apt-get satisfy`).
ct_deps_of() {
  local debs=$1 f
  for f in $(ct_debs "$debs"); do
    dpkg-deb -f "$f" Depends | tr ',' '\n' | sed 's/^ *//; s/ *$//' | grep -v '^\(tandem\|$\)'
  done | sort -u
}

# Makes sure $CT_CACHE/root exists, matches the key and is younger than CT_MAX_AGE_DAYS; builds it otherwise.
# Prints progress; returns 1 (with the log's tail) when the build fails.
ct_prepare_root() {
  local debs=$1 key stamp age_days t0 log new
  key=$(ct_cache_key "$debs")
  stamp="$CT_CACHE/stamp"
  if [ -d "$CT_CACHE/root" ] && [ -f "$stamp" ] && [ "$(sed -n 's/^key=//p' "$stamp")" = "$key" ]; then
    age_days=$(( ($(date +%s) - $(stat -c %Y "$stamp")) / 86400 ))
    if [ "$age_days" -lt "$CT_MAX_AGE_DAYS" ]; then
      echo "cached root $CT_CACHE/root (key $key, $age_days days old)"
      return 0
    fi
    echo "cached root is $age_days days old (limit $CT_MAX_AGE_DAYS): rebuilding"
  elif [ -d "$CT_CACHE/root" ]; then
    echo "cached root has another key (recipe, mirror or the packages' dependencies changed): rebuilding"
  else
    echo "no cached root in $CT_CACHE: building it (debootstrap --variant=minbase, then the packages' dependencies)"
  fi
  if ! command -v debootstrap >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null 2>&1 ||
      { echo "apt-get install debootstrap failed"; return 1; }
  fi
  mkdir -p "$CT_CACHE"
  new="$CT_CACHE/root.new"
  log="$CT_CACHE/build.log"
  rm -rf "$new"
  t0=$(ct_now)
  # In a private mount namespace: whatever debootstrap or apt mount inside the root goes away with it.
  if ! unshare --mount --propagation private -- bash -c '
      set -e
      new=$1 suite=$2 mirror=$3 security=$4
      shift 4
      debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus "$suite" "$new" "$mirror"
      # A Debian machine as installed: the point release plus updates and security updates.
      printf "deb %s %s main\ndeb %s %s-updates main\ndeb %s %s-security main\n" "$mirror" "$suite" "$mirror" \
        "$suite" "$security" "$suite" >"$new/etc/apt/sources.list"
      mount -t proc proc "$new/proc"
      mount -t tmpfs -o mode=0755 tmpfs "$new/dev"
      for n in null zero full random urandom tty; do touch "$new/dev/$n"; mount --bind "/dev/$n" "$new/dev/$n"; done
      mount -t tmpfs tmpfs "$new/tmp"
      printf "#!/bin/sh\nexit 101\n" >"$new/usr/sbin/policy-rc.d"  # start nothing while building
      chmod 0755 "$new/usr/sbin/policy-rc.d"
      export DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 PATH=/usr/sbin:/usr/bin:/sbin:/bin
      chroot "$new" apt-get update -qq
      chroot "$new" apt-get dist-upgrade -y -q
      # Dependencies of the packages under test, resolved like `apt-get install ./tandemd_*.deb` would.
      chroot "$new" apt-get satisfy -y -q --no-install-recommends "$@"
      # Tools the checks use inside the container (procps: ps; curl: requests to the HTTP gateway; util-linux is
      # essential and has setpriv; Wyoming is spoken through /dev/tcp of bash).
      chroot "$new" apt-get install -y -q --no-install-recommends procps curl
      chroot "$new" apt-get clean
      rm -f "$new/usr/sbin/policy-rc.d"
    ' ct-build "$new" "$CT_SUITE" "$CT_MIRROR" "$CT_SECURITY_MIRROR" "$(ct_deps_of "$debs" | paste -sd, -)" >"$log" 2>&1; then
    tail -25 "$log" | sed 's/^/  | /'
    echo "building the cached root failed (log: $log)"
    rm -rf "$new"
    return 1
  fi
  local u
  for u in "${CT_MASK[@]}"; do ln -sf /dev/null "$new/etc/systemd/system/$u"; done
  echo "tandem-systest" >"$new/etc/hostname"
  printf '127.0.0.1 localhost tandem-systest\n' >"$new/etc/hosts"
  : >"$new/etc/machine-id"
  rm -rf "$CT_CACHE/root" "$stamp"
  mv "$new" "$CT_CACHE/root"
  CT_CACHE_BUILT_S=$(ct_secs "$t0" "$(ct_now)")
  printf 'key=%s\nbuilt=%s\nseconds=%s\n' "$key" "$(date -u +%FT%TZ)" "$CT_CACHE_BUILT_S" >"$stamp"
  echo "cached root built in ${CT_CACHE_BUILT_S} s ($(du -sm "$CT_CACHE/root" | cut -f1) MiB)"
}

# Our own cgroup path in hierarchy line "ID:CONTROLLERS:PATH" → the directory of that hierarchy.
ct_cgroup_dir() {
  local controllers=$1
  case $controllers in
    "") if [ -d /sys/fs/cgroup/unified ]; then echo /sys/fs/cgroup/unified; else echo /sys/fs/cgroup; fi ;;
    name=systemd) echo /sys/fs/cgroup/systemd ;;
    *) echo "/sys/fs/cgroup/$controllers" ;;
  esac
}

# Creates HIERARCHY/PATH one level at a time, remembering what it made (CT_CGROUP_MADE, removed again at teardown
# when empty). A new cpuset cgroup gets its parent's CPUs and memory nodes (v1 starts it empty: no task may join).
CT_CGROUP_MADE=()
ct_mkcgroup() {
  local path=$2 d=$1 part
  local IFS=/
  for part in ${path#/}; do
    d="$d/$part"
    [ -d "$d" ] && continue
    mkdir "$d" || return 1
    CT_CGROUP_MADE+=("$d")
    if [ -f "$d/cpuset.cpus" ]; then
      cat "${d%/*}/cpuset.cpus" >"$d/cpuset.cpus" && cat "${d%/*}/cpuset.mems" >"$d/cpuset.mems" || return 1
    fi
  done
}

# Boots the container over an overlay of the cached root. Sets CT_PID, CT_WORK, CT_ROOT, CT_CGROUP.
ct_boot() {
  local id controllers path dir
  CT_WORK=$(mktemp -d /var/tmp/tandem-systest.XXXXXX)
  chmod 0755 "$CT_WORK"
  mkdir "$CT_WORK/upper" "$CT_WORK/ovl-work" "$CT_WORK/root"
  CT_ROOT="$CT_WORK/root"
  id=${CT_WORK##*.}
  # The container's cgroup: one new directory at the top of every hierarchy (systemd uses the same path in all
  # of them). At the top, the unit's own MemoryMax is the tightest memory limit above it.
  CT_CGROUP="/tandem-systest-$id"
  CT_CGROUP_MADE=()
  while IFS=: read -r _ controllers path; do
    dir=$(ct_cgroup_dir "$controllers")
    [ -d "$dir" ] || continue
    ct_mkcgroup "$dir" "$CT_CGROUP" || return 1
  done </proc/self/cgroup
  CT_BOOT_T0=$(ct_now)
  # In its own session: a signal to our process group (Ctrl-C, timeout(1)) reaches us, not the container's init.
  setsid unshare --pid --fork --mount --uts --ipc --propagation private -- \
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin container=tandem-systest \
    bash "${BASH_SOURCE[0]}" --pid1 "$CT_CACHE/root" "$CT_WORK" "$CT_CGROUP" \
    </dev/null >"$CT_WORK/console.log" 2>&1 &
  local unshare_pid=$! i
  for i in $(seq 1 100); do
    CT_PID=$(awk '{ print $1 }' "/proc/$unshare_pid/task/$unshare_pid/children" 2>/dev/null)
    [ -n "$CT_PID" ] && break
    sleep 0.05
  done
  if [ -z "$CT_PID" ]; then
    echo "the container's first process did not appear"
    return 1
  fi
  echo "$unshare_pid" >"$CT_WORK/unshare.pid"
  # A reaper outside our process group: if this script dies without its trap (SIGKILL), it powers the container
  # off (SIGRTMIN+4, then SIGKILL), after checking that CT_PID is still the same process (start time).
  local start
  start=$(awk '{ print $22 }' "/proc/$CT_PID/stat")
  setsid bash -c '
    owner=$1 pid=$2 start=$3
    same() { [ "$(awk "{ print \$22 }" /proc/$pid/stat 2>/dev/null)" = "$start" ]; }
    while kill -0 "$owner" 2>/dev/null && same; do sleep 1; done
    same || exit 0
    kill -s SIGRTMIN+4 "$pid"
    for i in $(seq 1 100); do same || exit 0; sleep 0.1; done
    same && kill -KILL "$pid"
  ' ct-reaper "$$" "$CT_PID" "$start" </dev/null >/dev/null 2>&1 &
  CT_REAPER=$!
  # Wait until PID 1 is systemd (the --pid1 script execs it after the mounts).
  for i in $(seq 1 200); do
    [ "$(cat "/proc/$CT_PID/comm" 2>/dev/null)" = systemd ] && break
    kill -0 "$CT_PID" 2>/dev/null || break
    sleep 0.05
  done
  if [ "$(cat "/proc/$CT_PID/comm" 2>/dev/null)" != systemd ]; then
    sed 's/^/  | /' "$CT_WORK/console.log"
    echo "systemd did not start as the container's PID 1"
    return 1
  fi
  # Then until its private socket answers, and the boot is over (running, or degraded: a failed unit is reported
  # by the caller, not fatal here).
  for i in $(seq 1 300); do
    ct test -S /run/systemd/private 2>/dev/null && break
    kill -0 "$CT_PID" 2>/dev/null || break
    sleep 0.1
  done
  local state
  state=$(ct_t 60 systemctl is-system-running --wait 2>&1)
  CT_BOOT_S=$(ct_secs "$CT_BOOT_T0" "$(ct_now)")
  case $state in
    running | degraded) return 0 ;;
  esac
  tail -30 "$CT_WORK/console.log" | sed 's/^/  | /'
  echo "systemd did not finish booting within 60 s (state: ${state:-none})"
  return 1
}

# Runs a command inside the container (its PID, mount, UTS and IPC namespaces, its root) with a clean
# environment, killed after 120 s: no step can hang the test.
ct() { ct_t 120 "$@"; }

# The same, bounded: ct_t SECONDS COMMAND...
ct_t() {
  local s=$1
  shift
  timeout --kill-after=5 "$s" nsenter -t "$CT_PID" -p -m -u -i -r -w -- \
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"
}

# Stops the container: SIGRTMIN+4 (poweroff) to its systemd, SIGKILL after 15 s. Then the cgroups it left and the
# work directory. Safe to call twice, and when boot failed halfway.
ct_teardown() {
  local i up
  if [ -n "$CT_PID" ] && kill -0 "$CT_PID" 2>/dev/null; then
    kill -s SIGRTMIN+4 "$CT_PID" 2>/dev/null
    for i in $(seq 1 150); do kill -0 "$CT_PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$CT_PID" 2>/dev/null; then
      echo "container: systemd (pid $CT_PID) did not power off in 15 s: SIGKILL (its PID namespace goes with it)"
      kill -KILL "$CT_PID" 2>/dev/null
    fi
  fi
  if [ -n "$CT_WORK" ] && [ -f "$CT_WORK/unshare.pid" ]; then
    up=$(cat "$CT_WORK/unshare.pid")
    for i in $(seq 1 50); do kill -0 "$up" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$up" 2>/dev/null
    wait "$up" 2>/dev/null
  fi
  CT_PID=""
  if [ -n "$CT_REAPER" ]; then kill "$CT_REAPER" 2>/dev/null; wait "$CT_REAPER" 2>/dev/null; CT_REAPER=""; fi
  # Mounts live in the container's mount namespace only; if one ever leaked into ours, unmount it (ours only).
  if [ -n "$CT_WORK" ]; then
    findmnt -rn -o TARGET | grep "^$CT_WORK/" | sort -r | while read -r m; do umount -l "$m"; done
  fi
  # The cgroups systemd created under ours, deepest first (twice, a second apart: nothing may come back), then the
  # ones ct_boot made on the way (only if empty: rmdir never removes a cgroup that has members or children).
  if [ -n "$CT_CGROUP" ]; then
    ct_cgroup_cleanup
    sleep 1
    ct_cgroup_cleanup
    local k
    for ((k = ${#CT_CGROUP_MADE[@]} - 1; k >= 0; k--)); do
      [ -d "${CT_CGROUP_MADE[k]}" ] && rmdir "${CT_CGROUP_MADE[k]}" 2>/dev/null
    done
    CT_CGROUP_MADE=()
    CT_CGROUP=""
  fi
  if [ -n "$CT_WORK" ]; then
    if [ "${TANDEM_SYSTEST_KEEP:-0}" = 1 ]; then
      echo "container: kept $CT_WORK (upper layer and logs)"
    else
      rm -rf "$CT_WORK"
    fi
    CT_WORK=""
  fi
}

# Removes CT_CGROUP in every hierarchy (v1 controllers, name=systemd, the v2 tree). A process still in it can only
# be one of the container's (its PID namespace is gone by now, but an exiting task may linger): SIGKILL by PID.
ct_cgroup_cleanup() {
  local dirs=() left=() d pids
  case $CT_CGROUP in /tandem-systest-?*) ;; *) return 0 ;; esac  # never anything but our own directory
  for d in /sys/fs/cgroup/*"$CT_CGROUP" "/sys/fs/cgroup$CT_CGROUP"; do [ -d "$d" ] && dirs+=("$d"); done
  [ "${#dirs[@]}" = 0 ] && return 0
  for _ in $(seq 1 50); do
    pids=$(find "${dirs[@]}" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u | tr '\n' ' ')
    # shellcheck disable=SC2086
    [ -n "${pids// /}" ] && kill -KILL $pids 2>/dev/null
    left=()
    for d in "${dirs[@]}"; do
      [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
      [ -d "$d" ] && left+=("$d")
    done
    [ "${#left[@]}" = 0 ] && return 0
    sleep 0.2
  done
  echo "container: cgroups left behind: ${left[*]}"
}

# --- the container's first process -----------------------------------------------------------------------------
# bash container.sh --pid1 LOWER WORK CGROUP: PID 1 of the new PID namespace, in the new mount namespace.
ct_pid1() {
  local lower=$1 work=$2 cgroup=$3 r="$2/root" controllers dir n
  set -e
  # Into the container's cgroup in every hierarchy (created by ct_boot), so systemd manages only that subtree.
  while IFS=: read -r _ controllers path; do
    dir=$(ct_cgroup_dir "$controllers")
    [ -d "$dir$cgroup" ] && echo $$ >"$dir$cgroup/cgroup.procs"
  done </proc/self/cgroup
  mount -t overlay overlay -o "lowerdir=$lower,upperdir=$work/upper,workdir=$work/ovl-work" "$r"
  mount -t proc -o nosuid,nodev,noexec proc "$r/proc"
  mount --bind -o ro "$r/proc/sys" "$r/proc/sys"
  mount -o remount,bind,ro "$r/proc/sys"
  mount --rbind /sys "$r/sys"
  mount -o remount,bind,ro "$r/sys"  # the top only: the cgroup hierarchies under it stay writable
  mount -t tmpfs -o mode=0755,nosuid tmpfs "$r/dev"
  for n in null zero full random urandom tty; do
    touch "$r/dev/$n"
    mount --bind "/dev/$n" "$r/dev/$n"
  done
  mkdir -p "$r/dev/pts" "$r/dev/shm" "$r/dev/mqueue"
  mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,gid=5 devpts "$r/dev/pts"
  ln -s pts/ptmx "$r/dev/ptmx"
  mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$r/dev/shm"
  mount -t mqueue mqueue "$r/dev/mqueue" || true
  ln -s /proc/self/fd "$r/dev/fd"
  ln -s /proc/self/fd/0 "$r/dev/stdin"
  ln -s /proc/self/fd/1 "$r/dev/stdout"
  ln -s /proc/self/fd/2 "$r/dev/stderr"
  mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs "$r/run"
  mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$r/tmp"
  cd "$r"
  mkdir -p .oldroot
  pivot_root . .oldroot
  cd /
  umount -l /.oldroot
  rmdir /.oldroot
  set +e
  exec /lib/systemd/systemd --system --show-status=no
}

if [ "${1:-}" = --pid1 ]; then
  shift
  ct_pid1 "$@"
  exit 1
fi
