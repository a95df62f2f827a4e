//! The rules: whether a pod is opted in or skipped, and what it may ask for, in words.

use crate::engine::config::{Injector, NAMESPACE_ENABLED, NAMESPACE_REQUIRED};
use crate::engine::fit::PortClash;
use crate::engine::inject::facts::{Entry, PodFacts};
use crate::engine::messages;
use crate::engine::overrides::BadValue;
use crate::engine::template::TemplateError;
use crate::engine::view::PodView;

/// Why an opted-in pod was not injected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SkipReason {
    ExcludedNamespace(String),
    HostNetwork,
    Windows,
    /// Every template asked for conflicts with a container the pod runs (another mesh's proxy).
    Conflicts(String),
    /// The API server will refuse the pod whatever is added (no spec, no containers...): it is
    /// let through unchanged, so that the person sees the API server's own error.
    Malformed(&'static str),
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ExcludedNamespace(ns) => {
                write!(f, "namespace {ns:?} is excluded from injection (excludedNamespaces)")
            }
            Self::HostNetwork => f.write_str("hostNetwork pods are skipped (skip.hostNetwork)"),
            Self::Windows => f.write_str(
                "Windows pods are skipped: no selected template sets supportsWindows (skip.windows)",
            ),
            Self::Conflicts(container) => write!(
                f,
                "the pod already runs {container:?}, and every template it asks for conflicts with it (conflictsWith: another mesh's proxy binds the same ports)"
            ),
            Self::Malformed(what) => write!(
                f,
                "{what}, so the API server refuses it whatever is added; it is left as it is, for the API server to say what to fix, and injected once it can be created"
            ),
        }
    }
}

/// A request the injector cannot honour; the user sees the message.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error(
        "annotation {annotation} asks for template {name:?}, which does not exist (known templates: {known})"
    )]
    UnknownTemplate {
        annotation: String,
        name: String,
        known: String,
    },
    #[error("template {template:?}: {source}")]
    BadOverride {
        template: String,
        #[source]
        source: Box<BadValue>,
    },
    #[error(
        "{}",
        messages::port_clash(template, &clash.sidecar, &clash.port.to_string(), &clash.protocol, &clash.container, annotation)
    )]
    PortClash {
        template: String,
        clash: Box<PortClash>,
        /// The annotation that names the templates a pod asks for.
        annotation: String,
    },
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// A field the injector reads has a value k8s-openapi would not accept.
    #[error("the pod cannot be read: {0}")]
    Unread(#[from] serde_json::Error),
}

/// A revision in words: "the default revision" or `revision "canary"`.
pub fn revision_name(revision: &str) -> String {
    match revision {
        "" => "the default revision".into(),
        r => format!("revision {r:?}"),
    }
}

/// The webhook entry that sends the pod: the one the request came by or, with its namespace's
/// labels known (offline), the one the chart's selectors would pick; or why none would.
fn entry(inj: &Injector, facts: &PodFacts<'_>) -> Result<Entry, String> {
    let cfg = &inj.config;
    let Some(ns) = facts.namespace_labels else {
        return Ok(facts.entry);
    };
    let (value, entry) = match ns.get(&cfg.inject_label).map(String::as_str) {
        Some(NAMESPACE_ENABLED) => (NAMESPACE_ENABLED, Entry::Namespace),
        Some(NAMESPACE_REQUIRED) => (NAMESPACE_REQUIRED, Entry::Required),
        _ => return Ok(Entry::Pod),
    };
    let revision = ns.get(&cfg.revision_label).map_or("", String::as_str);
    if revision != cfg.revision {
        return Err(format!(
            "its namespace {:?} opts in ({}={value}) for {}, and this injector is {}",
            facts.namespace,
            cfg.inject_label,
            revision_name(revision),
            revision_name(&cfg.revision)
        ));
    }
    Ok(entry)
}

/// Which rule opts the pod in, or why none does (in words, for `explain`).
pub fn opt_in(inj: &Injector, facts: &PodFacts<'_>) -> Result<Entry, String> {
    let cfg = &inj.config;
    let label = facts.pod.label(&cfg.inject_label);
    let entry = entry(inj, facts)?;
    match entry {
        Entry::Pod => {
            if label != Some("true") {
                let namespace = match facts.namespace_labels {
                    Some(_) => format!(
                        " and its namespace does not carry {}={NAMESPACE_ENABLED}",
                        cfg.inject_label
                    ),
                    None => String::new(),
                };
                return Err(format!(
                    "it does not carry the label {}=\"true\"{namespace}",
                    cfg.inject_label
                ));
            }
            let revision = facts.pod.label(&cfg.revision_label).unwrap_or("");
            if revision != cfg.revision {
                return Err(format!(
                    "it asks for {} ({}), and this injector is {}",
                    revision_name(revision),
                    cfg.revision_label,
                    revision_name(&cfg.revision)
                ));
            }
        }
        Entry::Namespace => {
            if label == Some("false") {
                return Err(format!(
                    "its namespace opts it in, but the pod opts out with {}=\"false\"",
                    cfg.inject_label
                ));
            }
        }
        Entry::Required => {
            if label == Some("false") {
                let why = match required_opt_out(inj, facts) {
                    Some(OptOut::Exempt(exemption)) => format!(
                        "which it may: its service account {:?} is exempt (required.exempt: {exemption:?})",
                        facts.service_account()
                    ),
                    _ => format!(
                        "which the validating webhook and the backstop refuse: its service account {:?} is not exempt (required.exempt)",
                        facts.service_account()
                    ),
                };
                return Err(format!(
                    "its namespace requires sidecars ({}={NAMESPACE_REQUIRED}), and the pod opts out with {}=\"false\", {why}",
                    cfg.inject_label, cfg.inject_label
                ));
            }
        }
    }
    Ok(entry)
}

