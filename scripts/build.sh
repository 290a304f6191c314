#!/usr/bin/env bash
# Configure (once) and build Tandem into $TANDEM_BUILD (default: build/). Used by test.sh and demo.sh.
# TANDEM_BUILD_TARGETS="a b ...": only those ninja targets (and what they need) — demo.sh builds the five programs it
# runs and leaves the tests and benchmarks to the test command; empty: everything.
#
# TANDEM_DEB_FLAGS=1 (set by .ci/run) configures a new build directory the way the Debian package build does
# (debian/rules: buildtype plain, prefix /usr, the compiler flags of `dpkg-buildflags` with hardening=+all) instead
# of meson's debugoptimized. Every compile command is then the package build's, so with ccache installed (meson uses
# it by itself) and CCACHE_NOHASHDIR=1, the package build that follows in CI (scripts/test-package.sh) takes its
# objects from the cache instead of compiling the product a second time. The tests run on those hardened objects.
# Two more things must match for a hit (each gave 0 % hits when it did not): -Dcuda=disabled (debian/rules'
# default; a machine with /usr/local/cuda would otherwise add CUDA flags to the test build), and LC_ALL=C.UTF-8 for
# the compiles, which debhelper sets for ninja and ccache hashes (it changes the compiler's messages).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${TANDEM_BUILD:-build}
JOBS=${TANDEM_JOBS:-$(nproc)}
deb_flags=0
if [ "${TANDEM_DEB_FLAGS:-0}" = 1 ] && command -v dpkg-buildflags >/dev/null 2>&1; then
  deb_flags=1
  export LC_ALL=C.UTF-8
fi
if [ ! -f "$BUILD/build.ninja" ]; then
  if [ "$deb_flags" = 1 ]; then
    export DEB_BUILD_MAINT_OPTIONS=hardening=+all
    CFLAGS=$(dpkg-buildflags --get CFLAGS) CXXFLAGS=$(dpkg-buildflags --get CXXFLAGS) \
      CPPFLAGS=$(dpkg-buildflags --get CPPFLAGS) LDFLAGS=$(dpkg-buildflags --get LDFLAGS) \
      meson setup "$BUILD" --buildtype=plain --prefix=/usr --sysconfdir=/etc --localstatedir=/var \
      --libdir="lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH)" -Dcuda=disabled "$@"
  else
    meson setup "$BUILD" --buildtype=debugoptimized "$@"
  fi
fi
# shellcheck disable=SC2086  # a list of target names
ninja -C "$BUILD" -j "$JOBS" ${TANDEM_BUILD_TARGETS:-}
