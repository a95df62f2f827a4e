//! A template read for every pod at once: what it renders, with each value it reads of the pod
//! kept as a CEL expression over the admission request.
//!
//! The template's syntax tree says where it reads the pod (`pod.*`, `overrides`). Each
//! `{{ ... }}` that does is translated to CEL and replaced, in a copy of the source, by a
//! marker string; the copy is rendered by the set's own environment and read as a fragment, so
//! every constant part is exactly what the webhook renders. A read that changes the fragment's
//! shape (a loop or condition on the pod, a value kept in a variable) cannot become a JSONPatch
//! value and is refused with its line. Then the rendering is tried again with awkward values in
//! place of each marker (`0`, `true`, `null`, a YAML colon...): a value the webhook's YAML
//! would read as another type or another structure is refused too, so that what the policy
//! writes (always the string the CEL expression gives) is what the webhook writes.

use minijinja::machinery::ast::{self, CallArg, Expr, Stmt};
use minijinja::machinery::{Span, WhitespaceConfig};
use minijinja::syntax::SyntaxConfig;
use serde_json::Value;

use crate::engine::config::Injector;
use crate::engine::template::{Fragment, TEMPLATE_SUFFIX};

/// Opens and closes a marker in rendered text: private-use characters no template writes.
pub const OPEN: char = '\u{E000}';
pub const CLOSE: char = '\u{E001}';

/// A template as the policy writes it.
#[derive(Debug)]
pub struct Symbolic {
    /// The rendering, with a marker where each value read of the pod goes.
    pub fragment: Fragment,
    /// The CEL expression (of type string) of each marker, by number.
    pub exprs: Vec<String>,
}

/// Why a template, or a part of it, cannot be exported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// 1-based line in the template; 0 when the whole template is meant.
    pub line: usize,
    /// The construct, as written.
    pub construct: String,
    pub reason: String,
}

impl Refusal {
    /// A refusal of the whole template, not of one construct.
    pub fn whole(reason: String) -> Self {
        Self {
            line: 0,
            construct: String::new(),
            reason,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            0 => write!(f, "{}", self.reason),
            line => write!(f, "line {line}: `{}`: {}", self.construct, self.reason),
        }
    }
}

/// What a value read of the pod may contain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Chars {
    /// Letters, digits, `-`, `_`, `.` (names, namespaces, label values).
    Plain,
    /// Anything (annotations).
    Any,
}

/// A string-valued piece of CEL.
#[derive(Clone, Debug)]
struct Cel {
    text: String,
    chars: Chars,
}

/// A value read of the pod, which may be absent (a label the pod does not carry).
enum Read {
    Defined(Cel),
    Maybe { present: String, value: Cel },
}

/// A `{{ ... }}` that reads the pod.
struct Emit {
    /// Byte range of its expression in the source.
    range: std::ops::Range<usize>,
    /// Whether the expression ended in `| tojson` (kept around the marker).
    tojson: bool,
    cel: Cel,
    line: usize,
    construct: String,
}

