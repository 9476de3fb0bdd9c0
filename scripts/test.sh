#!/usr/bin/env bash
# The project's test command (README, CI): install what the tests need where it is missing
# (models, openai client, Chromium, playwright-core; see setup-test-deps.sh), build the npm
# package (scripts/build-web.sh) and the Vite example app on it, then run every
# test of the workspace in release mode (the model tests need optimized code), the fixture
# goldens again on the portable CPU kernels (what every non-x86 target, wasm32 included, runs),
# the wasm build's CPU kernels in WebAssembly against the scalar oracle, with
# TINYLLM_COOP_LAVAPIPE=1 the cooperative-matrix tests on a device that has them
# (scripts/test-coop-lavapipe.sh: root, a Debian 13 root of 400 MB, and 10 to 20 minutes of
# lavapipe's LLVM on 2 cores, so not in CI's run),
# and end with one line adding up all of cargo's test binaries:
# "tests: N passed, N failed, N skipped". Tests that skip at run time (no GPU adapter) are
# counted as skipped, not passed (tests/common's device_or_skip records them).
#   scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-test-deps.sh
# The browser tests (web/tests/browser.rs) load the built npm package and the Vite example
# app built from it.
scripts/build-web.sh
(cd web/example && npm ci --no-audit --no-fund && npm run build)
log=$(mktemp)
skips=$(mktemp)
trap 'rm -f "$log" "$skips"' EXIT
export TINYLLM_SKIP_LOG="$skips"
status=0
# --no-fail-fast: a failing test binary must not hide the ones after it.
cargo test --workspace --release --no-fail-fast "$@" 2>&1 | tee "$log" || status=$?
echo "=== fixture goldens on the portable CPU kernels"
TINYLLM_CPU_KERNELS=portable cargo test --release -p tinyllm --test model_golden -- fixtures 2>&1 | tee -a "$log" ||
  status=$?
echo "=== the wasm CPU kernels in WebAssembly (Node), against the scalar oracle"
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/web" CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner \
  CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="-C target-feature=+simd128" \
  cargo test --release -p tinyllm-web --target wasm32-unknown-unknown --test kernels 2>&1 | tee -a "$log" || status=$?
if [ "${TINYLLM_COOP_LAVAPIPE:-0}" = 1 ]; then
  # The Vulkan cooperative-matrix tests where the device has them (Mesa 26's lavapipe in a
  # Debian 13 root; root only, about 400 MB once per machine).
  echo "=== Vulkan cooperative matrices on Mesa 26's lavapipe"
  scripts/test-coop-lavapipe.sh 2>&1 | tee -a "$log" || status=$?
fi
n_skipped=$(wc -l < "$skips")
if [ "$n_skipped" -gt 0 ]; then
  echo "skipped at run time:"
  sed 's/^/  /' "$skips"
fi
awk -v skipped="$n_skipped" '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) s += $i } }
     END { printf "tests: %d passed, %d failed, %d skipped\n", p - skipped, f, s + skipped }' "$log"
exit "$status"
