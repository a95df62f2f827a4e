//! The template's values read of the pod translated to CEL: its name, labels, annotations or
//! a per-pod override, as a string-valued expression over the admission request, with what it
//! may hold (for the trials). [`Translator`] holds what the walk has learnt of the template;
//! `items.rs` adds its translations over the items of the pod's lists. Each translation says
//! what it cannot write, with the span of the construct; the walk turns that into a refusal.

use std::collections::{BTreeMap, BTreeSet};

use minijinja::machinery::Span;
use minijinja::machinery::ast::{self, CallArg, Expr};
use serde_json::Value;

use crate::engine::config::Injector;
use crate::engine::context::{self, Cel};
use crate::export::cel;
use crate::export::loops::Elem;
use crate::export::symbolic::Refusal;

/// What a value read of the pod may be, to try it with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Chars {
    /// Letters, digits, `-`, `_`, `.` (names, namespaces, label values).
    Plain,
    /// Anything (annotations).
    Any,
    /// The value of the per-pod override of this annotation: one its spec allows (tried
    /// with [`crate::engine::overrides::Spec::trials`]).
    Override(String),
}

/// A string-valued piece of CEL.
#[derive(Clone, Debug)]
pub(super) struct CelText {
    pub(super) text: String,
    pub(super) chars: Chars,
}

/// A value read of the pod, which may be absent (a label the pod does not carry).
pub(super) enum PodRead {
    Defined(CelText),
    Maybe { present: String, value: CelText },
}

/// A `{{ ... }}` that reads the pod.
pub(super) struct Emit {
    /// Byte range of its expression in the source.
    pub(super) range: std::ops::Range<usize>,
    /// Whether the expression ended in `| tojson` (kept around the marker).
    pub(super) tojson: bool,
    pub(super) cel: CelText,
    pub(super) line: usize,
    pub(super) construct: String,
}

impl Emit {
    /// This value's refusal, with its line and construct.
    pub(super) fn refusal(&self, reason: String) -> Refusal {
        Refusal {
            line: self.line,
            construct: self.construct.clone(),
            reason,
        }
    }
}

/// A list a template collects from the pod's: the CEL lists it is the concatenation of.
pub(super) struct Collected {
    pub(super) parts: Vec<String>,
    pub(super) elem: Elem,
    /// Appends guarded by `x not in ns.attr`, and all appends.
    pub(super) guarded: usize,
    pub(super) appends: usize,
}

impl Collected {
    pub(super) fn cel(&self) -> String {
        let all = match &self.parts[..] {
            [one] => one.clone(),
            parts => format!("({})", parts.join(" + ")),
        };
        // Each once, in order: every append is guarded.
        if self.guarded > 0 {
            format!("{all}.distinct()")
        } else {
            all
        }
    }
}

/// The body of output loop `k`: its variable and what its items are.
pub(super) struct Scope {
    pub(super) k: usize,
    pub(super) var: String,
    pub(super) elem: Elem,
}

/// A template variable inside a collecting loop: its name, its CEL name, its item.
pub(super) type Var = (String, String, Elem);

/// What the translations read: the template, and what the walk has learnt of it so far (the
/// `namespace()` objects, the lists collected from the pod, the output loop it is in).
pub(super) struct Translator<'a> {
    pub(super) inj: &'a Injector,
    /// The template's name.
    pub(super) name: &'a str,
    pub(super) source: &'a str,
    /// `namespace()` objects the template made, with their attributes.
    pub(super) namespaces: BTreeMap<String, BTreeSet<String>>,
    /// Lists collected from the pod's into a `namespace()`, by `ns.attr`.
    pub(super) lists: BTreeMap<String, Collected>,
    /// Inside the body of an output loop.
    pub(super) scope: Option<Scope>,
}

