//! Per-pod overrides: the annotations a template declares it reads, with a type and the values
//! it allows. A pod's value is checked here before any template sees it, so a bad value is
//! refused with a message naming the annotation, never rendered into a container.
//!
//! A template declares them in a comment block whose text starts with `overrides:`:
//!
//! ```text
//! {#- overrides:
//!   sidecar-injector.io/proxy-log-level: {type: string, allowed: [debug, info, warn], default: warn}
//!   sidecar-injector.io/proxy-cpu: {type: cpu, max: 2, default: 50m}
//! -#}
//! ```
//!
//! Templates read the checked values (or the defaults) as `overrides["<annotation>"]`.
//!
//! This is the one home of what each type ([`Kind`]) accepts: how a value is read and bounded
//! ([`check`]), how that is said ([`describe`]), the same test as CEL for the exported policies
//! ([`Spec::cel_test`]) and the values the exporter tries a template with ([`Spec::trials`]).

use std::collections::BTreeMap;

use serde::Deserialize;

/// The type of an override's value. What each accepts is written below, once per type: in
/// [`magnitude`] (via [`check`]), [`describe`], [`Spec::cel_test`] and [`Kind::samples`].
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Any string, or one of `allowed`.
    String,
    /// A whole number, within `min`..=`max` when given.
    Integer,
    /// `"true"` or `"false"`.
    Boolean,
    /// A CPU quantity in canonical form (`250m`, `2`), within `min`..=`max` when given.
    Cpu,
    /// A memory quantity in canonical form (`64Mi`, `1Gi`), within `min`..=`max` when given.
    Memory,
}

/// One declared annotation.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    #[serde(rename = "type")]
    pub kind: Kind,
    /// The only values accepted (strings as written), when not empty.
    #[serde(default)]
    pub allowed: Vec<String>,
    #[serde(default)]
    pub min: Option<Scalar>,
    #[serde(default)]
    pub max: Option<Scalar>,
    /// The value templates see when the pod does not set the annotation.
    pub default: Scalar,
}

/// A YAML scalar as written (`2`, `50m`, `true`), kept as text.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Scalar {
    Bool(bool),
    Int(i64),
    Text(String),
}

impl std::fmt::Display for Scalar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Bool(b) => write!(f, "{b}"),
            Self::Int(i) => write!(f, "{i}"),
            Self::Text(s) => f.write_str(s),
        }
    }
}

/// The overrides one template declares, by annotation.
pub type Declared = BTreeMap<String, Spec>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    overrides: Declared,
}

/// Reads the `{# overrides: ... #}` block of a template source, if it has one.
pub fn declared(source: &str) -> Result<Declared, String> {
    let mut found: Option<Declared> = None;
    let mut rest = source;
    while let Some(start) = rest.find("{#") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("#}") else {
            break;
        };
        let body = after[..end].trim_start_matches(['-', '+']);
        let body = body.trim_end_matches(['-', '+']);
        if body.trim_start().starts_with("overrides:") {
            if found.is_some() {
                return Err("more than one `overrides:` comment block".into());
            }
            let header: Header = serde_saphyr::from_str(&dedent(body))
                .map_err(|e| format!("the `overrides:` comment block is not valid: {e}"))?;
            for (annotation, spec) in &header.overrides {
                check_spec(annotation, spec)?;
            }
            found = Some(header.overrides);
        }
        rest = &after[end + 2..];
    }
    Ok(found.unwrap_or_default())
}

/// The block's text without the indentation of its first line, so it parses as YAML wherever
/// the comment starts.
fn dedent(body: &str) -> String {
    let body = body.trim_start_matches([' ', '\t', '\n', '\r']);
    let indent = body.len() - body.trim_start().len();
    body.lines()
        .map(|l| l.get(indent..).unwrap_or(l.trim_start()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn check_spec(annotation: &str, spec: &Spec) -> Result<(), String> {
    if annotation.is_empty() {
        return Err("an override has an empty annotation name".into());
    }
    if !spec.allowed.is_empty() && spec.kind != Kind::String {
        return Err(format!(
            "override {annotation}: `allowed` is for type string only"
        ));
    }
    if (spec.min.is_some() || spec.max.is_some())
        && !matches!(spec.kind, Kind::Integer | Kind::Cpu | Kind::Memory)
    {
        return Err(format!(
            "override {annotation}: `min` and `max` are for integer, cpu and memory only"
        ));
    }
    for (what, bound) in [("min", &spec.min), ("max", &spec.max)] {
        if let Some(bound) = bound {
            magnitude(spec.kind, &bound.to_string()).map_err(|e| {
                format!("override {annotation}: {what} {bound:?} is not valid: {e}")
            })?;
        }
    }
    check(annotation, spec, &spec.default.to_string())
        .map(|_| ())
        .map_err(|e| format!("override {annotation}: the default is not allowed: {e}"))
}

/// A pod's value that is not allowed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct BadValue {
    pub annotation: String,
    pub value: String,
    /// What is allowed, in words.
    pub allowed: String,
}

impl BadValue {
    /// The refusal's words around the value (written `{value:?}` between them): the webhook's
    /// message, and the exporter's, which writes the value in CEL in between.
    pub fn around(annotation: &str, allowed: &str) -> (String, String) {
        (
            format!("annotation {annotation}: "),
            format!(" is not allowed: {allowed}"),
        )
    }
}

impl std::fmt::Display for BadValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (before, after) = Self::around(&self.annotation, &self.allowed);
        write!(f, "{before}{:?}{after}", self.value)
    }
}

