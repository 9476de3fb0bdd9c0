//! STUB: IQ grids (tables from ggml-common.h).
