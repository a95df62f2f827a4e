//! The walk of the template's syntax tree: where it reads the pod. Each `{{ ... }}` that does
//! becomes an edit of the source (a marker, or a marker naming the iteration inside a loop),
//! each loop over a list of the pod an output loop or a collected list, and each construct
//! that cannot be written as CEL (a condition on the pod outside a loop, a value kept in a
//! variable, a loop in a loop...) a refusal with its line.

use std::collections::{BTreeMap, BTreeSet};

use minijinja::machinery::Span;
use minijinja::machinery::ast::{self, CallArg, Expr, Stmt};

use crate::engine::config::Injector;
use crate::export::loops::{Elem, IterExpr};
use crate::export::symbolic::Refusal;
use crate::export::translate::{Collected, Emit, Scope, Translator, Var, full_span};

/// The walk under way: what it found so far, and what the translations read.
struct Walk<'a> {
    tr: Translator<'a>,
    emits: Vec<Emit>,
    edits: Vec<Edit>,
    iters: Vec<(usize, IterExpr)>,
    loops: Vec<OutputLoop>,
    refusals: Vec<Refusal>,
}

/// What the walk found: the values read of the pod (by marker number), the edits of the
/// source (in order), the values iterations read, and the output loops.
pub(super) struct Walked {
    pub(super) emits: Vec<Emit>,
    pub(super) edits: Vec<Edit>,
    pub(super) iters: Vec<(usize, IterExpr)>,
    pub(super) loops: Vec<OutputLoop>,
}

impl Walked {
    /// Loop `k`'s refusal, with its line and construct.
    pub(super) fn loop_refusal(&self, k: usize, reason: String) -> Refusal {
        match self.loops.get(k) {
            Some(l) => Refusal {
                line: l.line,
                construct: l.construct.clone(),
                reason: format!("a loop over a list of the pod: {reason}"),
            },
            None => Refusal::whole(reason),
        }
    }
}

/// Walks template `name` (its `source`, parsed as `tree`): what it reads of the pod, or every
/// construct that cannot be written as CEL.
pub(super) fn walk(
    inj: &Injector,
    name: &str,
    source: &str,
    tree: &Stmt<'_>,
) -> Result<Walked, Vec<Refusal>> {
    let mut walk = Walk {
        tr: Translator {
            inj,
            name,
            source,
            namespaces: BTreeMap::new(),
            lists: BTreeMap::new(),
            scope: None,
        },
        emits: Vec::new(),
        edits: Vec::new(),
        iters: Vec::new(),
        loops: Vec::new(),
        refusals: Vec::new(),
    };
    walk.stmt(tree, false);
    if !walk.refusals.is_empty() {
        return Err(walk.refusals);
    }
    let Walk {
        emits,
        mut edits,
        iters,
        loops,
        ..
    } = walk;
    edits.sort_by_key(|e| e.range.start);
    Ok(Walked {
        emits,
        edits,
        iters,
        loops,
    })
}

/// A change to the template's source for one rendering.
pub(super) struct Edit {
    pub(super) range: std::ops::Range<usize>,
    pub(super) kind: EditKind,
}

pub(super) enum EditKind {
    /// Value `i` read of the pod: its marker.
    Marker(usize),
    /// Value `j` an iteration reads: a marker naming the iteration (or left as written).
    Iter { j: usize, tojson: bool },
    /// `{% if %}` on the iteration, as a value `j` (or left as written).
    Cond { j: usize, open: bool, close: bool },
    /// Loop `k`'s list: run n times, or over given items.
    Iterable(usize),
    /// A loop that collects a list: not run (the list is only read by loops).
    Collect,
}

/// A loop over a list of the pod whose body writes the fragment.
pub(super) struct OutputLoop {
    pub(super) cel: String,
    pub(super) elem: Elem,
    pub(super) line: usize,
    pub(super) construct: String,
}

/// Per `ns.attr`, the CEL lists a collecting block appends.
type Appends = BTreeMap<String, Vec<String>>;

