//! AdmissionReview in, AdmissionReview out: the one function the server and the CLI both call,
//! so `sidecar-injector review` prints exactly the bytes `serve` answers.

use base64::Engine as _;
use k8s_openapi::api::core::v1::Pod;
use kube::core::Status;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use serde::Deserialize;

use crate::config::{Injector, ValidationMode};
use crate::inject::{
    Decision, Entry, InjectError, PodFacts, Status as InjectStatus, decide, plan_edits, to_patch,
};
use crate::validate::{denial_message, findings, sidecars_changed};

/// Which webhook a review is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Webhook {
    Mutate,
    Validate,
}

impl Webhook {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mutate => "mutate",
            Self::Validate => "validate",
        }
    }
}

/// What happened to a review, for metrics and logs (a small, fixed set of labels).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A patch was returned.
    Injected,
    /// An opted-in pod was skipped by a rule.
    Skipped,
    /// Admitted with nothing to do.
    Allowed,
    /// Refused: a validation finding or a request the injector cannot honour.
    Denied,
    /// The injector failed (a template failed to render, a request could not be read).
    Error,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Injected => "injected",
            Self::Skipped => "skipped",
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::Error => "error",
        }
    }
}

/// The request's identity, for the log span.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub operation: String,
}

/// An answer ready to send.
#[derive(Debug)]
pub struct Answer {
    /// The AdmissionReview response, JSON.
    pub body: Vec<u8>,
    pub outcome: Outcome,
    pub summary: Summary,
    /// For an injection: each template injected and its hash ([`crate::template::TemplateSet::hash`]).
    pub injected: Injected,
}

/// Template names with their hashes.
pub type Injected = Vec<(String, String)>;

/// A body that is not an AdmissionReview at all, so there is no uid to answer to.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("request body is not a readable AdmissionReview: {0}")]
    Unreadable(String),
    #[error("AdmissionReview has no request")]
    NoRequest,
    #[error(
        "unsupported AdmissionReview apiVersion {0:?} (expected admission.k8s.io/v1 or admission.k8s.io/v1beta1)"
    )]
    Version(String),
}

const VERSIONS: [&str; 2] = ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"];

/// The paths the server answers on: the webhook, and the chart's entry that calls it (which
/// selectors the API server matched: see [`Entry`]).
pub const PATHS: [(&str, Webhook, Entry); 4] = [
    ("/mutate", Webhook::Mutate, Entry::Pod),
    ("/validate", Webhook::Validate, Entry::Pod),
    ("/mutate/namespace", Webhook::Mutate, Entry::Namespace),
    ("/validate/namespace", Webhook::Validate, Entry::Namespace),
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
pub fn answer_for(
    inj: &Injector,
    webhook: Webhook,
    entry: Entry,
    body: &[u8],
) -> Result<Answer, ReviewError> {
    let review: AdmissionReview<Pod> = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(error) => return refuse_unreadable(body, &error),
    };
    if !VERSIONS.contains(&review.types.api_version.as_str()) {
        return Err(ReviewError::Version(review.types.api_version));
    }
    let req: AdmissionRequest<Pod> = review.try_into().map_err(|_| ReviewError::NoRequest)?;
    let summary = Summary {
        uid: req.uid.clone(),
        namespace: req.namespace.clone().unwrap_or_default(),
        name: pod_name(&req),
        operation: format!("{:?}", req.operation).to_uppercase(),
    };
    let (response, outcome, injected) = match webhook {
        Webhook::Mutate => mutate(inj, entry, &req),
        Webhook::Validate => {
            let (response, outcome) = validate(inj, entry, &req);
            (response, outcome, Vec::new())
        }
    };
    Ok(Answer {
        body: encode(response),
        outcome,
        summary,
        injected,
    })
}

/// A body that does not parse as a review of a pod: answer with its uid when one can be read
/// (the API server then shows our message), else report it to the caller as a 400.
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
            let summary = Summary {
                uid: env.request.uid,
                operation: env.request.operation,
                ..Summary::default()
            };
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
            let summary = Summary {
                uid: env.request.uid,
                ..Summary::default()
            };
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

fn pod_name(req: &AdmissionRequest<Pod>) -> String {
    let meta = req
        .object
        .as_ref()
        .or(req.old_object.as_ref())
        .map(|p| &p.metadata);
    match meta {
        _ if !req.name.is_empty() => req.name.clone(),
        Some(m) => m
            .name
            .clone()
            .or_else(|| m.generate_name.clone().map(|g| format!("{g}*")))
            .unwrap_or_default(),
        None => String::new(),
    }
}

fn is_pod(req: &AdmissionRequest<Pod>) -> bool {
    req.kind.group.is_empty()
        && req.kind.kind == "Pod"
        && req.sub_resource.as_deref().unwrap_or("").is_empty()
}