impl Translator<'_> {
    pub(super) fn text(&self, span: Span) -> &str {
        self.source
            .get(span.start_offset as usize..span.end_offset as usize)
            .unwrap_or("")
    }

    /// The variables whose values depend on the pod: the pod, its overrides, the namespaces
    /// holding lists collected from it, and inside an output loop its variable and `loop`.
    pub(super) fn tainted(&self, e: &Expr<'_>) -> bool {
        let mut names: Vec<&str> = vec!["pod", "overrides"];
        names.extend(self.lists.keys().filter_map(|k| k.split('.').next()));
        if let Some(scope) = &self.scope {
            names.push(&scope.var);
            names.push("loop");
        }
        reads(e, &names)
    }

    /// Whether, inside an output loop, an expression reads its item or `loop`.
    pub(super) fn per_iteration(&self, e: &Expr<'_>) -> bool {
        self.scope
            .as_ref()
            .is_some_and(|s| reads(e, &[s.var.as_str(), "loop"]))
    }

    /// An expression that reads nothing of the pod, evaluated now, as JSON.
    pub(super) fn constant_json(&self, e: &Expr<'_>) -> Result<Value, (Span, String)> {
        let value = self.evaluated(e)?;
        serde_json::to_value(&value).map_err(|err| (full_span(e), err.to_string()))
    }

    /// The whole inside of the `{{ ... }}` around `span` (without whitespace control), so
    /// that parentheses the syntax tree does not record are replaced too.
    pub(super) fn between_delimiters(&self, span: Span) -> std::ops::Range<usize> {
        let (start, end) = (span.start_offset as usize, span.end_offset as usize);
        let open = self.source[..start].rfind("{{").map(|at| {
            let mut at = at + 2;
            if matches!(self.source.as_bytes().get(at), Some(b'-' | b'+')) {
                at += 1;
            }
            at
        });
        let close = self.source[end..].find("}}").map(|at| {
            let mut at = end + at;
            if at > end && matches!(self.source.as_bytes().get(at - 1), Some(b'-' | b'+')) {
                at -= 1;
            }
            at
        });
        match (open, close) {
            (Some(open), Some(close)) if open <= start && close >= end => open..close,
            _ => start..end,
        }
    }

    /// A `{{ ... }}` that reads the pod.
    pub(super) fn top(&self, e: &Expr<'_>) -> Result<Emit, (Span, String)> {
        let (inner, tojson) = without_tojson(e);
        let cel = self.string(inner)?;
        let span = full_span(e);
        Ok(Emit {
            range: self.between_delimiters(span),
            tojson,
            cel,
            line: span.start_line as usize,
            construct: self.text(span).trim().to_owned(),
        })
    }

    pub(super) fn string(&self, e: &Expr<'_>) -> Result<CelText, (Span, String)> {
        match self.value(e)? {
            PodRead::Defined(cel) => Ok(cel),
            PodRead::Maybe { .. } => Err((
                full_span(e),
                "may be absent from a pod, and then the webhook fails to render it; give it a `| default(...)`"
                    .into(),
            )),
        }
    }

    pub(super) fn value(&self, e: &Expr<'_>) -> Result<PodRead, (Span, String)> {
        const SUPPORTED: &str = "only the pod's name, generateName, namespace, serviceAccount, labels and annotations, with `| default(...)` and `~`, can be written as CEL";
        if !reads_pod(e) {
            return self.constant(e).map(PodRead::Defined);
        }
        match e {
            Expr::Filter(f) if f.name == "default" => {
                let Some(inner) = &f.expr else {
                    return Err((full_span(e), SUPPORTED.into()));
                };
                let [CallArg::Pos(fallback)] = &f.args[..] else {
                    return Err((
                        full_span(e),
                        "`default` with other than one argument".into(),
                    ));
                };
                if reads_pod(fallback) {
                    return Err((full_span(fallback), "a default read from the pod".into()));
                }
                let fallback = self.constant(fallback)?;
                Ok(match self.value(inner)? {
                    PodRead::Defined(cel) => PodRead::Defined(cel),
                    PodRead::Maybe { present, value } => PodRead::Defined(CelText {
                        text: format!("({present} ? {} : {})", value.text, fallback.text),
                        chars: worst(value.chars, fallback.chars),
                    }),
                })
            }
            Expr::BinOp(b) if matches!(b.op, ast::BinOpKind::Concat) => {
                let (l, r) = (self.string(&b.left)?, self.string(&b.right)?);
                Ok(PodRead::Defined(CelText {
                    text: format!("{} + {}", l.text, r.text),
                    chars: worst(l.chars, r.chars),
                }))
            }
            _ => match path(e) {
                Some(p) => self.pod_value(full_span(e), &p),
                None if overrides(e) => self.override_value(e),
                None => Err((full_span(e), SUPPORTED.into())),
            },
        }
    }

    /// `overrides["<annotation>"]`: the pod's annotation, or the default. The webhook
    /// refuses a pod whose value the template does not allow, and the mutating policy leaves
    /// such a pod to the backstop (see `export::mutating`), so the value is one of those.
    pub(super) fn override_value(&self, e: &Expr<'_>) -> Result<PodRead, (Span, String)> {
        let key = match e {
            Expr::GetItem(g) if matches!(&g.expr, Expr::Var(v) if v.id == "overrides") => g
                .subscript_expr
                .as_const()
                .and_then(|k| k.as_str().map(str::to_owned)),
            Expr::GetAttr(g) if matches!(&g.expr, Expr::Var(v) if v.id == "overrides") => {
                Some(g.name.to_owned())
            }
            _ => None,
        };
        let spec = key.as_ref().and_then(|k| {
            self.inj
                .templates
                .declared(self.name)
                .and_then(|d| d.get(k))
        });
        let (Some(key), Some(spec)) = (key, spec) else {
            return Err((
                full_span(e),
                "only `overrides[\"<annotation>\"]` of an override the template declares can be written as CEL".into(),
            ));
        };
        let k = cel::string(&key);
        Ok(PodRead::Defined(CelText {
            text: format!(
                "((has(object.metadata.annotations) && {k} in object.metadata.annotations) ? object.metadata.annotations[{k}] : {})",
                cel::string(&spec.default.to_string())
            ),
            chars: Chars::Override(key),
        }))
    }

    /// The value of an expression that reads nothing of the pod, evaluated now.
    pub(super) fn evaluated(&self, e: &Expr<'_>) -> Result<minijinja::Value, (Span, String)> {
        self.inj
            .templates
            .evaluate(self.text(full_span(e)))
            .map_err(|err| (full_span(e), err))
    }

    /// An expression that reads nothing of the pod, evaluated now.
    pub(super) fn constant(&self, e: &Expr<'_>) -> Result<CelText, (Span, String)> {
        let value = self.evaluated(e)?;
        let text = match value.as_str() {
            Some(s) => s.to_owned(),
            None if value.is_number() => value.to_string(),
            None => {
                return Err((
                    full_span(e),
                    format!(
                        "joined to a value read from the pod, this is a {} rather than a string",
                        value.kind()
                    ),
                ));
            }
        };
        let chars = if text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            Chars::Plain
        } else {
            Chars::Any
        };
        Ok(CelText {
            text: cel::string(&text),
            chars,
        })
    }

    pub(super) fn pod_value(&self, span: Span, path: &[String]) -> Result<PodRead, (Span, String)> {
        let cfg = &self.inj.config;
        let owned = self.inj.templates.owned();
        let defined = |text: &str| {
            Ok(PodRead::Defined(CelText {
                text: text.to_owned(),
                chars: Chars::Plain,
            }))
        };
        let p: Vec<&str> = path.iter().map(String::as_str).collect();
        match context::cel_at(&p) {
            Some((Cel::Value(text), _)) => defined(text),
            Some((Cel::Entry { map, plain }, Some(key))) => {
                let hidden = match map {
                    "labels" => owned.labels.contains(key),
                    _ => owned.annotations.contains(key) || key == cfg.status_annotation,
                };
                if hidden {
                    return Err((
                        span,
                        format!("{key:?} is set by a template, so templates never see it"),
                    ));
                }
                let key = cel::string(key);
                Ok(PodRead::Maybe {
                    present: format!(
                        "(has(object.metadata.{map}) && {key} in object.metadata.{map})"
                    ),
                    value: CelText {
                        text: format!("object.metadata.{map}[{key}]"),
                        chars: if plain { Chars::Plain } else { Chars::Any },
                    },
                })
            }
            Some((Cel::Refused(why), _)) => Err((span, why.into())),
            Some((Cel::Entry { .. }, None)) | None => Err((
                span,
                "only the pod's name, generateName, namespace, serviceAccount, labels and annotations can be written as CEL".into(),
            )),
        }
    }
}

