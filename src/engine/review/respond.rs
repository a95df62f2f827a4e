//! The answer to a request, however it was read: mutate (the decision and its patch) or
//! validate (what the final pod is held to), with the warnings and denials a person reads.

use kube::core::admission::{AdmissionResponse, Operation};

use crate::engine::config::{Injector, ValidationMode};
use crate::engine::inject::{
    Decision, Entry, InjectError, OptOut, PodFacts, Status as InjectStatus, decide, plan_edits,
    required_opt_out, to_patch,
};
use crate::engine::review::answer::{Answer, Injected, Outcome, Summary, Webhook};
use crate::engine::review::write::{Allowed, base, deny, finish, warn, write_allowed};
use crate::engine::validate::{denial_message, findings, required_refusal, sidecars_changed};
use crate::engine::view::PodView;

/// A request as the engine reads it, whichever road it came by.
pub(super) struct Req<'a> {
    pub(super) api_version: &'a str,
    pub(super) uid: &'a str,
    /// The group and kind of the object.
    pub(super) group: &'a str,
    pub(super) kind: &'a str,
    pub(super) sub_resource: &'a str,
    pub(super) name: &'a str,
    pub(super) namespace: Option<&'a str>,
    pub(super) operation: &'a Operation,
    pub(super) object: Option<&'a PodView<'a>>,
    pub(super) old_object: Option<&'a PodView<'a>>,
}

/// Why a request read through the view is read again by the typed road ([`super::road`]): a
/// field the view read holds a value k8s-openapi would not accept. The typed road reads the
/// body as k8s-openapi types and answers from them, or refuses it; this is never an answer.
#[derive(Debug)]
pub(super) struct Reread(pub(super) serde_json::Error);

impl From<serde_json::Error> for Reread {
    fn from(error: serde_json::Error) -> Self {
        Self(error)
    }
}

/// The answer to a request, or [`Reread`] when a field the engine reads cannot be read as
/// k8s-openapi would read it.
pub(super) fn respond(
    inj: &Injector,
    webhook: Webhook,
    entry: Entry,
    r: &Req<'_>,
) -> Result<Answer, Reread> {
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

fn inject_error(response: AdmissionResponse, error: &InjectError) -> (AdmissionResponse, Outcome) {
    match error {
        InjectError::UnknownTemplate { .. }
        | InjectError::BadOverride { .. }
        | InjectError::PortClash { .. } => (
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
fn mutate(inj: &Injector, entry: Entry, r: &Req<'_>) -> Result<Mutated, Reread> {
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
        Err(InjectError::Unread(error)) => return Err(Reread(error)),
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
) -> Result<(AdmissionResponse, Outcome), Reread> {
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
                    denial_message(inj, entry, &name, &changed),
                ),
                Outcome::Denied,
            ));
        }
    }
    // A pod that opts out where its namespace requires sidecars, its service account not
    // exempt. On UPDATE, one that already did (created before its namespace required them) is
    // admitted with a warning, like any problem the update does not introduce.
    let facts = PodFacts::new(pod, r.namespace).with_entry(entry);
    let refusal = match required_opt_out(inj, &facts) {
        Some(OptOut::Refused) => required_refusal(inj, &facts, &display_name(r, pod)),
        _ => None,
    };
    if let Some(refusal) = refusal {
        let before = match (r.operation, r.old_object) {
            (Operation::Update, Some(old)) => {
                let old = PodFacts::new(old, r.namespace).with_entry(entry);
                required_opt_out(inj, &old) == Some(OptOut::Refused)
            }
            _ => false,
        };
        return Ok(match (before, inj.config.validation.mode) {
            (false, ValidationMode::Enforce) => {
                (deny(response, 403, "Forbidden", refusal), Outcome::Denied)
            }
            (true, _) | (false, ValidationMode::Warn) => {
                let refusal = refusal.trim_start_matches("sidecar-injector: ");
                let warning = match before {
                    true => format!("sidecar-injector: pre-existing problem: {refusal}"),
                    false => format!("sidecar-injector: {refusal}"),
                };
                (warn(response, vec![warning]), Outcome::Allowed)
            }
        });
    }
    let problems = match problems(inj, entry, pod, r.namespace) {
        Ok(p) if p.is_empty() => return Ok((response, Outcome::Allowed)),
        Ok(p) => p,
        Err(InjectError::Unread(error)) => return Err(Reread(error)),
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
    Ok(match inj.config.validation.mode {
        ValidationMode::Enforce => {
            let response = warn(response, warnings);
            (
                deny(
                    response,
                    403,
                    "Forbidden",
                    denial_message(inj, entry, &display_name(r, pod), &new),
                ),
                Outcome::Denied,
            )
        }
        ValidationMode::Warn => {
            warnings.extend(new.iter().map(|p| format!("sidecar-injector: {p}")));
            (warn(response, warnings), Outcome::Allowed)
        }
    })
}

/// The pod's name as a denial quotes it: `"web"`, `"web-"*` for one still to be named. Made
/// only for a denial: an admitted pod is never named.
fn display_name(r: &Req<'_>, pod: &PodView<'_>) -> String {
    match r.name {
        n if !n.is_empty() => format!("{n:?}"),
        _ => match pod.meta().generate_name.as_ref() {
            Some(g) => format!("{:?}*", g.as_str()),
            None => "(unnamed)".into(),
        },
    }
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
) -> Result<Vec<String>, Reread> {
    match problems(inj, entry, pod, namespace) {
        Ok(p) => Ok(p),
        Err(InjectError::Unread(error)) => Err(Reread(error)),
        Err(e) => Ok(vec![e.to_string()]),
    }
}