fn deny(
    response: AdmissionResponse,
    code: u16,
    reason: &str,
    message: String,
) -> AdmissionResponse {
    let mut response = response.deny(message);
    response.result = Status::failure(&response.result.message, reason).with_code(code);
    response
}

fn warn(mut response: AdmissionResponse, warnings: Vec<String>) -> AdmissionResponse {
    if !warnings.is_empty() {
        response
            .warnings
            .get_or_insert_with(Vec::new)
            .extend(warnings);
    }
    response
}

fn inject_error(response: AdmissionResponse, error: &InjectError) -> (AdmissionResponse, Outcome) {
    match error {
        InjectError::UnknownTemplate { .. } | InjectError::BadOverride { .. } => (
            deny(
                response,
                400,
                "BadRequest",
                format!("sidecar-injector: {error}"),
            ),
            Outcome::Denied,
        ),
        InjectError::Template(_) => (
            deny(
                response,
                500,
                "InternalError",
                format!("sidecar-injector failed to render a template: {error}"),
            ),
            Outcome::Error,
        ),
    }
}

/// The mutating answer, and for an injection the templates injected with their hashes.
fn mutate(
    inj: &Injector,
    entry: Entry,
    req: &AdmissionRequest<Pod>,
) -> (AdmissionResponse, Outcome, Injected) {
    let response = AdmissionResponse::from(req);
    if req.operation != Operation::Create || !is_pod(req) {
        return (response, Outcome::Allowed, Vec::new());
    }
    let Some(pod) = req.object.as_ref() else {
        return (
            deny(
                response,
                400,
                "BadRequest",
                "sidecar-injector: CREATE request has no object".into(),
            ),
            Outcome::Error,
            Vec::new(),
        );
    };
    let facts = PodFacts::new(pod, req.namespace.as_deref()).with_entry(entry);
    match decide(inj, &facts) {
        Err(error) => {
            let (response, outcome) = inject_error(response, &error);
            (response, outcome, Vec::new())
        }
        Ok(Decision::NotOptedIn) => (response, Outcome::Allowed, Vec::new()),
        Ok(Decision::Skip(reason)) => {
            let mut response = warn(
                response,
                vec![format!("sidecar-injector: pod not injected: {reason}")],
            );
            response
                .audit_annotations
                .insert("skipped".into(), reason.to_string());
            (response, Outcome::Skipped, Vec::new())
        }
        Ok(Decision::Inject(plan)) => {
            let edits = plan_edits(inj, pod, &plan);
            let response = warn(
                response,
                plan.notes
                    .iter()
                    .map(|n| format!("sidecar-injector: {n}"))
                    .collect(),
            );
            if edits.is_empty() {
                return (response, Outcome::Allowed, Vec::new());
            }
            let names: Vec<&str> = plan.templates.iter().map(|t| t.name.as_str()).collect();
            match response.clone().with_patch(to_patch(pod, &edits)) {
                Ok(mut response) => {
                    response
                        .audit_annotations
                        .insert("injected".into(), names.join(","));
                    let injected = plan
                        .templates
                        .iter()
                        .map(|t| (t.name.clone(), inj.templates.hash(&t.name).to_owned()))
                        .collect();
                    (response, Outcome::Injected, injected)
                }
                Err(error) => (
                    deny(
                        response,
                        500,
                        "InternalError",
                        format!("sidecar-injector: cannot encode patch: {error}"),
                    ),
                    Outcome::Error,
                    Vec::new(),
                ),
            }
        }
    }
}

