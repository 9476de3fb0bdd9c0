//! Pauses the tests ask for through the environment, in a module of their own so the engine
//! thread and the loader reach them without importing the server's root.

/// A pause a test asks for through the environment variable `var` (milliseconds); zero when
/// it is unset, as in every real run. A set hook is said on stderr as a warning: it slows a
/// real server down, and a value left in a shell's environment would otherwise go unnoticed.
pub fn test_delay(var: &str) -> std::time::Duration {
    let Some(value) = std::env::var_os(var) else {
        return std::time::Duration::ZERO;
    };
    match value.to_str().and_then(|v| v.parse::<u64>().ok()) {
        Some(ms) => {
            eprintln!("warning: {var}={ms} is set: a test hook that adds {ms} ms (unset it outside tests)");
            std::time::Duration::from_millis(ms)
        }
        None => {
            eprintln!("warning: {var}={value:?} is set but is not a number of milliseconds: ignored (a test hook)");
            std::time::Duration::ZERO
        }
    }
}
