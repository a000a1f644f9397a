# Sourced by the CLI tests: a scratch folder removed on exit, and check(), which
# counts a named assertion as passed or failed; finish prints the tally in the
# form CI reads ("N passed, N failed") and fails when any check did.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0
check() {  # check NAME COMMAND...: the command must succeed
  local name=$1; shift
  if "$@"; then passed=$((passed + 1)); else echo "FAILED: $name"; failed=$((failed + 1)); fi
}
finish() {
  echo "$passed passed, $failed failed"
  test "$failed" -eq 0
}
