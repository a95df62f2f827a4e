//! AdmissionReview in, AdmissionReview out: the one function the server and the CLI both call,
//! so `sidecar-injector review` prints exactly the bytes `serve` answers.

use std::borrow::Cow;
use std::ops::Range;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Pod;
use kube::core::Status;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use serde::Deserialize;

use crate::engine::config::{Injector, ValidationMode};
use crate::engine::inject::{
    Decision, Entry, InjectError, Patch, PodFacts, Status as InjectStatus, decide, plan_edits,
    to_patch,
};
use crate::engine::validate::{denial_message, findings, sidecars_changed};
use crate::engine::view::{PodView, ReviewView, Str};

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

/// The request's identity, for the events a review logs: its uid, namespace, pod name (for a
/// pod still to be named, its `generateName` and `*`) and operation, kept in one string (one
/// allocation a review, where four strings were four).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    text: String,
    /// Where the uid, the namespace and the name end in `text`; the operation is the rest.
    ends: [usize; 3],
}

impl Summary {
    fn new(uid: &str, namespace: &str, name: [&str; 2], operation: &str) -> Self {
        let mut text = String::with_capacity(
            uid.len() + namespace.len() + name[0].len() + name[1].len() + operation.len(),
        );
        text.push_str(uid);
        let uid_end = text.len();
        text.push_str(namespace);
        let namespace_end = text.len();
        text.push_str(name[0]);
        text.push_str(name[1]);
        let name_end = text.len();
        text.push_str(operation);
        Self {
            text,
            ends: [uid_end, namespace_end, name_end],
        }
    }

    pub fn uid(&self) -> &str {
        &self.text[..self.ends[0]]
    }

    /// The same summary for a request with another uid.
    pub fn with_uid(&self, uid: &str) -> Self {
        let old = self.ends[0];
        let mut text = String::with_capacity(self.text.len() - old + uid.len());
        text.push_str(uid);
        text.push_str(&self.text[old..]);
        Self {
            text,
            ends: self.ends.map(|end| end - old + uid.len()),
        }
    }

    pub fn namespace(&self) -> &str {
        &self.text[self.ends[0]..self.ends[1]]
    }

    pub fn name(&self) -> &str {
        &self.text[self.ends[1]..self.ends[2]]
    }

    pub fn operation(&self) -> &str {
        &self.text[self.ends[2]..]
    }
}

/// An answer ready to send.
#[derive(Debug)]
pub struct Answer {
    /// The AdmissionReview response, JSON.
    pub body: Vec<u8>,
    pub outcome: Outcome,
    pub summary: Summary,
    /// For an injection: each template injected and its hash ([`super::template::TemplateSet::hash`]).
    pub injected: Injected,
}

/// Template names with their hashes.
pub type Injected = Vec<crate::engine::template::Injection>;

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

/// Where in a body the view read what [`super::memo`] may find changed in a replica's body.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Located {
    /// The request's uid, when the view read it as it is written (no escapes): the answer
    /// depends on those bytes only by echoing them.
    pub uid: Option<Range<usize>>,
    /// The pod's ServiceAccount token volume's name (`kube-api-access-` and a suffix the API
    /// server draws for each pod), where the view read it as written: in the volume and in
    /// every mount of a container or init container that names it. Empty when the pod has no
    /// such volume, has more than one, or one of these names was unescaped into a copy. The
    /// engine compares these names only with other names, and keeps them out of the template
    /// context.
    pub token_name: Vec<Range<usize>>,
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

/// [`answer_for`], and with `locate` [`Located`] (only the memory asks, and only for a body
/// it may keep).
fn answer_in(
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
        Err(error) => Ok(unreadable(&req, &error)),
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

/// A request as the engine reads it, whichever road it came by.
struct Req<'a> {
    api_version: &'a str,
    uid: &'a str,
    /// The group and kind of the object.
    group: &'a str,
    kind: &'a str,
    sub_resource: &'a str,
    name: &'a str,
    namespace: Option<&'a str>,
    operation: &'a Operation,
    object: Option<&'a PodView<'a>>,
    old_object: Option<&'a PodView<'a>>,
}

