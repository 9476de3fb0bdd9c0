#!/usr/bin/env bash
# Coverage-guided fuzzing of the engine's untrusted-input surfaces (cargo-fuzz, libFuzzer):
#   scripts/fuzz.sh [SECONDS]            every target for SECONDS each (default 60)
#   FUZZ_TARGETS="gguf grammar" scripts/fuzz.sh 600    only those targets
#
# Targets (fuzz/fuzz_targets/, bodies in fuzz/targets.rs): gguf, gguf_stream, tokenizer,
# chat_template, openai_request, output_router, grammar. Installs cargo-fuzz where it is missing
# and needs the nightly toolchain (`rustup toolchain install nightly`; libFuzzer's coverage
# instrumentation is nightly-only). Builds every target once, then runs each with a 10 s limit
# per input and a 2 GiB memory limit; the seeds in fuzz/corpus/<target>/ are read, the inputs a
# run finds worth keeping go to $TINYLLM_CACHE/fuzz-corpus/<target>/ (the next run starts from
# them), crash inputs to fuzz/artifacts/<target>/. Prints one line per target (executions,
# coverage: libFuzzer's `cov` edges and `ft` features, crashes) and exits non-zero when any
# target left a crash, timeout or out-of-memory input.
#
# A crash is fixed in src/ and its input copied to fuzz/regressions/<target>/ (descriptive
# name): tests/fuzz_corpus.rs replays every seed and regression in the ordinary test run.
#
# Each target runs in libFuzzer's fork mode with crashes, timeouts and out-of-memory inputs
# recorded and skipped, so one finding does not end the run: every target gets its SECONDS and
# every distinct finding is reported. FUZZ_FORKS (default 1) fuzzes each target in that many
# processes at once. FUZZ_SANITIZER (default none) picks cargo-fuzz's sanitizer: the targets'
# code is safe Rust, where libFuzzer itself catches what we look for (panics, hangs, memory
# blow-ups); `address` also finds memory errors in unsafe code, at about half the speed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
seconds=${1:-60}
cache=${TINYLLM_CACHE:-$HOME/.cache/tinyllm}
export CARGO_TARGET_DIR=${FUZZ_TARGET_DIR:-$cache/fuzz-target}
sanitizer=${FUZZ_SANITIZER:-none}
forks=${FUZZ_FORKS:-1}
targets=${FUZZ_TARGETS:-gguf gguf_stream tokenizer chat_template openai_request output_router grammar}
triple=$(rustc +nightly -vV | sed -n 's/^host: //p')

if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "fuzz.sh: installing cargo-fuzz" >&2
  cargo install cargo-fuzz --locked
fi

# One build of every target: release with debug assertions and overflow checks.
(cd fuzz && cargo +nightly fuzz build --release --debug-assertions --sanitizer "$sanitizer" \
  --codegen-units 16 --target-dir "$CARGO_TARGET_DIR")
bin_dir=$CARGO_TARGET_DIR/$triple/release

logs=$cache/fuzz-logs
mkdir -p "$logs"
run_one() {
  local t=$1
  local corpus=$cache/fuzz-corpus/$t artifacts=$root/fuzz/artifacts/$t
  mkdir -p "$corpus" "$artifacts"
  local dict=()
  [ -f "$root/fuzz/dicts/$t.dict" ] && dict=(-dict="$root/fuzz/dicts/$t.dict")
  local seeds=("$root/fuzz/corpus/$t")
  [ -d "$root/fuzz/regressions/$t" ] && seeds+=("$root/fuzz/regressions/$t")
  # The first corpus directory receives the new inputs; the seeds are only read.
  "$bin_dir/$t" "$corpus" "${seeds[@]}" "${dict[@]}" \
    -fork="$forks" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$artifacts/" >"$logs/$t.log" 2>&1
}

stamp=$(mktemp)
trap 'rm -f "$stamp"' EXIT
for t in $targets; do
  echo "fuzz.sh: $t for ${seconds}s (log: $logs/$t.log)" >&2
  # libFuzzer's exit status is not needed: its log and the artifacts tell what happened.
  run_one "$t" || true
done

failed=0
printf '%-16s %12s %8s %8s %8s %8s  %s\n' target executions exec/s cov ft corpus result
for t in $targets; do
  log=$logs/$t.log
  # The fork-mode parent's last status line:
  # "#N: cov: C ft: F corp: K exec/s: E oom/timeout/crash: O/T/X time: Ss job: J dft_time: D"
  last=$(grep -E '^#[0-9]+: cov: ' "$log" | tail -1 || true)
  execs=$(sed -n 's/^#\([0-9]*\):.*/\1/p' <<<"$last")
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
  took=$(sed -n 's/^INFO: exiting: .* time: \([0-9]*\)s.*/\1/p' "$log" | tail -1)
  rate=$([ -n "$execs" ] && [ "${took:-0}" -gt 0 ] && echo $((execs / took)) || echo "?")
  found=$(find "$root/fuzz/artifacts/$t" -type f -newer "$stamp" \( -name 'crash-*' -o -name 'timeout-*' \
    -o -name 'oom-*' -o -name 'leak-*' \) 2>/dev/null | wc -l)
  result=ok
  if [ "$found" -gt 0 ]; then
    kinds=$(sed -n 's/.* oom\/timeout\/crash: \([0-9\/]*\).*/\1/p' <<<"$last")
    result="FOUND $found input(s) (oom/timeout/crash ${kinds:-?}) in fuzz/artifacts/$t/"
    failed=1
  elif [ -z "$took" ]; then
    result="did not finish, see $log"
    failed=1
  fi
  printf '%-16s %12s %8s %8s %8s %8s  %s\n' "$t" "${execs:-?}" "$rate" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result"
done
exit $failed
