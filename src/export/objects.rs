//! What both exported policies share: the objects' names, labels and metadata, the pods their
//! bindings and match conditions select (as the chart's webhook entries do), every template
//! read for every pod, the errors of an export, and the YAML the CLI writes.

use serde_json::{Value, json};

use crate::engine::config::{Injector, NAMESPACE_ENABLED, NAMESPACE_REQUIRED};
use crate::engine::inject::revision_name;
use crate::engine::template::{Fragment, TEMPLATE_SUFFIX};
use crate::export::cel;
use crate::export::read::read;
use crate::export::symbolic::{Refusal, Symbolic};

/// The API version of `admissionregistration.k8s.io` a MutatingAdmissionPolicy is written in:
/// `v1` from Kubernetes 1.36; `v1beta1` for 1.34-1.35 with the `MutatingAdmissionPolicy`
/// feature gate and its runtime-config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MutatingVersion {
    V1,
    V1beta1,
}

impl MutatingVersion {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1 => "v1",
            Self::V1beta1 => "v1beta1",
        }
    }
}

/// How the policies select pods, as the chart's webhook entries do (its `webhook.*` values).
#[derive(Clone, Debug)]
pub struct Selection {
    /// A second binding for namespaces labelled `<injectLabel>: enabled`
    /// (`webhook.namespaceOptIn.enabled`).
    pub namespace_opt_in: bool,
    /// A third binding for namespaces labelled `<injectLabel>: required`
    /// (`webhook.namespaceOptIn.required`).
    pub namespace_required: bool,
    /// Namespaces labelled `<this>: "true"` are left alone (`webhook.disabledLabel`).
    pub disabled_label: String,
}

/// Why the configuration cannot be exported. Nothing is written then.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("the configuration has no templates: there is nothing to export")]
    NoTemplates,
    #[error(
        "the configuration is {}, not {}: export the configuration of that revision (--config)",
        revision_name(have),
        revision_name(asked)
    )]
    Revision { have: String, asked: String },
    #[error("the policies could not be written as YAML: {0}")]
    Yaml(String),
    #[error("{}", describe_refusals(.0))]
    Refused(Vec<(String, Refusal)>),
}

fn describe_refusals(all: &[(String, Refusal)]) -> String {
    let mut out = String::from(
        "these templates cannot be written as a MutatingAdmissionPolicy (nothing was written):",
    );
    for (name, r) in all {
        out.push_str(&format!("\n  {name}{TEMPLATE_SUFFIX}: {r}"));
    }
    out.push_str("\nThe webhook injects them as they are; the backstop (`export backstop`) can still guard them.");
    out
}

/// The prefix of every object's name: `sidecar-injector`, with the revision when there is one.
pub fn base_name(inj: &Injector) -> String {
    match inj.config.revision.as_str() {
        "" => "sidecar-injector".into(),
        r => format!("sidecar-injector-{r}"),
    }
}

/// Checks a revision asked for on the command line against the configuration's.
pub fn check_revision(inj: &Injector, asked: Option<&str>) -> Result<(), ExportError> {
    match asked {
        Some(asked) if asked != inj.config.revision => Err(ExportError::Revision {
            have: inj.config.revision.clone(),
            asked: asked.to_owned(),
        }),
        _ => Ok(()),
    }
}

/// Every template, read for every pod, or every reason some cannot be.
pub(super) fn read_all(inj: &Injector) -> Result<Vec<(String, Symbolic)>, ExportError> {
    let names: Vec<String> = inj.templates.names().map(str::to_owned).collect();
    if names.is_empty() {
        return Err(ExportError::NoTemplates);
    }
    let mut out = Vec::new();
    let mut refused = Vec::new();
    for name in names {
        match read(inj, &name) {
            Ok(s) => out.push((name, s)),
            Err(rs) => refused.extend(rs.into_iter().map(|r| (name.clone(), r))),
        }
    }
    if !refused.is_empty() {
        return Err(ExportError::Refused(refused));
    }
    Ok(out)
}

pub(super) fn match_constraints(inj: &Injector, operations: &[&str]) -> Value {
    json!({
        "resourceRules": [{
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": operations,
            "resources": ["pods"],
        }],
        "namespaceSelector": {"matchExpressions": [{
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": cel::excluded(inj),
        }]},
    })
}

pub(super) fn conditions(inj: &Injector) -> Vec<Value> {
    let mut out = vec![
        json!({"name": "has-containers", "expression": "has(object.spec) && has(object.spec.containers)"}),
    ];
    for (name, expression) in cel::not_skipped(inj) {
        out.push(json!({"name": name, "expression": expression}));
    }
    out
}