/// Whether an expression reads the pod (or the per-pod overrides, which come from its
/// annotations).
pub(super) fn reads_pod(e: &Expr<'_>) -> bool {
    reads(e, &["pod", "overrides"])
}

/// Whether an expression reads any of these variables.
pub(super) fn reads(e: &Expr<'_>, names: &[&str]) -> bool {
    let r = |e: &Expr<'_>| reads(e, names);
    let args = |args: &[CallArg<'_>]| {
        args.iter().any(|a| match a {
            CallArg::Pos(e)
            | CallArg::Kwarg(_, e)
            | CallArg::PosSplat(e)
            | CallArg::KwargSplat(e) => r(e),
        })
    };
    match e {
        Expr::Var(v) => names.contains(&v.id),
        Expr::Const(_) => false,
        Expr::Slice(s) => r(&s.expr) || [&s.start, &s.stop, &s.step].into_iter().flatten().any(r),
        Expr::UnaryOp(u) => r(&u.expr),
        Expr::BinOp(b) => r(&b.left) || r(&b.right),
        Expr::Compare(c) => r(&c.expr) || c.ops.iter().any(|o| r(&o.expr)),
        Expr::IfExpr(i) => {
            r(&i.test_expr) || r(&i.true_expr) || i.false_expr.as_ref().is_some_and(r)
        }
        Expr::Filter(f) => f.expr.as_ref().is_some_and(r) || args(&f.args),
        Expr::Test(t) => r(&t.expr) || args(&t.args),
        Expr::GetAttr(g) => r(&g.expr),
        Expr::GetItem(g) => r(&g.expr) || r(&g.subscript_expr),
        Expr::Call(c) => r(&c.expr) || args(&c.args),
        Expr::List(l) => l.items.iter().any(r),
        Expr::Map(m) => m.keys.iter().chain(&m.values).any(r),
    }
}

