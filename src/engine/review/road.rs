//! The two roads a body is read by: the borrowed view first, and the typed objects
//! (k8s-openapi through serde_json) for a body the view cannot read; both answer through
//! [`respond`](super::respond).

use std::borrow::Cow;
use std::ops::Range;

use k8s_openapi::api::core::v1::Pod;
use kube::core::Status;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use serde::Deserialize;

use crate::engine::config::Injector;
use crate::engine::inject::Entry;
use crate::engine::review::answer::{Answer, Located, Outcome, ReviewError, Summary, Webhook};
use crate::engine::review::respond::{Req, Reread, respond};
use crate::engine::review::write::{base, deny, encode, finish};
use crate::engine::view::{PodView, ReviewView, Str};

const VERSIONS: [&str; 2] = ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"];

/// [`answer_for`], and with `locate` [`Located`] (only the memory asks, and only for a body
/// it may keep).
pub(super) fn answer_in(
    inj: &Injector,
    webhook: Webhook,
    entry: Entry,
    body: &[u8],
    locate: bool,
) -> (Result<Answer, ReviewError>, Located) {
    // A body that is UTF-8 is read as a string: its strings need no second check.
    if let Ok(text) = simdutf8::basic::from_utf8(body)
        && let Ok(review) = ReviewView::parse(text)
        && VERSIONS.contains(&review.api_version.as_str())
        && let Some(req) = &review.request
    {
        let r = Req {
            api_version: &review.api_version,
            uid: &req.uid,
            group: &req.kind.group,
            kind: &req.kind.kind,
            sub_resource: req.sub_resource(),
            name: req.name(),
            namespace: req.namespace(),
            operation: &req.operation,
            object: req.object.as_deref(),
            old_object: req.old_object.as_deref(),
        };
        if let Ok(answer) = respond(inj, webhook, entry, &r) {
            if !locate {
                return (Ok(answer), Located::default());
            }
            let located = Located {
                uid: borrowed_span(text, &req.uid),
                token_name: req
                    .object
                    .as_deref()
                    .map(|pod| token_name_spans(text, pod))
                    .unwrap_or_default(),
            };
            return (Ok(answer), located);
        }
    }
    (answer_typed(inj, webhook, entry, body), Located::default())
}

/// Where `s` is in `whole`, when it was borrowed from it.
fn borrowed_span(whole: &str, s: &Str<'_>) -> Option<Range<usize>> {
    match &s.0 {
        Cow::Borrowed(part) => span_in(whole, part),
        Cow::Owned(_) => None,
    }
}

/// See [`Located::token_name`].
fn token_name_spans(text: &str, pod: &PodView<'_>) -> Vec<Range<usize>> {
    let volumes = pod.spec.as_ref().map_or(&[][..], |s| s.volumes());
    let mut tokens = volumes
        .iter()
        .filter(|v| matches!(v.is_token_volume(), Ok(true)));
    let (Some(token), None) = (tokens.next(), tokens.next()) else {
        return Vec::new();
    };
    let mut spans = Vec::with_capacity(4);
    let names = pod
        .containers()
        .iter()
        .chain(pod.init_containers())
        .flat_map(|c| c.volume_mounts.as_deref().unwrap_or_default())
        .filter_map(|m| m.name.as_ref())
        .filter(|name| name.as_str() == token.name.as_str());
    for name in std::iter::once(&token.name).chain(names) {
        match borrowed_span(text, name) {
            Some(span) => spans.push(span),
            None => return Vec::new(),
        }
    }
    spans
}

/// Where `part`, a slice of `whole`, sits in it.
fn span_in(whole: &str, part: &str) -> Option<Range<usize>> {
    let start = (part.as_ptr() as usize).checked_sub(whole.as_ptr() as usize)?;
    let range = start..start + part.len();
    // Proves `part` borrowed from `whole` (an equal string elsewhere would not pass).
    whole
        .get(range.clone())
        .filter(|s| std::ptr::eq(s.as_ptr(), part.as_ptr()))
        .map(|_| range)
}

