//! The tree shows the design (docs/ARCHITECTURE.md, "The code"): the engine (`src/engine/`),
//! the exporter (`src/export/`) and the cluster diagnostics (`src/diagnose/`) do no I/O and
//! import no shell, no module imports itself back through others, and modules import in the
//! order the tree states. This reads the sources, outside `#[cfg(test)]` modules and comments.

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

/// What the pure modules may not use: I/O, the clock, the kube client, a shell.
const NO_IO: &[&str] = &[
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
    let found = offences("src/engine", NO_IO)?;
    assert!(found.is_empty(), "{found:#?}");
    Ok(())
}

#[test]
fn the_exporter_does_no_io_and_imports_no_shell() -> Result<()> {
    let found = offences("src/export", NO_IO)?;
    assert!(found.is_empty(), "{found:#?}");
    Ok(())
}

#[test]
fn the_certificate_plan_does_no_io_and_imports_no_shell() -> Result<()> {
    let found = offences("src/certs", NO_IO)?;
    assert!(found.is_empty(), "{found:#?}");
    Ok(())
}

#[test]
fn the_diagnostics_do_no_io_and_import_no_shell() -> Result<()> {
    let found = offences("src/diagnose", NO_IO)?;
    assert!(found.is_empty(), "{found:#?}");
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

// === The import graph ===

/// A source file's module path (`engine::inject::facts` for src/engine/inject/facts.rs,
/// `engine::inject` for its mod.rs; the crate root is empty).
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).unwrap_or(file);
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The paths a file's code names from the crate root: `crate::a::b` as written, and
/// `super::a` resolved against the file's module. Group imports (`crate::a::{b, c::d}`) are
/// expanded one level, which is as deep as this code base writes them.
fn named_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    for (start, prefix) in code
        .match_indices("crate::")
        .map(|(i, _)| (i, "crate"))
        .chain(code.match_indices("super::").map(|(i, _)| (i, "super")))
    {
        if code[..start].ends_with(|c: char| ident(c) || c == ':') {
            continue;
        }
        let mut base: Vec<String> = match prefix {
            "crate" => Vec::new(),
            // `super` of a.rs and of a/mod.rs alike is the module that declares `a`.
            _ => module[..module.len().saturating_sub(1)].to_vec(),
        };
        let mut rest = &code[start + prefix.len() + 2..];
        while rest.starts_with("super::") {
            base.pop();
            rest = &rest["super::".len()..];
        }
        let end = rest
            .find(|c: char| !(ident(c) || c == ':'))
            .unwrap_or(rest.len());
        let path: Vec<String> = rest[..end]
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        let head: Vec<String> = base.iter().cloned().chain(path).collect();
        if rest[end..].starts_with('{') {
            let group = &rest[end + 1..rest[end..].find('}').map_or(rest.len(), |i| end + i)];
            for item in group.split(',') {
                let item = match item.trim() {
                    "self" => "",
                    item => item,
                };
                let mut full = head.clone();
                full.extend(
                    item.split("::")
                        .map(|s| s.split_whitespace().next().unwrap_or(""))
                        .filter(|s| !s.is_empty() && s.chars().all(ident))
                        .map(str::to_owned),
                );
                out.push(full);
            }
        } else {
            out.push(head);
        }
    }
    out
}

/// Every source file with the modules it imports: the longest module a named path starts
/// with (a type or function in it names its file).
fn import_graph() -> Result<Vec<(String, Vec<String>)>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files)?;
    files.sort();
    let modules: Vec<Vec<String>> = files.iter().map(|f| module_of(&root, f)).collect();
    let mut graph = Vec::new();
    for (file, module) in files.iter().zip(&modules) {
        let mut imports: Vec<String> = named_paths(&code(file)?, module)
            .iter()
            .filter_map(|path| {
                modules
                    .iter()
                    .filter(|m| !m.is_empty() && path.starts_with(m))
                    .max_by_key(|m| m.len())
            })
            .filter(|m| *m != module)
            .map(|m| m.join("::"))
            .collect();
        imports.sort();
        imports.dedup();
        graph.push((module.join("::"), imports));
    }
    Ok(graph)
}

