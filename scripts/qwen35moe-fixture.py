#!/usr/bin/env python3
"""The qwen35moe fixture and llama.cpp's goldens for it.

qwen35moe is llama.cpp's Qwen3.5 MoE (`src/models/qwen35moe.cpp`): the qwen35 hybrid of
gated-delta-net and full-attention layers with every layer's FFN a routed one (softmax over the
experts, the chosen weights normalized) plus a shared expert gated per token by
`sigmoid(ffn_gate_inp_shexp · x)`. The fixture is made from the qwen35 F16 fixture: the same
keys (under `qwen35moe.`), tokenizer, embedding, attention and recurrent tensors, with each
layer's dense FFN replaced by 8 random experts of 64 (2 used) and a shared expert of 128,
seeded, at the widths and spreads of the other fixtures (the qwen3moe fixture's router spread,
so routing is far from ties).

1. `tests/golden/fixtures/qwen35moe.F16.gguf` (written with the llama.cpp tree's gguf-py);
2. `qwen35moe.Q8_0.gguf` and `qwen35moe.Q4_K_M.gguf` by llama-quantize;
3. each file's goldens `qwen35moe.<TYPE>.golden.jsonl`: the qwen35 F16 goldens' prompts through
   llama-server with the goldens' settings (`-fa off`, `scripts/kv-cache-goldens.py`'s driver),
   greedy with the top-10 probabilities, the format of every golden file.

    scripts/qwen35moe-fixture.py

Needs numpy and pyyaml (for gguf-py): e.g. the project's venv, `pip install numpy pyyaml`.
llama.cpp's tools come from scripts/llama-cpp.sh (the goldens' source) unless LLAMA_SERVER and
LLAMA_QUANTIZE name others. A rerun remakes the same F16 file (fixed seed) and goldens.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests/golden/fixtures"
N_EXPERT, N_USED, N_FF_EXP, N_FF_SHEXP = 8, 2, 64, 128
SEED = 3535


def lowbit_goldens():
    """scripts/lowbit-goldens.py as a module: its tool lookup, llama-server driver (through
    kv-cache-goldens.py) and tensor-type counts are reused."""
    spec = importlib.util.spec_from_file_location("lowbit_goldens", ROOT / "scripts/lowbit-goldens.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


LOWBIT = lowbit_goldens()


def llama_build():
    return Path(LOWBIT.tool("llama-server")).parent.parent


def write_f16(out):
    sys.path.insert(0, str(llama_build().parent / "src/gguf-py"))
    import gguf

    src = gguf.GGUFReader(str(FIXTURES / "qwen35.F16.gguf"))
    w = gguf.GGUFWriter(str(out), "qwen35moe")
    for f in src.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        key = f.name.replace("qwen35.", "qwen35moe.", 1) if f.name.startswith("qwen35.") else f.name
        if key == "general.name":
            w.add_key_value(key, "tiny-random-qwen35moe", gguf.GGUFValueType.STRING)
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), vtype, sub_type=sub)
    w.add_uint32("qwen35moe.expert_count", N_EXPERT)
    w.add_uint32("qwen35moe.expert_used_count", N_USED)
    w.add_uint32("qwen35moe.expert_feed_forward_length", N_FF_EXP)
    w.add_uint32("qwen35moe.expert_shared_feed_forward_length", N_FF_SHEXP)
    rng = np.random.default_rng(SEED)
    n_embd = int(src.fields["qwen35.embedding_length"].contents())

    def normal(shape, std, dtype=np.float16):
        return (rng.standard_normal(shape) * std).astype(dtype)

    for t in src.tensors:
        if any(t.name.endswith(s) for s in ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")):
            if t.name.endswith("ffn_gate.weight"):
                blk = t.name[: -len("ffn_gate.weight")]
                # numpy shapes are GGUF shapes reversed: [n_in, n_out, n_expert] is (e, out, in).
                w.add_tensor(blk + "ffn_gate_inp.weight", normal((N_EXPERT, n_embd), 0.3))
                w.add_tensor(blk + "ffn_gate_exps.weight", normal((N_EXPERT, N_FF_EXP, n_embd), 0.05))
                w.add_tensor(blk + "ffn_up_exps.weight", normal((N_EXPERT, N_FF_EXP, n_embd), 0.05))
                w.add_tensor(blk + "ffn_down_exps.weight", normal((N_EXPERT, n_embd, N_FF_EXP), 0.2))
                w.add_tensor(blk + "ffn_gate_inp_shexp.weight", normal((n_embd,), 0.05, np.float32))
                w.add_tensor(blk + "ffn_gate_shexp.weight", normal((N_FF_SHEXP, n_embd), 0.05))
                w.add_tensor(blk + "ffn_up_shexp.weight", normal((N_FF_SHEXP, n_embd), 0.05))
                w.add_tensor(blk + "ffn_down_shexp.weight", normal((n_embd, N_FF_SHEXP), 0.2))
            continue
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    kv = LOWBIT.kv_goldens()
    os.environ.setdefault("LLAMA_SERVER", LOWBIT.tool("llama-server"))
    base = FIXTURES / "qwen35moe.F16.gguf"
    write_f16(base)
    cases = [json.loads(l) for l in (FIXTURES / "qwen35.F16.golden.jsonl").read_text().splitlines() if l.strip()]
    manifest_path = FIXTURES / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    for ty in ["F16", "Q8_0", "Q4_K_M"]:
        gguf = FIXTURES / f"qwen35moe.{ty}.gguf"
        if ty != "F16":
            subprocess.run([LOWBIT.tool("llama-quantize"), str(base), str(gguf), ty, "2"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        mine = [{**c, "file": gguf.name, "arch": "qwen35moe"} for c in cases]
        golden = kv.generate(gguf, mine, ["-fa", "off"])
        (FIXTURES / f"qwen35moe.{ty}.golden.jsonl").write_text("".join(json.dumps(r) + "\n" for r in golden))
        entry = {
            "file": gguf.name, "arch": "qwen35moe", "type": ty, "bytes": gguf.stat().st_size,
            "golden": f"qwen35moe.{ty}.golden.jsonl", "tensor_type_counts": LOWBIT.tensor_type_counts(gguf),
            "hparams": {"n_expert": N_EXPERT, "n_expert_used": N_USED, "n_ff_exp": N_FF_EXP,
                        "n_ff_shexp": N_FF_SHEXP, "seed": SEED, "base": "qwen35.F16.gguf"},
            "made_by": "scripts/qwen35moe-fixture.py",
        }
        manifest["files"] = [f for f in manifest["files"] if f["file"] != gguf.name] + [entry]
        print(f"qwen35moe.{ty}: {gguf.stat().st_size} bytes, {len(golden)} goldens", flush=True)
    manifest_path.write_text(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    main()