/// What is allowed for `spec`, in words.
pub fn describe(spec: &Spec) -> String {
    let range = match (&spec.min, &spec.max) {
        (Some(min), Some(max)) => format!(" from {min} to {max}"),
        (Some(min), None) => format!(" of at least {min}"),
        (None, Some(max)) => format!(" of at most {max}"),
        (None, None) => String::new(),
    };
    match spec.kind {
        Kind::String if spec.allowed.is_empty() => "any string".into(),
        Kind::String => format!("one of {}", spec.allowed.join(", ")),
        Kind::Boolean => "true or false".into(),
        Kind::Integer => format!("a whole number{range}"),
        Kind::Cpu => {
            format!("a CPU quantity in canonical form such as 250m or 2 (not 0.25 or 2000m){range}")
        }
        Kind::Memory => {
            format!("a memory quantity in canonical form such as 64Mi or 1Gi (not 1024Mi){range}")
        }
    }
}

/// Checks `value` against `spec`; the value as templates see it.
pub fn check(annotation: &str, spec: &Spec, value: &str) -> Result<serde_json::Value, BadValue> {
    let bad = || BadValue {
        annotation: annotation.to_owned(),
        value: value.to_owned(),
        allowed: describe(spec),
    };
    match spec.kind {
        Kind::String => {
            if spec.allowed.is_empty() || spec.allowed.iter().any(|a| a == value) {
                Ok(value.into())
            } else {
                Err(bad())
            }
        }
        Kind::Boolean => match value {
            "true" => Ok(true.into()),
            "false" => Ok(false.into()),
            _ => Err(bad()),
        },
        Kind::Integer | Kind::Cpu | Kind::Memory => {
            let n = magnitude(spec.kind, value).map_err(|_| bad())?;
            let within = |bound: &Option<Scalar>, ok: fn(i128, i128) -> bool| {
                bound
                    .as_ref()
                    .is_none_or(|b| magnitude(spec.kind, &b.to_string()).is_ok_and(|b| ok(n, b)))
            };
            if !within(&spec.min, |n, b| n >= b) || !within(&spec.max, |n, b| n <= b) {
                return Err(bad());
            }
            if spec.kind == Kind::Integer {
                Ok(i64::try_from(n).map_err(|_| bad())?.into())
            } else {
                Ok(value.into())
            }
        }
    }
}

/// A bound's magnitude (as `magnitude` reads it): the number a bound stands for in its type's
/// unit (itself, millicores or bytes).
pub fn bound(kind: Kind, bound: &Scalar) -> Option<i128> {
    magnitude(kind, &bound.to_string()).ok()
}

/// The number a value stands for: itself, millicores, or bytes. Only canonical forms are
/// accepted for quantities: the API server rewrites others (`0.5` to `500m`, `1024Mi` to `1Gi`),
/// and the validator would then find the sidecar changed.
fn magnitude(kind: Kind, value: &str) -> Result<i128, &'static str> {
    let digits = |s: &str| -> Result<i128, &'static str> {
        let canonical = !s.is_empty()
            && s.bytes().all(|b| b.is_ascii_digit())
            && (s == "0" || !s.starts_with('0'))
            && s.len() <= 18;
        if canonical {
            s.parse::<i128>().map_err(|_| "not a number")
        } else {
            Err("not a whole number without leading zeros")
        }
    };
    match kind {
        Kind::Integer => match value.strip_prefix('-') {
            Some(rest) if rest != "0" => digits(rest).map(|n| -n),
            _ => digits(value),
        },
        Kind::Cpu => match value.strip_suffix('m') {
            Some(milli) => {
                let n = digits(milli)?;
                if n % 1000 == 0 {
                    Err("whole cores are written without m")
                } else {
                    Ok(n)
                }
            }
            None => Ok(digits(value)? * 1000),
        },
        Kind::Memory => {
            for (i, suffix) in ["Ki", "Mi", "Gi", "Ti"].iter().enumerate() {
                if let Some(n) = value.strip_suffix(suffix) {
                    let n = digits(n)?;
                    if n % 1024 == 0 && n != 0 && *suffix != "Ti" {
                        return Err("use the next larger suffix");
                    }
                    return Ok(n << (10 * (i + 1)));
                }
            }
            Err("not a memory quantity with a Ki, Mi, Gi or Ti suffix")
        }
        Kind::String | Kind::Boolean => Err("not a number"),
    }
}

