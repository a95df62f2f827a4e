//! AdmissionReview in, AdmissionReview out: the one function the server and the CLI both call,
//! so `sidecar-injector review` prints exactly the bytes `serve` answers.
//!
//! - [`answer`]: what an answer is (bytes, outcome, log summary) and the errors with none;
//! - [`write`]: the answer's bytes;
//! - [`respond`]: the mutating and the validating answer to a request read either way;
//! - [`road`]: the body read through the borrowed view, or by the typed road when it cannot be.
//!
//! Each file imports only files above it in this list; this one imports them.

pub mod answer;
pub mod respond;
pub mod road;
pub mod write;

pub use answer::{Answer, Injected, Located, Outcome, ReviewError, Summary, Webhook};
pub use road::answer_typed;
pub use write::{encode, finish};

use crate::engine::config::Injector;
use crate::engine::inject::Entry;
use crate::engine::review::road::answer_in;

/// The paths the server answers on: the webhook, and the chart's entry that calls it (which
/// selectors the API server matched: see [`Entry`]).
pub const PATHS: [(&str, Webhook, Entry); 6] = [
    ("/mutate", Webhook::Mutate, Entry::Pod),
    ("/validate", Webhook::Validate, Entry::Pod),
    ("/mutate/namespace", Webhook::Mutate, Entry::Namespace),
    ("/validate/namespace", Webhook::Validate, Entry::Namespace),
    ("/mutate/required", Webhook::Mutate, Entry::Required),
    ("/validate/required", Webhook::Validate, Entry::Required),
];

/// The webhook and entry a path stands for.
pub fn route(path: &str) -> Option<(Webhook, Entry)> {
    PATHS
        .iter()
        .find(|(p, _, _)| *p == path)
        .map(|(_, webhook, entry)| (*webhook, *entry))
}

/// Answers one AdmissionReview body for `webhook`, sent by the pod-label entry.
pub fn answer(inj: &Injector, webhook: Webhook, body: &[u8]) -> Result<Answer, ReviewError> {
    answer_for(inj, webhook, Entry::Pod, body)
}

/// Answers one AdmissionReview body for `webhook`, sent by `entry`.
///
/// The body is read through the borrowed view ([`super::view`]). A body the view cannot read
/// (a repeated field, a value of the wrong type where the engine reads) takes the typed road:
/// it is read as k8s-openapi types, refused if that fails too, and otherwise answered by the
/// same engine from the typed objects' canonical JSON. Both roads give the same bytes.
pub fn answer_for(
    inj: &Injector,
    webhook: Webhook,
    entry: Entry,
    body: &[u8],
) -> Result<Answer, ReviewError> {
    answer_in(inj, webhook, entry, body, false).0
}

/// [`answer_for`], and where in `body` the view read the request's uid and the token volume's
/// name ([`Located`]): what lets [`super::memo`] answer a body that differs from this one only
/// there. Nothing is located when the answer came by the typed road.
pub fn answer_located(
    inj: &Injector,
    webhook: Webhook,
    entry: Entry,
    body: &[u8],
) -> (Result<Answer, ReviewError>, Located) {
    answer_in(inj, webhook, entry, body, true)
}

#[cfg(test)]
mod tests {
    use super::write::base;
    use super::*;
    use crate::engine::inject::Patch;

    /// A review, or its request, written as a JSON array is unreadable: serde's derive would
    /// read it field by field.
    #[test]
    fn a_request_that_is_not_an_object_is_unreadable() {
        let inj = Injector::embedded(None).expect("the embedded configuration loads");
        for body in [
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":["u",{"group":"","version":"v1","kind":"Pod"}]}"#,
            r#"["admission.k8s.io/v1","AdmissionReview"]"#,
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":"u"}"#,
        ] {
            match answer(&inj, Webhook::Mutate, body.as_bytes()) {
                Err(ReviewError::Unreadable(why)) => {
                    assert!(why.contains("not a JSON object"), "{why}")
                }
                other => panic!("{body}: {other:?}"),
            }
        }
    }

    /// The straight writer and the general encoder write the same bytes for every allowed
    /// response: with and without warnings, audit annotations and a patch, with strings that
    /// need escaping.
    #[test]
    fn the_straight_writer_writes_what_the_encoder_writes() {
        let patch =
            r#"[{"op":"add","path":"/metadata/annotations/a~1b","value":"\"q\" é"}]"#.as_bytes();
        for api_version in ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"] {
            for warnings in [
                None,
                Some(vec!["one \"quoted\"".to_owned(), "two\n".to_owned()]),
            ] {
                for audit in [None, Some(("injected", "log-shipper,proxy"))] {
                    for with_patch in [false, true] {
                        let mut response = base(api_version, "uid-\u{1}-é");
                        response.warnings = warnings.clone();
                        if let Some((k, v)) = audit {
                            response.audit_annotations.insert(k.into(), v.into());
                        }
                        let as_patch = Patch::from(patch.to_vec());
                        let straight = finish(response.clone(), with_patch.then_some(&as_patch));
                        let general = if with_patch {
                            let ops: json_patch::Patch =
                                serde_json::from_slice(patch).expect("a patch");
                            let response = response.with_patch(ops).expect("encodes");
                            // The encoder takes the patch as `with_patch` wrote it.
                            assert_eq!(response.patch.as_deref(), Some(patch));
                            encode(response)
                        } else {
                            encode(response)
                        };
                        assert_eq!(
                            String::from_utf8_lossy(&straight),
                            String::from_utf8_lossy(&general)
                        );
                    }
                }
            }
        }
    }
}
