//! Every relative link in README.md and docs/*.md resolves: the file (or directory) it names
//! exists, and a `#anchor` names a heading of the Markdown file it points into, computed the way
//! GitHub computes heading anchors. The README is a front door that links the reference in
//! docs/, so a section moved or renamed there must not leave a dead link behind.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The lines of a Markdown text outside fenced code blocks, with their line numbers (from 1).
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m => fence = None,
            (None, None) => out.push((i + 1, line)),
            _ => {}
        }
    }
    out
}

/// A line with its inline code spans (`...`) removed, so a link written as code is not a link.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code {
            out.push(c);
        }
    }
    out
}

/// The targets of the inline links `[text](target)` on a line.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut targets = Vec::new();
    let mut rest = line.as_str();
    while let Some(start) = rest.find("](") {
        let after = &rest[start + 2..];
        let mut depth = 0usize;
        let mut end = None;
        for (i, c) in after.char_indices() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => {
                    end = Some(i);
                    break;
                }
                ')' => depth -= 1,
                _ => {}
            }
        }
        let Some(end) = end else { break };
        let target = after[..end].trim();
        // `[text](target "title")`: the target is the first word.
        let target = target.split_whitespace().next().unwrap_or("");
        targets.push(target.trim_matches(['<', '>']).to_string());
        rest = &after[end + 1..];
    }
    targets
}

/// The heading's text as GitHub renders it: inline links reduced to their text, emphasis and
/// code markers dropped by the anchor rule below.
fn heading_text(raw: &str) -> String {
    let mut text = String::new();
    let mut rest = raw;
    while let Some(open) = rest.find('[') {
        let Some(mid) = rest[open..].find("](") else {
            break;
        };
        let Some(close) = rest[open + mid..].find(')') else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..open + mid]);
        rest = &rest[open + mid + close + 1..];
    }
    text.push_str(rest);
    text
}

/// GitHub's anchor for a heading: lowercase; letters, digits, `-` and `_` kept, each space
/// turned into `-`, everything else dropped.
fn anchor(heading: &str) -> String {
    heading_text(heading)
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown text's headings; a repeated heading gets `-1`, `-2`, ... as on GitHub.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = HashSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = anchor(line[hashes..].trim().trim_end_matches('#'));
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The broken relative links of one Markdown file, `file:line: target: why`. `read` gives the
/// text of another Markdown file (None if it does not exist), `exists` whether a path exists.
fn broken_links(
    file: &Path,
    text: &str,
    read: &dyn Fn(&Path) -> Option<String>,
    exists: &dyn Fn(&Path) -> bool,
) -> Vec<String> {
    let dir = file.parent().unwrap_or(Path::new(""));
    let mut broken = Vec::new();
    for (number, line) in prose_lines(text) {
        for target in link_targets(line) {
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = match target.split_once('#') {
                Some((path, fragment)) => (path, Some(fragment)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.to_path_buf()
            } else {
                dir.join(path)
            };
            let say = |why: &str| format!("{}:{number}: {target}: {why}", file.display());
            if !path.is_empty() && !exists(&resolved) {
                broken.push(say("no such file"));
                continue;
            }
            let Some(fragment) = fragment else { continue };
            if resolved.extension().is_none_or(|e| e != "md") {
                broken.push(say("an anchor into a file that is not Markdown"));
                continue;
            }
            let target_text = if path.is_empty() {
                Some(text.to_string())
            } else {
                read(&resolved)
            };
            match target_text {
                Some(t) if anchors(&t).contains(fragment) => {}
                Some(_) => broken.push(say("no heading has this anchor")),
                None => broken.push(say("cannot be read")),
            }
        }
    }
    broken
}

fn documents() -> Result<Vec<PathBuf>> {
    let root = root();
    let mut files = vec![root.join("README.md")];
    let docs = root.join("docs");
    for entry in std::fs::read_dir(&docs).with_context(|| docs.display().to_string())? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

#[test]
fn every_relative_link_in_the_readme_and_docs_resolves() -> Result<()> {
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    let exists = |p: &Path| p.exists();
    let files = documents()?;
    let mut broken = Vec::new();
    let mut links = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).with_context(|| file.display().to_string())?;
        links += prose_lines(&text)
            .iter()
            .map(|(_, l)| link_targets(l).len())
            .sum::<usize>();
        broken.extend(broken_links(file, &text, &read, &exists));
    }
    if links == 0 {
        bail!(
            "no links found in {} files: the reader is broken",
            files.len()
        );
    }
    if !broken.is_empty() {
        bail!("broken links:\n{}", broken.join("\n"));
    }
    Ok(())
}

#[test]
fn anchors_are_computed_as_github_does() {
    assert_eq!(
        anchor("`export`: admission policies that need no injector"),
        "export-admission-policies-that-need-no-injector"
    );
    assert_eq!(
        anchor("When the injector is down: the backstop and policy mode"),
        "when-the-injector-is-down-the-backstop-and-policy-mode"
    );
    assert_eq!(
        anchor("The image (`make image`, `docker/`)"),
        "the-image-make-image-docker"
    );
    assert_eq!(
        anchor("Who is injected: pods, namespaces, revisions"),
        "who-is-injected-pods-namespaces-revisions"
    );
    assert_eq!(
        anchor("Results at 80e1456 (27 November, 11:08–11:28; 1.47× / 1.31×)"),
        "results-at-80e1456-27-november-11081128-147--131"
    );
    assert_eq!(
        anchor("snake_case and [a link](x.md)"),
        "snake_case-and-a-link"
    );
    let repeated = anchors("# Same\n\n## Same\n```\n# not a heading\n```\n#not either\n");
    assert_eq!(
        repeated,
        HashSet::from(["same".to_string(), "same-1".to_string()])
    );
}

#[test]
fn a_broken_link_is_found() {
    let files: HashMap<PathBuf, String> = HashMap::from([
        (
            PathBuf::from("docs/A.md"),
            "# A\n\n## Part one\n".to_string(),
        ),
        (PathBuf::from("docs/picture.png"), String::new()),
    ]);
    let read = |p: &Path| files.get(p).cloned();
    let exists = |p: &Path| files.contains_key(p);
    let text = "# B\n\
                [fine](A.md#part-one) [fine too](#b) [web](https://example.com/x#y)\n\
                [gone](Missing.md) [bad anchor](A.md#part-two) [own](#nowhere)\n\
                [not markdown](picture.png#top) `[code](Missing.md)`\n\
                ```\n[fenced](Missing.md)\n```\n";
    let broken = broken_links(Path::new("docs/B.md"), text, &read, &exists);
    assert_eq!(
        broken,
        vec![
            "docs/B.md:3: Missing.md: no such file",
            "docs/B.md:3: A.md#part-two: no heading has this anchor",
            "docs/B.md:3: #nowhere: no heading has this anchor",
            "docs/B.md:4: picture.png#top: an anchor into a file that is not Markdown",
        ]
    );
}
