#!/usr/bin/env bash
# The project's test command (README, CI): install what the tests need where it is missing
# (models, openai client, Chromium, playwright-core; see setup-test-deps.sh), then run every
# test of the workspace in release mode (the model tests need optimized code), and end with
# one line adding up all of cargo's test binaries: "tests: N passed, N failed, N skipped".
#   scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-test-deps.sh
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --release "$@" 2>&1 | tee "$log" || status=$?
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) s += $i } }
     END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
exit "$status"