/// The answer to a request; an error when a field the engine reads cannot be read as
/// k8s-openapi would read it (the caller takes the typed road).
fn respond(
    inj: &Injector,
    webhook: Webhook,
    entry: Entry,
    r: &Req<'_>,
) -> Result<Answer, serde_json::Error> {
    let summary = Summary::new(
        r.uid,
        r.namespace.unwrap_or_default(),
        pod_name(r),
        operation_name(r.operation),
    );
    let (body, outcome, injected) = match webhook {
        Webhook::Mutate => mutate(inj, entry, r)?,
        Webhook::Validate => {
            let (response, outcome) = validate(inj, entry, r)?;
            (finish(response, None), outcome, Vec::new())
        }
    };
    Ok(Answer {
        body,
        outcome,
        summary,
        injected,
    })
}

fn operation_name(operation: &Operation) -> &'static str {
    match operation {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

/// The response to a request before anything is decided: allowed, nothing to say.
fn base(api_version: &str, uid: &str) -> AdmissionResponse {
    let mut response = AdmissionResponse::invalid("");
    response.types.api_version = api_version.to_owned();
    response.uid = uid.to_owned();
    response.allowed = true;
    response.result = Status::default();
    response
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

/// The pod's name for the log, in two parts: a pod still to be named is its `generateName`
/// and `*`.
fn pod_name<'a>(r: &Req<'a>) -> [&'a str; 2] {
    if !r.name.is_empty() {
        return [r.name, ""];
    }
    match r.object.or(r.old_object) {
        Some(pod) if pod.meta().name.is_some() => [pod.name(), ""],
        Some(pod) if pod.meta().generate_name.is_some() => [pod.generate_name(), "*"],
        _ => ["", ""],
    }
}

fn is_pod(r: &Req<'_>) -> bool {
    r.group.is_empty() && r.kind == "Pod" && r.sub_resource.is_empty()
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
        InjectError::Unread(_) => (
            deny(
                response,
                400,
                "BadRequest",
                format!("sidecar-injector: {error}"),
            ),
            Outcome::Error,
        ),
    }
}

/// The answer's bytes, the outcome, and for an injection the templates injected.
type Mutated = (Vec<u8>, Outcome, Injected);

/// The mutating answer: its bytes (the patch encoded into them while the plan it borrows from
/// is at hand), and for an injection the templates injected with their hashes.
fn mutate(inj: &Injector, entry: Entry, r: &Req<'_>) -> Result<Mutated, serde_json::Error> {
    // Built only for the answers that need it: an injection is written from its parts.
    let response = || base(r.api_version, r.uid);
    if *r.operation != Operation::Create || !is_pod(r) {
        return Ok((finish(response(), None), Outcome::Allowed, Vec::new()));
    }
    let Some(pod) = r.object else {
        return Ok((
            finish(
                deny(
                    response(),
                    400,
                    "BadRequest",
                    "sidecar-injector: CREATE request has no object".into(),
                ),
                None,
            ),
            Outcome::Error,
            Vec::new(),
        ));
    };
    let facts = PodFacts::new(pod, r.namespace).with_entry(entry);
    Ok(match decide(inj, &facts) {
        Err(InjectError::Unread(error)) => return Err(error),
        Err(error) => {
            let (response, outcome) = inject_error(response(), &error);
            (finish(response, None), outcome, Vec::new())
        }
        Ok(Decision::NotOptedIn) => (finish(response(), None), Outcome::Allowed, Vec::new()),
        Ok(Decision::Skip(reason)) => {
            let mut response = warn(
                response(),
                vec![format!("sidecar-injector: pod not injected: {reason}")],
            );
            response
                .audit_annotations
                .insert("skipped".into(), reason.to_string());
            (finish(response, None), Outcome::Skipped, Vec::new())
        }
        Ok(Decision::Inject(plan)) => {
            let edits = plan_edits(inj, pod, &plan);
            let warnings: Vec<String> = plan
                .notes
                .iter()
                .map(|n| format!("sidecar-injector: {n}"))
                .collect();
            if edits.is_empty() {
                let response = warn(response(), warnings);
                return Ok((finish(response, None), Outcome::Allowed, Vec::new()));
            }
            let patch = to_patch(pod, &edits);
            let mut names =
                String::with_capacity(plan.templates.iter().map(|t| t.name.len() + 1).sum());
            let mut injected = Vec::with_capacity(plan.templates.len());
            for t in &plan.templates {
                if !names.is_empty() {
                    names.push(',');
                }
                names.push_str(&t.name);
                injected.push(inj.templates.injection(&t.name));
            }
            let allowed = Allowed {
                api_version: r.api_version,
                uid: r.uid,
                audit: &[("injected", &names)],
                warnings: &warnings,
            };
            (
                write_allowed(&allowed, Some(&patch)),
                Outcome::Injected,
                injected,
            )
        }
    })
}