/// No module imports, through any number of others, a module that imports it. A folder's
/// mod.rs may re-export its files, so a file of the folder imports its siblings, never the
/// folder's re-exports.
#[test]
fn no_import_circle() -> Result<()> {
    let graph = import_graph()?;
    let edges = |m: &str| {
        graph
            .iter()
            .find(|(n, _)| n == m)
            .map(|(_, i)| i.clone())
            .unwrap_or_default()
    };
    for (start, _) in &graph {
        // Depth-first from `start`, looking for a way back to it.
        let mut stack: Vec<Vec<String>> = vec![vec![start.clone()]];
        let mut seen = std::collections::BTreeSet::new();
        while let Some(path) = stack.pop() {
            let last = path.last().cloned().unwrap_or_default();
            for next in edges(&last) {
                if next == *start {
                    return Err(format!(
                        "an import circle: {} -> {start}",
                        path.join(" -> ")
                    ));
                }
                if seen.insert(next.clone()) {
                    let mut longer = path.clone();
                    longer.push(next);
                    stack.push(longer);
                }
            }
        }
    }
    Ok(())
}

/// The stated order (docs/ARCHITECTURE.md, "The code"): a module imports only modules listed
/// before it, or its own. Within a folder, the files' order is told by `no_import_circle`.
const ORDER: &[&str] = &[
    "engine::overrides",
    "engine::messages",
    "engine::json",
    "engine::view",
    "engine::context",
    "engine::template",
    "engine::fit",
    "engine::config",
    "engine::inject",
    "engine::validate",
    "engine::review",
    "engine::memo",
    "engine::manifest",
    "engine::explain",
    "engine::uninject",
    "engine",
    "export",
    "diagnose",
    "certs",
    "load",
    "server",
    "cli",
    "",
    "main",
];

/// The unit of [`ORDER`] a module belongs to.
fn unit(module: &str) -> Option<usize> {
    ORDER
        .iter()
        .enumerate()
        .filter(|(_, u)| module == **u || u.is_empty() || module.starts_with(&format!("{u}::")))
        .max_by_key(|(_, u)| u.len())
        .map(|(i, _)| i)
}

#[test]
fn imports_follow_the_stated_order() -> Result<()> {
    let mut found = Vec::new();
    for (module, imports) in import_graph()? {
        let Some(own) = unit(&module) else {
            found.push(format!("{module} is in no unit of ORDER"));
            continue;
        };
        for import in imports {
            match unit(&import) {
                Some(theirs) if theirs <= own => {}
                _ => found.push(format!("{module} imports {import}, listed after it")),
            }
        }
    }
    assert!(found.is_empty(), "{found:#?}");
    Ok(())
}

/// docs/ARCHITECTURE.md's tree lists the units in [`ORDER`]'s order.
#[test]
fn the_architecture_lists_the_stated_order() -> Result<()> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/ARCHITECTURE.md");
    let doc = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let tree = doc
        .split("## The code")
        .nth(1)
        .ok_or("docs/ARCHITECTURE.md has no section \"The code\"")?;
    let mut at = 0;
    // The roots (lib.rs, main.rs) and the engine's own mod.rs are not rooms of the tree.
    for u in ORDER
        .iter()
        .filter(|u| !["", "engine", "main"].contains(*u))
    {
        let leaf = u.rsplit("::").next().unwrap_or(u);
        let entry = [format!("── {leaf}.rs"), format!("── {leaf}/")]
            .into_iter()
            .filter_map(|e| tree[at..].find(&e).map(|i| at + i))
            .min()
            .ok_or(format!(
                "docs/ARCHITECTURE.md's tree does not list {u} after the units before it"
            ))?;
        at = entry;
    }
    Ok(())
}
