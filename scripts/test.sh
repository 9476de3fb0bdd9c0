#!/usr/bin/env bash
# The project's test command (README, CI), in two tiers:
#   scripts/test.sh [--full] [extra cargo test args]
# The fast tier (the default, what .ci/run runs) and, with --full, the slow tier too
# (TINYLLM_TEST_TIER=full): the real models on lavapipe and in the browser, the GPU variant
# sweeps, the agent (OpenCode) and full structured-output runs. The README's "Test tiers" says
# what only the full tier runs and what covers each path in the fast one. A full-tier test in a
# fast run is counted as skipped (tests/common's `full_tier`), never as passed.
#
# Installs what the tests need where it is missing (models, the Python venv with the openai
# client, Chromium, playwright-core; see setup-test-deps.sh), builds the npm package
# (scripts/build-web.sh) and the Vite example app on it, then runs every test of the workspace
# in release mode (the model tests need optimized code), the fixture goldens again on the
# portable CPU kernels (what every non-x86 target, wasm32 included, runs), the wasm build's CPU
# kernels in WebAssembly against the scalar oracle, with TINYLLM_COOP_LAVAPIPE=1 the
# cooperative-matrix tests on a device that has them (scripts/test-coop-lavapipe.sh: root, a
# Debian 13 root of 400 MB, and 10 to 20 minutes of lavapipe's LLVM on 2 cores, so in neither
# tier by default). Each test binary's wall time is printed after it, the slowest at the end,
# and the last line adds up all of cargo's test binaries: "tests: N passed, N failed, N skipped".
# Tests that skip at run time (no GPU adapter, full tier only) are counted as skipped, not
# passed (tests/common's `skip` records them in TINYLLM_SKIP_LOG).
set -euo pipefail
cd "$(dirname "$0")/.."
tier=fast
if [ "${1:-}" = "--full" ]; then
  tier=full
  shift
fi
export TINYLLM_TEST_TIER=$tier
started=$EPOCHREALTIME
scripts/setup-test-deps.sh
# The Python packages the tests drive the server with live in the project's venv.
. scripts/python-env.sh
tinyllm_python_env
# The browser tests (web/tests/browser.rs) load the built npm package and the Vite example
# app built from it.
scripts/build-web.sh
(cd web/example && npm ci --no-audit --no-fund && npm run build)
log=$(mktemp)
skips=$(mktemp)
times=$(mktemp)
# One line per step that exited non-zero (each step's status is lost in its pipe to `tee`).
failures=$(mktemp)
trap 'rm -f "$log" "$skips" "$times" "$failures"' EXIT
export TINYLLM_SKIP_LOG="$skips"
status=0

# Passes cargo's output through, and after each test binary (cargo runs them one after another,
# each announced by a "Running" or "Doc-tests" line) prints and records its wall time.
timed() { # label prefix for the binaries of this cargo run
  local prefix=$1 name="" start line
  start=$EPOCHREALTIME
  report() {
    local s
    s=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
    echo "=== $prefix$name: $s s"
    echo "$s $prefix$name" >>"$times"
  }
  while IFS= read -r line; do
    case $line in
      *"     Running "* | *"   Doc-tests "*)
        [ -z "$name" ] || report
        # "Running tests/x.rs (…/deps/x-0123abcd)" -> x; "Doc-tests tinyllm" -> doc-tests tinyllm
        if [[ $line == *Doc-tests* ]]; then
          name="doc-tests ${line##*Doc-tests }"
        else
          name=${line##*/}
          name=${name%)}
          name=${name%-*}
        fi
        start=$EPOCHREALTIME
        ;;
    esac
    printf '%s\n' "$line"
  done
  [ -z "$name" ] || report
}

echo "=== $tier tier"
# --no-fail-fast: a failing test binary must not hide the ones after it.
{ cargo test --workspace --release --no-fail-fast "$@" 2>&1 || echo "cargo test exit $?" >>"$failures"; } |
  timed "" | tee "$log"
echo "=== fixture goldens on the portable CPU kernels"
# --workspace, as above: with `-p tinyllm` alone cargo resolves the dependencies' features for
# that package only and builds every dependency a second time (minutes on a new machine).
{ TINYLLM_CPU_KERNELS=portable cargo test --workspace --release --test model_golden -- fixtures 2>&1 ||
  echo "portable exit $?" >>"$failures"; } | timed "portable " | tee -a "$log"
echo "=== the wasm CPU kernels in WebAssembly (SIMD128 build in Node), against the scalar oracle"
{ CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/web" CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner \
  CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="-C target-feature=+simd128" \
  cargo test --release -p tinyllm-web --target wasm32-unknown-unknown --test kernels 2>&1 ||
  echo "wasm kernels exit $?" >>"$failures"; } | timed "wasm " | tee -a "$log"
# Node 20's relaxed SIMD (behind a flag) computes the byte dot product wrongly (120 for a
# product whose value is 60; Chromium 156 gives 60): the relaxed build runs in headless Chromium
# through chromedriver.
echo "=== the wasm CPU kernels in WebAssembly (relaxed-SIMD build in Chromium), against the scalar oracle"
{ CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/web-relaxed" CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner \
  CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="-C target-feature=+simd128,+relaxed-simd" \
  WASM_BINDGEN_USE_BROWSER=1 CHROMEDRIVER=/usr/bin/chromedriver WASM_BINDGEN_TEST_WEBDRIVER_JSON="$PWD/web/tests/webdriver.json" \
  cargo test --release -p tinyllm-web --target wasm32-unknown-unknown --test kernels 2>&1 ||
  echo "wasm relaxed kernels exit $?" >>"$failures"; } | timed "wasm-relaxed " | tee -a "$log"
if [ "${TINYLLM_COOP_LAVAPIPE:-0}" = 1 ]; then
  # The Vulkan cooperative-matrix tests where the device has them (Mesa 26's lavapipe in a
  # Debian 13 root; root only, about 400 MB once per machine).
  echo "=== Vulkan cooperative matrices on Mesa 26's lavapipe"
  { scripts/test-coop-lavapipe.sh 2>&1 || echo "coop exit $?" >>"$failures"; } | tee -a "$log"
fi
if [ -s "$failures" ]; then
  status=1
  sed 's/^/failed: /' "$failures"
fi
n_skipped=$(wc -l <"$skips")
if [ "$n_skipped" -gt 0 ]; then
  echo "skipped at run time:"
  sed 's/^/  /' "$skips"
fi
echo "slowest test binaries ($tier tier):"
sort -rn "$times" | head -n 8 | awk '{ printf "  %7.1f s  %s\n", $1, substr($0, index($0, $2)) }'
awk -v a="$started" -v b="$EPOCHREALTIME" -v t="$tier" 'BEGIN { printf "%s tier: %.0f s in all\n", t, b - a }'
awk -v skipped="$n_skipped" '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) s += $i } }
     END { printf "tests: %d passed, %d failed, %d skipped\n", p - skipped, f, s + skipped }' "$log"
exit "$status"
