//! Writing CEL: literals, and the expressions over the pod that both policies share (who is
//! opted in, which templates a pod asks for, what of the pod templates see).

use crate::engine::config::Injector;

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
/// support Windows when Windows pods are skipped.
pub fn injected(inj: &Injector, asked: &str, windows_ok: &[&str]) -> String {
    if !inj.config.skip.windows {
        return asked.to_owned();
    }
    format!(
        "({WINDOWS} ? {asked}.filter(t, t in {}) : {asked})",
        strings(windows_ok.iter().copied())
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
            OverrideCheck {
                present: format!(
                    "(has(object.metadata.annotations) && {key} in object.metadata.annotations)"
                ),
                allowed: allowed(spec, &value),
                message: format!(
                    "{} + {quoted} + {}",
                    string(&format!(
                        "sidecar-injector: template {name:?}: annotation {annotation}: \""
                    )),
                    string(&format!(
                        "\" is not allowed: {}",
                        crate::engine::overrides::describe(spec)
                    )),
                ),
            }
        })
        .collect()
}

/// Whether `value` (a CEL string) is allowed by `spec`, as `overrides::check` tells: the
/// canonical forms by regular expression, the bounds compared in the value's own unit so that
/// no product overflows.
fn allowed(spec: &crate::engine::overrides::Spec, value: &str) -> String {
    use crate::engine::overrides::{Kind, bound};
    const DIGITS: &str = "(0|[1-9][0-9]{0,17})";
    // `n * unit` within the bounds, as conditions on `n`.
    let within = |n: &str, unit: i128| -> String {
        let mut out = Vec::new();
        if let Some(min) = spec.min.as_ref().and_then(|b| bound(spec.kind, b)) {
            let least = (min + unit - 1).div_euclid(unit);
            out.push(match i64::try_from(least) {
                Ok(least) => format!("{n} >= {least}"),
                Err(_) => "false".into(),
            });
        }
        if let Some(max) = spec.max.as_ref().and_then(|b| bound(spec.kind, b)) {
            let most = max.div_euclid(unit);
            if let Ok(most) = i64::try_from(most) {
                out.push(format!("{n} <= {most}"));
            }
        }
        out.into_iter()
            .map(|c| format!(" && {c}"))
            .collect::<String>()
    };
    match spec.kind {
        Kind::String if spec.allowed.is_empty() => "true".into(),
        Kind::String => format!(
            "{value} in {}",
            strings(spec.allowed.iter().map(String::as_str))
        ),
        Kind::Boolean => format!("{value} in [\"true\", \"false\"]"),
        Kind::Integer => format!(
            "({value}.matches(\"^(0|-?[1-9][0-9]{{0,17}})$\"){})",
            within(&format!("int({value})"), 1)
        ),
        Kind::Cpu => {
            let milli = format!("int({value}.substring(0, size({value}) - 1))");
            format!(
                "(({value}.matches(\"^{DIGITS}$\"){}) || ({value}.matches(\"^{DIGITS}m$\") && {milli} % 1000 != 0{}))",
                within(&format!("int({value})"), 1000),
                within(&milli, 1),
            )
        }
        Kind::Memory => {
            let n = format!("int({value}.substring(0, size({value}) - 2))");
            let forms: Vec<String> = ["Ki", "Mi", "Gi", "Ti"]
                .iter()
                .enumerate()
                .map(|(i, suffix)| {
                    let unit = 1i128 << (10 * (i + 1));
                    let next = match *suffix {
                        "Ti" => String::new(),
                        _ => format!(" && ({n} % 1024 != 0 || {n} == 0)"),
                    };
                    format!(
                        "({value}.matches(\"^{DIGITS}{suffix}$\"){next}{})",
                        within(&n, unit)
                    )
                })
                .collect();
            format!("({})", forms.join(" || "))
        }
    }
}
