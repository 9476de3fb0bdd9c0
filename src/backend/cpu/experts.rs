//! The CPU's ops for routed experts and latent attention ([`crate::backend::moe`]): routing,
//! the expert-grouped matmul, the weighted sum of expert outputs, strided copies and gpt-oss's
//! clamped SwiGLU.
//!
//! The grouped matmul sorts a pass's (row, slot) pairs by expert, gathers each expert's input
//! rows, and runs the ordinary tile kernels over that expert's weight rows only: each chosen
//! expert's weights are streamed once per pass for all the rows that chose it, and experts no
//! row chose are never touched (a decode step reads `k` experts, not all of them).

use std::borrow::Cow;

use super::{Columns, CpuBackend, CpuBuffer, CpuWeight, WeightData, MATMUL_TILE};
use crate::backend::checks::shape;
use crate::backend::error::BackendError;
use crate::backend::moe::{self, expert_id, MatId, Route, Strided};
use crate::quant;

impl CpuWeight {
    /// Rows per stacked matrix.
    fn mat_rows(&self) -> usize {
        self.n_out / self.mats
    }

    /// Row `r` of a matrix or vector decoded to f32 (`out`: `n_in` values).
    fn decode_row(&self, r: usize, out: &mut [f32]) -> Result<(), BackendError> {
        match &self.data {
            WeightData::Dense(v) => out.copy_from_slice(&v[r * self.n_in..(r + 1) * self.n_in]),
            WeightData::Interleaved(_) => {
                let mut row = Vec::new();
                super::interleave::row(self.ty, self.n_in, self.bytes(), r, &mut row);
                quant::dequantize(self.ty, &row, out)?;
            }
            _ => quant::dequantize(self.ty, self.rows(r, 1), out)?,
        }
        Ok(())
    }

    /// All the weight's values as f32: borrowed for vectors and biases (decoded at load),
    /// decoded now for small matrices (a conv kernel).
    pub(super) fn values(&self) -> Result<Cow<'_, [f32]>, BackendError> {
        if let WeightData::Dense(v) = &self.data {
            return Ok(Cow::Borrowed(v));
        }
        let mut out = vec![0f32; self.n_in * self.n_out.max(1)];
        for (r, row) in out.chunks_exact_mut(self.n_in).enumerate() {
            self.decode_row(r, row)?;
        }
        Ok(Cow::Owned(out))
    }
}

/// The ids of `n` pairs from an ids buffer, each checked against `n_mat`.
fn read_ids(ids: &[f32], n: usize, n_mat: usize) -> Result<Vec<usize>, BackendError> {
    ids[..n].iter().map(|&v| expert_id(v, n_mat)).collect()
}

impl CpuBackend {
    pub(super) fn route(
        &self,
        logits: &CpuBuffer,
        rows: usize,
        route: &Route,
        bias: Option<&CpuWeight>,
        ids: &mut CpuBuffer,
        weights: &mut CpuBuffer,
    ) -> Result<(), BackendError> {
        let bias = bias.map(CpuWeight::values).transpose()?;
        route.check_call(
            rows,
            logits.0.len(),
            bias.as_ref().map(|b| b.len()),
            ids.0.len(),
            weights.0.len(),
        )?;
        let (n, k) = (route.n_expert, route.k);
        for r in 0..rows {
            route.row(
                &logits.0[r * n..(r + 1) * n],
                bias.as_deref(),
                &mut ids.0[r * k..(r + 1) * k],
                &mut weights.0[r * k..(r + 1) * k],
            );
        }
        Ok(())
    }

