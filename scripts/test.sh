#!/usr/bin/env bash
# The project's test command (README, CI): install what the tests need where it is missing
# (models, openai client, Chromium, playwright-core; see setup-test-deps.sh), then run every
# test of the workspace in release mode (the model tests need optimized code).
#   scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-test-deps.sh
exec cargo test --workspace --release "$@"
