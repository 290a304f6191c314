#!/usr/bin/env bash
# Install every Debian 12 package Tandem's build, tests and benchmarks need. Idempotent; run as root.
# Used by README.md and .ci/run. Facts behind the list: ../shared/TOOLCHAIN.md.
set -euo pipefail

PACKAGES=(
  build-essential meson ninja-build pkg-config
  ccache  # meson compiles through it when installed: CI's package build reuses the test build's objects (.ci/run)
  libtorch-dev libopenblas0-pthread
  libsdbus-c++-dev libsdbus-c++-bin libsystemd-dev
  libspdlog-dev libfmt-dev libboost-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libtomlplusplus-dev nlohmann-json3-dev libsentencepiece-dev
  libicu-dev  # the BPE tokenizers: Unicode-property regexes and normalization (docs/tokenizers.md)
  libjpeg62-turbo-dev libpng-dev  # image input (src/image): JPEG and PNG decoding, PNG writing (docs/image-input.md)
  libsndfile1-dev libsamplerate0-dev zlib1g-dev  # audio input (src/audio): WAV/FLAC/Ogg decoding, resampling to
                                                 # 16 kHz; zlib: Whisper's compression-ratio check (src/speech)
  espeak-ng  # speech made on this machine for the default speech model and the transcription tests
  libsqlite3-dev  # tandemctl index/search: the image index is a SQLite file (src/client/image_index.h, docs/image-search.md)
  dbus dbus-daemon dbus-bin libglib2.0-bin systemd socat jq util-linux
  debhelper devscripts lintian
  clang libclang-rt-14-dev llvm
  python3
  gjs gnome-shell  # the GNOME Shell extension's tests (tests/gnome-shell): its model in gjs, and the extension in a
                   # real headless Shell 43 (about 160 packages with --no-install-recommends)
)

if [ "$(id -u)" != 0 ]; then
  echo "setup.sh: run as root (it installs Debian packages with apt-get)" >&2
  exit 1
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# Node.js and npm for the official OpenAI/Ollama client tests (tests/http/node, a lockfile): Debian's unless a Node.js is
# already there (a NodeSource build, say: Debian's npm would conflict with it).
if ! command -v npm >/dev/null 2>&1; then missing+=(nodejs npm); fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup.sh: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

echo "setup.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup.sh: done"