    pub(super) fn grouped_matmul(
        &self,
        w: &CpuWeight,
        bias: Option<&CpuWeight>,
        x: &CpuBuffer,
        ids: &CpuBuffer,
        m: MatId,
        out: &mut CpuBuffer,
    ) -> Result<(), BackendError> {
        let (k, n, n_mat) = (w.n_in, w.mat_rows(), w.mats);
        if matches!(w.data, WeightData::Dense(_)) {
            return Err(shape(
                "matmul_id",
                format!("'{}' is a vector, expected matrices", w.name),
            ));
        }
        let bias_len = bias.map(|b| b.n_in * b.n_out.max(1));
        m.check(k, n, n_mat, bias_len, x.0.len(), ids.0.len(), out.0.len())?;
        let pairs = m.pairs();
        let ids = read_ids(&ids.0, pairs, n_mat)?;
        // Pairs in expert order (stable: by pair within an expert), and each expert's run.
        let mut order: Vec<usize> = (0..pairs).collect();
        order.sort_by_key(|&p| ids[p]);
        let mut groups: Vec<(usize, usize, usize)> = Vec::new(); // (expert, first, count)
        for (i, &p) in order.iter().enumerate() {
            match groups.last_mut() {
                Some((e, _, c)) if *e == ids[p] => *c += 1,
                _ => groups.push((ids[p], i, 1)),
            }
        }
        // xg: [pairs, k] inputs in expert order; og: [pairs, n] outputs in the same order.
        let mut xg = vec![0f32; pairs * k];
        for (dst, &p) in xg.chunks_exact_mut(k).zip(&order) {
            let r = m.input_of(p);
            dst.copy_from_slice(&x.0[r * k..(r + 1) * k]);
        }
        let acts = groups
            .iter()
            .map(|&(_, first, count)| (self.kernels.prepare)(w.ty, &xg[first * k..(first + count) * k], k))
            .collect::<Result<Vec<_>, _>>()?;
        let mut og = vec![0f32; pairs * n];
        let tiles = n.div_ceil(MATMUL_TILE);
        let cols: Vec<Columns> = {
            let mut rest = og.as_mut_slice();
            let mut cols = Vec::with_capacity(groups.len());
            for &(_, _, count) in &groups {
                let (head, tail) = rest.split_at_mut(count * n);
                cols.push(Columns::new(head, count, n));
                rest = tail;
            }
            cols
        };
        let (tile_fn, ty, layout) = (self.kernels.tile, w.ty, w.layout());
        self.pool.for_each_index(groups.len() * tiles, |t| {
            let (g, tile) = (t / tiles, t % tiles);
            let e = groups[g].0;
            let r0 = tile * MATMUL_TILE;
            let nw = MATMUL_TILE.min(n - r0);
            // SAFETY: task `t` alone handles rows `r0..r0 + nw` of expert group `g`, so it alone
            // touches those columns of the group's part of `og`, and `r0 + nw <= n`.
            let mut out_tile = unsafe { cols[g].tile(r0, nw) };
            tile_fn(ty, layout, k, w.rows(e * n + r0, nw), &acts[g], &mut out_tile);
        });
        drop(cols);
        let bias = bias.map(CpuWeight::values).transpose()?;
        for (src, &p) in og.chunks_exact(n).zip(&order) {
            let dst = &mut out.0[p * n..(p + 1) * n];
            dst.copy_from_slice(src);
            if let Some(b) = &bias {
                let e = ids[p];
                dst.iter_mut().zip(&b[e * n..(e + 1) * n]).for_each(|(d, &v)| *d += v);
            }
        }
        Ok(())
    }

    pub(super) fn combine(
        &self,
        experts: &CpuBuffer,
        weights: &CpuBuffer,
        rows: usize,
        slots: usize,
        width: usize,
        out: &mut CpuBuffer,
    ) -> Result<(), BackendError> {
        moe::check_combine(rows, slots, width, experts.0.len(), weights.0.len(), out.0.len())?;
        for r in 0..rows {
            let o = &mut out.0[r * width..(r + 1) * width];
            o.fill(0.0);
            for j in 0..slots {
                let p = r * slots + j;
                let wgt = weights.0[p];
                o.iter_mut()
                    .zip(&experts.0[p * width..(p + 1) * width])
                    .for_each(|(o, &e)| *o += wgt * e);
            }
        }
        Ok(())
    }

    pub(super) fn strided(&self, src: &CpuBuffer, dst: &mut CpuBuffer, c: &Strided) -> Result<(), BackendError> {
        c.check(src.0.len(), dst.0.len())?;
        for i in 0..c.count {
            let (s, d) = (c.src_off + i * c.src_stride, c.dst_off + i * c.dst_stride);
            dst.0[d..d + c.width].copy_from_slice(&src.0[s..s + c.width]);
        }
        Ok(())
    }

    pub(super) fn oai_glu(
        &self,
        gate: &mut CpuBuffer,
        up: &CpuBuffer,
        len: usize,
        alpha: f32,
        limit: f32,
    ) -> Result<(), BackendError> {
        self.gated("swiglu_oai", gate, up, len, move |g: &mut [f32], u: &[f32]| {
            g.iter_mut()
                .zip(u)
                .for_each(|(g, &u)| *g = moe::swiglu_oai(*g, u, alpha, limit));
        })
    }
}
