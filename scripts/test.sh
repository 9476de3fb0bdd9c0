#!/usr/bin/env bash
# The project's test command (README, CI): fetch the real models into the cache if needed,
# then run every test of the workspace in release mode (the model tests need optimized code).
#   scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-models.sh
exec cargo test --workspace --release "$@"
