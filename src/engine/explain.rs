//! `explain`: for each pod or pod template (in a document or a `kind: List`), whether it is
//! injected, why, and what is added.

use std::fmt::Write as _;

use crate::engine::config::Injector;
use crate::engine::manifest::{DocOutcome, ManifestError, Object, Target, process_for};

/// A human-readable report of what the injector does to each document; the first document
/// that cannot be read is the error ([`explain_for`] reports it with the others).
pub fn explain(
    inj: &Injector,
    text: &str,
    namespace: Option<&str>,
) -> Result<String, ManifestError> {
    let mut explained = explain_for(
        inj,
        text,
        &Target {
            namespace,
            namespace_labels: None,
        },
    );
    if explained.errors.is_empty() {
        Ok(explained.text)
    } else {
        Err(explained.errors.swap_remove(0))
    }
}

/// What `explain` writes, and the documents it could not read (each also named in `text`, in
/// its place).
#[derive(Debug)]
pub struct Explained {
    pub text: String,
    pub errors: Vec<ManifestError>,
}

/// [`explain`] with namespace labels (see [`crate::engine::manifest::process_for`]), every
/// document reported: one that cannot be read is named in its place.
pub fn explain_for(inj: &Injector, text: &str, target: &Target<'_>) -> Explained {
    let docs = process_for(inj, text, target);
    let mut out = String::new();
    let mut errors = Vec::new();
    let mut passed = 0;
    for doc in docs {
        for object in &doc.objects {
            passed += usize::from(matches!(object.outcome, DocOutcome::Passthrough));
            describe(inj, object, &mut out);
        }
        if let Some(error) = doc.error {
            let _ = writeln!(out, "{error}");
            errors.push(error);
        }
    }
    if passed > 0 {
        let _ = writeln!(
            out,
            "{passed} other document(s) are not pods or pod templates and pass through unchanged"
        );
    }
    Explained { text: out, errors }
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
