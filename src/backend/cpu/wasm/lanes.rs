//! What the wasm kernel files share: the byte dot products of each instruction set ([`Dot`]:
//! SIMD128, relaxed SIMD), a format's kernels for each activation group ([`Family`]) and the
//! vector loads, apart from the dispatcher in `mod.rs`, which imports the kernel files.

use core::arch::wasm32::*;

use crate::backend::cpu::interleave::TILE_ROWS;
use crate::backend::cpu::tile::Activations;

/// Rows of a tile that one vector holds (a 32-bit lane each).
pub(super) const HALF: usize = 4;
const _: () = assert!(TILE_ROWS == 2 * HALF);

/// Byte dot products of one instruction set: per 32-bit lane, the sum of the four products of
/// its bytes in `w` and in an activation (four bytes repeated in every lane), accumulated.
pub trait Dot {
    /// An activation's four bytes, prepared once for every weight vector they meet.
    type A: Copy;
    /// A running sum; [`Dot::sum`] gives its i32 lanes.
    type Acc: Copy;
    /// Prepare four activation bytes (`a`: the same four bytes in every lane).
    fn act(a: v128) -> Self::A;
    fn zero() -> Self::Acc;
    /// `acc +` the lane sums of `w · a`, every byte of `w` in 0..=127.
    fn u7(acc: Self::Acc, w: v128, a: Self::A) -> Self::Acc;
    /// `acc +` the lane sums of `w · a`, `w` any signed byte but -128 (see the module doc).
    fn i8(acc: Self::Acc, w: v128, a: Self::A) -> Self::Acc;
    /// The four i32 lane sums.
    fn sum(acc: Self::Acc) -> v128;
    /// Whether the set has a byte dot product instruction ([`Dot::u7_bytes16`] one
    /// instruction, so unsigned weights beat signed ones).
    const BYTE_DOT: bool;
    /// `acc +` the i32 lane sums of `w · a`, 16 signed bytes each (`w` not -128; the row
    /// kernels of `unpacked.rs`, whose activations are a whole vector, not four bytes repeated).
    fn bytes16(acc: v128, w: v128, a: v128) -> v128;
    /// [`Dot::bytes16`] with every byte of `w` in 0..=127.
    fn u7_bytes16(acc: v128, w: v128, a: v128) -> v128;
}

/// SIMD128 byte dot products: widened to i16, pairs summed by `i32x4.dot_i16x8_s`. The low
/// eight bytes of `w` are rows 0 and 1 (four each), the high eight rows 2 and 3: each half
/// accumulates two partial sums per row, folded into one lane per row by [`Dot::sum`].
pub struct Simd128;

impl Dot for Simd128 {
    /// The four bytes as i16, twice: the low (and high) eight bytes of a weight vector meet it.
    type A = v128;
    /// Rows 0-1 and rows 2-3, two partial sums each.
    type Acc = (v128, v128);

    #[inline(always)]
    fn act(a: v128) -> v128 {
        i16x8_extend_low_i8x16(a)
    }

    #[inline(always)]
    fn zero() -> (v128, v128) {
        (i32x4_splat(0), i32x4_splat(0))
    }

    #[inline(always)]
    fn u7(acc: (v128, v128), w: v128, a: v128) -> (v128, v128) {
        Self::i8(acc, w, a)
    }

    #[inline(always)]
    fn i8(acc: (v128, v128), w: v128, a: v128) -> (v128, v128) {
        (
            i32x4_add(acc.0, i32x4_dot_i16x8(i16x8_extend_low_i8x16(w), a)),
            i32x4_add(acc.1, i32x4_dot_i16x8(i16x8_extend_high_i8x16(w), a)),
        )
    }

    #[inline(always)]
    fn sum(acc: (v128, v128)) -> v128 {
        i32x4_add(
            i32x4_shuffle::<0, 2, 4, 6>(acc.0, acc.1),
            i32x4_shuffle::<1, 3, 5, 7>(acc.0, acc.1),
        )
    }

    const BYTE_DOT: bool = false;

