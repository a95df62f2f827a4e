//! The tree shows the design (docs/ARCHITECTURE.md, "The code"): the engine (`src/engine/`) and
//! the exporter (`src/export/`) do no I/O and import no shell, and the shells import one another
//! in one direction only (cli → server → load). This reads the sources, outside `#[cfg(test)]`
//! modules and comments.

use std::path::{Path, PathBuf};

type Result<T> = std::result::Result<T, String>;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The code of a file: up to its `#[cfg(test)]` module, without comment lines.
fn code(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let end = text.find("#[cfg(test)]").unwrap_or(text.len());
    Ok(text[..end]
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n"))
}

fn offences(dir: &str, forbidden: &[&str]) -> Result<Vec<String>> {
    let mut files = Vec::new();
    sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join(dir), &mut files)?;
    if files.is_empty() {
        return Err(format!("no sources under {dir}"));
    }
    let mut found = Vec::new();
    for file in files {
        let code = code(&file)?;
        for word in forbidden {
            if code.contains(word) {
                found.push(format!("{} uses {word}", file.display()));
            }
        }
    }
    Ok(found)
}

/// What no pure module may use: I/O, the clock, the kube client, a shell module.
const IMPURE: &[&str] = &[
    "tokio",
    "std::fs",
    "std::net",
    "std::env",
    "std::process",
    "std::time::SystemTime",
    "kube::Client",
    "crate::server",
    "crate::cli",
    "crate::load",
];

#[test]
fn the_engine_does_no_io_and_imports_no_shell() -> Result<()> {
    for dir in ["src/engine", "src/export"] {
        let found = offences(dir, IMPURE)?;
        assert!(found.is_empty(), "{found:#?}");
    }
    Ok(())
}

#[test]
fn the_shells_import_in_one_direction() -> Result<()> {
    let found = offences("src/server", &["crate::cli"])?;
    assert!(found.is_empty(), "{found:#?}");
    let load = code(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src/load.rs"))?;
    for word in ["crate::server", "crate::cli"] {
        assert!(!load.contains(word), "src/load.rs uses {word}");
    }
    Ok(())
}
