#!/usr/bin/env bash
# Configure (once) and build Tandem into $TANDEM_BUILD (default: build/). Used by test.sh and demo.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${TANDEM_BUILD:-build}
JOBS=${TANDEM_JOBS:-$(nproc)}
if [ ! -f "$BUILD/build.ninja" ]; then
  meson setup "$BUILD" --buildtype=debugoptimized "$@"
fi
ninja -C "$BUILD" -j "$JOBS"
