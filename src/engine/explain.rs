//! `explain`: for each pod or pod template, whether it is injected, why, and what is added.

use std::fmt::Write as _;

use crate::engine::config::Injector;
use crate::engine::manifest::{Doc, DocOutcome, ManifestError, Target, process_for};

/// A human-readable report of what the injector does to each document.
pub fn explain(
    inj: &Injector,
    text: &str,
    namespace: Option<&str>,
) -> Result<String, ManifestError> {
    explain_for(
        inj,
        text,
        &Target {
            namespace,
            namespace_labels: None,
        },
    )
}

/// [`explain`] with namespace labels (see [`crate::engine::manifest::process_for`]).
pub fn explain_for(
    inj: &Injector,
    text: &str,
    target: &Target<'_>,
) -> Result<String, ManifestError> {
    let docs = process_for(inj, text, target)?;
    let mut out = String::new();
    for doc in docs
        .iter()
        .filter(|d| !matches!(d.outcome, DocOutcome::Passthrough))
    {
        describe(inj, doc, &mut out);
    }
    let passed = docs
        .iter()
        .filter(|d| matches!(d.outcome, DocOutcome::Passthrough))
        .count();
    if passed > 0 {
        let _ = writeln!(
            out,
            "{passed} other document(s) are not pods or pod templates and pass through unchanged"
        );
    }
    Ok(out)
}

fn describe(inj: &Injector, doc: &Doc, out: &mut String) {
    let _ = match &doc.outcome {
        DocOutcome::Passthrough => Ok(()),
        DocOutcome::NotOptedIn(why) => writeln!(out, "{}: not injected: {why}", doc.id),
        DocOutcome::Skipped(reason) => {
            writeln!(out, "{}: not injected: opted in, but {reason}", doc.id)
        }
        DocOutcome::AlreadyInjected { templates } => writeln!(
            out,
            "{}: already injected with [{}]: nothing to add",
            doc.id,
            templates.join(", ")
        ),
        DocOutcome::Failed(error) => writeln!(out, "{}: cannot be injected: {error}", doc.id),
        DocOutcome::Injected {
            entry,
            templates,
            changes,
        } => {
            let _ = writeln!(
                out,
                "{}: injected with [{}] (opted in by {}); it would get:",
                doc.id,
                templates.join(", "),
                entry.describe(inj)
            );
            for change in changes {
                let _ = writeln!(out, "  + {change}");
            }
            if doc.namespace_guessed {
                let _ = writeln!(
                    out,
                    "  (rendered for namespace \"default\": it names none; pass -n NAMESPACE for where it will be applied)"
                );
            }
            Ok(())
        }
    };
}