/// Per `ns.attr`: the appends guarded by `not in`, all appends, and what the items are.
type Counts = BTreeMap<String, (usize, usize, Elem)>;

const COLLECT_SUPPORTED: &str = "a loop that collects a list may hold only loops over lists of the pod's items, `{% if %}` and `{% set ns.x = ns.x + [...] %}`";

impl Walk<'_> {
    fn refuse(&mut self, span: Span, reason: impl Into<String>) {
        self.refusals.push(Refusal {
            line: span.start_line as usize,
            construct: self.tr.text(span).trim().to_owned(),
            reason: reason.into(),
        });
    }

    fn stmts(&mut self, list: &[Stmt<'_>], captured: bool) {
        for s in list {
            self.stmt(s, captured);
        }
    }

    /// `captured`: inside a block whose output is kept in a variable or filtered, where a
    /// marker would not reach the fragment as it is.
    fn stmt(&mut self, s: &Stmt<'_>, captured: bool) {
        const SHAPE: &str = "the fragment's shape would depend on the pod; only loops over the pod's lists (and their `else`) can be written as CEL, not a condition outside one";
        match s {
            Stmt::Template(t) => self.stmts(&t.children, captured),
            Stmt::EmitRaw(_) => {}
            Stmt::EmitExpr(e) => self.emit(&e.expr, captured),
            Stmt::ForLoop(f) => self.for_loop(f, captured),
            Stmt::IfCond(c) if self.tr.per_iteration(&c.expr) => match self.tr.iteration_cond(c) {
                Ok((range, x, open, close)) => {
                    let j = self.push_iter(x);
                    self.edits.push(Edit {
                        range,
                        kind: EditKind::Cond { j, open, close },
                    });
                }
                Err((span, reason)) => self.refuse(span, reason),
            },
            Stmt::IfCond(c) => {
                if self.tr.tainted(&c.expr) {
                    self.refuse(
                        full_span(&c.expr),
                        format!("a condition on a value read from the pod: {SHAPE}"),
                    );
                }
                self.stmts(&c.true_body, captured);
                self.stmts(&c.false_body, captured);
            }
            Stmt::WithBlock(w) => {
                for (_, e) in &w.assignments {
                    if self.tr.tainted(e) {
                        self.refuse(full_span(e), "a value read from the pod kept in a variable");
                    }
                }
                self.stmts(&w.body, captured);
            }
            Stmt::Set(set) => self.set(set),
            Stmt::SetBlock(b) => self.stmts(&b.body, true),
            Stmt::AutoEscape(a) => self.stmts(&a.body, captured),
            Stmt::FilterBlock(f) => self.stmts(&f.body, true),
            Stmt::Do(d) => {
                if self.tr.tainted(&d.call.expr) {
                    self.refuse(d.call.span(), "a call with a value read from the pod");
                }
            }
            Stmt::Macro(m) => self.stmts(&m.body, true),
            Stmt::CallBlock(c) => {
                if c.call.args.iter().any(|a| match a {
                    CallArg::Pos(e)
                    | CallArg::Kwarg(_, e)
                    | CallArg::PosSplat(e)
                    | CallArg::KwargSplat(e) => self.tr.tainted(e),
                }) {
                    self.refuse(
                        c.call.span(),
                        "a macro called with a value read from the pod",
                    );
                }
                self.stmts(&c.macro_decl.body, true);
            }
            Stmt::Block(b) => self.stmts(&b.body, captured),
            Stmt::Import(i) => self.refuse(full_span(&i.expr), "an import of another template"),
            Stmt::FromImport(i) => self.refuse(full_span(&i.expr), "an import of another template"),
            Stmt::Extends(e) => self.refuse(full_span(&e.name), "a template that extends another"),
            Stmt::Include(i) => self.refuse(full_span(&i.name), "an include of another template"),
        }
    }

    /// A `{{ ... }}`: a marker where it reads an iteration or the pod.
    fn emit(&mut self, e: &Expr<'_>, captured: bool) {
        if self.tr.per_iteration(e) {
            match self.tr.iteration_emit(e) {
                Ok((range, x, tojson)) => {
                    let j = self.push_iter(x);
                    self.edits.push(Edit {
                        range,
                        kind: EditKind::Iter { j, tojson },
                    });
                }
                Err((span, reason)) => self.refuse(span, reason),
            }
        } else if self.tr.tainted(e) {
            if captured {
                self.refuse(
                    full_span(e),
                    "a value read from the pod inside a block whose output is captured or filtered",
                );
                return;
            }
            match self.tr.top(e) {
                Ok(emit) => {
                    self.edits.push(Edit {
                        range: emit.range.clone(),
                        kind: EditKind::Marker(self.emits.len()),
                    });
                    self.emits.push(emit);
                }
                Err((span, reason)) => self.refuse(span, reason),
            }
        }
    }

    /// A `{% for %}`: walked through when it does not loop over the pod; else an output loop,
    /// or a loop that collects a list.
    fn for_loop(&mut self, f: &ast::Spanned<ast::ForLoop<'_>>, captured: bool) {
        let on_pod =
            self.tr.tainted(&f.iter) || f.filter_expr.as_ref().is_some_and(|e| self.tr.tainted(e));
        if self.tr.scope.is_some() {
            self.refuse(
                full_span(&f.iter),
                "a loop inside a loop over a list of the pod: CEL writes one level of loops",
            );
            return;
        }
        if !on_pod {
            self.stmts(&f.body, captured);
            self.stmts(&f.else_body, captured);
            return;
        }
        if captured {
            self.refuse(
                full_span(&f.iter),
                "a loop over a list of the pod inside a block whose output is captured or filtered",
            );
            return;
        }
        let span = full_span(&f.iter);
        let done = if writes_nothing(&f.body) && f.else_body.is_empty() {
            self.collect(f).map(|()| EditKind::Collect)
        } else {
            self.output_loop(f, span)
        };
        match done {
            Ok(kind) => self.edits.push(Edit {
                range: span.start_offset as usize..span.end_offset as usize,
                kind,
            }),
            Err((span, reason)) => self.refuse(span, reason),
        }
    }

    /// A `{% set %}`: a `namespace()` noted; a value of the pod kept, refused.
    fn set(&mut self, set: &ast::Spanned<ast::Set<'_>>) {
        if self.tr.scope.is_some() {
            self.refuse(
                set.span(),
                "a variable set inside a loop over a list of the pod",
            );
        } else if self.tr.tainted(&set.expr) {
            self.refuse(
                full_span(&set.expr),
                "a value read from the pod kept in a variable (only lists collected in a loop over the pod's lists are written as CEL)",
            );
        } else if let Some((var, attrs)) = namespace_decl(set) {
            self.tr.namespaces.insert(var, attrs);
        } else if let Some(key) = attr_key(&set.target)
            && self.tr.lists.contains_key(&key)
        {
            self.refuse(
                set.span(),
                "a list collected from the pod changed outside its loop",
            );
        }
    }

    fn push_iter(&mut self, x: IterExpr) -> usize {
        let k = self.tr.scope.as_ref().map_or(0, |s| s.k);
        self.iters.push((k, x));
        self.iters.len() - 1
    }

    /// A loop over a list of the pod whose body writes the fragment: its list as CEL, its
    /// body walked with its variable in scope.
    fn output_loop(
        &mut self,
        f: &ast::Spanned<ast::ForLoop<'_>>,
        span: Span,
    ) -> Result<EditKind, (Span, String)> {
        if f.recursive || f.filter_expr.is_some() {
            return Err((
                span,
                "a recursive or filtered loop over a list of the pod".into(),
            ));
        }
        let Expr::Var(var) = &f.target else {
            return Err((full_span(&f.target), "a loop that unpacks its items".into()));
        };
        let (cel, elem) = self.tr.list(&f.iter, &[])?;
        let k = self.loops.len();
        self.loops.push(OutputLoop {
            cel,
            elem,
            line: span.start_line as usize,
            construct: self.tr.text(span).trim().to_owned(),
        });
        self.tr.scope = Some(Scope {
            k,
            var: var.id.to_owned(),
            elem,
        });
        self.stmts(&f.body, false);
        self.tr.scope = None;
        self.stmts(&f.else_body, false);
        Ok(EditKind::Iterable(k))
    }

    /// A loop that writes nothing and collects items into `namespace()` lists.
    fn collect(&mut self, f: &ast::Spanned<ast::ForLoop<'_>>) -> Result<(), (Span, String)> {
        let mut counts = BTreeMap::new();
        let appends = self.collect_for(f, &[], &mut counts)?;
        for (key, parts) in appends {
            let (guarded, all, elem) = counts.get(&key).copied().unwrap_or((0, 0, Elem::Str));
            let entry = self.tr.lists.entry(key.clone()).or_insert(Collected {
                parts: Vec::new(),
                elem,
                guarded: 0,
                appends: 0,
            });
            if entry.elem != elem {
                return Err((
                    full_span(&f.iter),
                    format!("{key} collects items of two types"),
                ));
            }
            entry.parts.push(join_lists(&parts));
            entry.guarded += guarded;
            entry.appends += all;
            if entry.guarded > 0 && entry.guarded < entry.appends {
                return Err((
                    full_span(&f.iter),
                    format!(
                        "{key} is appended to both with and without `not in {key}`: only all or none can be written as CEL"
                    ),
                ));
            }
        }
        Ok(())
    }

    fn collect_for(
        &self,
        f: &ast::ForLoop<'_>,
        vars: &[Var],
        counts: &mut Counts,
    ) -> Result<Appends, (Span, String)> {
        let Expr::Var(target) = &f.target else {
            return Err((full_span(&f.target), "a loop that unpacks its items".into()));
        };
        if f.recursive || !f.else_body.is_empty() {
            return Err((
                full_span(&f.iter),
                "a recursive loop, or one with an `else`, that collects a list".into(),
            ));
        }
        let (list, elem) = self.tr.list(&f.iter, vars)?;
        let v = format!("a{}", vars.len());
        let mut inner = vars.to_vec();
        inner.push((target.id.to_owned(), v.clone(), elem));
        let list = match &f.filter_expr {
            Some(c) => format!("{list}.filter({v}, {})", self.tr.condition(c, &inner)?),
            None => list,
        };
        let body = self.collect_stmts(&f.body, &inner, counts)?;
        Ok(body
            .into_iter()
            .map(|(key, parts)| {
                (
                    key,
                    vec![format!("{list}.map({v}, {}).flatten()", join_lists(&parts))],
                )
            })
            .collect())
    }

    fn collect_stmts(
        &self,
        list: &[Stmt<'_>],
        vars: &[Var],
        counts: &mut Counts,
    ) -> Result<Appends, (Span, String)> {
        let mut out = Appends::new();
        for s in list {
            match s {
                Stmt::EmitRaw(r) if r.raw.is_empty() => {}
                Stmt::ForLoop(f) => merge(&mut out, self.collect_for(f, vars, counts)?),
                Stmt::IfCond(c) => self.collect_if(c, vars, counts, &mut out)?,
                Stmt::Set(set) => self.collect_append(set, vars, counts, &mut out)?,
                Stmt::EmitRaw(r) => {
                    return Err((
                        r.span(),
                        "a loop that collects a list writes whitespace for each item: strip it with `{%-` or `-%}`".into(),
                    ));
                }
                other => return Err((stmt_span(other), COLLECT_SUPPORTED.into())),
            }
        }
        Ok(out)
    }

    /// A `{% if %}` in a collecting loop: a guard `x not in ns.attr` on an append of `x` (each
    /// once), or a condition on items choosing what is appended.
    fn collect_if(
        &self,
        c: &ast::Spanned<ast::IfCond<'_>>,
        vars: &[Var],
        counts: &mut Counts,
        out: &mut Appends,
    ) -> Result<(), (Span, String)> {
        // `x not in ns.attr` guards an append of `x` to ns.attr: each once.
        let all = conjuncts(&c.expr);
        let guard = all.iter().enumerate().find_map(|(n, e)| match e {
            Expr::UnaryOp(u) if matches!(u.op, ast::UnaryOpKind::Not) => match &u.expr {
                Expr::BinOp(b) if matches!(b.op, ast::BinOpKind::In) => {
                    let key = attr_key(&b.right)?;
                    self.tr
                        .namespace_attr(&key)
                        .then(|| (n, key, self.tr.text(full_span(&b.left)).trim().to_owned()))
                }
                _ => None,
            },
            _ => None,
        });
        match guard {
            Some((n, key, item)) => {
                let only_append = match &c.true_body[..] {
                    [Stmt::Set(set)] => {
                        attr_key(&set.target).as_ref() == Some(&key)
                            && appended(set, &key).is_some_and(|items| {
                                matches!(items, [one] if self.tr.text(full_span(one)).trim() == item)
                            })
                    }
                    _ => false,
                };
                if !only_append || !c.false_body.is_empty() {
                    return Err((
                        full_span(&c.expr),
                        format!(
                            "`not in {key}` guards more than an append of the same item to {key}"
                        ),
                    ));
                }
                let rest: Vec<String> = all
                    .iter()
                    .enumerate()
                    .filter(|(m, _)| *m != n)
                    .map(|(_, e)| self.tr.condition(e, vars))
                    .collect::<Result<_, _>>()?;
                let appended = self.collect_stmts(&c.true_body, vars, counts)?;
                let entry = counts.entry(key.clone()).or_insert((0, 0, Elem::Str));
                entry.0 += 1;
                for (k, parts) in appended {
                    let list = join_lists(&parts);
                    let piece = match rest.is_empty() {
                        true => list,
                        false => format!("(({}) ? {list} : [])", rest.join(" && ")),
                    };
                    out.entry(k).or_default().push(piece);
                }
            }
            None => {
                let cond = self.tr.condition(&c.expr, vars)?;
                let yes = self.collect_stmts(&c.true_body, vars, counts)?;
                let no = self.collect_stmts(&c.false_body, vars, counts)?;
                let keys: BTreeSet<&String> = yes.keys().chain(no.keys()).collect();
                for k in keys {
                    let y = join_lists(yes.get(k).map_or(&[][..], Vec::as_slice));
                    let n = join_lists(no.get(k).map_or(&[][..], Vec::as_slice));
                    out.entry(k.clone())
                        .or_default()
                        .push(format!("({cond} ? {y} : {n})"));
                }
            }
        }
        Ok(())
    }

    /// `{% set ns.attr = ns.attr + [items] %}` in a collecting loop.
    fn collect_append(
        &self,
        set: &ast::Spanned<ast::Set<'_>>,
        vars: &[Var],
        counts: &mut Counts,
        out: &mut Appends,
    ) -> Result<(), (Span, String)> {
        let key = attr_key(&set.target)
            .filter(|k| self.tr.namespace_attr(k))
            .ok_or((set.span(), COLLECT_SUPPORTED.to_owned()))?;
        let items = appended(set, &key).ok_or((
            full_span(&set.expr),
            format!("only `{key} + [...]` can be written as CEL"),
        ))?;
        let mut cel = Vec::new();
        let mut elem = None;
        for item in items {
            let (c, e) = self.tr.item_value(item, vars)?;
            if elem.is_some_and(|x| x != e) {
                return Err((full_span(item), "items of two types".into()));
            }
            elem = Some(e);
            cel.push(c);
        }
        let entry = counts.entry(key.clone()).or_insert((0, 0, Elem::Str));
        entry.1 += 1;
        if let Some(e) = elem {
            entry.2 = e;
        }
        out.entry(key)
            .or_default()
            .push(format!("[{}]", cel.join(", ")));
        Ok(())
    }
}

/// Whether a loop's body writes nothing at all (it only collects).
fn writes_nothing(list: &[Stmt<'_>]) -> bool {
    list.iter().all(|s| match s {
        Stmt::EmitRaw(r) => r.raw.is_empty(),
        Stmt::EmitExpr(_) => false,
        Stmt::ForLoop(f) => writes_nothing(&f.body) && writes_nothing(&f.else_body),
        Stmt::IfCond(c) => writes_nothing(&c.true_body) && writes_nothing(&c.false_body),
        _ => true,
    })
}

/// `a and b and c` as `[a, b, c]`.
fn conjuncts<'e, 'a>(e: &'e Expr<'a>) -> Vec<&'e Expr<'a>> {
    match e {
        Expr::BinOp(b) if matches!(b.op, ast::BinOpKind::ScAnd) => {
            let mut out = conjuncts(&b.left);
            out.extend(conjuncts(&b.right));
            out
        }
        e => vec![e],
    }
}

fn join_lists(parts: &[String]) -> String {
    match parts {
        [] => "[]".into(),
        [one] => one.clone(),
        parts => format!("({})", parts.join(" + ")),
    }
}

fn merge(into: &mut Appends, from: Appends) {
    for (k, v) in from {
        into.entry(k).or_default().extend(v);
    }
}

/// `{% set x = namespace(a=[], ...) %}`: the namespace and its attributes.
fn namespace_decl(set: &ast::Set<'_>) -> Option<(String, BTreeSet<String>)> {
    let (Expr::Var(var), Expr::Call(call)) = (&set.target, &set.expr) else {
        return None;
    };
    let Expr::Var(f) = &call.expr else {
        return None;
    };
    if f.id != "namespace" {
        return None;
    }
    let attrs = call
        .args
        .iter()
        .map(|a| match a {
            CallArg::Kwarg(name, _) => Some((*name).to_owned()),
            _ => None,
        })
        .collect::<Option<_>>()?;
    Some((var.id.to_owned(), attrs))
}

/// `ns.attr` as `"ns.attr"`.
fn attr_key(e: &Expr<'_>) -> Option<String> {
    match e {
        Expr::GetAttr(g) => match &g.expr {
            Expr::Var(v) => Some(format!("{}.{}", v.id, g.name)),
            _ => None,
        },
        _ => None,
    }
}

/// The items of `{% set ns.attr = ns.attr + [items] %}`.
fn appended<'s, 'a>(set: &'s ast::Set<'a>, key: &str) -> Option<&'s [Expr<'a>]> {
    match &set.expr {
        Expr::BinOp(b) if matches!(b.op, ast::BinOpKind::Add) => {
            match (attr_key(&b.left).as_deref() == Some(key), &b.right) {
                (true, Expr::List(l)) => Some(&l.items),
                _ => None,
            }
        }
        _ => None,
    }
}

fn stmt_span(s: &Stmt<'_>) -> Span {
    match s {
        Stmt::Template(t) => t.span(),
        Stmt::EmitExpr(e) => e.span(),
        Stmt::EmitRaw(r) => r.span(),
        Stmt::ForLoop(f) => f.span(),
        Stmt::IfCond(c) => c.span(),
        Stmt::WithBlock(w) => w.span(),
        Stmt::Set(x) => x.span(),
        Stmt::SetBlock(x) => x.span(),
        Stmt::AutoEscape(x) => x.span(),
        Stmt::FilterBlock(x) => x.span(),
        Stmt::Block(x) => x.span(),
        Stmt::Import(x) => x.span(),
        Stmt::FromImport(x) => x.span(),
        Stmt::Extends(x) => x.span(),
        Stmt::Include(x) => x.span(),
        Stmt::Macro(x) => x.span(),
        Stmt::CallBlock(x) => x.span(),
        Stmt::Do(x) => x.span(),
    }
}
