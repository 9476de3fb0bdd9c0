#!/usr/bin/env bash
# Install what the test suite needs beyond Rust, only where it is missing (idempotent):
# the real models, the wasm32 target, Python's `openai` and `anthropic` clients (server tests), Debian's
# Chromium and playwright-core from npm (chat-page test). Needs root for apt-get when
# Chromium or npm are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v rustup >/dev/null; then
  rustup target list --installed | grep -q wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown
fi
apt_updated=0
apt_install() {
  [ $apt_updated = 1 ] || { apt-get update -qq; apt_updated=1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}
command -v python3 >/dev/null || apt_install python3
# The server tests drive `tinyllm-native serve` with the official OpenAI client, and the
# structured-output test judges answers with the `jsonschema` package: both in the project's
# virtual environment (a distribution's Python refuses system-wide pip installs), which
# test.sh puts first on PATH.
. scripts/python-env.sh
tinyllm_python_env openai anthropic jsonschema
# The browser test drives the chat page in Debian's Chromium with playwright-core (npm).
# playwright-core wants Node >= 20 (the image has it; Debian 12's own nodejs is 18).
[ -x /usr/bin/chromium ] || apt_install chromium
# The relaxed-SIMD wasm kernels' test runs in Chromium through its WebDriver (Node 20's relaxed
# SIMD is wrong): wasm-bindgen-test-runner drives it.
[ -x /usr/bin/chromedriver ] || apt_install chromium-driver
# The WebGPU backend's tests run on Mesa lavapipe (Vulkan on the CPU) through wgpu, and the
# Vulkan device layer's (tests/vulkan_device.rs, `inspect --gpus`) on it directly; the package
# brings the loader, libvulkan1, which the Vulkan backend opens at run time.
ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || apt_install mesa-vulkan-drivers
ldconfig -p 2>/dev/null | grep 'libvulkan\.so\.1 ' >/dev/null || apt_install libvulkan1
command -v npm >/dev/null || apt_install nodejs npm
# The replicas test (native/tests/replicas.rs) puts Debian's nginx in front of two servers.
[ -x /usr/sbin/nginx ] || apt_install nginx-light
[ -d native/tests/browser/node_modules/playwright-core ] || (cd native/tests/browser && npm ci --no-audit --no-fund)
[ -x native/tests/opencode/node_modules/.bin/opencode ] || (cd native/tests/opencode && npm ci --no-audit --no-fund)
# The npm package's tests: playwright-core, wasm-opt (binaryen) and @wllama/wllama (the speed
# comparison) from web/package.json.
[ -d web/node_modules/playwright-core ] || (cd web && npm ci --no-audit --no-fund)
scripts/fetch-models.sh
