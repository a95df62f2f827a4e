//! Writing CEL: literals, the fragment's values as typed object constructions, and the
//! expressions both policies share (who is opted in, which templates a pod asks for).
//!
//! The API server's CEL checks that list and map literals are homogeneous, so a container
//! cannot be a map literal: objects are written as `Object.spec.containers{...}`, their type
//! named by their path in the pod, and only string-to-string fields (resources, labels) as
//! maps.

use serde_json::Value;

use crate::engine::config::Injector;
use crate::export::loops::{self, INT, LOOP_KEY, Piece};
use crate::export::symbolic::{CLOSE, Exprs};

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

/// A string of the fragment: literal text, with each marker's expression joined in, and each
/// loop's output as its body repeated over its list (or its `else`).
pub fn text(s: &str, exprs: &Exprs) -> Result<String, String> {
    joined(&loops::parse(s)?, exprs)
}

fn joined(pieces: &[Piece], exprs: &Exprs) -> Result<String, String> {
    let parts: Vec<String> = pieces
        .iter()
        .map(|p| match p {
            Piece::Text(lit) => Ok(string(lit)),
            Piece::Marker(n) => exprs
                .markers
                .get(*n)
                .map(|e| format!("({e})"))
                .ok_or_else(|| format!("marker {n} has no expression")),
            Piece::Iter(j) => exprs.iter(*j, true).map(|e| format!("({e})")),
            Piece::Loop { k, body, other } => {
                let list = exprs.loops.get(*k).ok_or("an unknown loop")?;
                let (i, v) = Exprs::vars(*k);
                Ok(format!(
                    "({list}.size() == 0 ? {} : {list}.transformList({i}, {v}, {}).join(\"\"))",
                    joined(other, exprs)?,
                    joined(body, exprs)?
                ))
            }
        })
        .collect::<Result<_, String>>()?;
    Ok(match (parts.len(), pieces) {
        (0, _) => "\"\"".into(),
        // A value read of the pod alone may be typed dyn (an annotation), and list literals
        // must be homogeneous (`args: ["--x", <annotation>]`): string() types it.
        (1, [Piece::Marker(_)]) => format!("string{}", parts.concat()),
        (1, _) => parts.concat(),
        _ => format!("({})", parts.join(" + ")),
    })
}

/// Fields of the pod's types whose values are maps of strings, not objects.
const STRING_MAPS: &[&str] = &[
    "limits",
    "requests",
    "labels",
    "annotations",
    "nodeSelector",
    "volumeAttributes",
];

/// A value of the fragment, of the object type `ty` (e.g. `Object.spec.containers`) where it
/// is an object.
pub fn value(v: &Value, ty: &str, exprs: &Exprs) -> Result<String, String> {
    Ok(match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) if n.is_i64() || n.is_u64() => n.to_string(),
        Value::Number(n) => return Err(format!("the number {n} is not an integer")),
        Value::String(s) => match s
            .strip_prefix(INT)
            .and_then(|r| r.strip_suffix(CLOSE))
            .and_then(|n| n.parse::<usize>().ok())
        {
            // A whole number an iteration computes (a port).
            Some(j) => exprs.iter(j, false)?,
            None => text(s, exprs)?,
        },
        Value::Array(items) => {
            // Runs of fixed items, and each loop's items in between.
            let mut segments = Vec::new();
            let mut run = Vec::new();
            for i in items {
                match i.get(LOOP_KEY).and_then(Value::as_u64) {
                    Some(k) => {
                        if !run.is_empty() {
                            segments.push(format!("[{}]", std::mem::take(&mut run).join(", ")));
                        }
                        let k = k as usize;
                        let list = exprs.loops.get(k).ok_or("an unknown loop")?;
                        let (ix, it) = Exprs::vars(k);
                        let items = |key: &str| -> Result<Vec<String>, String> {
                            i[key]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .map(|e| value(e, ty, exprs))
                                .collect()
                        };
                        let (each, other) = (items("each")?, items("else")?);
                        let repeated = match &each[..] {
                            [one] => format!("{list}.transformList({ix}, {it}, {one})"),
                            many => format!(
                                "{list}.transformList({ix}, {it}, [{}]).flatten()",
                                many.join(", ")
                            ),
                        };
                        segments.push(format!(
                            "({list}.size() == 0 ? [{}] : {repeated})",
                            other.join(", ")
                        ));
                    }
                    None => run.push(value(i, ty, exprs)?),
                }
            }
            if !run.is_empty() || segments.is_empty() {
                segments.push(format!("[{}]", run.join(", ")));
            }
            segments.join(" + ")
        }
        Value::Object(fields) => {
            let last = ty.rsplit('.').next().unwrap_or("");
            if STRING_MAPS.contains(&last) {
                let entries: Vec<String> = fields
                    .iter()
                    .map(|(k, v)| match v {
                        Value::String(s) => Ok(format!("{}: {}", string(k), text(s, exprs)?)),
                        other => Err(format!("{last}.{k} is {other}, not a string")),
                    })
                    .collect::<Result<_, _>>()?;
                format!("{{{}}}", entries.join(", "))
            } else {
                let entries: Vec<String> = fields
                    .iter()
                    .map(|(k, v)| Ok(format!("{k}: {}", value(v, &format!("{ty}.{k}"), exprs)?)))
                    .collect::<Result<_, String>>()?;
                format!("{ty}{{{}}}", entries.join(", "))
            }
        }
    })
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
