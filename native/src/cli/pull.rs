//! `pull ALIAS|URL`: fetch a model into the cache (see `crate::pull`).

#[derive(clap::Args)]
pub struct Args {
    /// A model alias (`qwen2.5-coder:0.5b`, `gemma3:270m`) or an http(s) URL of a file.
    model: String,
    /// Expected SHA-256 (hex) of a URL's file; a mismatch deletes the download. Aliases carry
    /// their own.
    #[arg(long, value_name = "HEX")]
    sha256: Option<String>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let pulled = crate::pull::pull(&a.model, a.sha256.as_deref(), &crate::models::cache_dir())
        .map_err(crate::pull::PullError::into_cli)?;
    if pulled.cached {
        println!("ok (cached) {}", pulled.path.display());
    } else {
        println!("ok {}", pulled.path.display());
    }
    Ok(())
}
