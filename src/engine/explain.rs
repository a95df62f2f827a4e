//! `explain`: for each pod or pod template (in a document or a `kind: List`), whether it is
//! injected, why, and what is added.

use std::fmt::Write as _;

use crate::engine::config::Injector;
use crate::engine::manifest::{DocOutcome, ManifestError, Object, Target, process_for};

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
    let objects = || docs.iter().flat_map(|d| &d.objects);
    let mut out = String::new();
    for object in objects() {
        describe(inj, object, &mut out);
    }
    let passed = objects()
        .filter(|o| matches!(o.outcome, DocOutcome::Passthrough))
        .count();
    if passed > 0 {
        let _ = writeln!(
            out,
            "{passed} other document(s) are not pods or pod templates and pass through unchanged"
        );
    }
    Ok(out)
}

fn describe(inj: &Injector, object: &Object, out: &mut String) {
    let Some(verdict) = object.verdict(inj) else {
        return;
    };
    let _ = writeln!(out, "{verdict}");
    for warning in &object.warnings {
        let _ = writeln!(out, "  ! {warning}");
    }
    if let DocOutcome::Injected { changes, .. } = &object.outcome {
        for change in changes {
            let _ = writeln!(out, "  + {change}");
        }
        if object.namespace_guessed {
            let _ = writeln!(
                out,
                "  (rendered for namespace \"default\": it names none; pass -n NAMESPACE for where it will be applied)"
            );
        }
    }
}
