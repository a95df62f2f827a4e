//! The configuration exported as admission policies that run inside the API server: no
//! network hop, nothing that can be down.
//!
//! - [`backstop`]: a ValidatingAdmissionPolicy holding what CEL can check of the validator's
//!   contract, so that an opted-in pod the injector did not reach is refused with a message
//!   that says so, whatever the webhooks' failure policies.
//! - [`mutating`]: a MutatingAdmissionPolicy per template, whose JSONPatch adds what the
//!   webhook adds (only what is missing), so that the API server injects by itself.
//!
//! Both are another rendering of the same decision: who is opted in and skipped, which
//! templates a pod asks for, what each template renders ([`symbolic`]). Documents are JSON
//! values; the CLI writes them as YAML.

pub mod cel;
pub mod symbolic;

use std::collections::BTreeSet;

use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::engine::config::{Injector, NAMESPACE_ENABLED, ValidationMode};
use crate::engine::policy::symbolic::{Refusal, Symbolic};
use crate::engine::template::{Fragment, TEMPLATE_SUFFIX};

/// The API version of `admissionregistration.k8s.io` a MutatingAdmissionPolicy is written in:
/// `v1` from Kubernetes 1.36; `v1beta1` for 1.34-1.35 with the `MutatingAdmissionPolicy`
/// feature gate and its runtime-config.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MutatingVersion {
    #[default]
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
    /// Namespaces labelled `<this>: "true"` are left alone (`webhook.disabledLabel`).
    pub disabled_label: String,
}

impl Default for Selection {
    fn default() -> Self {
        Self {
            namespace_opt_in: true,
            disabled_label: "sidecar-injector.io/disabled".into(),
        }
    }
}

/// Why the configuration cannot be exported. Nothing is written then.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("the configuration has no templates: there is nothing to export")]
    NoTemplates,
    #[error(
        "the configuration is {}, not {asked}: export the configuration of that revision (--config)",
        revision_words(have)
    )]
    Revision { have: String, asked: String },
    #[error("the policies could not be written as YAML: {0}")]
    Yaml(String),
    #[error("{}", describe_refusals(.0))]
    Refused(Vec<(String, Refusal)>),
}

fn revision_words(r: &str) -> String {
    match r {
        "" => "the default revision".into(),
        r => format!("revision {r:?}"),
    }
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
            asked: revision_words(asked),
        }),
        _ => Ok(()),
    }
}

/// Every template, read for every pod, or every reason some cannot be.
fn read_all(inj: &Injector) -> Result<Vec<(String, Symbolic)>, ExportError> {
    let names: Vec<String> = inj.templates.names().map(str::to_owned).collect();
    if names.is_empty() {
        return Err(ExportError::NoTemplates);
    }
    let mut out = Vec::new();
    let mut refused = Vec::new();
    for name in names {
        if let Some(declared) = inj.templates.declared(&name).filter(|d| !d.is_empty()) {
            let keys: Vec<&str> = declared.keys().map(String::as_str).collect();
            refused.push((
                name.clone(),
                Refusal {
                    line: 0,
                    construct: String::new(),
                    reason: format!(
                        "it declares per-pod overrides ({}): the webhook refuses a pod whose value is not allowed, and a mutating policy cannot refuse",
                        keys.join(", ")
                    ),
                },
            ));
        }
        match symbolic::read(inj, &name) {
            Ok(s) => out.push((name, s)),
            Err(rs) => refused.extend(rs.into_iter().map(|r| (name.clone(), r))),
        }
    }
    if !refused.is_empty() {
        return Err(ExportError::Refused(refused));
    }
    Ok(out)
}

