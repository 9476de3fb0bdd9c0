//! The grid tables of the codebook formats (IQ1_S to IQ3_S) on the GPU. Each weight buffer of
//! such a format begins with its format's table and the rows follow it:
//! `[table bytes][rows][row_bytes]`. The WGSL decoder (`shaders/quant/iq*.wgsl`, helpers in
//! `iq_grid.wgsl`) reads the table at byte 0 and adds its size to every row offset.
//!
//! Why in the weight buffer: a WGSL constant array indexed at run time is copied into each
//! invocation's private memory (1 to 16 KB here), and a binding of its own would change the
//! layout of every matmul, embedding and expert kernel for seven formats. The tables are at most
//! 16 KB against megabytes of rows, so a copy per buffer costs nothing that matters.

use crate::quant::GgmlType;
use crate::quant::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};

/// The bytes that begin each weight buffer of type `ty` (empty for the formats without a grid):
/// the table's entries in little-endian order, one value per byte, as the WGSL decoder reads
/// them.
pub fn leading_table(ty: GgmlType) -> &'static [u8] {
    use GgmlType::*;
    // The hosts we build for are little-endian, as the GPU reads the words.
    match ty {
        IQ2_XXS => bytemuck::cast_slice(&IQ2XXS_GRID),
        IQ2_XS => bytemuck::cast_slice(&IQ2XS_GRID),
        IQ2_S => bytemuck::cast_slice(&IQ2S_GRID),
        IQ3_XXS => bytemuck::cast_slice(&IQ3XXS_GRID),
        IQ3_S => bytemuck::cast_slice(&IQ3S_GRID),
        IQ1_S | IQ1_M => bytemuck::cast_slice(&IQ1S_GRID),
        _ => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The support table's grid column and the tables agree, and every table keeps the rows
    /// after it 4-byte aligned (buffer writes are).
    #[test]
    fn grid_formats_have_a_table_and_only_they() {
        for &ty in GgmlType::ALL {
            let grid = crate::quant::support_of(ty).is_some_and(|s| s.wgsl_grid);
            let table = leading_table(ty);
            assert_eq!(grid, !table.is_empty(), "{ty}");
            assert!(table.len().is_multiple_of(4), "{ty}");
        }
    }

    /// Each decoder's `IQ_TABLE` is its table's size.
    #[test]
    fn decoders_skip_their_tables() {
        for &ty in GgmlType::ALL {
            let table = leading_table(ty);
            if table.is_empty() {
                continue;
            }
            let path = format!(
                "{}/shaders/quant/{}.wgsl",
                env!("CARGO_MANIFEST_DIR"),
                ty.name().to_lowercase()
            );
            let src = std::fs::read_to_string(&path).expect("decoder");
            assert!(
                src.contains(&format!("const IQ_TABLE: u32 = {}u;", table.len())),
                "{path} does not skip {} bytes",
                table.len()
            );
        }
    }
}
