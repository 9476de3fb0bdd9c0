#!/usr/bin/env bash
# The browser's speed in one command, on this machine: the npm package on the wasm CPU (1 and 2
# threads, the SIMD128 and the relaxed-SIMD builds) and on WebGPU, @wllama/wllama (llama.cpp in
# wasm) on the same page, and native `tinyllm-native bench` with the same threads, for both real
# models. Native runs before and after the browser runs (the best of the two is kept), the
# browser engines alternate within their run (web/tests/browser.rs, bench_cpu_and_webgpu_against_wllama).
# Prints prefill and decode tok/s, the ratios to wllama and the fractions of native, and the
# wasm memory (docs/benchmarks.md's browser table comes from it).
#
#   scripts/browser-bench.sh [--no-webgpu]     (TINYLLM_BENCH_ROUNDS, _THREADS, _MODELS as in the test)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
[ "${1:-}" = "--no-webgpu" ] && export TINYLLM_BENCH_WEBGPU=0
threads="${TINYLLM_BENCH_THREADS:-1,2}"
export TINYLLM_BENCH_THREADS="$threads"
scripts/fetch-models.sh >/dev/null
scripts/build-web.sh >/dev/null
cargo build -q --release -p tinyllm-native
native="$CARGO_TARGET_DIR/release/tinyllm-native"
models_dir="${TINYLLM_MODELS:-${TINYLLM_CACHE:-$HOME/.cache/tinyllm}/models}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# $1: pass number. One JSON per model and thread count: 128-token prompt, 64 decoded tokens.
native_pass() {
  for m in gemma-3-270m-q4_k_m.gguf qwen2.5-coder-0.5b-instruct-q4_k_m.gguf; do
    for t in ${threads//,/ }; do
      "$native" bench -m "$models_dir/$m" --threads "$t" --prompt-tokens 128 --decode-tokens 64 \
        --repetitions 3 --json >"$out/$1.$m.$t.json"
    done
  done
}
echo "native pass 1"
native_pass 1
echo "browser (a few minutes per model and thread count)"
cargo test -q --release -p tinyllm-web --test browser bench -- --ignored --nocapture >"$out/browser.log" 2>&1 ||
  { cat "$out/browser.log"; exit 1; }
echo "native pass 2"
native_pass 2
# The best native rate of the two passes, then the browser table with the native fractions.
python3 - "$out" "$threads" "$CARGO_TARGET_DIR/tmp/web-bench.json" <<'PY'
import json, sys, glob, os
out, threads, raw = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
native = {}
for f in glob.glob(os.path.join(out, "[12].*.json")):
    _, rest = os.path.basename(f).split(".", 1)
    model, t, _ = rest.rsplit(".", 2)
    r = json.load(open(f))["results"][0]
    best = native.setdefault(model, {}).setdefault(t, {"prefill": 0, "decode": 0})
    best["prefill"] = max(best["prefill"], r["prefill_tok_s"])
    best["decode"] = max(best["decode"], r["decode_tok_s"])
def median(v):
    v = sorted(v); return v[len(v) // 2]
print("| model | engine | threads | prefill tok/s | x wllama | % native | decode tok/s | x wllama | % native | wasm memory |")
print("|---|---|---|---|---|---|---|---|---|---|")
for c in json.load(open(raw)):
    if "dispatch" in c:
        d = c["dispatch"]
        print(f"hand-off per op, {c['build']}, {c['threads']} threads, after {d.get('serial_us', 0):.1f} us of serial work: rayon {d.get('rayon_us', float('nan')):.1f} us, team {d.get('team_us', float('nan')):.1f} us")
        continue
    t = str(c["threads"]); nat = native.get(c["model"], {}).get(t, {})
    w = c["wllama"]
    wp = median([x["prefill_tok_s"] for r in w for x in r["runs"]])
    wd = median([x["decode_tok_s"] for r in w for x in r["runs"]])
    rows = [(name, rs) for name, rs in c["tinyllm"]] + [("wllama", w)]
    for name, rs in rows:
        p = median([x["prefill_tok_s"] for r in rs for x in r["runs"]])
        d = median([x["decode_tok_s"] for r in rs for x in r["runs"]])
        mem = max((r.get("wasmBytes") or 0) for r in rs) / 1e6
        frac = lambda v, k: f"{100 * v / nat[k]:.0f}%" if nat and c["path"] == "cpu" else "-"
        print(f"| {c['model']} | {name} | {t} | {p:.1f} | {p / wp:.2f}x | {frac(p, 'prefill')} | {d:.1f} | {d / wd:.2f}x | {frac(d, 'decode')} | {mem:.0f} MB |" if name != "wllama" else
              f"| {c['model']} | wllama | {t} | {p:.1f} | 1.00x | {frac(p, 'prefill')} | {d:.1f} | 1.00x | {frac(d, 'decode')} | page {((rs[0]['page'] or {}).get('totalBytes') or 0) / 1e6:.0f} MB |")
for m, ts in sorted(native.items()):
    for t, r in sorted(ts.items()):
        print(f"native {m} {t} threads: prefill {r['prefill']:.1f} / decode {r['decode']:.1f} tok/s (best of two passes)")
PY
