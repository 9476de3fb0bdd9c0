#!/usr/bin/env bash
# Compare tinyllm's CPU speed, memory and start-up with llama.cpp's: see compare-llama.py.
#
#   scripts/compare-llama.sh MODEL... [--threads 2] [--rounds 2] [--reps 3] [--json OUT]
set -euo pipefail
exec python3 "$(dirname "$0")/compare-llama.py" "$@"