/// Reads template `name` of `inj` for every pod.
pub fn read(inj: &Injector, name: &str) -> Result<Symbolic, Vec<Refusal>> {
    let whole = |reason: String| vec![Refusal::whole(reason)];
    let set = &inj.templates;
    let source = set
        .source(name)
        .ok_or_else(|| whole(format!("there is no template {name:?}")))?;
    let file = format!("{name}{TEMPLATE_SUFFIX}");
    let whitespace = WhitespaceConfig {
        keep_trailing_newline: true,
        ..WhitespaceConfig::default()
    };
    let tree = minijinja::machinery::parse(source, &file, SyntaxConfig, whitespace)
        .map_err(|e| whole(format!("does not parse: {e}")))?;
    let mut walk = Walk {
        inj,
        source,
        emits: Vec::new(),
        refusals: Vec::new(),
    };
    walk.stmt(&tree, false);
    if !walk.refusals.is_empty() {
        return Err(walk.refusals);
    }
    let emits = walk.emits;
    let rewrite = |substitute: &dyn Fn(usize) -> String| {
        let mut out = String::with_capacity(source.len());
        let mut at = 0;
        for (i, e) in emits.iter().enumerate() {
            out.push_str(&source[at..e.range.start]);
            out.push_str(&literal(&substitute(i)));
            if e.tojson {
                out.push_str(" | tojson");
            }
            at = e.range.end;
        }
        out.push_str(&source[at..]);
        out
    };
    let refuse = |e: &Emit, reason: String| Refusal {
        line: e.line,
        construct: e.construct.clone(),
        reason,
    };
    let marked = rewrite(&marker);
    let fragment = set.render_source(name, &marked).map_err(|err| {
        let reason = format!(
            "a value read from the pod is used where the fragment needs another type: {err}"
        );
        match emits.first() {
            Some(e) => vec![refuse(e, reason)],
            None => whole(reason),
        }
    })?;
    let json = serde_json::to_value(&fragment).unwrap_or_default();
    let mut refusals = Vec::new();
    for (i, e) in emits.iter().enumerate() {
        if !contains_marker(&json, i) {
            refusals.push(refuse(
                e,
                "the value does not reach the fragment as a string (used as a number, a key or a comment)"
                    .into(),
            ));
            continue;
        }
        if let Some(field) = in_a_name(&fragment, i) {
            refusals.push(refuse(
                e,
                format!(
                    "{field} may not depend on the pod: the policy finds what it added by these"
                ),
            ));
            continue;
        }
        let trials: &[&str] = match e.cel.chars {
            Chars::Plain => &PLAIN_TRIALS,
            Chars::Any => &ANY_TRIALS,
        };
        for trial in trials {
            let text = rewrite(&|j| {
                if j == i {
                    (*trial).to_owned()
                } else {
                    marker(j)
                }
            });
            let want = substitute(&json, &marker(i), trial);
            let got = set
                .render_source(name, &text)
                .map(|f| serde_json::to_value(&f).unwrap_or_default());
            if got.ok().as_ref() != Some(&want) {
                let hint = match e.tojson {
                    true => "",
                    false => "; quote it with `| tojson`",
                };
                refusals.push(refuse(
                    e,
                    format!(
                        "for a pod where it is {trial:?} the webhook's YAML would not read it as that string{hint}"
                    ),
                ));
                break;
            }
        }
    }
    if !refusals.is_empty() {
        return Err(refusals);
    }
    Ok(Symbolic {
        fragment,
        exprs: emits.into_iter().map(|e| e.cel.text).collect(),
    })
}

/// Values a plain read (a label value, a name) may have that YAML reads as something else.
const PLAIN_TRIALS: [&str; 6] = ["0", "1.5", "true", "null", "-", "x"];
/// And what an annotation may hold besides.
const ANY_TRIALS: [&str; 12] = [
    "0", "1.5", "true", "null", "-", "x", "a: b", "#c", "'\"", "[1]", "{a: 1}", "x\ny",
];

pub fn marker(i: usize) -> String {
    format!("{OPEN}{i}{CLOSE}")
}

/// A minijinja string literal.
fn literal(text: &str) -> String {
    // JSON string syntax is a subset of what minijinja reads.
    serde_json::to_string(text).unwrap_or_default()
}

fn contains_marker(v: &Value, i: usize) -> bool {
    let m = marker(i);
    match v {
        Value::String(s) => s.contains(&m),
        Value::Array(a) => a.iter().any(|v| contains_marker(v, i)),
        Value::Object(o) => o.values().any(|v| contains_marker(v, i)),
        _ => false,
    }
}