/// The typed road (see [`answer_for`]). Public so that tests can hold the two roads equal.
pub fn answer_typed(
    inj: &Injector,
    webhook: Webhook,
    entry: Entry,
    body: &[u8],
) -> Result<Answer, ReviewError> {
    if let Some(what) = not_an_object(body) {
        return Err(ReviewError::Unreadable(format!(
            "{what} is not a JSON object"
        )));
    }
    let review: AdmissionReview<Pod> = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(error) => return refuse_unreadable(body, &error),
    };
    if !VERSIONS.contains(&review.types.api_version.as_str()) {
        return Err(ReviewError::Version(review.types.api_version));
    }
    let req: AdmissionRequest<Pod> = review.try_into().map_err(|_| ReviewError::NoRequest)?;
    let object = req.object.as_ref().map(crate::engine::view::pod_json);
    let old_object = req.old_object.as_ref().map(crate::engine::view::pod_json);
    let (object_view, old_view) = match (
        object.as_deref().map(PodView::parse).transpose(),
        old_object.as_deref().map(PodView::parse).transpose(),
    ) {
        (Ok(object), Ok(old)) => (object, old),
        (Err(error), _) | (_, Err(error)) => return Ok(unreadable(&req, &error)),
    };
    let r = Req {
        api_version: &req.types.api_version,
        uid: &req.uid,
        group: &req.kind.group,
        kind: &req.kind.kind,
        sub_resource: req.sub_resource.as_deref().unwrap_or(""),
        name: &req.name,
        namespace: req.namespace.as_deref(),
        operation: &req.operation,
        object: object_view.as_ref(),
        old_object: old_view.as_ref(),
    };
    match respond(inj, webhook, entry, &r) {
        Ok(answer) => Ok(answer),
        Err(Reread(error)) => Ok(unreadable(&req, &error)),
    }
}

/// A typed object whose canonical JSON the engine still cannot read: a bug, said as such.
fn unreadable(req: &AdmissionRequest<Pod>, error: &serde_json::Error) -> Answer {
    let response = deny(
        base(&req.types.api_version, &req.uid),
        500,
        "InternalError",
        format!("sidecar-injector cannot read the pod it was sent: {error}"),
    );
    Answer {
        body: finish(response, None),
        outcome: Outcome::Error,
        summary: Summary::new(&req.uid, "", ["", ""], ""),
        injected: Vec::new(),
    }
}

/// A body that does not parse as a review of a pod: answer with its uid when one can be read
/// (the API server then shows our message), else report it to the caller as a 400.
/// serde's derive reads a struct from a JSON array too, by position: a review, or its
/// `request`, written as an array would be read field by field. The API server never sends
/// one; it is unreadable, and named. (The view refuses both already: only this road needs it.)
fn not_an_object(body: &[u8]) -> Option<&'static str> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    match value.get("request") {
        _ if !value.is_object() => Some("the AdmissionReview"),
        Some(request) if !request.is_object() && !request.is_null() => Some("its request"),
        _ => None,
    }
}

fn refuse_unreadable(body: &[u8], error: &serde_json::Error) -> Result<Answer, ReviewError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Envelope {
        api_version: String,
        request: Header,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Header {
        uid: String,
        #[serde(default)]
        operation: String,
        #[serde(default)]
        sub_resource: Option<String>,
    }
    let message = format!("sidecar-injector cannot read this AdmissionReview: {error}");
    match serde_json::from_slice::<Envelope>(body) {
        // CONNECT (pods/exec, pods/attach) and subresources carry other kinds of object
        // (PodExecOptions, Eviction...). The injector has nothing to say about them.
        Ok(env)
            if VERSIONS.contains(&env.api_version.as_str())
                && !env.request.uid.is_empty()
                && (matches!(env.request.operation.as_str(), "DELETE" | "CONNECT")
                    || env
                        .request
                        .sub_resource
                        .as_deref()
                        .is_some_and(|s| !s.is_empty())) =>
        {
            let mut response = AdmissionResponse::invalid("");
            response.types.api_version = env.api_version;
            response.uid = env.request.uid.clone();
            response.allowed = true;
            response.result = Status::default();
            let summary = Summary::new(&env.request.uid, "", ["", ""], &env.request.operation);
            Ok(Answer {
                body: encode(response),
                outcome: Outcome::Allowed,
                summary,
                injected: Vec::new(),
            })
        }
        Ok(env) if VERSIONS.contains(&env.api_version.as_str()) && !env.request.uid.is_empty() => {
            let mut response = AdmissionResponse::invalid(&message);
            response.types.api_version = env.api_version;
            response.uid = env.request.uid.clone();
            response.result.code = 400;
            let summary = Summary::new(&env.request.uid, "", ["", ""], "");
            Ok(Answer {
                body: encode(response),
                outcome: Outcome::Error,
                summary,
                injected: Vec::new(),
            })
        }
        _ => Err(ReviewError::Unreadable(error.to_string())),
    }
}
