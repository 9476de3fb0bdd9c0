//! When the process started (as near as Rust gets: `main`'s first line), for `bench`'s startup
//! timings.

pub static PROCESS_START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