/// The bindings' selectors, one per rule that opts a pod in, as the chart's webhook entries:
/// `("", pod label)`, with namespace opt-in `("-namespace", namespace label enabled)` and with
/// required namespaces `("-required", namespace label required)`. They cannot overlap, so a
/// pod is never matched twice. `opted_out`: the required binding also selects the pods that
/// say `"false"` (the backstop refuses them; the mutating policy leaves them alone).
pub(super) fn bindings(
    inj: &Injector,
    sel: &Selection,
    opted_out: bool,
) -> Vec<(&'static str, Value)> {
    let cfg = &inj.config;
    let rev = cfg.revision.as_str();
    let rev_selector = |key: &str| match rev {
        "" => json!({"key": key, "operator": "DoesNotExist"}),
        r => json!({"key": key, "operator": "In", "values": [r]}),
    };
    let common = vec![
        json!({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": cel::excluded(inj)}),
        json!({"key": sel.disabled_label, "operator": "NotIn", "values": ["true"]}),
    ];
    let not_false = json!({"matchExpressions": [
        {"key": cfg.inject_label, "operator": "NotIn", "values": ["false"]},
    ]});
    let mut pod_ns = common.clone();
    let others: Vec<&str> = [
        (sel.namespace_opt_in, NAMESPACE_ENABLED),
        (sel.namespace_required, NAMESPACE_REQUIRED),
    ]
    .into_iter()
    .filter_map(|(on, value)| on.then_some(value))
    .collect();
    if !others.is_empty() {
        pod_ns.push(json!({"key": cfg.inject_label, "operator": "NotIn", "values": others}));
    }
    let mut out = vec![(
        "",
        json!({
            "namespaceSelector": {"matchExpressions": pod_ns},
            "objectSelector": {
                "matchLabels": {cfg.inject_label.clone(): "true"},
                "matchExpressions": [rev_selector(&cfg.revision_label)],
            },
        }),
    )];
    let namespace_of = |value: &str| {
        let mut selector = common.clone();
        selector.push(json!({"key": cfg.inject_label, "operator": "In", "values": [value]}));
        selector.push(rev_selector(&cfg.revision_label));
        json!({"matchExpressions": selector})
    };
    if sel.namespace_opt_in {
        out.push((
            "-namespace",
            json!({
                "namespaceSelector": namespace_of(NAMESPACE_ENABLED),
                "objectSelector": not_false,
            }),
        ));
    }
    if sel.namespace_required {
        let mut selectors = json!({"namespaceSelector": namespace_of(NAMESPACE_REQUIRED)});
        if !opted_out {
            selectors["objectSelector"] = not_false;
        }
        out.push(("-required", selectors));
    }
    out
}

/// The annotation every exported object carries: the digest of the configuration it was
/// exported from ([`Injector::digest`]), so that whoever keeps it in step (`serve
/// --backstop`) can tell whether it still is.
pub const CONFIG_ANNOTATION: &str = "sidecar-injector.io/config";

/// An exported object's metadata: its name, labels and the configuration's digest.
pub(super) fn metadata(inj: &Injector, name: String) -> Value {
    json!({
        "name": name,
        "labels": labels(inj),
        "annotations": {CONFIG_ANNOTATION: inj.digest},
    })
}

fn labels(inj: &Injector) -> Value {
    let mut labels = json!({"app.kubernetes.io/managed-by": "sidecar-injector"});
    if !inj.config.revision.is_empty() {
        labels["sidecar-injector.io/rev"] = inj.config.revision.clone().into();
    }
    labels
}

/// The templates that may be injected into Windows pods, as their renderings say.
pub(super) fn windows_ok(fragments: &[(String, Fragment)]) -> Vec<&str> {
    fragments
        .iter()
        .filter(|(_, f)| f.supports_windows)
        .map(|(n, _)| n.as_str())
        .collect()
}

/// Each template's `conflictsWith` (the containers it is not injected beside), as its
/// rendering says.
pub(super) fn conflicts(fragments: &[(String, Fragment)]) -> Vec<(&str, &[String])> {
    fragments
        .iter()
        .map(|(n, f)| (n.as_str(), f.conflicts_with.as_slice()))
        .collect()
}

/// The sidecar names of each template, in the webhook's order (containers, then init
/// containers), as a CEL map from template name to list.
pub(super) fn sidecars_by_template(all: &[(String, Fragment)]) -> String {
    let entries: Vec<String> = all
        .iter()
        .map(|(name, f)| {
            let mut names: Vec<&str> = f.sidecar_names().collect();
            // Homogeneous literals: an empty list would be list(dyn) among lists of strings.
            names.push("");
            format!("{}: {}", cel::string(name), cel::strings(names))
        })
        .collect();
    format!("{{{}}}", entries.join(", "))
}

pub(super) fn refused(name: &str, reason: impl std::fmt::Display) -> ExportError {
    ExportError::Refused(vec![(name.to_owned(), Refusal::whole(reason.to_string()))])
}

/// Documents as one YAML stream.
pub fn to_yaml(docs: &[Value]) -> Result<String, ExportError> {
    let mut out = String::new();
    for doc in docs {
        out.push_str("---\n");
        let text = serde_saphyr::to_string(doc).map_err(|e| ExportError::Yaml(e.to_string()))?;
        out.push_str(&text);
        if !text.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}