impl Kind {
    /// A few values of this type, besides a spec's default, bounds and allowed strings, to try
    /// a template with (those the spec allows): a whole number of cores, a quantity in each
    /// suffix, a negative number.
    pub fn samples(self) -> &'static [&'static str] {
        match self {
            Self::String => &[],
            Self::Boolean => &["true", "false"],
            Self::Integer => &["0", "1", "-1", "1000"],
            Self::Cpu => &["1", "2", "100m", "1500m", "250m"],
            Self::Memory => &["1Gi", "1536Mi", "100Ki", "64Mi", "1Ti"],
        }
    }
}

impl Spec {
    /// Whether `value` (a CEL expression of type string) is allowed, as [`check`] tells, as
    /// CEL: the canonical forms by regular expression, the bounds compared in the value's own
    /// unit so that no product overflows. `string` writes a CEL string literal.
    pub fn cel_test(&self, value: &str, string: impl Fn(&str) -> String) -> String {
        const DIGITS: &str = "(0|[1-9][0-9]{0,17})";
        let within = |n: &str, unit: i128| self.cel_within(n, unit);
        match self.kind {
            Kind::String if self.allowed.is_empty() => "true".into(),
            Kind::String => {
                let items: Vec<String> = self.allowed.iter().map(|a| string(a)).collect();
                format!("{value} in [{}]", items.join(", "))
            }
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

    /// `n * unit` within the bounds, as CEL conditions on `n`, each after ` && `.
    fn cel_within(&self, n: &str, unit: i128) -> String {
        let mut out = Vec::new();
        if let Some(min) = self.min.as_ref().and_then(|b| bound(self.kind, b)) {
            let least = (min + unit - 1).div_euclid(unit);
            out.push(match i64::try_from(least) {
                Ok(least) => format!("{n} >= {least}"),
                Err(_) => "false".into(),
            });
        }
        if let Some(max) = self.max.as_ref().and_then(|b| bound(self.kind, b)) {
            let most = max.div_euclid(unit);
            if let Ok(most) = i64::try_from(most) {
                out.push(format!("{n} <= {most}"));
            }
        }
        out.into_iter()
            .map(|c| format!(" && {c}"))
            .collect::<String>()
    }

    /// The values of this override to try a template with, each once, as written and as
    /// templates see them: of the default, the bounds, every allowed string and the type's
    /// [`Kind::samples`] (`any_text` for a string the spec does not constrain), those it allows.
    pub fn trials(&self, annotation: &str, any_text: &[&str]) -> Vec<(String, serde_json::Value)> {
        let mut candidates: Vec<String> = vec![self.default.to_string()];
        candidates.extend(self.min.iter().chain(&self.max).map(ToString::to_string));
        candidates.extend(self.allowed.iter().cloned());
        let extra = match self.kind {
            Kind::String if self.allowed.is_empty() => any_text,
            kind => kind.samples(),
        };
        candidates.extend(extra.iter().map(|s| (*s).to_owned()));
        let mut out: Vec<(String, serde_json::Value)> = Vec::new();
        for c in candidates {
            let Ok(value) = check(annotation, self, &c) else {
                continue;
            };
            if !out.iter().any(|(_, v)| *v == value) {
                out.push((c, value));
            }
        }
        out
    }
}

/// A pod's annotations, read by name: a typed map, or the view's.
pub trait Annotations {
    fn annotation(&self, key: &str) -> Option<&str>;
}

impl<K, V> Annotations for BTreeMap<K, V>
where
    K: std::borrow::Borrow<str> + Ord,
    V: AsRef<str>,
{
    fn annotation(&self, key: &str) -> Option<&str> {
        self.get(key).map(AsRef::as_ref)
    }
}

/// Checks a pod's annotations against what a template declares: the values templates see
/// (the pod's, or the defaults).
pub fn resolve(
    declared: &Declared,
    annotations: &(impl Annotations + ?Sized),
) -> Result<BTreeMap<String, serde_json::Value>, BadValue> {
    declared
        .iter()
        .map(|(annotation, spec)| {
            let value = match annotations.annotation(annotation) {
                Some(v) => check(annotation, spec, v)?,
                None => check(annotation, spec, &spec.default.to_string())?,
            };
            Ok((annotation.clone(), value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = "{#- A proxy. -#}\n{#- overrides:\n  example.com/level: {type: string, allowed: [debug, info], default: info}\n  example.com/cpu: {type: cpu, max: 2, default: 50m}\n  example.com/mem: {type: memory, min: 32Mi, default: 64Mi}\n  example.com/n: {type: integer, min: 1, max: 5, default: 2}\n  example.com/on: {type: boolean, default: false}\n-#}\ncontainers: []\n";

    fn spec(annotation: &str) -> Spec {
        declared(SOURCE).expect("parses")[annotation].clone()
    }

    #[test]
    fn a_header_is_read_from_its_comment() {
        let d = declared(SOURCE).expect("parses");
        assert_eq!(d.len(), 5);
        assert_eq!(d["example.com/level"].allowed, ["debug", "info"]);
        assert!(declared("containers: []\n").expect("none").is_empty());
    }

    #[test]
    fn values_are_checked_by_type() {
        let ok = |a: &str, v: &str| check(a, &spec(a), v).is_ok();
        assert!(ok("example.com/level", "debug"));
        assert!(!ok("example.com/level", "loud"));
        for v in ["250m", "1", "2", "1500m"] {
            assert!(ok("example.com/cpu", v), "{v}");
        }
        for v in ["0.5", "2000m", "3", "050m", "x", "", "-1"] {
            assert!(!ok("example.com/cpu", v), "{v}");
        }
        for v in ["64Mi", "1Gi", "32Mi", "1536Mi"] {
            assert!(ok("example.com/mem", v), "{v}");
        }
        for v in ["1024Mi", "16Mi", "64M", "64"] {
            assert!(!ok("example.com/mem", v), "{v}");
        }
        assert_eq!(
            check("example.com/n", &spec("example.com/n"), "3"),
            Ok(3.into())
        );
        assert!(!ok("example.com/n", "6") && !ok("example.com/n", "0"));
        assert_eq!(
            check("example.com/on", &spec("example.com/on"), "true"),
            Ok(true.into())
        );
        assert!(!ok("example.com/on", "yes"));
    }

    #[test]
    fn a_refusal_names_the_annotation_and_what_is_allowed() {
        let err = check("example.com/level", &spec("example.com/level"), "loud").expect_err("bad");
        assert_eq!(
            err.to_string(),
            "annotation example.com/level: \"loud\" is not allowed: one of debug, info"
        );
        let err = check("example.com/cpu", &spec("example.com/cpu"), "0.5").expect_err("bad");
        assert!(
            err.to_string().contains("canonical form") && err.to_string().contains("at most 2"),
            "{err}"
        );
    }

    #[test]
    fn the_exporter_reads_each_type_here_its_cel_test_and_trial_values() {
        let cpu = spec("example.com/cpu");
        let tried: Vec<String> = cpu
            .trials("example.com/cpu", &[])
            .into_iter()
            .map(|(t, _)| t)
            .collect();
        assert_eq!(
            tried,
            ["50m", "2", "1", "100m", "1500m", "250m"],
            "each allowed, once"
        );
        let level = spec("example.com/level");
        let quote = |s: &str| format!("'{s}'");
        assert_eq!(level.cel_test("v", quote), "v in ['debug', 'info']");
        let any = Spec {
            allowed: Vec::new(),
            ..level
        };
        assert_eq!(
            any.trials("a", &["x", "0"]).len(),
            3,
            "the default and the texts given"
        );
        assert!(
            spec("example.com/n")
                .cel_test("v", quote)
                .contains("int(v) >= 1 && int(v) <= 5")
        );
    }

    #[test]
    fn defaults_fill_in_and_are_checked_at_load() {
        let d = declared(SOURCE).expect("parses");
        let values = resolve(&d, &BTreeMap::<String, String>::new()).expect("defaults");
        assert_eq!(values["example.com/cpu"], "50m");
        assert_eq!(values["example.com/n"], 2);
        let bad = "{# overrides:\n  a: {type: string, allowed: [x], default: y}\n#}";
        assert!(declared(bad).expect_err("bad default").contains("default"));
        let typo = "{# overrides:\n  a: {type: text, default: y}\n#}";
        assert!(declared(typo).is_err());
    }
}
