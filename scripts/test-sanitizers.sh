#!/usr/bin/env bash
# The CPU tests that need no CUDA toolkit at run time, built with AddressSanitizer
# and UndefinedBehaviorSanitizer (the `debug` preset, build-debug/), for CI.
# Restricted to the cache store's tests (its decoder fuzz included) and the
# manifest parser's (its fuzz reaches codegen's spec parsing too) to keep CI's
# time in budget: a sanitizer build of everything takes far longer.
# Any sanitizer report fails the run. Extra targets and a ctest regex can be
# given: scripts/test-sanitizers.sh [TARGET... [-- CTEST_REGEX]].
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(kjit_cache_tests kjit_cache_fault_tests kjit_manifest_tests)
regex='^(cache\.|manifest:)'
# Run by the release ctest, not here: under ASan the mutation fuzz of the
# bundled manifests takes ~280 s and the kernel-limit expansion ~60 s, more than
# CI's time allows; the schema-driven fuzz of every family covers the parser.
exclude='mutation fuzz of the bundled manifests|manifest at the kernel limit'
if [ $# -gt 0 ]; then
  exclude='^$'

  targets=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do targets+=("$1"); shift; done
  [ "${1:-}" = "--" ] && regex="$2"
fi
launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake --preset debug "${launcher[@]}" > /dev/null
cmake --build --preset debug --target "${targets[@]}"
# halt_on_error: UBSan only prints by default; a report must fail the test.
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export ASAN_OPTIONS="halt_on_error=1:detect_stack_use_after_return=1:strict_string_checks=1"
started=$(date +%s)
ctest --preset debug -R "$regex" -E "$exclude" -j "$(nproc)"
echo "sanitizer tests: $(( $(date +%s) - started )) s"