fn validate(
    inj: &Injector,
    entry: Entry,
    req: &AdmissionRequest<Pod>,
) -> (AdmissionResponse, Outcome) {
    let response = AdmissionResponse::from(req);
    let checked = matches!(req.operation, Operation::Create | Operation::Update);
    let Some(pod) = req.object.as_ref().filter(|_| checked && is_pod(req)) else {
        return (response, Outcome::Allowed);
    };
    // A pod on its way out is never held up.
    if pod.metadata.deletion_timestamp.is_some() {
        return (response, Outcome::Allowed);
    }
    // A pod another revision injected (its namespace was moved to this revision since) was
    // checked against that revision's templates when it was created; they are not this
    // revision's. Its sidecars (the containers it did not bring itself) may still not change;
    // anything else is admitted, with a word on how to move the pod.
    if let (Operation::Update, Some(old)) = (&req.operation, &req.old_object) {
        let other = |p: &Pod| status_of(inj, p).filter(|s| s.revision != inj.config.revision);
        if let (Some(now), Some(before)) = (other(pod), other(old))
            && now.revision == before.revision
        {
            // A status from before `context` existed cannot tell sidecars from the pod's own.
            let changed = before
                .context
                .as_ref()
                .map(|own| sidecars_changed(old, pod, own))
                .unwrap_or_default();
            let warning = format!(
                "sidecar-injector: this pod was injected by {}; {} checks only that its sidecars do not change. Restart the pod's workload to inject it with this revision",
                revision_name(&now.revision),
                revision_name(&inj.config.revision)
            );
            if changed.is_empty() || inj.config.validation.mode == ValidationMode::Warn {
                let mut warnings = vec![warning];
                warnings.extend(changed.iter().map(|p| format!("sidecar-injector: {p}")));
                return (warn(response, warnings), Outcome::Allowed);
            }
            let name = format!("{:?}", req.name);
            return (
                deny(
                    warn(response, vec![warning]),
                    403,
                    "Forbidden",
                    denial_message(inj, &name, &changed),
                ),
                Outcome::Denied,
            );
        }
    }
    let problems = match problems(inj, entry, pod, req.namespace.as_deref()) {
        Ok(p) if p.is_empty() => return (response, Outcome::Allowed),
        Ok(p) => p,
        Err(error @ (InjectError::UnknownTemplate { .. } | InjectError::BadOverride { .. })) => {
            vec![error.to_string()]
        }
        Err(error) => return inject_error(response, &error),
    };
    // On UPDATE, only problems the update introduces are refused: a pod that was already
    // inconsistent (created before the injector, or before a template changed) stays updatable.
    let (new, old): (Vec<String>, Vec<String>) = match (&req.operation, &req.old_object) {
        (Operation::Update, Some(old)) => {
            let before = problems_or_none(inj, entry, old, req.namespace.as_deref());
            problems.into_iter().partition(|p| !before.contains(p))
        }
        _ => (problems, Vec::new()),
    };
    let mut warnings: Vec<String> = old
        .iter()
        .map(|p| format!("sidecar-injector: pre-existing problem: {p}"))
        .collect();
    if new.is_empty() {
        return (warn(response, warnings), Outcome::Allowed);
    }
    let name = match &req.name {
        n if !n.is_empty() => format!("{n:?}"),
        _ => pod
            .metadata
            .generate_name
            .as_deref()
            .map_or_else(|| "(unnamed)".into(), |g| format!("{g:?}*")),
    };
    match inj.config.validation.mode {
        ValidationMode::Enforce => {
            let response = warn(response, warnings);
            (
                deny(response, 403, "Forbidden", denial_message(inj, &name, &new)),
                Outcome::Denied,
            )
        }
        ValidationMode::Warn => {
            warnings.extend(new.iter().map(|p| format!("sidecar-injector: {p}")));
            (warn(response, warnings), Outcome::Allowed)
        }
    }
}

fn status_of(inj: &Injector, pod: &Pod) -> Option<InjectStatus> {
    let value = pod
        .metadata
        .annotations
        .as_ref()?
        .get(&inj.config.status_annotation)?;
    serde_json::from_str(value).ok()
}

fn revision_name(revision: &str) -> String {
    match revision {
        "" => "the default revision of sidecar-injector".into(),
        r => format!("sidecar-injector revision {r:?}"),
    }
}

fn problems(
    inj: &Injector,
    entry: Entry,
    pod: &Pod,
    namespace: Option<&str>,
) -> Result<Vec<String>, InjectError> {
    match decide(inj, &PodFacts::new(pod, namespace).with_entry(entry))? {
        Decision::Inject(plan) => Ok(findings(inj, pod, &plan)),
        Decision::NotOptedIn | Decision::Skip(_) => Ok(Vec::new()),
    }
}

fn problems_or_none(
    inj: &Injector,
    entry: Entry,
    pod: &Pod,
    namespace: Option<&str>,
) -> Vec<String> {
    match problems(inj, entry, pod, namespace) {
        Ok(p) => p,
        Err(e) => vec![e.to_string()],
    }
}

/// Serializes a response review. The patch goes out base64-encoded, as the API documents
/// `[]byte` fields; key order is fixed, so the same review always gives the same bytes.
pub fn encode(mut response: AdmissionResponse) -> Vec<u8> {
    let patch = response.patch.take();
    let mut review = response.into_review();
    // Echoed from the request, which a damaged review may have left empty.
    review.types.kind = "AdmissionReview".to_owned();
    let mut value = serde_json::to_value(&review).unwrap_or_default();
    if let (Some(patch), Some(r)) = (
        patch,
        value.get_mut("response").and_then(|r| r.as_object_mut()),
    ) {
        r.insert(
            "patch".into(),
            base64::engine::general_purpose::STANDARD
                .encode(patch)
                .into(),
        );
        r.insert("patchType".into(), "JSONPatch".into());
    }
    serde_json::to_vec(&value).unwrap_or_default()
}
