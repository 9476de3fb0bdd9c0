//! `tinyllm-native`: the command-line front end of the engine.
//!
//! `main` only maps the outcome of [`try_main`] to an exit code: 0 ok, 1 runtime error,
//! 2 usage or input error (bad flag, unreadable or malformed model, bad ids or messages).

mod aliases;
mod allocator;
mod cli;
mod clock;
mod error;
mod models;
mod pull;
mod server;

use std::process::ExitCode;

fn main() -> ExitCode {
    clock::PROCESS_START.get_or_init(std::time::Instant::now);
    allocator::keep_freed_memory();
    match try_main() {
        Ok(()) => ExitCode::SUCCESS,
        // A closed stdout (`| head`) is the reader's choice, not an error worth reporting.
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(cli::exit_code(&err))
        }
    }
}

fn try_main() -> anyhow::Result<()> {
    cli::run()
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
