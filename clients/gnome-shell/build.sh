#!/bin/sh
# Builds the extension directory for one GNOME Shell generation from the shared sources (src/):
#   build.sh legacy|esm OUTDIR [VERSION]      → OUTDIR/tandem@tandem.io/   (meson.build runs it, and so do the tests)
# legacy (Shell 43, 44): the shared modules lose their `export` keywords (function declarations and `var`s are
#   what the `imports` loader exports) and their gi imports become imports.gi; extension.js = extension-legacy.js.
# esm (Shell 45+): the shared modules as they are; extension.js = extension-esm.js.
# Both get metadata.json (with that generation's shell-version list), stylesheet.css, icons/ and a copy of the D-Bus
# interface XML (dbus/; used when tandem-dev's copy in /usr/share/dbus-1/interfaces is not installed).
set -eu
flavour=$1 out=$2 version=${3:-0.1.0}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# From meson.add_install_script: a relative OUTDIR is inside the (DESTDIR-prefixed) installation prefix.
case $out in
  /*) ;;
  *) if [ -n "${MESON_INSTALL_DESTDIR_PREFIX:-}" ]; then out="$MESON_INSTALL_DESTDIR_PREFIX/$out"; fi ;;
esac
uuid=tandem@tandem.io
dir="$out/$uuid"
case $flavour in
  legacy) shells='["43", "44"]' ;;
  esm) shells='["45", "46", "47", "48"]' ;;
  *) echo "build.sh: flavour must be legacy or esm, not '$flavour'" >&2; exit 2 ;;
esac
rm -rf "$dir"
mkdir -p "$dir/icons" "$dir/dbus"
for m in tandemClient presentation indicator; do
  if [ "$flavour" = esm ]; then
    cp "$here/src/$m.js" "$dir/$m.js"
  else
    sed -E \
      -e "s#^import ([A-Za-z_]+) from 'gi://([A-Za-z]+)(\?version=[0-9.]+)?';#const \1 = imports.gi.\2;#" \
      -e 's#^export (async )?function #\1function #' \
      -e 's#^export class ([A-Za-z_]+)#var \1 = class \1#' \
      -e 's#^export (const|let) #var #' \
      "$here/src/$m.js" > "$dir/$m.js"
    if grep -nE '^(import|export) ' "$dir/$m.js" >&2; then
      echo "build.sh: $m.js: a construct the legacy conversion does not handle (above)" >&2
      exit 1
    fi
  fi
done
cp "$here/src/extension-$flavour.js" "$dir/extension.js"
cp "$here/src/stylesheet.css" "$dir/stylesheet.css"
cp "$here"/icons/*.svg "$dir/icons/"
cp "$root/dbus/io.tandem.Tandem1.xml" "$root/dbus/io.tandem.Tandem1.Model.xml" "$dir/dbus/"
sed -e "s/@SHELL_VERSIONS@/$shells/" -e "s/@VERSION@/$version/" "$here/metadata.json.in" > "$dir/metadata.json"