fn match_constraints(inj: &Injector, operations: &[&str]) -> Value {
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

fn conditions(inj: &Injector) -> Vec<Value> {
    let mut out = vec![
        json!({"name": "has-containers", "expression": "has(object.spec) && has(object.spec.containers)"}),
    ];
    for (name, expression) in cel::not_skipped(inj) {
        out.push(json!({"name": name, "expression": expression}));
    }
    out
}

/// The bindings' selectors, one per rule that opts a pod in, as the chart's webhook entries:
/// `("", pod label)` and, with namespace opt-in, `("-namespace", namespace label)`. They
/// cannot overlap, so a pod is never matched twice.
fn bindings(inj: &Injector, sel: &Selection) -> Vec<(&'static str, Value)> {
    let cfg = &inj.config;
    let rev = cfg.revision.as_str();
    let rev_selector = |key: &str| match rev {
        "" => json!({"key": key, "operator": "DoesNotExist"}),
        r => json!({"key": key, "operator": "In", "values": [r]}),
    };
    let mut common = vec![
        json!({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": cel::excluded(inj)}),
        json!({"key": sel.disabled_label, "operator": "NotIn", "values": ["true"]}),
    ];
    let mut pod_ns = common.clone();
    if sel.namespace_opt_in {
        pod_ns.push(
            json!({"key": cfg.inject_label, "operator": "NotIn", "values": [NAMESPACE_ENABLED]}),
        );
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
    if sel.namespace_opt_in {
        common.push(
            json!({"key": cfg.inject_label, "operator": "In", "values": [NAMESPACE_ENABLED]}),
        );
        common.push(rev_selector(&cfg.revision_label));
        out.push((
            "-namespace",
            json!({
                "namespaceSelector": {"matchExpressions": common},
                "objectSelector": {"matchExpressions": [
                    {"key": cfg.inject_label, "operator": "NotIn", "values": ["false"]},
                ]},
            }),
        ));
    }
    out
}

fn labels(inj: &Injector) -> Value {
    let mut labels = json!({"app.kubernetes.io/managed-by": "sidecar-injector"});
    if !inj.config.revision.is_empty() {
        labels["sidecar-injector.io/rev"] = inj.config.revision.clone().into();
    }
    labels
}

/// The templates that may be injected into Windows pods.
fn windows_ok(inj: &Injector) -> Vec<String> {
    inj.templates
        .names()
        .filter(|n| {
            // A template that does not render for a sample pod never loads; the bundled sample
            // is what the set checked.
            inj.templates
                .source(n)
                .is_some_and(|s| s.contains("supportsWindows: true"))
        })
        .map(str::to_owned)
        .collect()
}

/// The sidecar names of each template, in the webhook's order (containers, then init
/// containers), as a CEL map from template name to list.
fn sidecars_by_template(all: &[(String, &Fragment)]) -> String {
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

/// What a ServiceAccount token volume looks like (its name is random; the status leaves it out).
const TOKEN_VOLUME: &str = "(v.name.startsWith(\"kube-api-access-\") && has(v.projected) && has(v.projected.sources) && v.projected.sources.exists(s, has(s.serviceAccountToken)))";

/// The ValidatingAdmissionPolicy and its binding.
pub fn backstop(inj: &Injector, sel: &Selection) -> Result<Vec<Value>, ExportError> {
    let names: Vec<String> = inj.templates.names().map(str::to_owned).collect();
    if names.is_empty() {
        return Err(ExportError::NoTemplates);
    }
    // Each template rendered for a sample pod: the backstop checks only what does not depend
    // on the pod (names, lists, restart policy, images without a value read of the pod).
    let symbolic: Vec<(String, Option<Symbolic>)> = names
        .iter()
        .map(|n| (n.clone(), symbolic::read(inj, n).ok()))
        .collect();
    let mut fragments = Vec::new();
    for (name, s) in &symbolic {
        let f = match s {
            Some(s) => s.fragment.clone(),
            None => sample_fragment(inj, name)?,
        };
        fragments.push((name.clone(), f));
    }
    let cfg = &inj.config;
    let base = base_name(inj);
    let status = cel::string(&cfg.status_annotation);
    let windows_ok = windows_ok(inj);
    let windows_ok: Vec<&str> = windows_ok.iter().map(String::as_str).collect();
    let known = cel::strings(names.iter().map(String::as_str));
    let mut missing = Vec::new();
    let mut problems = Vec::new();
    for (name, f) in &fragments {
        let t = cel::string(name);
        let lists = [
            ("containers", &f.containers, "initContainers"),
            ("initContainers", &f.init_containers, "containers"),
        ];
        for (list, wanted, other) in lists {
            for c in wanted {
                let s = cel::string(&c.name);
                let guard = format!("{t} in variables.injected && !({s} in variables.kept)");
                missing.push(format!(
                    "({guard} && !({s} in variables.names)) ? [{}] : []",
                    cel::string(&format!("{} (template {name})", c.name))
                ));
                problems.push(format!(
                    "({guard} && {s} in variables.{other} && !({s} in variables.{list})) ? {} : \"\"",
                    cel::string(&format!(
                        "sidecar {:?} (template {name}) must be in spec.{list} but is in spec.{other}",
                        c.name
                    ))
                ));
                let found = format!(
                    "(has(object.spec.{list}) ? object.spec.{list} : []).exists(c, c.name == {s}"
                );
                if c.restart_policy.as_deref() == Some("Always") {
                    problems.push(format!(
                        "({guard} && {found} && (!has(c.restartPolicy) || c.restartPolicy != \"Always\"))) ? {} : \"\"",
                        cel::string(&format!(
                            "sidecar {:?} (template {name}) must have restartPolicy: Always (a native sidecar)",
                            c.name
                        ))
                    ));
                }
                if let Some(image) = c.image.as_deref().filter(|i| !i.contains(symbolic::OPEN)) {
                    problems.push(format!(
                        "({guard} && {found} && (!has(c.image) || c.image != {}))) ? {} : \"\"",
                        cel::string(image),
                        cel::string(&format!(
                            "sidecar {:?} (template {name}) must run image {image}: the injector owns it",
                            c.name
                        ))
                    ));
                }
            }
        }
        for v in &f.volumes {
            problems.push(format!(
                "({t} in variables.injected && !(has(object.spec.volumes) && object.spec.volumes.exists(v, v.name == {s}))) ? {} : \"\"",
                cel::string(&format!("volume {:?} (template {name}) is missing from spec.volumes", v.name)),
                s = cel::string(&v.name),
            ));
        }
    }
    problems.push(format!(
        "(variables.injected.size() > 0 && !(has(object.metadata.annotations) && {status} in object.metadata.annotations)) ? {} : \"\"",
        cel::string(&format!("annotation {} is missing: the pod did not pass through the sidecar injector", cfg.status_annotation))
    ));
    let kept = format!(
        "(has(object.metadata.annotations) && {status} in object.metadata.annotations && object.metadata.annotations[{status}].contains('\"kept\":[')) ? object.metadata.annotations[{status}].split('\"kept\":[')[1].split(']')[0].split(',').map(k, k.trim().replace('\"', '')) : [\"\"]"
    );
    let name_expr = "(has(object.metadata.name) && object.metadata.name != \"\" ? object.metadata.name : (has(object.metadata.generateName) ? object.metadata.generateName + \"*\" : \"\"))";
    let variables = json!([
        {"name": "asked", "expression": cel::asked(inj)},
        {"name": "unknown", "expression": format!("variables.asked.filter(n, !(n in {known}))")},
        {"name": "injected", "expression": cel::injected(inj, "variables.asked", &windows_ok)},
        {"name": "containers", "expression": "has(object.spec.containers) ? object.spec.containers.map(c, c.name) : []"},
        {"name": "initContainers", "expression": "has(object.spec.initContainers) ? object.spec.initContainers.map(c, c.name) : []"},
        {"name": "names", "expression": "variables.containers + variables.initContainers"},
        {"name": "kept", "expression": kept},
        {"name": "missing", "expression": format!("[{}].flatten()", join_or_empty(&missing))},
        {"name": "problems", "expression": format!("[{}].filter(p, p != \"\")", problems.join(",\n"))},
    ]);
    let action = match cfg.validation.mode {
        ValidationMode::Enforce => "Deny",
        ValidationMode::Warn => "Warn",
    };
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": format!("{base}-backstop"), "labels": labels(inj)},
        "spec": {
            // In-process: an error is a bug of the expressions, and a pod let through unchecked
            // is what the backstop exists to prevent.
            "failurePolicy": "Fail",
            "matchConstraints": match_constraints(inj, &["CREATE"]),
            "matchConditions": conditions(inj),
            "variables": variables,
            "validations": [
                {
                    "expression": "variables.unknown.size() == 0",
                    "messageExpression": format!(
                        "\"pod \" + {name_expr} + \": annotation {} names template(s) \" + variables.unknown.join(\", \") + \" that do not exist (known templates: {})\"",
                        cfg.templates_annotation, names.join(", ")
                    ),
                    "reason": "Invalid",
                },
                {
                    "expression": "variables.unknown.size() > 0 || variables.missing.filter(m, m != \"\").size() == 0",
                    "messageExpression": format!(
                        "\"pod \" + {name_expr} + \" lacks its sidecar(s) \" + variables.missing.filter(m, m != \"\").join(\", \") + \": the sidecar injector did not run for it (is it down, or its webhook unreachable?). Create the pod again once the injector is running; `kubectl get pods -n <injector namespace>` shows it.\""
                    ),
                    "reason": "Invalid",
                },
                {
                    "expression": "variables.unknown.size() > 0 || variables.missing.filter(m, m != \"\").size() > 0 || variables.problems.size() == 0",
                    "messageExpression": format!("\"pod \" + {name_expr} + \": \" + variables.problems.join(\"; \")"),
                    "reason": "Invalid",
                },
            ],
        },
    });
    let mut docs = vec![policy];
    for (suffix, selectors) in bindings(inj, sel) {
        docs.push(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": format!("{base}-backstop{suffix}"), "labels": labels(inj)},
            "spec": {
                "policyName": format!("{base}-backstop"),
                "validationActions": [action],
                "matchResources": selectors,
            },
        }));
    }
    Ok(docs)
}

fn join_or_empty(items: &[String]) -> String {
    if items.is_empty() {
        "[\"\"]".into()
    } else {
        items.join(",\n")
    }
}

/// A template that cannot be read for every pod, rendered for the set's sample pod: its names,
/// lists and restart policies do not depend on the pod (the set checks that when it loads).
fn sample_fragment(inj: &Injector, name: &str) -> Result<Fragment, ExportError> {
    inj.templates
        .sample(name)
        .map(|f| (*f).clone())
        .map_err(|e| {
            ExportError::Refused(vec![(
                name.to_owned(),
                Refusal {
                    line: 0,
                    construct: String::new(),
                    reason: e.to_string(),
                },
            )])
        })
}

/// The policy's stand-in for the status hash: CEL has no hash function, so the policy records
/// a digest of what it was exported from, the same for every pod.
fn export_hash(all: &[(String, Symbolic)]) -> String {
    let mut h = Sha256::new();
    for (name, s) in all {
        h.update(name.as_bytes());
        h.update([0]);
        h.update(serde_json::to_vec(&s.fragment).unwrap_or_default());
        for e in &s.exprs {
            h.update(e.as_bytes());
            h.update([0]);
        }
    }
    let hex: String = h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("policy-{hex}")
}

/// A MutatingAdmissionPolicy and its binding per template.
pub fn mutating(
    inj: &Injector,
    sel: &Selection,
    version: MutatingVersion,
) -> Result<Vec<Value>, ExportError> {
    let all = read_all(inj)?;
    let cfg = &inj.config;
    let owned = inj.templates.owned();
    let base = base_name(inj);
    let api = format!("admissionregistration.k8s.io/{}", version.as_str());
    let windows_ok = windows_ok(inj);
    let windows_ok: Vec<&str> = windows_ok.iter().map(String::as_str).collect();
    let known = cel::strings(all.iter().map(|(n, _)| n.as_str()));
    let fragments: Vec<(String, &Fragment)> =
        all.iter().map(|(n, s)| (n.clone(), &s.fragment)).collect();
    let hash = export_hash(&all);
    let mut docs = Vec::new();
    for (name, s) in &all {
        let t = cel::string(name);
        let f = &s.fragment;
        let v = |value: &Value, ty: &str| -> Result<String, ExportError> {
            cel::value(value, ty, &s.exprs).map_err(|reason| {
                ExportError::Refused(vec![(
                    name.clone(),
                    Refusal {
                        line: 0,
                        construct: String::new(),
                        reason,
                    },
                )])
            })
        };
        let json = serde_json::to_value(f).unwrap_or_default();
        let field = |k: &str| -> Vec<Value> {
            json.get(k)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        let sidecars = sidecars_by_template(&fragments);
        let mut variables = vec![
            json!({"name": "asked", "expression": cel::asked(inj)}),
            json!({"name": "injected", "expression": cel::injected(inj, "variables.asked", &windows_ok)}),
            json!({"name": "names", "expression": "object.spec.containers.map(c, c.name) + (has(object.spec.initContainers) ? object.spec.initContainers.map(c, c.name) : [])"}),
            json!({"name": "sidecars", "expression": format!("variables.injected.map(t, {sidecars}[t]).flatten().filter(n, n != \"\")")}),
        ];
        let mut ops = Vec::new();
        // Object-typed values (`Object.spec...{}`) exist only in the patch expression itself,
        // not in variables: each item is written once, guarded by a test on its name.
        //
        // Mounts and env first, on the indices the containers have now (before any container
        // is inserted), for every application container (not a sidecar of the templates
        // injected). A list the container lacks is created empty, then appended to.
        let mounts = field("volumeMounts");
        let env = field("env");
        if !mounts.is_empty() || !env.is_empty() {
            let mut per = Vec::new();
            for (items, key, ty) in [
                (
                    &mounts,
                    "volumeMounts",
                    "Object.spec.containers.volumeMounts",
                ),
                (&env, "env", "Object.spec.containers.env"),
            ] {
                if items.is_empty() {
                    continue;
                }
                let path = format!("\"/spec/containers/\" + string(i) + \"/{key}\"");
                per.push(format!(
                    "(has(c.{key}) ? [] : [JSONPatch{{op: \"add\", path: {path}, value: []}}])"
                ));
                for item in items {
                    let name = cel::string(item.get("name").and_then(Value::as_str).unwrap_or(""));
                    let same = match key {
                        "volumeMounts" => format!(
                            "x.name == {name} || x.mountPath == {}",
                            cel::string(
                                item.get("mountPath").and_then(Value::as_str).unwrap_or("")
                            )
                        ),
                        _ => format!("x.name == {name}"),
                    };
                    per.push(format!(
                        "((has(c.{key}) && c.{key}.exists(x, {same})) ? [] : [JSONPatch{{op: \"add\", path: {path} + \"/-\", value: {}}}])",
                        v(item, ty)?
                    ));
                }
            }
            ops.push(format!(
                "object.spec.containers.transformList(i, c, !(c.name in variables.sidecars), {}).flatten()",
                per.join("\n    + ")
            ));
        }
        // Containers: before the sidecars of the templates the pod asks for after this one, so
        // that the order is the webhook's whatever order the policies run in. Each is inserted
        // at the same index, the last first.
        let containers = field("containers");
        if !containers.is_empty() {
            variables.push(json!({"name": "after", "expression": format!("variables.injected.filter(t, variables.injected.indexOf(t) > variables.injected.indexOf({t})).map(t, {sidecars}[t]).flatten().filter(n, n != \"\")")}));
            variables.push(json!({"name": "containerIndex", "expression": "string(size(object.spec.containers) - object.spec.containers.filter(c, c.name in variables.after).size())"}));
            for c in containers.iter().rev() {
                let name = cel::string(c.get("name").and_then(Value::as_str).unwrap_or(""));
                ops.push(format!(
                    "({name} in variables.names ? [] : [JSONPatch{{op: \"add\", path: \"/spec/containers/\" + variables.containerIndex, value: {}}}])",
                    v(c, "Object.spec.containers")?
                ));
            }
        }
        // Init containers: after those of the templates asked for before this one, before the
        // pod's own.
        let inits = field("initContainers");
        if !inits.is_empty() {
            let names: Vec<&str> = inits
                .iter()
                .map(|c| c.get("name").and_then(Value::as_str).unwrap_or(""))
                .collect();
            variables.push(json!({"name": "before", "expression": format!("variables.injected.filter(t, variables.injected.indexOf(t) < variables.injected.indexOf({t})).map(t, {sidecars}[t]).flatten().filter(n, n != \"\")")}));
            variables.push(json!({"name": "initIndex", "expression": "has(object.spec.initContainers) ? string(object.spec.initContainers.filter(c, c.name in variables.before).size()) : \"0\""}));
            ops.push(format!(
                "((has(object.spec.initContainers) || {}.all(n, n in variables.names)) ? [] : [JSONPatch{{op: \"add\", path: \"/spec/initContainers\", value: []}}])",
                cel::strings(names.iter().copied())
            ));
            for c in inits.iter().rev() {
                let name = cel::string(c.get("name").and_then(Value::as_str).unwrap_or(""));
                ops.push(format!(
                    "({name} in variables.names ? [] : [JSONPatch{{op: \"add\", path: \"/spec/initContainers/\" + variables.initIndex, value: {}}}])",
                    v(c, "Object.spec.initContainers")?
                ));
            }
        }
        for (key, ty) in [
            ("volumes", "Object.spec.volumes"),
            ("imagePullSecrets", "Object.spec.imagePullSecrets"),
        ] {
            let items = field(key);
            if items.is_empty() {
                continue;
            }
            ops.push(format!(
                "(has(object.spec.{key}) ? [] : [JSONPatch{{op: \"add\", path: \"/spec/{key}\", value: []}}])"
            ));
            for item in &items {
                let name = cel::string(item.get("name").and_then(Value::as_str).unwrap_or(""));
                ops.push(format!(
                    "((has(object.spec.{key}) && object.spec.{key}.exists(y, y.name == {name})) ? [] : [JSONPatch{{op: \"add\", path: \"/spec/{key}/-\", value: {}}}])",
                    v(item, ty)?
                ));
            }
        }
        if !f.labels.is_empty() {
            ops.push(meta_ops("labels", &f.labels, None, &s.exprs).map_err(|r| refused(name, r))?);
        }
        variables.push(json!({"name": "status", "expression": status_expr(inj, &hash, owned)}));
        let annotations: std::collections::BTreeMap<String, String> = f
            .annotations
            .iter()
            .filter(|(k, _)| **k != cfg.status_annotation)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let status_var = "variables.status".to_owned();
        ops.push(
            meta_ops(
                "annotations",
                &annotations,
                Some((&cfg.status_annotation, &status_var)),
                &s.exprs,
            )
            .map_err(|r| refused(name, r))?,
        );
        let mut match_conditions = conditions(inj);
        match_conditions.push(json!({
            "name": "known-templates",
            "expression": format!("{}.all(n, n in {known})", cel::asked(inj)),
        }));
        match_conditions.push(json!({
            "name": "injects-template",
            "expression": format!("{t} in {}", cel::injected(inj, &cel::asked(inj), &windows_ok)),
        }));
        let policy_name = format!("{base}-{name}");
        docs.push(json!({
            "apiVersion": api,
            "kind": "MutatingAdmissionPolicy",
            "metadata": {"name": policy_name, "labels": labels(inj)},
            "spec": {
                "failurePolicy": "Fail",
                "reinvocationPolicy": "IfNeeded",
                "matchConstraints": match_constraints(inj, &["CREATE"]),
                "matchConditions": match_conditions,
                "variables": variables,
                "mutations": [{
                    "patchType": "JSONPatch",
                    "jsonPatch": {"expression": ops.join("\n+ ")},
                }],
            },
        }));
        for (suffix, selectors) in bindings(inj, sel) {
            docs.push(json!({
                "apiVersion": api,
                "kind": "MutatingAdmissionPolicyBinding",
                "metadata": {"name": format!("{policy_name}{suffix}"), "labels": labels(inj)},
                "spec": {"policyName": policy_name, "matchResources": selectors},
            }));
        }
    }
    Ok(docs)
}

fn refused(name: &str, reason: String) -> ExportError {
    ExportError::Refused(vec![(
        name.to_owned(),
        Refusal {
            line: 0,
            construct: String::new(),
            reason,
        },
    )])
}

/// Ops that add the labels or annotations a template sets, where absent (the map too), and
/// `status` (a key and a CEL string) where absent.
fn meta_ops(
    map: &str,
    entries: &std::collections::BTreeMap<String, String>,
    status: Option<(&String, &String)>,
    exprs: &[String],
) -> Result<String, String> {
    let mut all: Vec<(String, String)> = entries
        .iter()
        .map(|(k, v)| Ok((k.clone(), cel::text(v, exprs)?)))
        .collect::<Result<_, String>>()?;
    if let Some((k, v)) = status {
        all.push((k.clone(), v.clone()));
    }
    let whole: Vec<String> = all
        .iter()
        .map(|(k, v)| format!("{}: {v}", cel::string(k)))
        .collect();
    let each: Vec<String> = all
        .iter()
        .map(|(k, v)| {
            format!(
                "({key} in object.metadata.{map} ? [] : [JSONPatch{{op: \"add\", path: {path}, value: {v}}}])",
                key = cel::string(k),
                path = cel::string(&format!("/metadata/{map}/{}", cel::pointer_token(k))),
            )
        })
        .collect();
    Ok(format!(
        "(has(object.metadata.{map}) ? {} : [JSONPatch{{op: \"add\", path: \"/metadata/{map}\", value: {{{}}}}}])",
        each.join(" + "),
        whole.join(", ")
    ))
}

/// The status annotation the webhook writes, as CEL: the templates injected, the export's
/// hash, the sidecar names the pod brought itself, the revision and what of the pod the
/// rendering saw.
fn status_expr(inj: &Injector, hash: &str, owned: &crate::engine::template::Owned) -> String {
    let quoted = |list: &str| format!("{list}.map(n, \"\\\"\" + n + \"\\\"\").join(\",\")");
    let revision = match inj.config.revision.as_str() {
        "" => String::new(),
        r => format!(
            ",\"revision\":{}",
            serde_json::to_string(r).unwrap_or_default()
        ),
    };
    let sidecars = cel::strings(owned.sidecars.iter().map(String::as_str));
    let volumes = cel::strings(owned.volumes.iter().map(String::as_str));
    let seen_containers =
        format!("object.spec.containers.map(c, c.name).filter(n, !(n in {sidecars}))");
    let seen_inits = format!(
        "(has(object.spec.initContainers) ? object.spec.initContainers.map(c, c.name) : []).filter(n, !(n in {sidecars}))"
    );
    let seen_volumes = format!(
        "(has(object.spec.volumes) ? object.spec.volumes.filter(v, !(v.name in {volumes}) && !{TOKEN_VOLUME}).map(v, v.name) : [])"
    );
    let part = |key: &str, list: &str| {
        format!(
            "({list}.size() == 0 ? \"\" : \"\\\"{key}\\\":[\" + {} + \"]\")",
            quoted(list)
        )
    };
    let kept = "variables.sidecars.filter(n, n in variables.names)";
    format!(
        "\"{{\\\"templates\\\":[\" + {templates} + \"],\\\"hash\\\":\\\"{hash}\\\"\" + ({kept}.size() == 0 ? \"\" : \",\\\"kept\\\":[\" + {kept_list} + \"]\") + {revision} + \",\\\"context\\\":{{\" + [{c}, {i}, {v}].filter(p, p != \"\").join(\",\") + \"}}}}\"",
        templates = quoted("variables.injected"),
        kept_list = quoted(kept),
        revision = cel::string(&revision),
        c = part("containers", &seen_containers),
        i = part("initContainers", &seen_inits),
        v = part("volumes", &seen_volumes),
    )
}

/// Documents as one YAML stream, each with a header comment saying what wrote it.
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

/// The names every policy of an export may create, for tests and the chart.
pub fn names(inj: &Injector) -> BTreeSet<String> {
    let base = base_name(inj);
    let mut out: BTreeSet<String> = inj
        .templates
        .names()
        .map(|n| format!("{base}-{n}"))
        .collect();
    out.insert(format!("{base}-backstop"));
    out
}
