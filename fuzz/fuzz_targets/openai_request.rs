//! libFuzzer entry for `targets::openai_request` (see `fuzz/targets.rs`).
#![no_main]

#[path = "../targets.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| targets::openai_request(data));
