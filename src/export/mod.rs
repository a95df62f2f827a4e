//! The configuration exported as admission policies that run inside the API server: no
//! network hop, nothing that can be down.
//!
//! - [`backstop`]: a ValidatingAdmissionPolicy holding what CEL can check of the validator's
//!   contract, so that an opted-in pod the injector did not reach is refused with a message
//!   that says so, whatever the webhooks' failure policies.
//! - [`mutating`]: one MutatingAdmissionPolicy for every template, whose JSONPatch adds what
//!   the webhook adds (only what is missing), so that the API server injects by itself.
//!
//! Both are another rendering of the same decision: who is opted in and skipped, which
//! templates a pod asks for, what each template renders ([`symbolic`]). Documents are JSON
//! values; the CLI writes them as YAML.

pub mod cel;
pub mod loops;
pub mod markers;
pub mod read;
pub mod symbolic;
mod translate;
mod trials;
mod walk;

use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::engine::config::{Injector, NAMESPACE_ENABLED, ValidationMode};
use crate::engine::inject::revision_name;
use crate::engine::template::{Fragment, TEMPLATE_SUFFIX};
use crate::export::cel::TOKEN_VOLUME;
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
fn read_all(inj: &Injector) -> Result<Vec<(String, Symbolic)>, ExportError> {
    let names: Vec<String> = inj.templates.names().map(str::to_owned).collect();
    if names.is_empty() {
        return Err(ExportError::NoTemplates);
    }
    let mut out = Vec::new();
    let mut refused = Vec::new();
    for name in names {
        match read::read(inj, &name) {
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

/// The annotation every exported object carries: the digest of the configuration it was
/// exported from ([`Injector::digest`]), so that whoever keeps it in step (`serve
/// --backstop`) can tell whether it still is.
pub const CONFIG_ANNOTATION: &str = "sidecar-injector.io/config";

/// An exported object's metadata: its name, labels and the configuration's digest.
fn metadata(inj: &Injector, name: String) -> Value {
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
fn windows_ok(fragments: &[(String, Fragment)]) -> Vec<&str> {
    fragments
        .iter()
        .filter(|(_, f)| f.supports_windows)
        .map(|(n, _)| n.as_str())
        .collect()
}

/// The sidecar names of each template, in the webhook's order (containers, then init
/// containers), as a CEL map from template name to list.
fn sidecars_by_template(all: &[(String, Fragment)]) -> String {
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

/// The ValidatingAdmissionPolicy and its bindings.
/// `images`: also refuse a sidecar whose image is not the one its template fixes. Off unless
/// asked: such a backstop must change in the same instant as the injector's configuration (a
/// reload, a rollout), or it refuses pods the injector injected with the other version.
pub fn backstop(inj: &Injector, sel: &Selection, images: bool) -> Result<Vec<Value>, ExportError> {
    let names: Vec<String> = inj.templates.names().map(str::to_owned).collect();
    if names.is_empty() {
        return Err(ExportError::NoTemplates);
    }
    // Each template rendered for a sample pod: the backstop checks only what does not depend
    // on the pod (names, lists, restart policy, images without a value read of the pod).
    let symbolic: Vec<(String, Option<Symbolic>)> = names
        .iter()
        .map(|n| (n.clone(), read::read(inj, n).ok()))
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
    let windows_ok = windows_ok(&fragments);
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
                if let Some(image) = c
                    .image
                    .as_deref()
                    .filter(|i| images && !markers::symbolic(i))
                {
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
    // Held to this export's contract: a pod the injector never reached (no status), or one it
    // injected under this very configuration. A pod injected under another (a replica not yet
    // reloaded, or already reloaded while this policy is replaced) needs only its status: a
    // stale backstop never refuses what the running configuration injected.
    let current = format!(
        "!(has(object.metadata.annotations) && {status} in object.metadata.annotations) || object.metadata.annotations[{status}].contains({})",
        cel::string(&format!("\"config\":\"{}\"", inj.digest))
    );
    let refusals = override_refusals(inj, &names);
    // After an unknown template, the webhook refuses the first override not allowed; the
    // other checks wait for both to pass, so that the pod gets one message.
    let after = match refusals {
        Some(_) => "variables.unknown.size() > 0 || variables.overrides.size() > 0 || ",
        None => "variables.unknown.size() > 0 || ",
    };
    let mut variables = json!([
        {"name": "current", "expression": current},
        {"name": "asked", "expression": cel::asked(inj, false)},
        {"name": "unknown", "expression": format!("variables.current ? variables.asked.filter(n, !(n in {known})) : []")},
        {"name": "injected", "expression": cel::injected(inj, "variables.asked", &windows_ok)},
        {"name": "containers", "expression": "has(object.spec.containers) ? object.spec.containers.map(c, c.name) : []"},
        {"name": "initContainers", "expression": "has(object.spec.initContainers) ? object.spec.initContainers.map(c, c.name) : []"},
        {"name": "names", "expression": "variables.containers + variables.initContainers"},
        {"name": "kept", "expression": kept},
        {"name": "missing", "expression": format!("variables.current ? ({}).filter(m, m != \"\") : []", join_or_empty(&missing))},
        {"name": "problems", "expression": format!("variables.current ? [{}].filter(p, p != \"\") : []", problems.join(",\n"))},
    ]);
    if let (Some(chain), Some(list)) = (&refusals, variables.as_array_mut()) {
        list.insert(
            3,
            json!({"name": "overrides", "expression": format!("variables.current ? variables.asked.map(t, {chain}).filter(m, m != \"\") : []")}),
        );
    }
    let action = match cfg.validation.mode {
        ValidationMode::Enforce => "Deny",
        ValidationMode::Warn => "Warn",
    };
    let mut validations = json!([
        {
            "expression": "variables.unknown.size() == 0",
            "messageExpression": format!(
                "\"pod \" + {name_expr} + \": annotation {} names template(s) \" + variables.unknown.join(\", \") + \" that do not exist (known templates: {})\"",
                cfg.templates_annotation, names.join(", ")
            ),
            "reason": "Invalid",
        },
        {
            "expression": format!("{after}variables.missing.size() == 0"),
            "messageExpression": format!(
                "\"pod \" + {name_expr} + \" lacks its sidecar(s) \" + variables.missing.join(\", \") + \": the sidecar injector did not run for it (is it down, or its webhook unreachable?). Create the pod again once the injector is running; `kubectl get pods -n <injector namespace>` shows it.\""
            ),
            "reason": "Invalid",
        },
        {
            "expression": format!("{after}variables.missing.size() > 0 || variables.problems.size() == 0"),
            "messageExpression": format!("\"pod \" + {name_expr} + \": \" + variables.problems.join(\"; \")"),
            "reason": "Invalid",
        },
    ]);
    if let (Some(_), Some(list)) = (&refusals, validations.as_array_mut()) {
        list.insert(
            1,
            json!({
                "expression": "variables.unknown.size() > 0 || variables.overrides.size() == 0",
                "messageExpression": "variables.overrides[0]",
                "reason": "Invalid",
            }),
        );
    }
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": metadata(inj, format!("{base}-backstop")),
        "spec": {
            // In-process: an error is a bug of the expressions, and a pod let through unchecked
            // is what the backstop exists to prevent.
            "failurePolicy": "Fail",
            "matchConstraints": match_constraints(inj, &["CREATE"]),
            "matchConditions": conditions(inj),
            "variables": variables,
            "validations": validations,
        },
    });
    let mut docs = vec![policy];
    for (suffix, selectors) in bindings(inj, sel) {
        docs.push(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": metadata(inj, format!("{base}-backstop{suffix}")),
            "spec": {
                "policyName": format!("{base}-backstop"),
                "validationActions": [action],
                "matchResources": selectors,
            },
        }));
    }
    Ok(docs)
}

/// Whether every per-pod override the pod sets, of the templates it asks for, is allowed. A
/// mutating policy cannot refuse a pod as the webhook does; with this as a match condition it
/// leaves such a pod alone, and the backstop refuses it with the webhook's message.
fn overrides_allowed(inj: &Injector) -> Option<String> {
    let asked = cel::asked(inj, true);
    let each: Vec<String> = inj
        .templates
        .names()
        .filter_map(|name| {
            let checks = cel::override_checks(inj, name);
            (!checks.is_empty()).then(|| {
                let all: Vec<String> = checks
                    .iter()
                    .map(|c| format!("(!{} || {})", c.present, c.allowed))
                    .collect();
                format!(
                    "(!({} in {asked}) || ({}))",
                    cel::string(name),
                    all.join(" && ")
                )
            })
        })
        .collect();
    (!each.is_empty()).then(|| each.join(" && "))
}

/// The webhook's refusal of the first override not allowed, for template `t` (CEL, a name the
/// pod asks for): `""` when there is none.
fn override_refusals(inj: &Injector, names: &[String]) -> Option<String> {
    let mut chain = String::from("\"\"");
    let mut any = false;
    for name in names.iter().rev() {
        let checks = cel::override_checks(inj, name);
        if checks.is_empty() {
            continue;
        }
        any = true;
        let mut first = String::from("\"\"");
        for c in checks.iter().rev() {
            first = format!(
                "(({} && !({})) ? {} : {first})",
                c.present, c.allowed, c.message
            );
        }
        chain = format!("(t == {} ? {first} : {chain})", cel::string(name));
    }
    any.then_some(chain)
}

/// Lists joined with `+` (no `flatten()`: a list function of Kubernetes 1.34+, and the
/// backstop runs from 1.30).
fn join_or_empty(items: &[String]) -> String {
    if items.is_empty() {
        "[\"\"]".into()
    } else {
        items
            .iter()
            .map(|i| format!("({i})"))
            .collect::<Vec<_>>()
            .join("\n+ ")
    }
}

/// A template that cannot be read for every pod, rendered for the set's sample pod: its names,
/// lists and restart policies do not depend on the pod (the set checks that when it loads).
fn sample_fragment(inj: &Injector, name: &str) -> Result<Fragment, ExportError> {
    inj.templates
        .sample(name)
        .map(|f| (*f).clone())
        .map_err(|e| refused(name, e))
}

/// The policy's stand-in for the status hash: CEL has no hash function, so the policy records
/// a digest of what it was exported from, the same for every pod.
fn export_hash(all: &[(String, Symbolic)]) -> String {
    let mut h = Sha256::new();
    for (name, s) in all {
        h.update(name.as_bytes());
        h.update([0]);
        h.update(serde_json::to_vec(&s.json).unwrap_or_default());
        for e in s.exprs.markers.iter().chain(&s.exprs.loops) {
            h.update(e.as_bytes());
            h.update([0]);
        }
        for (k, e) in &s.exprs.iters {
            let (i, v) = symbolic::Exprs::vars(*k);
            h.update(e.cel(&i, &v, "").as_bytes());
            h.update([0]);
        }
    }
    let hex: String = h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("policy-{hex}")
}

/// The MutatingAdmissionPolicy and its bindings: one policy for every template, so that what
/// it adds comes in the order the webhook adds it (the templates in the order the pod asks for
/// them), whatever the API server's order of policies; a policy per template could only be
/// ordered by name.
pub fn mutating(
    inj: &Injector,
    sel: &Selection,
    version: MutatingVersion,
) -> Result<Vec<Value>, ExportError> {
    let mut all = read_all(inj)?;
    // Each list a loop reads, computed once per pod: a variable for every distinct one.
    let mut lists: Vec<String> = Vec::new();
    for (_, s) in &mut all {
        for l in &mut s.exprs.loops {
            let n = match lists.iter().position(|x| x == l) {
                Some(n) => n,
                None => {
                    lists.push(l.clone());
                    lists.len() - 1
                }
            };
            *l = format!("variables.list{n}");
        }
    }
    let cfg = &inj.config;
    let owned = inj.templates.owned();
    let base = base_name(inj);
    let api = format!("admissionregistration.k8s.io/{}", version.as_str());
    let known = cel::strings(all.iter().map(|(n, _)| n.as_str()));
    let fragments: Vec<(String, Fragment)> = all
        .iter()
        .map(|(n, s)| (n.clone(), s.fragment.clone()))
        .collect();
    let windows_ok = windows_ok(&fragments);
    let hash = export_hash(&all);
    let sidecars = sidecars_by_template(&fragments);

    // Per template, the items of one field, as CEL (objects typed by `ty`).
    let by_template = |field: &str, ty: &str| -> Result<Option<String>, ExportError> {
        let mut entries = Vec::new();
        for (name, s) in &all {
            let items = s
                .json
                .get(field)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if items.is_empty() {
                continue;
            }
            let items: Vec<String> = items
                .iter()
                .map(|i| symbolic::value(i, ty, &s.exprs).map_err(|r| refused(name, r)))
                .collect::<Result<_, _>>()?;
            entries.push(format!("{}: [{}]", cel::string(name), items.join(", ")));
        }
        Ok((!entries.is_empty()).then(|| format!("{{{}}}", entries.join(",\n  "))))
    };
    // The items of the templates injected, in their order, each once (the first of a name).
    let in_order = |map: &str, same: &str, absent: &str| {
        format!(
            "[variables.injected.map(t, t in {map} ? {map}[t] : []).flatten()].map(all, all.transformList(j, m, !({absent}) && !all.slice(0, j).exists(y, {same}), m))[0]"
        )
    };
    let mut ops = Vec::new();
    // Mounts and env, for every application container (not a sidecar of the templates
    // injected): what it lacks, in template order, appended (or the list created).
    let mut per = Vec::new();
    for (field, ty, same, has) in [
        (
            "volumeMounts",
            "Object.spec.containers.volumeMounts",
            "y.name == m.name || y.mountPath == m.mountPath",
            "has(c.volumeMounts) && c.volumeMounts.exists(y, y.name == m.name || y.mountPath == m.mountPath)",
        ),
        (
            "env",
            "Object.spec.containers.env",
            "y.name == m.name",
            "has(c.env) && c.env.exists(y, y.name == m.name)",
        ),
    ] {
        if let Some(map) = by_template(field, ty)? {
            let new = in_order(&map, same, has);
            per.push(format!(
                "[{new}].map(new, new.size() == 0 ? [] : (has(c.{field}) ? new.map(m, JSONPatch{{op: \"add\", path: \"/spec/containers/\" + string(i) + \"/{field}/-\", value: m}}) : [JSONPatch{{op: \"add\", path: \"/spec/containers/\" + string(i) + \"/{field}\", value: new}}]))[0]"
            ));
        }
    }
    if !per.is_empty() {
        ops.push(format!(
            "object.spec.containers.transformList(i, c, !(c.name in variables.sidecars), {}).flatten()",
            per.join("\n    + ")
        ));
    }
    // Sidecar containers, appended in template order.
    if let Some(map) = by_template("containers", "Object.spec.containers")? {
        let new = in_order(&map, "y.name == m.name", "m.name in variables.names");
        ops.push(format!(
            "{new}.map(s, JSONPatch{{op: \"add\", path: \"/spec/containers/-\", value: s}})"
        ));
    }
    // Init containers, in template order, before the pod's own.
    if let Some(map) = by_template("initContainers", "Object.spec.initContainers")? {
        let new = in_order(&map, "y.name == m.name", "m.name in variables.names");
        ops.push(format!(
            "[{new}].map(new, new.size() == 0 ? [] : (has(object.spec.initContainers) ? new.transformList(k, s, JSONPatch{{op: \"add\", path: \"/spec/initContainers/\" + string(k), value: s}}) : [JSONPatch{{op: \"add\", path: \"/spec/initContainers\", value: new}}]))[0]"
        ));
    }
    for (field, ty) in [
        ("volumes", "Object.spec.volumes"),
        ("imagePullSecrets", "Object.spec.imagePullSecrets"),
    ] {
        if let Some(map) = by_template(field, ty)? {
            let new = in_order(
                &map,
                "y.name == m.name",
                &format!(
                    "has(object.spec.{field}) && object.spec.{field}.exists(y, y.name == m.name)"
                ),
            );
            ops.push(format!(
                "[{new}].map(new, new.size() == 0 ? [] : (has(object.spec.{field}) ? new.map(x, JSONPatch{{op: \"add\", path: \"/spec/{field}/-\", value: x}}) : [JSONPatch{{op: \"add\", path: \"/spec/{field}\", value: new}}]))[0]"
            ));
        }
    }
    // Labels and annotations the templates set, where the pod has none of that key (the
    // first template injected that sets a key gives its value), then the status.
    let variables = vec![
        json!({"name": "asked", "expression": cel::asked(inj, true)}),
        json!({"name": "injected", "expression": cel::injected(inj, "variables.asked", &windows_ok)}),
        json!({"name": "names", "expression": "object.spec.containers.map(c, c.name) + (has(object.spec.initContainers) ? object.spec.initContainers.map(c, c.name) : [])"}),
        json!({"name": "sidecars", "expression": format!("variables.injected.map(t, {sidecars}[t]).flatten().filter(n, n != \"\")")}),
        json!({"name": "status", "expression": status_expr(inj, &hash, owned)}),
    ];
    let variables: Vec<Value> = variables
        .into_iter()
        .chain(
            lists
                .iter()
                .enumerate()
                .map(|(n, l)| json!({"name": format!("list{n}"), "expression": l})),
        )
        .collect();
    for map in ["labels", "annotations"] {
        let mut keys: std::collections::BTreeMap<&str, Vec<(&str, String)>> = Default::default();
        for (name, s) in &all {
            let entries = s.json.get(map).and_then(Value::as_object);
            for (k, v) in entries.into_iter().flatten() {
                if map == "annotations" && *k == cfg.status_annotation {
                    continue;
                }
                let v = symbolic::text(v.as_str().unwrap_or_default(), &s.exprs)
                    .map_err(|r| refused(name, r))?;
                keys.entry(k.as_str()).or_default().push((name.as_str(), v));
            }
        }
        let mut each = Vec::new();
        for (k, setters) in &keys {
            let names = cel::strings(setters.iter().map(|(t, _)| *t));
            let values: Vec<String> = setters
                .iter()
                .map(|(t, v)| format!("{}: {v}", cel::string(t)))
                .collect();
            each.push(format!(
                "((variables.injected.exists(t, t in {names}) && !(has(object.metadata.{map}) && {key} in object.metadata.{map})) ? [JSONPatch{{op: \"add\", path: {path}, value: {{{values}}}[variables.injected.filter(t, t in {names})[0]]}}] : [])",
                key = cel::string(k),
                path = cel::string(&format!("/metadata/{map}/{}", cel::pointer_token(k))),
                values = values.join(", "),
            ));
        }
        if map == "annotations" {
            each.push(format!(
                "((has(object.metadata.annotations) && {key} in object.metadata.annotations) ? [] : [JSONPatch{{op: \"add\", path: {path}, value: variables.status}}])",
                key = cel::string(&cfg.status_annotation),
                path = cel::string(&format!("/metadata/annotations/{}", cel::pointer_token(&cfg.status_annotation))),
            ));
        }
        if each.is_empty() {
            continue;
        }
        // A pod without the map gets an empty one first, when an entry follows: the status
        // always does; a label only when a template that sets one is injected.
        let setters = cel::strings(keys.values().flatten().map(|(t, _)| *t));
        let create = match map {
            "annotations" => format!("!has(object.metadata.{map})"),
            _ => format!(
                "!has(object.metadata.{map}) && variables.injected.exists(t, t in {setters})"
            ),
        };
        ops.push(format!(
            "(({create}) ? [JSONPatch{{op: \"add\", path: \"/metadata/{map}\", value: {{}}}}] : [])\n+ {}",
            each.join("\n+ ")
        ));
    }
    let mut match_conditions = conditions(inj);
    match_conditions.push(json!({
        "name": "known-templates",
        "expression": format!("{}.all(n, n in {known})", cel::asked(inj, true)),
    }));
    if let Some(expression) = overrides_allowed(inj) {
        match_conditions.push(json!({"name": "overrides-allowed", "expression": expression}));
    }
    match_conditions.push(json!({
        "name": "injects-a-template",
        "expression": format!("{}.size() > 0", cel::injected(inj, &cel::asked(inj, true), &windows_ok)),
    }));
    let mut docs = vec![json!({
        "apiVersion": api,
        "kind": "MutatingAdmissionPolicy",
        "metadata": metadata(inj, base.clone()),
        "spec": {
            // In-process: an error is a bug of the expressions; an opted-in pod is then refused
            // rather than stored without its sidecars.
            "failurePolicy": "Fail",
            // Containers another webhook or policy adds after this one get the mounts and env.
            "reinvocationPolicy": "IfNeeded",
            "matchConstraints": match_constraints(inj, &["CREATE"]),
            "matchConditions": match_conditions,
            "variables": variables,
            "mutations": [{
                "patchType": "JSONPatch",
                "jsonPatch": {"expression": ops.join("\n+ ")},
            }],
        },
    })];
    for (suffix, selectors) in bindings(inj, sel) {
        docs.push(json!({
            "apiVersion": api,
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": metadata(inj, format!("{base}{suffix}")),
            "spec": {"policyName": base, "matchResources": selectors},
        }));
    }
    Ok(docs)
}

fn refused(name: &str, reason: impl std::fmt::Display) -> ExportError {
    ExportError::Refused(vec![(name.to_owned(), Refusal::whole(reason.to_string()))])
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
        "\"{{\\\"templates\\\":[\" + {templates} + \"],\\\"hash\\\":\\\"{hash}\\\",\\\"config\\\":\\\"{config}\\\"\" + ({kept}.size() == 0 ? \"\" : \",\\\"kept\\\":[\" + {kept_list} + \"]\") + {revision} + \",\\\"context\\\":{{\" + [{c}, {i}, {v}].filter(p, p != \"\").join(\",\") + \"}}}}\"",
        templates = quoted("variables.injected"),
        config = inj.digest,
        kept_list = quoted(kept),
        revision = cel::string(&revision),
        c = part("containers", &seen_containers),
        i = part("initContainers", &seen_inits),
        v = part("volumes", &seen_volumes),
    )
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
