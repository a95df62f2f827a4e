//! The template's expressions translated to CEL: a value read of the pod (its name, labels,
//! annotations, a per-pod override) as a string-valued expression over the admission request,
//! a value an iteration reads as an [`IterExpr`], a list of the pod and what its items are, a
//! condition or an item of a collecting loop. Each translation says what it cannot write, with
//! the span of the construct; the walk ([`super::walk`]) turns that into a refusal.

use std::collections::{BTreeMap, BTreeSet};

use minijinja::machinery::Span;
use minijinja::machinery::ast::{self, CallArg, Expr, Stmt};
use serde_json::Value;

use crate::engine::config::Injector;
use crate::export::cel;
use crate::export::loops::{Elem, Field, IterExpr, Ty};
use crate::export::symbolic::Refusal;
use crate::export::trials;

/// What a value read of the pod may be, to try it with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Chars {
    /// Letters, digits, `-`, `_`, `.` (names, namespaces, label values).
    Plain,
    /// Anything (annotations).
    Any,
    /// The values a per-pod override allows: `(minijinja literal, text)`.
    Allowed(Vec<(String, String)>),
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

    /// A `{{ ... }}` that reads the iteration: its range, expression and `| tojson`.
    #[allow(clippy::type_complexity)]
    pub(super) fn iteration_emit(
        &self,
        e: &Expr<'_>,
    ) -> Result<(std::ops::Range<usize>, IterExpr, bool), (Span, String)> {
        let (inner, tojson) = without_tojson(e);
        let x = self.iteration(inner)?;
        Ok((self.between_delimiters(full_span(e)), x, tojson))
    }

    /// `{% if <on the iteration> %}text{% else %}text{% endif %}`: its range (tags included),
    /// the choice, and whether its tags strip whitespace before and after.
    #[allow(clippy::type_complexity)]
    pub(super) fn iteration_cond(
        &self,
        c: &ast::Spanned<ast::IfCond<'_>>,
    ) -> Result<(std::ops::Range<usize>, IterExpr, bool, bool), (Span, String)> {
        let text = |body: &[Stmt<'_>]| -> Option<String> {
            body.iter()
                .map(|s| match s {
                    Stmt::EmitRaw(r) => Some(r.raw),
                    _ => None,
                })
                .collect()
        };
        let (Some(yes), Some(no)) = (text(&c.true_body), text(&c.false_body)) else {
            return Err((
                full_span(&c.expr),
                "a condition on the iteration around more than text".into(),
            ));
        };
        let x = self.iteration(&c.expr)?;
        let span = c.span();
        let start = self.source[..span.start_offset as usize]
            .rfind("{%")
            .ok_or((span, "no tag".to_owned()))?;
        let end = self.source[span.end_offset as usize..]
            .find("%}")
            .map(|at| span.end_offset as usize + at + 2)
            .ok_or((span, "no tag".to_owned()))?;
        let open = self.source.as_bytes().get(start + 2) == Some(&b'-');
        let close = self.source.as_bytes().get(end - 3) == Some(&b'-');
        Ok((
            start..end,
            IterExpr::Cond(Box::new(x), yes, no),
            open,
            close,
        ))
    }

    /// A value an iteration of the current output loop reads.
    pub(super) fn iteration(&self, e: &Expr<'_>) -> Result<IterExpr, (Span, String)> {
        const SUPPORTED: &str = "of an item, only its fields, `loop.index0`, `loop.index`, `loop.first`, `loop.last`, `loop.length`, `+`, `-`, `~`, `==`, `!=`, `and`, `or`, `not` and `| default(...)` can be written as CEL";
        let Some(scope) = &self.scope else {
            return Err((full_span(e), SUPPORTED.into()));
        };
        let b = Box::new;
        let field = |name: &str, default: Option<Value>| -> Result<IterExpr, (Span, String)> {
            match scope.elem.field(name) {
                Some(Field::One(elem, present)) if elem.scalar() => {
                    let ty = ty_of(elem);
                    if !present && default.is_none() {
                        return Err((
                            full_span(e),
                            format!(
                                "`{name}` may be absent from an item, and then the webhook fails to render it; give it a `| default(...)`"
                            ),
                        ));
                    }
                    Ok(IterExpr::Item(Some(name.to_owned()), ty, default))
                }
                _ => Err((
                    full_span(e),
                    format!(
                        "`{name}` is not a field templates see of such an item, or not a single value"
                    ),
                )),
            }
        };
        if !reads(e, &[scope.var.as_str(), "loop", "pod", "overrides"]) {
            let v = self.constant_json(e)?;
            return match v {
                Value::String(_) | Value::Bool(_) => Ok(IterExpr::Const(v)),
                Value::Number(ref n) if n.is_i64() => Ok(IterExpr::Const(v)),
                _ => Err((
                    full_span(e),
                    "a constant that is not a string, a whole number or a boolean".into(),
                )),
            };
        }
        match e {
            Expr::Var(v) if v.id == scope.var && scope.elem.scalar() => {
                Ok(IterExpr::Item(None, ty_of(scope.elem), None))
            }
            Expr::GetAttr(g) => match &g.expr {
                Expr::Var(v) if v.id == "loop" => match g.name {
                    "index0" => Ok(IterExpr::Index0),
                    "index" => Ok(IterExpr::Add(
                        b(IterExpr::Index0),
                        b(IterExpr::Const(1.into())),
                    )),
                    "first" => Ok(IterExpr::Eq(
                        b(IterExpr::Index0),
                        b(IterExpr::Const(0.into())),
                    )),
                    "last" => Ok(IterExpr::Eq(
                        b(IterExpr::Index0),
                        b(IterExpr::Sub(
                            b(IterExpr::Length),
                            b(IterExpr::Const(1.into())),
                        )),
                    )),
                    "length" => Ok(IterExpr::Length),
                    _ => Err((full_span(e), SUPPORTED.into())),
                },
                Expr::Var(v) if v.id == scope.var => field(g.name, None),
                _ => Err((full_span(e), SUPPORTED.into())),
            },
            Expr::Filter(f) if f.name == "default" => {
                let (Some(Expr::GetAttr(g)), [CallArg::Pos(d)]) = (&f.expr, &f.args[..]) else {
                    return Err((full_span(e), SUPPORTED.into()));
                };
                match &g.expr {
                    Expr::Var(v) if v.id == scope.var => {
                        field(g.name, Some(self.constant_json(d)?))
                    }
                    _ => Err((full_span(e), SUPPORTED.into())),
                }
            }
            Expr::BinOp(o) => {
                let (l, r) = (self.iteration(&o.left)?, self.iteration(&o.right)?);
                let ints = l.ty() == Ty::Int && r.ty() == Ty::Int;
                let strs = l.ty() == Ty::Str && r.ty() == Ty::Str;
                let bools = l.ty() == Ty::Bool && r.ty() == Ty::Bool;
                match o.op {
                    ast::BinOpKind::Add if ints => Ok(IterExpr::Add(b(l), b(r))),
                    ast::BinOpKind::Sub if ints => Ok(IterExpr::Sub(b(l), b(r))),
                    ast::BinOpKind::Add if strs => Ok(IterExpr::Concat(b(l), b(r))),
                    ast::BinOpKind::Concat => Ok(IterExpr::Concat(b(l), b(r))),
                    ast::BinOpKind::ScAnd if bools => Ok(IterExpr::And(b(l), b(r))),
                    ast::BinOpKind::ScOr if bools => Ok(IterExpr::Or(b(l), b(r))),
                    ast::BinOpKind::Eq => Ok(IterExpr::Eq(b(l), b(r))),
                    ast::BinOpKind::Ne => Ok(IterExpr::Ne(b(l), b(r))),
                    _ => Err((full_span(e), SUPPORTED.into())),
                }
            }
            Expr::UnaryOp(u) if matches!(u.op, ast::UnaryOpKind::Not) => {
                let x = self.iteration(&u.expr)?;
                match x.ty() {
                    Ty::Bool => Ok(IterExpr::Not(b(x))),
                    _ => Err((
                        full_span(e),
                        "`not` of a value that is not a boolean".into(),
                    )),
                }
            }
            _ => Err((full_span(e), SUPPORTED.into())),
        }
    }

    /// Whether `ns.attr` names an attribute of a `namespace()` the template made.
    pub(super) fn namespace_attr(&self, key: &str) -> bool {
        key.split_once('.')
            .is_some_and(|(ns, attr)| self.namespaces.get(ns).is_some_and(|a| a.contains(attr)))
    }

    /// A list of the pod, as CEL, with what its items are: the pod's containers, init
    /// containers and volumes as templates see them (without any template's sidecars and
    /// volumes), a list field of an item in scope, or a list collected earlier.
    pub(super) fn list(
        &self,
        e: &Expr<'_>,
        vars: &[Var],
    ) -> Result<(String, Elem), (Span, String)> {
        const SUPPORTED: &str = "only `pod.spec.containers`, `pod.spec.initContainers`, `pod.spec.volumes`, a list field of their items (`c.ports | default([])`) and a list collected from them can be looped over in CEL";
        let (inner, empty_default) = match e {
            Expr::Filter(f) if f.name == "default" => match (&f.expr, &f.args[..]) {
                (Some(inner), [CallArg::Pos(Expr::List(l))]) if l.items.is_empty() => (inner, true),
                _ => return Err((full_span(e), SUPPORTED.into())),
            },
            e => (e, false),
        };
        let owned = self.inj.templates.owned();
        if let Some(p) = path(inner) {
            let p: Vec<&str> = p.iter().map(String::as_str).collect();
            let sidecars = cel::strings(owned.sidecars.iter().map(String::as_str));
            let volumes = cel::strings(owned.volumes.iter().map(String::as_str));
            return match p[..] {
                ["spec", "containers"] => Ok((
                    format!("object.spec.containers.filter(c, !(c.name in {sidecars}))"),
                    Elem::Container,
                )),
                ["spec", "initContainers"] => Ok((
                    format!(
                        "(has(object.spec.initContainers) ? object.spec.initContainers : []).filter(c, !(c.name in {sidecars}))"
                    ),
                    Elem::Container,
                )),
                ["spec", "volumes"] => Ok((
                    format!(
                        "(has(object.spec.volumes) ? object.spec.volumes : []).filter(v, !(v.name in {volumes}) && !{})",
                        cel::TOKEN_VOLUME
                    ),
                    Elem::Volume,
                )),
                _ => Err((full_span(e), SUPPORTED.into())),
            };
        }
        if let Expr::GetAttr(g) = inner
            && let Expr::Var(v) = &g.expr
        {
            if let Some((_, cel, elem)) = vars.iter().rev().find(|(n, _, _)| n == v.id) {
                return match elem.field(g.name) {
                    Some(Field::List(item, true)) => Ok((format!("{cel}.{}", g.name), item)),
                    Some(Field::List(item, false)) if empty_default => Ok((
                        format!("(has({cel}.{f}) ? {cel}.{f} : [])", f = g.name),
                        item,
                    )),
                    Some(Field::List(..)) => Err((
                        full_span(e),
                        format!(
                            "`{}` may be absent from an item; give it a `| default([])`",
                            g.name
                        ),
                    )),
                    _ => Err((full_span(e), SUPPORTED.into())),
                };
            }
            let key = format!("{}.{}", v.id, g.name);
            if let Some(c) = self.lists.get(&key) {
                return Ok((c.cel(), c.elem));
            }
        }
        Err((full_span(e), SUPPORTED.into()))
    }

    /// An item appended to a collected list, as CEL.
    pub(super) fn item_value(
        &self,
        e: &Expr<'_>,
        vars: &[Var],
    ) -> Result<(String, Elem), (Span, String)> {
        const SUPPORTED: &str = "only an item, a field of an item (with `| default(...)` where it may be absent) and constants can be collected in CEL";
        let names: Vec<&str> = vars.iter().map(|(n, _, _)| n.as_str()).collect();
        if !reads(e, &names) && !self.tainted(e) && !reads(e, &["loop"]) {
            let v = self.constant_json(e)?;
            let elem = match v {
                Value::String(_) => Elem::Str,
                Value::Bool(_) => Elem::Bool,
                Value::Number(ref n) if n.is_i64() => Elem::Int,
                _ => return Err((full_span(e), SUPPORTED.into())),
            };
            return Ok((loops_literal(&v), elem));
        }
        let var = |name: &str| vars.iter().rev().find(|(n, _, _)| n == name);
        match e {
            Expr::Var(v) => match var(v.id) {
                Some((_, cel, elem)) if elem.scalar() => Ok((cel.clone(), *elem)),
                _ => Err((full_span(e), SUPPORTED.into())),
            },
            Expr::GetAttr(g) => match (&g.expr, &g.expr) {
                (Expr::Var(v), _) => match var(v.id).map(|(_, c, el)| (c, el.field(g.name))) {
                    Some((cel, Some(Field::One(elem, true)))) => {
                        Ok((format!("{cel}.{}", g.name), elem))
                    }
                    Some((_, Some(Field::One(_, false)))) => Err((
                        full_span(e),
                        format!(
                            "`{}` may be absent from an item, and then the webhook fails to render it; give it a `| default(...)`",
                            g.name
                        ),
                    )),
                    _ => Err((full_span(e), SUPPORTED.into())),
                },
                _ => Err((full_span(e), SUPPORTED.into())),
            },
            Expr::Filter(f) if f.name == "default" => {
                let (Some(Expr::GetAttr(g)), [CallArg::Pos(d)]) = (&f.expr, &f.args[..]) else {
                    return Err((full_span(e), SUPPORTED.into()));
                };
                let Expr::Var(v) = &g.expr else {
                    return Err((full_span(e), SUPPORTED.into()));
                };
                match var(v.id).map(|(_, c, el)| (c, el.field(g.name))) {
                    Some((cel, Some(Field::One(elem, _)))) => {
                        let d = self.constant_json(d)?;
                        Ok((
                            format!(
                                "(has({cel}.{f}) ? {cel}.{f} : {})",
                                loops_literal(&d),
                                f = g.name
                            ),
                            elem,
                        ))
                    }
                    _ => Err((full_span(e), SUPPORTED.into())),
                }
            }
            _ => Err((full_span(e), SUPPORTED.into())),
        }
    }

    /// A condition inside a collecting loop, as CEL.
    pub(super) fn condition(&self, e: &Expr<'_>, vars: &[Var]) -> Result<String, (Span, String)> {
        const SUPPORTED: &str = "only `==`, `!=`, `in`, `not in`, `and`, `or` and `not` over items, their fields and constants can be written as CEL";
        match e {
            Expr::BinOp(b) if matches!(b.op, ast::BinOpKind::ScAnd | ast::BinOpKind::ScOr) => {
                let op = match b.op {
                    ast::BinOpKind::ScAnd => "&&",
                    _ => "||",
                };
                Ok(format!(
                    "({} {op} {})",
                    self.condition(&b.left, vars)?,
                    self.condition(&b.right, vars)?
                ))
            }
            Expr::UnaryOp(u) if matches!(u.op, ast::UnaryOpKind::Not) => {
                Ok(format!("!{}", self.condition(&u.expr, vars)?))
            }
            Expr::BinOp(b)
                if matches!(
                    b.op,
                    ast::BinOpKind::Eq | ast::BinOpKind::Ne | ast::BinOpKind::In
                ) =>
            {
                let (l, _) = self.item_value(&b.left, vars)?;
                let (r, _) = self.item_value(&b.right, vars).or_else(|err| {
                    // A constant list for `in`.
                    match self.constant_json(&b.right) {
                        Ok(v @ Value::Array(_)) => Ok((loops_literal(&v), Elem::Str)),
                        _ => Err(err),
                    }
                })?;
                Ok(match b.op {
                    ast::BinOpKind::Eq => format!("({l} == {r})"),
                    ast::BinOpKind::Ne => format!("({l} != {r})"),
                    _ => format!("({l} in {r})"),
                })
            }
            _ => Err((full_span(e), SUPPORTED.into())),
        }
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
            chars: Chars::Allowed(trials::of_override(&key, spec)),
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
        match p[..] {
            ["namespace"] => defined("request.namespace"),
            ["name"] => defined(NAME),
            ["generateName"] => defined(GENERATE_NAME),
            ["serviceAccount"] => defined(SERVICE_ACCOUNT),
            ["labels", key] | ["annotations", key] => {
                let (map, hidden, chars) = match p[0] {
                    "labels" => (
                        "labels",
                        owned.labels.contains(key),
                        Chars::Plain,
                    ),
                    _ => (
                        "annotations",
                        owned.annotations.contains(key) || key == cfg.status_annotation,
                        Chars::Any,
                    ),
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
                        chars,
                    },
                })
            }
            ["spec", ..] => Err((
                span,
                "reads the pod's spec: export supports the pod's metadata only".into(),
            )),
            ["owner", ..] => Err((
                span,
                "reads the pod's owner: export does not write the Deployment-from-ReplicaSet rule in CEL yet".into(),
            )),
            _ => Err((
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

fn ty_of(elem: Elem) -> Ty {
    match elem {
        Elem::Int => Ty::Int,
        Elem::Bool => Ty::Bool,
        _ => Ty::Str,
    }
}

/// A constant as a CEL literal.
fn loops_literal(v: &Value) -> String {
    match v {
        Value::String(s) => cel::string(s),
        Value::Array(items) => format!(
            "[{}]",
            items
                .iter()
                .map(loops_literal)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => other.to_string(),
    }
}

/// `pod.name` as templates see it: empty under `generateName` (the API server names the pod
/// between the mutating and the validating policies).
pub const NAME: &str = "((has(object.metadata.generateName) && object.metadata.generateName != \"\") ? \"\" : (has(object.metadata.name) ? object.metadata.name : \"\"))";

pub const GENERATE_NAME: &str =
    "(has(object.metadata.generateName) ? object.metadata.generateName : \"\")";

pub const SERVICE_ACCOUNT: &str = "((has(object.spec.serviceAccountName) && object.spec.serviceAccountName != \"\") ? object.spec.serviceAccountName : \"default\")";

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
fn path(e: &Expr<'_>) -> Option<Vec<String>> {
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
fn without_tojson<'a, 'e>(e: &'e Expr<'a>) -> (&'e Expr<'a>, bool) {
    match e {
        Expr::Filter(f) if f.name == "tojson" && f.args.is_empty() => match &f.expr {
            Some(inner) => (inner, true),
            None => (e, false),
        },
        _ => (e, false),
    }
}
