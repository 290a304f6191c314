#!/bin/bash
# Runs on a build machine (Debian 12, apt reachable): downloads the -dev packages that tests/gpu/run.sh needs on the
# GPU machine (which has no apt and no network) into .gpu-debs/ at the repository root. About 1.2 MB.
#
#   tests/gpu/fetch-debs.sh            # then: the device tool's run with carry [".gpu-debs"], command tests/gpu/run.sh
#
# .gpu-debs/ is listed in .git/info/exclude (local to this checkout, so that it is never committed); an ignored
# path only travels to the GPU machine when the run names it in `carry`.
#
# googletest: the GoogleTest/GoogleMock sources, which run.sh compiles with the GPU machine's own compiler (the
#   prebuilt .a files in libgtest-dev/libgmock-dev were built with Debian's g++ 12 and may not link elsewhere);
# libgtest-dev, libgmock-dev: headers, pkg-config and CMake files; nlohmann-json3-dev: header-only.
# Google Benchmark is not needed: run.sh configures with -Dbenchmarks=false.
set -euo pipefail

root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
dest="$root/.gpu-debs"
packages=(googletest libgtest-dev libgmock-dev nlohmann-json3-dev)

mkdir -p "$dest"
exclude="$(git -C "$root" rev-parse --git-path info/exclude)"
case "$exclude" in /*) ;; *) exclude="$root/$exclude" ;; esac
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.gpu-debs/' "$exclude" 2>/dev/null || echo '/.gpu-debs/' >>"$exclude"

rm -f "$dest"/*.deb
(cd "$dest" && apt-get download "${packages[@]}")

for p in "${packages[@]}"; do
  if ! compgen -G "$dest/${p}_*.deb" >/dev/null; then
    echo "fetch-debs: ${p} was not downloaded" >&2
    exit 1
  fi
done
du -ch "$dest"/*.deb | tail -n 1 | sed 's/total/in .gpu-debs\//'
ls -1 "$dest"