fn validate(
    inj: &Injector,
    entry: Entry,
    r: &Req<'_>,
) -> Result<(AdmissionResponse, Outcome), serde_json::Error> {
    let response = base(r.api_version, r.uid);
    let checked = matches!(r.operation, Operation::Create | Operation::Update);
    let Some(pod) = r.object.filter(|_| checked && is_pod(r)) else {
        return Ok((response, Outcome::Allowed));
    };
    // A pod on its way out is never held up.
    if let Some(raw) = pod.meta().deletion_timestamp {
        // Read as the typed road reads it, so that both agree on a malformed time.
        serde_json::from_str::<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>(raw.get())?;
        return Ok((response, Outcome::Allowed));
    }
    // A pod another revision injected (its namespace was moved to this revision since) was
    // checked against that revision's templates when it was created; they are not this
    // revision's. Its sidecars (the containers it did not bring itself) may still not change;
    // anything else is admitted, with a word on how to move the pod.
    if let (Operation::Update, Some(old)) = (r.operation, r.old_object) {
        let other =
            |p: &PodView<'_>| status_of(inj, p).filter(|s| s.revision != inj.config.revision);
        if let (Some(now), Some(before)) = (other(pod), other(old))
            && now.revision == before.revision
        {
            // A status from before `context` existed cannot tell sidecars from the pod's own.
            let changed = match before.context.as_ref() {
                Some(own) => sidecars_changed(old, pod, own)?,
                None => Vec::new(),
            };
            let warning = format!(
                "sidecar-injector: this pod was injected by {}; {} checks only that its sidecars do not change. Restart the pod's workload to inject it with this revision",
                revision_name(&now.revision),
                revision_name(&inj.config.revision)
            );
            if changed.is_empty() || inj.config.validation.mode == ValidationMode::Warn {
                let mut warnings = vec![warning];
                warnings.extend(changed.iter().map(|p| format!("sidecar-injector: {p}")));
                return Ok((warn(response, warnings), Outcome::Allowed));
            }
            let name = format!("{:?}", r.name);
            return Ok((
                deny(
                    warn(response, vec![warning]),
                    403,
                    "Forbidden",
                    denial_message(inj, &name, &changed),
                ),
                Outcome::Denied,
            ));
        }
    }
    let problems = match problems(inj, entry, pod, r.namespace) {
        Ok(p) if p.is_empty() => return Ok((response, Outcome::Allowed)),
        Ok(p) => p,
        Err(InjectError::Unread(error)) => return Err(error),
        Err(error @ (InjectError::UnknownTemplate { .. } | InjectError::BadOverride { .. })) => {
            vec![error.to_string()]
        }
        Err(error) => return Ok(inject_error(response, &error)),
    };
    // On UPDATE, only problems the update introduces are refused: a pod that was already
    // inconsistent (created before the injector, or before a template changed) stays updatable.
    let (new, old): (Vec<String>, Vec<String>) = match (r.operation, r.old_object) {
        (Operation::Update, Some(old)) => {
            let before = problems_or_none(inj, entry, old, r.namespace)?;
            problems.into_iter().partition(|p| !before.contains(p))
        }
        _ => (problems, Vec::new()),
    };
    let mut warnings: Vec<String> = old
        .iter()
        .map(|p| format!("sidecar-injector: pre-existing problem: {p}"))
        .collect();
    if new.is_empty() {
        return Ok((warn(response, warnings), Outcome::Allowed));
    }
    let name = match r.name {
        n if !n.is_empty() => format!("{n:?}"),
        _ => match pod.meta().generate_name.as_ref() {
            Some(g) => format!("{:?}*", g.as_str()),
            None => "(unnamed)".into(),
        },
    };
    Ok(match inj.config.validation.mode {
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
    })
}

