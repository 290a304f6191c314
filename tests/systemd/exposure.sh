# Sourced by verify_unit.sh and verify_http_units.sh: check_exposure UNIT — reads $tmp/sec.out and $tmp/sec.err
# (systemd-analyze security output for UNIT), checks the overall score against $max_exposure and every failed check
# against the caller's accepted_fails, reporting through the caller's ok / fail / show.
check_exposure() {
  local unit=$1 score name known a
  cat "$tmp/sec.out"
  [ -s "$tmp/sec.err" ] && { fail "systemd-analyze security wrote to stderr:"; show "$tmp/sec.err"; }
  score=$(sed -n "s/.*Overall exposure level for ${unit//./\\.}: \([0-9][0-9]*\.[0-9]\).*/\1/p" "$tmp/sec.out")
  if [ -z "$score" ]; then
    fail "no exposure score in the systemd-analyze security output"
  elif awk -v s="$score" -v m="$max_exposure" 'BEGIN { exit !(s <= m) }'; then
    ok "exposure $score <= $max_exposure"
  else
    fail "exposure $score > $max_exposure (a hardening directive was weakened or removed?)"
  fi
  # A failed check is a table row ending in its exposure weight; passed and not-applicable rows carry none.
  while read -r name; do
    known=no
    for a in "${accepted_fails[@]}"; do [ "$name" = "$a" ] && known=yes; done
    if [ "$known" = yes ]; then ok "accepted exposure: $name"; else fail "new exposure: $name"; fi
  done < <(awk 'NF >= 3 && $NF ~ /^[0-9]+\.[0-9]+$/ && $2 ~ /=/ { print $2 }' "$tmp/sec.out")
}
