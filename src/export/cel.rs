//! Writing CEL: literals, and the expressions over the pod that both policies share (who is
//! opted in, which templates a pod asks for, what of the pod templates see).

use crate::engine::config::Injector;
use crate::engine::overrides::{self, BadValue};

/// A CEL string literal.
pub fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A list of strings.
pub fn strings<'s>(items: impl IntoIterator<Item = &'s str>) -> String {
    let items: Vec<String> = items.into_iter().map(string).collect();
    format!("[{}]", items.join(", "))
}

/// A JSON pointer token.
pub fn pointer_token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Whether the pod is one the injector never touches: an excluded namespace, or `hostNetwork`
/// when it is skipped. (Windows is per template.)
pub fn not_skipped(inj: &Injector) -> Vec<(&'static str, String)> {
    let mut out = vec![(
        "not-excluded-namespace",
        format!(
            "!(request.namespace in {})",
            strings(excluded(inj).iter().map(String::as_str))
        ),
    )];
    if inj.config.skip.host_network {
        out.push((
            "not-host-network",
            "!(has(object.spec) && has(object.spec.hostNetwork) && object.spec.hostNetwork)".into(),
        ));
    }
    out
}

/// Excluded namespaces, the injector's own included, sorted.
pub fn excluded(inj: &Injector) -> Vec<String> {
    let mut all: Vec<String> = inj.config.excluded_namespaces.clone();
    if let Some(own) = &inj.own_namespace {
        all.push(own.clone());
    }
    all.sort();
    all.dedup();
    all
}

/// What a ServiceAccount token volume looks like (its name is random; the status leaves it out).
pub const TOKEN_VOLUME: &str = "(v.name.startsWith(\"kube-api-access-\") && has(v.projected) && has(v.projected.sources) && v.projected.sources.exists(s, has(s.serviceAccountToken)))";

/// Whether the pod is a Windows pod, as the webhook tells.
pub const WINDOWS: &str = "(has(object.spec) && ((has(object.spec.os) && has(object.spec.os.name) && object.spec.os.name == \"windows\") || (has(object.spec.nodeSelector) && \"kubernetes.io/os\" in object.spec.nodeSelector && object.spec.nodeSelector[\"kubernetes.io/os\"] == \"windows\")))";

/// The names of the templates the pod asks for (its annotation, trimmed, empty names left
/// out; or the configured defaults), in order; with `once`, each once (`distinct()`, a list
/// function of Kubernetes 1.34+: the backstop, which runs from 1.30, only tests membership and
/// does without it).
pub fn asked(inj: &Injector, once: bool) -> String {
    let cfg = &inj.config;
    let key = string(&cfg.templates_annotation);
    let distinct = if once { ".distinct()" } else { "" };
    format!(
        "((has(object.metadata.annotations) && {key} in object.metadata.annotations) ? object.metadata.annotations[{key}].split(\",\").map(n, n.trim()).filter(n, n != \"\"){distinct} : {})",
        strings(cfg.default_templates.iter().map(String::as_str))
    )
}

/// Of `asked` (a CEL list), the templates injected: all, but on a Windows pod only those that
/// support Windows when Windows pods are skipped, and no template whose `conflictsWith` names
/// a container the pod runs (`conflicts`: each template's names, as its rendering says).
pub fn injected(
    inj: &Injector,
    asked: &str,
    windows_ok: &[&str],
    conflicts: &[(&str, &[String])],
) -> String {
    let mut out = asked.to_owned();
    if inj.config.skip.windows {
        out = format!(
            "({WINDOWS} ? {out}.filter(t, t in {}) : {out})",
            strings(windows_ok.iter().copied())
        );
    }
    for (template, names) in conflicts.iter().filter(|(_, n)| !n.is_empty()) {
        let names = strings(names.iter().map(String::as_str));
        out = format!(
            "{out}.filter(t, t != {} || !(object.spec.containers.exists(c, c.name in {names}) || (has(object.spec.initContainers) && object.spec.initContainers.exists(c, c.name in {names}))))",
            string(template)
        );
    }
    out
}

/// Whether the pod's QoS class is `Guaranteed`, as [`crate::engine::fit::guaranteed`] tells:
/// from its pod-level resources when it sets them, or else every container and init container
/// but the templates' sidecars (`owned`) has cpu and memory limits and requests, where given,
/// equal to them (compared as quantities).
pub fn guaranteed(owned: &[&str]) -> String {
    let owned = strings(owned.iter().copied());
    let equal = |r: &str| {
        format!(
            "(has({r}.limits) && [\"cpu\", \"memory\"].all(n, n in {r}.limits && (!has({r}.requests) || !(n in {r}.requests) || quantity({r}.requests[n]).compareTo(quantity({r}.limits[n])) == 0)))"
        )
    };
    let budget = "object.spec.resources";
    let pod_level = format!(
        "(has({budget}) && ((has({budget}.requests) && (\"cpu\" in {budget}.requests || \"memory\" in {budget}.requests)) || (has({budget}.limits) && (\"cpu\" in {budget}.limits || \"memory\" in {budget}.limits))))"
    );
    format!(
        "{pod_level} ? {} : [object.spec.containers.filter(c, !(c.name in {owned})) + (has(object.spec.initContainers) ? object.spec.initContainers.filter(c, !(c.name in {owned})) : [])].all(own, own.size() > 0 && own.all(c, has(c.resources) && {}))",
        equal(budget),
        equal("c.resources"),
    )
}

/// One per-pod override, as CEL over the pod: whether the pod sets it, whether the value it
/// sets is allowed (as `overrides::check` tells; only when it is set), and the webhook's
/// refusal of it (`InjectError::BadOverride` as the review writes it).
pub struct OverrideCheck {
    pub present: String,
    pub allowed: String,
    pub message: String,
}

/// The checks of every override template `name` declares, in the webhook's order.
pub fn override_checks(inj: &Injector, name: &str) -> Vec<OverrideCheck> {
    let Some(declared) = inj.templates.declared(name) else {
        return Vec::new();
    };
    declared
        .iter()
        .map(|(annotation, spec)| {
            let key = string(annotation);
            let value = format!("object.metadata.annotations[{key}]");
            // As Rust's `{:?}` writes it, but for control characters other than these.
            let quoted = format!(
                "{value}.replace(\"\\\\\", \"\\\\\\\\\").replace(\"\\\"\", \"\\\\\\\"\").replace(\"\\n\", \"\\\\n\").replace(\"\\r\", \"\\\\r\").replace(\"\\t\", \"\\\\t\")"
            );
            let (before, after) = BadValue::around(annotation, &overrides::describe(spec));
            OverrideCheck {
                present: format!(
                    "(has(object.metadata.annotations) && {key} in object.metadata.annotations)"
                ),
                allowed: spec.cel_test(&value, string),
                // The webhook's words (`InjectError::BadOverride` around `BadValue`), the
                // value between its quotes.
                message: format!(
                    "{} + {quoted} + {}",
                    string(&format!("sidecar-injector: template {name:?}: {before}\"")),
                    string(&format!("\"{after}")),
                ),
            }
        })
        .collect()
}