fn worst(a: Chars, b: Chars) -> Chars {
    match (a, b) {
        (Chars::Plain, Chars::Plain) => Chars::Plain,
        // A value joined to others is tried as any text.
        _ => Chars::Any,
    }
}

/// The span of an expression with all of its parts: minijinja gives an attribute lookup or a
/// filter the span of its own token only.
pub(super) fn full_span(e: &Expr<'_>) -> Span {
    let mut span = e.span();
    let mut widen = |other: Span| {
        if other.start_offset < span.start_offset {
            span.start_offset = other.start_offset;
            span.start_line = other.start_line;
            span.start_col = other.start_col;
        }
        if other.end_offset > span.end_offset {
            span.end_offset = other.end_offset;
            span.end_line = other.end_line;
            span.end_col = other.end_col;
        }
    };
    let args = |args: &[CallArg<'_>]| -> Vec<Span> {
        args.iter()
            .map(|a| match a {
                CallArg::Pos(e)
                | CallArg::Kwarg(_, e)
                | CallArg::PosSplat(e)
                | CallArg::KwargSplat(e) => full_span(e),
            })
            .collect()
    };
    let parts: Vec<Span> = match e {
        Expr::Var(_) | Expr::Const(_) => Vec::new(),
        Expr::Slice(s) => std::iter::once(&s.expr)
            .chain([&s.start, &s.stop, &s.step].into_iter().flatten())
            .map(full_span)
            .collect(),
        Expr::UnaryOp(u) => vec![full_span(&u.expr)],
        Expr::BinOp(b) => vec![full_span(&b.left), full_span(&b.right)],
        Expr::Compare(c) => std::iter::once(full_span(&c.expr))
            .chain(c.ops.iter().map(|o| full_span(&o.expr)))
            .collect(),
        Expr::IfExpr(i) => [
            Some(&i.test_expr),
            Some(&i.true_expr),
            i.false_expr.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(full_span)
        .collect(),
        Expr::Filter(f) => f.expr.iter().map(full_span).chain(args(&f.args)).collect(),
        Expr::Test(t) => std::iter::once(full_span(&t.expr))
            .chain(args(&t.args))
            .collect(),
        Expr::GetAttr(g) => vec![full_span(&g.expr)],
        Expr::GetItem(g) => vec![full_span(&g.expr), full_span(&g.subscript_expr)],
        Expr::Call(c) => std::iter::once(full_span(&c.expr))
            .chain(args(&c.args))
            .collect(),
        Expr::List(l) => l.items.iter().map(full_span).collect(),
        Expr::Map(m) => m.keys.iter().chain(&m.values).map(full_span).collect(),
    };
    for p in parts {
        widen(p);
    }
    span
}

/// `pod.a.b["c"]` as `["a", "b", "c"]`.
pub(super) fn path(e: &Expr<'_>) -> Option<Vec<String>> {
    match e {
        Expr::Var(v) if v.id == "pod" => Some(Vec::new()),
        Expr::GetAttr(g) => {
            let mut p = path(&g.expr)?;
            p.push(g.name.to_owned());
            Some(p)
        }
        Expr::GetItem(g) => {
            let mut p = path(&g.expr)?;
            let key = g.subscript_expr.as_const()?;
            p.push(match key.as_str() {
                Some(k) => k.to_owned(),
                None => i64::try_from(key).ok()?.to_string(),
            });
            Some(p)
        }
        _ => None,
    }
}

/// Whether the expression is a lookup in `overrides`.
fn overrides(e: &Expr<'_>) -> bool {
    match e {
        Expr::Var(v) => v.id == "overrides",
        Expr::GetAttr(g) => overrides(&g.expr),
        Expr::GetItem(g) => overrides(&g.expr),
        _ => false,
    }
}

/// `e` without a trailing `| tojson`, and whether it had one.
pub(super) fn without_tojson<'a, 'e>(e: &'e Expr<'a>) -> (&'e Expr<'a>, bool) {
    match e {
        Expr::Filter(f) if f.name == "tojson" && f.args.is_empty() => match &f.expr {
            Some(inner) => (inner, true),
            None => (e, false),
        },
        _ => (e, false),
    }
}