    #[inline(always)]
    fn bytes16(acc: v128, w: v128, a: v128) -> v128 {
        let lo = i32x4_dot_i16x8(i16x8_extend_low_i8x16(w), i16x8_extend_low_i8x16(a));
        let hi = i32x4_dot_i16x8(i16x8_extend_high_i8x16(w), i16x8_extend_high_i8x16(a));
        i32x4_add(acc, i32x4_add(lo, hi))
    }

    #[inline(always)]
    fn u7_bytes16(acc: v128, w: v128, a: v128) -> v128 {
        Self::bytes16(acc, w, a)
    }
}

/// Relaxed-SIMD byte dot products (`i32x4.relaxed_dot_i8x16_i7x16_add_s`).
#[cfg(target_feature = "relaxed-simd")]
pub struct Relaxed;

#[cfg(target_feature = "relaxed-simd")]
impl Dot for Relaxed {
    type A = v128;
    type Acc = v128;

    #[inline(always)]
    fn act(a: v128) -> v128 {
        a
    }

    #[inline(always)]
    fn zero() -> v128 {
        i32x4_splat(0)
    }

    #[inline(always)]
    fn u7(acc: v128, w: v128, a: v128) -> v128 {
        i32x4_relaxed_dot_i8x16_i7x16_add(a, w, acc)
    }

    #[inline(always)]
    fn i8(acc: v128, w: v128, a: v128) -> v128 {
        // a·sign(w) (negated where w < 0: `(a ^ m) - m` with m all ones there) meets |w|.
        let m = i8x16_shr(w, 7);
        let signed = i8x16_sub(v128_xor(a, m), m);
        i32x4_relaxed_dot_i8x16_i7x16_add(signed, i8x16_abs(w), acc)
    }

    #[inline(always)]
    fn sum(acc: v128) -> v128 {
        acc
    }

    const BYTE_DOT: bool = true;

    #[inline(always)]
    fn bytes16(acc: v128, w: v128, a: v128) -> v128 {
        Self::i8(acc, w, a)
    }

    #[inline(always)]
    fn u7_bytes16(acc: v128, w: v128, a: v128) -> v128 {
        Self::u7(acc, w, a)
    }
}

/// A tile kernel: rows `4·h..` (`h` the half) of the tile at `tile` (`nb` blocks) against
/// activation rows `a0..a0 + C`, returning each row's four results.
pub(super) type HalfFn<const C: usize> =
    unsafe fn(nb: usize, tile: *const u8, h: usize, act: &Activations, a0: usize) -> [v128; C];

/// The kernels of one format for activation groups of 8, 4, 2 and 1 rows.
pub(super) struct Family {
    pub(super) eight: HalfFn<8>,
    pub(super) four: HalfFn<4>,
    pub(super) two: HalfFn<2>,
    pub(super) one: HalfFn<1>,
}

/// Four f16 at `p` as f32 (exact for every finite value, infinities and NaNs kept): the
/// magnitude's bits shifted into an f32's place and rescaled by 2^112, which makes f16
/// subnormals normal exactly.
#[inline(always)]
pub(super) unsafe fn f16x4(p: *const u8) -> v128 {
    let h = u32x4_extend_low_u16x8(v128_load64_zero(p as *const u64));
    let em = u32x4_shl(v128_and(h, u32x4_splat(0x7fff)), 13);
    let sign = u32x4_shl(v128_and(h, u32x4_splat(0x8000)), 16);
    let mag = f32x4_mul(em, f32x4_splat(f32::from_bits(0x7780_0000)));
    let special = u32x4_ge(em, u32x4_splat(0x7c00 << 13));
    let mag = v128_bitselect(v128_or(em, u32x4_splat(0x7f80_0000)), mag, special);
    v128_or(mag, sign)
}

/// Four bytes at `p` in every lane.
#[inline(always)]
pub(super) unsafe fn splat4(p: *const u8) -> v128 {
    v128_load32_splat(p as *const u32)
}

#[inline(always)]
pub(super) unsafe fn load(p: *const u8) -> v128 {
    v128_load(p as *const v128)
}