/// A pod that says `inject: "false"` where its namespace requires sidecars.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptOut<'c> {
    /// Its service account is exempt, by this entry of `required.exempt`: it is admitted
    /// without sidecars.
    Exempt(&'c str),
    /// Nothing exempts it: the validator and the backstop refuse it.
    Refused,
}

/// Whether the pod opts out where its namespace requires sidecars (the request came by the
/// required entry, or the namespace's known labels say `required` for this revision), and
/// whether it may. `None`: the pod does not opt out there.
pub fn required_opt_out<'c>(inj: &'c Injector, facts: &PodFacts<'_>) -> Option<OptOut<'c>> {
    let cfg = &inj.config;
    if entry(inj, facts) != Ok(Entry::Required)
        || facts.pod.label(&cfg.inject_label) != Some("false")
        || inj.is_excluded_namespace(facts.namespace)
        || skipped_anyway(inj, facts)
    {
        return None;
    }
    Some(
        match cfg
            .required
            .exemption(facts.namespace, facts.service_account())
        {
            Some(exemption) => OptOut::Exempt(exemption),
            None => OptOut::Refused,
        },
    )
}

/// Whether the pod, were it not opting out, would get no sidecar anyway: malformed, a
/// `hostNetwork` pod (`skip.hostNetwork`), or every template it asks for left out (a Windows
/// pod and templates without `supportsWindows`, another mesh's proxy it runs). Requiring
/// sidecars of it would refuse a pod for what configuration forgives; the chart's
/// matchConditions keep such pods from the webhooks, and the backstop lets them by, alike.
/// Templates are read as rendered for the set's sample pod (what `supportsWindows` and
/// `conflictsWith` say does not depend on the pod).
fn skipped_anyway(inj: &Injector, facts: &PodFacts<'_>) -> bool {
    let cfg = &inj.config;
    if malformed(facts.pod).is_some() {
        return true;
    }
    let spec = facts.pod.spec.as_ref();
    if cfg.skip.host_network && spec.and_then(|s| s.host_network).unwrap_or(false) {
        return true;
    }
    let Ok(names) = selected_templates(inj, facts) else {
        return false;
    };
    let windows = cfg.skip.windows && facts.is_windows().unwrap_or(false);
    names.iter().all(|name| {
        inj.templates.sample(name).is_ok_and(|f| {
            (windows && !f.supports_windows)
                || f.conflicts_with.iter().any(|c| facts.pod.has_container(c))
        })
    })
}

/// What makes a pod one the API server refuses whatever a patch adds, and that a patch could
/// not even be written for: no metadata, no spec, no containers, a container with no name.
/// (A field of the wrong type is refused where it is read: see [`InjectError::Unread`].)
pub(crate) fn malformed(pod: &PodView<'_>) -> Option<&'static str> {
    if pod.metadata.is_none() {
        return Some("the pod has no metadata");
    }
    let Some(spec) = &pod.spec else {
        return Some("the pod has no spec");
    };
    if spec.containers().is_empty() {
        return Some("the pod has no spec.containers");
    }
    if spec
        .containers()
        .iter()
        .chain(spec.init_containers())
        .any(|c| c.name.is_empty())
    {
        return Some("a container of the pod has no name");
    }
    None
}

/// The template names a pod asks for: its annotation, else the configured default.
pub(crate) fn selected_templates<'s>(
    inj: &'s Injector,
    facts: &PodFacts<'s>,
) -> Result<Vec<&'s str>, InjectError> {
    let cfg = &inj.config;
    let Some(list) = facts.pod.annotation(&cfg.templates_annotation) else {
        return Ok(cfg.default_templates.iter().map(String::as_str).collect());
    };
    let mut names: Vec<&str> = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !inj.templates.contains(name) {
            return Err(InjectError::UnknownTemplate {
                annotation: cfg.templates_annotation.clone(),
                name: name.to_owned(),
                known: inj.templates.names().collect::<Vec<_>>().join(", "),
            });
        }
        if !names.contains(&name) {
            names.push(name);
        }
    }
    Ok(names)
}

/// Why a pod runs to completion (its phase ends `Succeeded` or `Failed`), if it does: its
/// `restartPolicy`, else its controller. A Job's pods always say `Never` or `OnFailure`; the
/// owner covers a pod template read offline with that field left out.
pub(crate) fn runs_to_completion(facts: &PodFacts<'_>) -> Option<String> {
    let policy = facts
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_ref())
        .map(|p| p.as_str());
    if let Some(policy @ ("Never" | "OnFailure")) = policy {
        return Some(format!("restartPolicy: {policy}"));
    }
    let owner = facts.owner();
    matches!(owner.kind.as_str(), "Job" | "CronJob")
        .then(|| format!("it belongs to {} {:?}", owner.kind, owner.name))
}

/// The containers the pod names to receive the templates' mounts and env
/// (`containersAnnotation`, comma-separated, blanks left out), when it names any.
pub fn targets<'a>(inj: &Injector, pod: &'a PodView<'_>) -> Option<Vec<&'a str>> {
    let value = pod.annotation(&inj.config.containers_annotation)?;
    Some(
        value
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .collect(),
    )
}