fn substitute(v: &Value, from: &str, to: &str) -> Value {
    match v {
        Value::String(s) => Value::String(s.replace(from, to)),
        Value::Array(a) => Value::Array(a.iter().map(|v| substitute(v, from, to)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (k.replace(from, to), substitute(v, from, to)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The field, if any, where marker `i` sits in something the policy matches by.
fn in_a_name(f: &Fragment, i: usize) -> Option<&'static str> {
    let m = marker(i);
    let has = |s: &str| s.contains(&m);
    if f.containers
        .iter()
        .chain(&f.init_containers)
        .any(|c| has(&c.name))
    {
        return Some("a container's name");
    }
    if f.volumes.iter().any(|v| has(&v.name)) {
        return Some("a volume's name");
    }
    if f.volume_mounts
        .iter()
        .any(|v| has(&v.name) || has(&v.mount_path))
    {
        return Some("a mount's name or path");
    }
    if f.env.iter().any(|e| has(&e.name)) {
        return Some("an env var's name");
    }
    if f.image_pull_secrets.iter().any(|s| has(&s.name)) {
        return Some("an image pull secret's name");
    }
    if f.labels.keys().chain(f.annotations.keys()).any(|k| has(k)) {
        return Some("a label or annotation key");
    }
    None
}

struct Walk<'a> {
    inj: &'a Injector,
    source: &'a str,
    emits: Vec<Emit>,
    refusals: Vec<Refusal>,
}

/// Whether an expression reads the pod (or the per-pod overrides, which come from its
/// annotations).
fn reads_pod(e: &Expr<'_>) -> bool {
    let args = |args: &[CallArg<'_>]| {
        args.iter().any(|a| match a {
            CallArg::Pos(e)
            | CallArg::Kwarg(_, e)
            | CallArg::PosSplat(e)
            | CallArg::KwargSplat(e) => reads_pod(e),
        })
    };
    match e {
        Expr::Var(v) => matches!(v.id, "pod" | "overrides"),
        Expr::Const(_) => false,
        Expr::Slice(s) => {
            reads_pod(&s.expr)
                || [&s.start, &s.stop, &s.step]
                    .into_iter()
                    .flatten()
                    .any(reads_pod)
        }
        Expr::UnaryOp(u) => reads_pod(&u.expr),
        Expr::BinOp(b) => reads_pod(&b.left) || reads_pod(&b.right),
        Expr::Compare(c) => reads_pod(&c.expr) || c.ops.iter().any(|o| reads_pod(&o.expr)),
        Expr::IfExpr(i) => {
            reads_pod(&i.test_expr)
                || reads_pod(&i.true_expr)
                || i.false_expr.as_ref().is_some_and(reads_pod)
        }
        Expr::Filter(f) => f.expr.as_ref().is_some_and(reads_pod) || args(&f.args),
        Expr::Test(t) => reads_pod(&t.expr) || args(&t.args),
        Expr::GetAttr(g) => reads_pod(&g.expr),
        Expr::GetItem(g) => reads_pod(&g.expr) || reads_pod(&g.subscript_expr),
        Expr::Call(c) => reads_pod(&c.expr) || args(&c.args),
        Expr::List(l) => l.items.iter().any(reads_pod),
        Expr::Map(m) => m.keys.iter().chain(&m.values).any(reads_pod),
    }
}

impl Walk<'_> {
    fn text(&self, span: Span) -> &str {
        self.source
            .get(span.start_offset as usize..span.end_offset as usize)
            .unwrap_or("")
    }

    fn refuse(&mut self, span: Span, reason: impl Into<String>) {
        self.refusals.push(Refusal {
            line: span.start_line as usize,
            construct: self.text(span).trim().to_owned(),
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
        const SHAPE: &str = "the fragment's shape would depend on the pod; a policy's JSONPatch values are fixed in shape";
        match s {
            Stmt::Template(t) => self.stmts(&t.children, captured),
            Stmt::EmitRaw(_) => {}
            Stmt::EmitExpr(e) if reads_pod(&e.expr) => {
                if captured {
                    self.refuse(full_span(&e.expr), "a value read from the pod inside a block whose output is captured or filtered");
                    return;
                }
                match self.top(&e.expr) {
                    Ok(emit) => self.emits.push(emit),
                    Err((span, reason)) => self.refuse(span, reason),
                }
            }
            Stmt::EmitExpr(_) => {}
            Stmt::ForLoop(f) => {
                if reads_pod(&f.iter) || f.filter_expr.as_ref().is_some_and(reads_pod) {
                    self.refuse(
                        full_span(&f.iter),
                        format!("a loop over a value read from the pod: {SHAPE}"),
                    );
                }
                self.stmts(&f.body, captured);
                self.stmts(&f.else_body, captured);
            }
            Stmt::IfCond(c) => {
                if reads_pod(&c.expr) {
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
                    if reads_pod(e) {
                        self.refuse(full_span(e), "a value read from the pod kept in a variable");
                    }
                }
                self.stmts(&w.body, captured);
            }
            Stmt::Set(set) => {
                if reads_pod(&set.expr) {
                    self.refuse(
                        full_span(&set.expr),
                        "a value read from the pod kept in a variable",
                    );
                }
            }
            Stmt::SetBlock(b) => self.stmts(&b.body, true),
            Stmt::AutoEscape(a) => self.stmts(&a.body, captured),
            Stmt::FilterBlock(f) => self.stmts(&f.body, true),
            Stmt::Do(d) => {
                if reads_pod(&d.call.expr) {
                    self.refuse(d.call.span(), "a call with a value read from the pod");
                }
            }
            Stmt::Macro(m) => self.stmts(&m.body, true),
            Stmt::CallBlock(c) => {
                if c.call.args.iter().any(|a| match a {
                    CallArg::Pos(e)
                    | CallArg::Kwarg(_, e)
                    | CallArg::PosSplat(e)
                    | CallArg::KwargSplat(e) => reads_pod(e),
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

    /// The whole inside of the `{{ ... }}` around `span` (without whitespace control), so
    /// that parentheses the syntax tree does not record are replaced too.
    fn between_delimiters(&self, span: Span) -> std::ops::Range<usize> {
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
    fn top(&self, e: &Expr<'_>) -> Result<Emit, (Span, String)> {
        let (inner, tojson) = match e {
            Expr::Filter(f) if f.name == "tojson" && f.args.is_empty() => match &f.expr {
                Some(inner) => (inner, true),
                None => (e, false),
            },
            _ => (e, false),
        };
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

    fn string(&self, e: &Expr<'_>) -> Result<Cel, (Span, String)> {
        match self.value(e)? {
            Read::Defined(cel) => Ok(cel),
            Read::Maybe { .. } => Err((
                full_span(e),
                "may be absent from a pod, and then the webhook fails to render it; give it a `| default(...)`"
                    .into(),
            )),
        }
    }

    fn value(&self, e: &Expr<'_>) -> Result<Read, (Span, String)> {
        const SUPPORTED: &str = "only the pod's name, generateName, namespace, serviceAccount, labels and annotations, with `| default(...)` and `~`, can be written as CEL";
        if !reads_pod(e) {
            return self.constant(e).map(Read::Defined);
        }
        match e {
            Expr::Filter(f) if f.name == "default" => {
                let Some(inner) = &f.expr else {
                    return Err((full_span(e), SUPPORTED.into()));
                };
                let [CallArg::Pos(fallback)] = &f.args[..] else {
                    return Err((full_span(e), "`default` with other than one argument".into()));
                };
                if reads_pod(fallback) {
                    return Err((full_span(fallback), "a default read from the pod".into()));
                }
                let fallback = self.constant(fallback)?;
                Ok(match self.value(inner)? {
                    Read::Defined(cel) => Read::Defined(cel),
                    Read::Maybe { present, value } => Read::Defined(Cel {
                        text: format!("({present} ? {} : {})", value.text, fallback.text),
                        chars: worst(value.chars, fallback.chars),
                    }),
                })
            }
            Expr::BinOp(b) if matches!(b.op, ast::BinOpKind::Concat) => {
                let (l, r) = (self.string(&b.left)?, self.string(&b.right)?);
                Ok(Read::Defined(Cel {
                    text: format!("{} + {}", l.text, r.text),
                    chars: worst(l.chars, r.chars),
                }))
            }
            _ => match path(e) {
                Some(p) => self.pod_value(full_span(e), &p),
                None if overrides(e) => Err((
                    full_span(e),
                    "reads a per-pod override, which the webhook checks against what the template allows".into(),
                )),
                None => Err((full_span(e), SUPPORTED.into())),
            },
        }
    }

    /// An expression that reads nothing of the pod, evaluated now.
    fn constant(&self, e: &Expr<'_>) -> Result<Cel, (Span, String)> {
        let text = self.text(full_span(e));
        let value = self
            .inj
            .templates
            .evaluate(text)
            .map_err(|err| (full_span(e), err))?;
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
        Ok(Cel {
            text: super::cel::string(&text),
            chars,
        })
    }

    fn pod_value(&self, span: Span, path: &[String]) -> Result<Read, (Span, String)> {
        let cfg = &self.inj.config;
        let owned = self.inj.templates.owned();
        let defined = |text: &str| {
            Ok(Read::Defined(Cel {
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
                let key = super::cel::string(key);
                Ok(Read::Maybe {
                    present: format!(
                        "(has(object.metadata.{map}) && {key} in object.metadata.{map})"
                    ),
                    value: Cel {
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

/// `pod.name` as templates see it: empty under `generateName` (the API server names the pod
/// between the mutating and the validating policies).
pub const NAME: &str = "((has(object.metadata.generateName) && object.metadata.generateName != \"\") ? \"\" : (has(object.metadata.name) ? object.metadata.name : \"\"))";
pub const GENERATE_NAME: &str =
    "(has(object.metadata.generateName) ? object.metadata.generateName : \"\")";
pub const SERVICE_ACCOUNT: &str = "((has(object.spec.serviceAccountName) && object.spec.serviceAccountName != \"\") ? object.spec.serviceAccountName : \"default\")";

fn worst(a: Chars, b: Chars) -> Chars {
    if a == Chars::Any || b == Chars::Any {
        Chars::Any
    } else {
        Chars::Plain
    }
}

/// The span of an expression with all of its parts: minijinja gives an attribute lookup or a
/// filter the span of its own token only.
fn full_span(e: &Expr<'_>) -> Span {
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

/// The markers in a string, with the text around them.
pub fn pieces(s: &str) -> Vec<Result<&str, usize>> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(open) = rest.find(OPEN) {
        let after = &rest[open + OPEN.len_utf8()..];
        let Some(close) = after.find(CLOSE) else {
            break;
        };
        let Ok(n) = after[..close].parse::<usize>() else {
            break;
        };
        if open > 0 {
            out.push(Ok(&rest[..open]));
        }
        out.push(Err(n));
        rest = &after[close + CLOSE.len_utf8()..];
    }
    if !rest.is_empty() || out.is_empty() {
        out.push(Ok(rest));
    }
    out
}

/// The marker numbers a fragment holds, for tests.
#[cfg(test)]
pub fn markers(f: &Fragment) -> std::collections::BTreeSet<usize> {
    fn walk(v: &Value, out: &mut std::collections::BTreeSet<usize>) {
        match v {
            Value::String(s) => out.extend(pieces(s).into_iter().filter_map(|p| p.err())),
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            Value::Object(o) => o.values().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = std::collections::BTreeSet::new();
    walk(&serde_json::to_value(f).unwrap_or_default(), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn injector(template: &str) -> Injector {
        Injector::from_sources(
            "test",
            "defaultTemplates: [t]\nvalues: {image: x:1}\n",
            vec![("t".into(), template.into())],
            None,
        )
        .expect("the template loads")
    }

    fn refusals(template: &str) -> Vec<Refusal> {
        read(&injector(template), "t").expect_err("refused")
    }

    const HEAD: &str = "containers:\n  - name: s\n    image: {{ values.image }}\n";

    #[test]
    fn metadata_reads_become_cel_and_constants_stay() {
        let src = format!(
            "{HEAD}    args:\n      - tag={{{{ pod.namespace }}}}.{{{{ pod.labels.app | default(\"pod\") }}}}\n      - {{{{ pod.annotations[\"a/b\"] | default(\"none\") | tojson }}}}\n"
        );
        let s = read(&injector(&src), "t").expect("exports");
        let c = &s.fragment.containers[0];
        assert_eq!(c.image.as_deref(), Some("x:1"), "constants are rendered");
        let args = c.args.as_deref().unwrap_or_default();
        assert_eq!(args[0], format!("tag={}.{}", marker(0), marker(1)));
        assert_eq!(args[1], marker(2));
        assert_eq!(s.exprs[0], "request.namespace");
        assert!(
            s.exprs[1].contains("object.metadata.labels[\"app\"]")
                && s.exprs[1].ends_with(": \"pod\")"),
            "{}",
            s.exprs[1]
        );
        assert!(
            s.exprs[2].contains("object.metadata.annotations[\"a/b\"]"),
            "{}",
            s.exprs[2]
        );
        assert_eq!(markers(&s.fragment).len(), 3);
    }

    #[test]
    fn a_loop_or_condition_on_the_pod_is_refused_with_its_line() {
        let src = format!(
            "{HEAD}{{% for c in pod.spec.containers %}}\n{{% endfor %}}\n{{% if pod.labels.x is defined %}}\n{{% endif %}}\n"
        );
        let r = refusals(&src);
        assert_eq!(r.len(), 2, "{r:?}");
        assert_eq!(
            (r[0].line, r[0].construct.as_str()),
            (4, "pod.spec.containers")
        );
        assert!(
            r[0].reason
                .contains("a loop over a value read from the pod"),
            "{}",
            r[0]
        );
        assert_eq!(r[1].line, 6);
        assert!(r[1].reason.contains("a condition"), "{}", r[1]);
    }

    #[test]
    fn a_variable_set_from_the_pod_or_the_spec_is_refused() {
        let r = refusals(&format!("{{% set n = pod.name %}}\n{HEAD}"));
        assert!(r[0].reason.contains("kept in a variable"), "{}", r[0]);
        let r = refusals(&format!(
            "{HEAD}    workingDir: /{{{{ pod.spec.containers[0].name }}}}\n"
        ));
        assert!(r[0].reason.contains("spec"), "{}", r[0]);
        assert_eq!(r[0].line, 4);
    }

    #[test]
    fn a_value_whose_yaml_type_depends_on_the_pod_is_refused() {
        // A label "1.5" would be a number, "true" a boolean: the policy always writes a string.
        let r = refusals(&format!(
            "{HEAD}    env:\n      - name: V\n        value: {{{{ pod.labels.v | default(\"x\") }}}}\n"
        ));
        assert_eq!(r[0].line, 6);
        assert!(r[0].reason.contains("tojson"), "{}", r[0]);
        // Quoted with tojson, it exports.
        let ok = format!(
            "{HEAD}    env:\n      - name: V\n        value: {{{{ pod.labels.v | default(\"x\") | tojson }}}}\n"
        );
        read(&injector(&ok), "t").expect("exports");
    }

    #[test]
    fn an_annotation_in_plain_yaml_is_refused_as_it_may_hold_a_colon() {
        let r = refusals(&format!(
            "{HEAD}    args: [\"--x={{{{ pod.annotations.a | default(\"\") }}}}\"]\n"
        ));
        assert!(
            r[0].reason.contains("would not read it as that string"),
            "{}",
            r[0]
        );
    }

    #[test]
    fn a_name_read_from_the_pod_is_refused() {
        // The set checks names against two sample pods; a label neither sample has keeps the
        // name the same for both, so only the exporter can tell.
        let src = "containers:\n  - name: s-{{ pod.labels.zz | default(\"a\") }}\n    image: x:1\n";
        let r = refusals(src);
        assert!(r[0].reason.contains("container's name"), "{}", r[0]);
    }

    #[test]
    fn markers_split_back_into_text_and_expressions() {
        let s = format!("a{}b{}", marker(3), marker(10));
        assert_eq!(pieces(&s), vec![Ok("a"), Err(3), Ok("b"), Err(10)]);
        assert_eq!(pieces("plain"), vec![Ok("plain")]);
        assert_eq!(pieces(""), vec![Ok("")]);
    }
}