fn status_of(inj: &Injector, pod: &PodView<'_>) -> Option<InjectStatus> {
    serde_json::from_str(pod.annotation(&inj.config.status_annotation)?).ok()
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
    pod: &PodView<'_>,
    namespace: Option<&str>,
) -> Result<Vec<String>, InjectError> {
    match decide(inj, &PodFacts::new(pod, namespace).with_entry(entry))? {
        Decision::Inject(plan) => Ok(findings(inj, pod, &plan)?),
        Decision::NotOptedIn | Decision::Skip(_) => Ok(Vec::new()),
    }
}

fn problems_or_none(
    inj: &Injector,
    entry: Entry,
    pod: &PodView<'_>,
    namespace: Option<&str>,
) -> Result<Vec<String>, serde_json::Error> {
    match problems(inj, entry, pod, namespace) {
        Ok(p) => Ok(p),
        Err(InjectError::Unread(error)) => Err(error),
        Err(e) => Ok(vec![e.to_string()]),
    }
}

/// The response review's bytes, with the patch (its JSON) written in base64. An allowed
/// response (every answer with a patch) is written straight into one buffer
/// ([`write_allowed`]); any other goes through [`encode`]. Both write the same bytes for the
/// same response (a test holds them equal).
pub fn finish(response: AdmissionResponse, patch: Option<&Patch<'_>>) -> Vec<u8> {
    if !response.allowed || response.result != Status::default() {
        return encode(response);
    }
    let audit: Vec<(&str, &str)> = response
        .audit_annotations
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    write_allowed(
        &Allowed {
            api_version: &response.types.api_version,
            uid: &response.uid,
            audit: &audit,
            warnings: response.warnings.as_deref().unwrap_or_default(),
        },
        patch,
    )
}

/// An allowed response, borrowed: what [`write_allowed`] writes. An injection's answer is
/// written from this directly, without building kube's `AdmissionResponse` (its strings, its
/// failure `Status` to be replaced, its audit map: about seven allocations a review).
struct Allowed<'a> {
    api_version: &'a str,
    uid: &'a str,
    audit: &'a [(&'a str, &'a str)],
    /// None are written when empty.
    warnings: &'a [String],
}

/// An allowed response review, the patch encoded into the same buffer in one SIMD pass.
fn write_allowed(a: &Allowed<'_>, patch: Option<&Patch<'_>>) -> Vec<u8> {
    let patch_len = patch.map_or(0, |p| p.len().div_ceil(3) * 4);
    let mut out = Vec::with_capacity(256 + patch_len + a.uid.len());
    out.extend_from_slice(br#"{"apiVersion":"#);
    json_str(&mut out, a.api_version);
    out.extend_from_slice(br#","kind":"AdmissionReview","response":{"uid":"#);
    json_str(&mut out, a.uid);
    out.extend_from_slice(br#","allowed":true,"status":{}"#);
    if patch.is_some() {
        out.extend_from_slice(br#","patchType":"JSONPatch""#);
    }
    if !a.audit.is_empty() {
        out.extend_from_slice(br#","auditAnnotations":{"#);
        for (i, (k, v)) in a.audit.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            json_str(&mut out, k);
            out.push(b':');
            json_str(&mut out, v);
        }
        out.push(b'}');
    }
    if !a.warnings.is_empty() {
        out.extend_from_slice(br#","warnings":["#);
        for (i, w) in a.warnings.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            json_str(&mut out, w);
        }
        out.push(b']');
    }
    if let Some(patch) = patch {
        out.extend_from_slice(br#","patch":""#);
        patch.base64_into(&mut out);
        out.push(b'"');
    }
    out.extend_from_slice(b"}}");
    out
}

fn json_str(out: &mut Vec<u8>, s: &str) {
    super::json::write_str(out, s);
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

#[cfg(test)]
mod tests {
    use super::*;

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
