// attention.wgsl over a q8_0 cache (kv_store_q8_0.wgsl's layout), read block by block as the
// CPU backend reads it (src/backend/cpu/attention_q8.rs) and as llama.cpp's flash attention
// reads a quantized cache: the query is quantized to Q8_0 with the cache's rule, q·k is the
// exact integer sum of each block times both scales, probabilities stay f32, and each V block
// is weighted as it is read (each int8 value times p · d, its scale folded into the
// probability). Heads are whole blocks of 32, so a head's values
// start on a word and its scales are whole f16 halves of the scale words.

@group(0) @binding(2) var<storage, read> KC: array<u32>;
@group(0) @binding(3) var<storage, read> VC: array<u32>;

// The query's int8 values and each block's scale (f16-rounded, as stored).
var<private> qv: array<i32, MAX_HD>;
var<private> qd: array<f32, MAX_HD / 32u>;

/// Value `k` (0..4) of a word of four int8, sign-extended.
fn byte_at(w: u32, k: u32) -> i32 {
    return extractBits(i32(w), 8u * k, 8u);
}

/// The f16 scale of block `g` (counted from value 0 of the cache) of the K cache, whose scale
/// words start at `P.k_scales`: the low half for even blocks, the high half for odd ones.
fn k_scale(g: u32) -> f32 {
    return unpack2x16float(KC[P.k_scales + g / 2u])[g & 1u];
}

/// The same for the V cache.
fn v_scale(g: u32) -> f32 {
    return unpack2x16float(VC[P.v_scales + g / 2u])[g & 1u];
}

/// Quantize the query head at `qb` of Q: d = max|x| / 127 (as f16), q = round(x · 127 / max)
/// (ties to even, WGSL's round), ggml's x86 rule.
fn load_q(qb: u32) {
    for (var b = 0u; b < P.hd_k / 32u; b++) {
        var amax = 0.0;
        for (var i = 0u; i < 32u; i++) {
            amax = max(amax, abs(Q[qb + 32u * b + i]));
        }
        var id = 0.0;
        if (amax != 0.0) {
            id = 127.0 / amax;
        }
        qd[b] = f16r(amax / 127.0);
        for (var i = 0u; i < 32u; i++) {
            qv[32u * b + i] = i32(round(Q[qb + 32u * b + i] * id));
        }
    }
}

/// q·k of the K head at value `kb` (raw: before soft-capping and the scale).
fn dot_k(kb: u32) -> f32 {
    var s = 0.0;
    for (var b = 0u; b < P.hd_k / 32u; b++) {
        let e = kb + 32u * b;
        // At most 32 · 127 · 127 in magnitude: exact.
        var isum = 0;
        for (var w = 0u; w < 8u; w++) {
            let kw = KC[e / 4u + w];
            for (var k = 0u; k < 4u; k++) {
                isum += qv[32u * b + 4u * w + k] * byte_at(kw, k);
            }
        }
        s += (k_scale(e / 32u) * qd[b]) * f32(isum);
    }
    return s;
}

/// Probabilities weight V in f32.
fn prob(p: f32) -> f32 {
    return p;
}

/// acc += p * the V head at value `vb`: each int8 value times its block's weight p · d.
fn add_v(vb: u32, p: f32) {
    for (var b = 0u; b < P.hd_v / 32u; b++) {
        let e = vb + 32u * b;
        let pd = p * v_scale(e / 32u);
        for (var w = 0u; w < 8u; w++) {
            let vw = VC[e / 4u + w];
            for (var k = 0u; k < 4u; k++) {
                acc[32u * b + 4u * w + k] += f32(byte_at(vw, k)) * pd;
            }
        }
    }
}
