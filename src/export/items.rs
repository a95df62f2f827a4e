//! The template's expressions over the items of the pod's lists translated to CEL: a value an
//! iteration of an output loop reads (an [`IterExpr`]), a `{% if %}` on it around text, a list
//! of the pod and what its items are, and the conditions and items of a loop that collects a
//! list. Methods of [`Translator`], beside those of `translate.rs` (values read of the pod).

use minijinja::machinery::Span;
use minijinja::machinery::ast::{self, CallArg, Expr, Stmt};
use serde_json::Value;

use crate::export::cel;
use crate::export::loops::{Elem, Field, IterExpr, Ty};
use crate::export::translate::{Translator, Var, full_span, path, reads, without_tojson};

impl Translator<'_> {
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
