//! What a command reads (a file named on the command line, or standard input) and writes
//! (standard output, and notes on standard error).

use std::io::{Read as _, Write as _};
use std::path::Path;

use anyhow::Context as _;

pub(crate) fn read_input(path: &Path) -> anyhow::Result<Vec<u8>> {
    if path == Path::new("-") {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .context("cannot read standard input")?;
        Ok(buf)
    } else {
        std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
    }
}

pub(crate) fn read_text(path: &Path) -> anyhow::Result<String> {
    String::from_utf8(read_input(path)?)
        .with_context(|| format!("{} is not UTF-8 text", path.display()))
}

pub(crate) fn write_stdout(bytes: &[u8]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)?;
    out.flush()?;
    Ok(())
}

/// One `note:` line on standard error for each of `lines`. A note that cannot be written is
/// lost, not an error: the command's output is already out.
pub(crate) fn write_notes(lines: &[String]) {
    write_prefixed("note", lines);
}

/// One `warning:` line on standard error for each of `lines`, as [`write_notes`].
pub(crate) fn write_warnings(lines: &[String]) {
    write_prefixed("warning", lines);
}

/// One `error:` line on standard error for each of `lines`, as [`write_notes`].
pub(crate) fn write_errors(lines: &[String]) {
    write_prefixed("error", lines);
}

fn write_prefixed(prefix: &str, lines: &[String]) {
    let mut err = std::io::stderr().lock();
    for line in lines {
        let _ = writeln!(err, "{prefix}: {line}");
    }
}
