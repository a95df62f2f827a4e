//! A template read for every pod at once: what it renders, with each value it reads of the pod
//! kept as a CEL expression over the admission request.
//!
//! The template's syntax tree says where it reads the pod (`pod.*`, `overrides`). Each
//! `{{ ... }}` that does is translated to CEL and replaced, in a copy of the source, by a
//! marker string; the copy is rendered by the set's own environment and read as a fragment, so
//! every constant part is exactly what the webhook renders. Loops over the pod's lists, and
//! lists a template collects from them in a `namespace()`, become CEL lists ([`loops`]). A
//! read that changes the fragment's shape in another way (a condition on the pod outside a
//! loop, a value kept in a variable) cannot become a JSONPatch value and is refused with its
//! line. Then the rendering is tried again with awkward values in place of each marker (`0`,
//! `true`, `null`, a YAML colon..., or every value a per-pod override allows): a value the
//! webhook's YAML would read as another type or another structure is refused too, so that
//! what the policy writes (always the string the CEL expression gives) is what the webhook
//! writes.

use std::collections::{BTreeMap, BTreeSet};

use minijinja::machinery::ast::{self, CallArg, Expr, Stmt};
use minijinja::machinery::{Span, WhitespaceConfig};
use minijinja::syntax::SyntaxConfig;
use serde_json::Value;

use crate::engine::config::Injector;
use crate::engine::overrides::{self, Kind};
use crate::engine::template::{Fragment, TEMPLATE_SUFFIX};
use crate::export::cel;
use crate::export::loops::{self, Elem, IterExpr, Renders, Ty};
use crate::export::markers::{self, LOOP_KEY, Piece, iteration_marker, marker};

/// A template as the policy writes it.
#[derive(Debug)]
pub struct Symbolic {
    /// The rendering with every loop run once: names, images, restart policies.
    pub fragment: Fragment,
    /// The rendering as the policy writes it: markers where values read of the pod go, and
    /// each loop's output in its place ([`loops::build`]).
    pub json: Value,
    pub exprs: Exprs,
}

/// The CEL of what a [`Symbolic`] fragment computes.
#[derive(Clone, Debug, Default)]
pub struct Exprs {
    /// The expression (of type string) of each marker, by number.
    pub markers: Vec<String>,
    /// Each value an iteration reads: its loop, and the expression.
    pub iters: Vec<(usize, IterExpr)>,
    /// Each loop's list, as CEL.
    pub loops: Vec<String>,
}

/// Why a string or value of the fragment cannot be written as CEL.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CelError {
    #[error("marker {0} has no expression")]
    NoExpression(usize),
    #[error("an unknown marker")]
    UnknownMarker,
    #[error("an unknown loop")]
    UnknownLoop,
    #[error("the number {0} is not an integer")]
    NotAnInteger(serde_json::Number),
    #[error("{map}.{key} is {value}, not a string")]
    NotAString {
        map: String,
        key: String,
        value: Value,
    },
    #[error(transparent)]
    Marker(#[from] markers::MarkerError),
}

impl Exprs {
    /// The CEL names of loop `k`'s index and item.
    pub fn vars(k: usize) -> (String, String) {
        (format!("li{k}"), format!("lv{k}"))
    }

    /// Value `j` an iteration reads, as CEL of its type (`text`: as the text written).
    pub fn iter(&self, j: usize, text: bool) -> Result<String, CelError> {
        let (k, e) = self.iters.get(j).ok_or(CelError::UnknownMarker)?;
        let (i, v) = Self::vars(*k);
        let list = self.loops.get(*k).ok_or(CelError::UnknownLoop)?;
        Ok(match text {
            true => e.text_cel(&i, &v, list),
            false => e.cel(&i, &v, list),
        })
    }
}

/// A string of the fragment: literal text, with each marker's expression joined in, and each
/// loop's output as its body repeated over its list (or its `else`).
pub fn text(s: &str, exprs: &Exprs) -> Result<String, CelError> {
    joined(&markers::parse(s)?, exprs)
}

fn joined(pieces: &[Piece], exprs: &Exprs) -> Result<String, CelError> {
    let parts: Vec<String> = pieces
        .iter()
        .map(|p| match p {
            Piece::Text(lit) => Ok(cel::string(lit)),
            Piece::Marker(n) => exprs
                .markers
                .get(*n)
                .map(|e| format!("({e})"))
                .ok_or(CelError::NoExpression(*n)),
            Piece::Iter(j) => exprs.iter(*j, true).map(|e| format!("({e})")),
            Piece::Loop { k, body, other } => {
                let list = exprs.loops.get(*k).ok_or(CelError::UnknownLoop)?;
                let (i, v) = Exprs::vars(*k);
                Ok(format!(
                    "({list}.size() == 0 ? {} : {list}.transformList({i}, {v}, {}).join(\"\"))",
                    joined(other, exprs)?,
                    joined(body, exprs)?
                ))
            }
        })
        .collect::<Result<_, CelError>>()?;
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
pub fn value(v: &Value, ty: &str, exprs: &Exprs) -> Result<String, CelError> {
    Ok(match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) if n.is_i64() || n.is_u64() => n.to_string(),
        Value::Number(n) => return Err(CelError::NotAnInteger(n.clone())),
        Value::String(s) => match markers::int_ref(s) {
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
                        let list = exprs.loops.get(k).ok_or(CelError::UnknownLoop)?;
                        let (ix, it) = Exprs::vars(k);
                        let items = |key: &str| -> Result<Vec<String>, CelError> {
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
                        Value::String(s) => Ok(format!("{}: {}", cel::string(k), text(s, exprs)?)),
                        other => Err(CelError::NotAString {
                            map: last.to_owned(),
                            key: k.clone(),
                            value: other.clone(),
                        }),
                    })
                    .collect::<Result<_, _>>()?;
                format!("{{{}}}", entries.join(", "))
            } else {
                let entries: Vec<String> = fields
                    .iter()
                    .map(|(k, v)| Ok(format!("{k}: {}", value(v, &format!("{ty}.{k}"), exprs)?)))
                    .collect::<Result<_, CelError>>()?;
                format!("{ty}{{{}}}", entries.join(", "))
            }
        }
    })
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

/// What a value read of the pod may be, to try it with.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Chars {
    /// Letters, digits, `-`, `_`, `.` (names, namespaces, label values).
    Plain,
    /// Anything (annotations).
    Any,
    /// The values a per-pod override allows: `(minijinja literal, text)`.
    Allowed(Vec<(String, String)>),
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

/// A change to the template's source for one rendering.
struct Edit {
    range: std::ops::Range<usize>,
    kind: EditKind,
}

enum EditKind {
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

/// How the loops run in one rendering.
#[derive(Clone, Copy)]
enum Mode<'m> {
    /// Loop k over `range(n[k])`, every value its iterations read as a marker.
    Times(&'m [usize]),
    /// Loop k over `lists[k]`, as the webhook renders it.
    Lists(&'m [Vec<Value>]),
}

/// A loop over a list of the pod whose body writes the fragment.
struct Loop {
    cel: String,
    elem: Elem,
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
        name,
        source,
        emits: Vec::new(),
        edits: Vec::new(),
        iters: Vec::new(),
        loops: Vec::new(),
        namespaces: BTreeMap::new(),
        lists: BTreeMap::new(),
        scope: None,
        refusals: Vec::new(),
    };
    walk.stmt(&tree, false);
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
    let rewrite = |substitute: &dyn Fn(usize) -> String, mode: Mode<'_>| {
        let mut out = String::with_capacity(source.len());
        let mut at = 0;
        for e in &edits {
            out.push_str(&source[at..e.range.start]);
            let original = &source[e.range.clone()];
            match (&e.kind, mode) {
                (EditKind::Marker(i), _) => {
                    out.push_str(&substitute(*i));
                    if emits[*i].tojson {
                        out.push_str(" | tojson");
                    }
                }
                (EditKind::Iter { j, tojson }, Mode::Times(_)) => {
                    out.push_str(&iteration_marker(*j, iters[*j].1.ty() == Ty::Int));
                    if *tojson {
                        out.push_str(" | tojson");
                    }
                }
                (EditKind::Cond { j, open, close }, Mode::Times(_)) => {
                    let dash = |d: bool| if d { "-" } else { "" };
                    out.push_str(&format!(
                        "{{{{{} {} {}}}}}",
                        dash(*open),
                        iteration_marker(*j, false),
                        dash(*close)
                    ));
                }
                (EditKind::Iter { .. } | EditKind::Cond { .. }, Mode::Lists(_)) => {
                    out.push_str(original)
                }
                (EditKind::Iterable(k), Mode::Times(n)) => {
                    out.push_str(&format!("range({})", n.get(*k).copied().unwrap_or(1)))
                }
                (EditKind::Iterable(k), Mode::Lists(lists)) => out.push_str(
                    &serde_json::to_string(lists.get(*k).map_or(&[][..], Vec::as_slice))
                        .unwrap_or_default(),
                ),
                (EditKind::Collect, _) => out.push_str("[]"),
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
    let refuse_loop = |k: usize, reason: String| match loops.get(k) {
        Some(l) => Refusal {
            line: l.line,
            construct: l.construct.clone(),
            reason: format!("a loop over a list of the pod: {reason}"),
        },
        None => Refusal::whole(reason),
    };
    let marked = |i: usize| literal(&marker(i));
    let once = vec![1; loops.len()];
    let fragment = set
        .render_source(name, &rewrite(&marked, Mode::Times(&once)))
        .map_err(|err| {
            let reason = format!(
                "a value read from the pod is used where the fragment needs another type: {err}"
            );
            match emits.first() {
                Some(e) => vec![refuse(e, reason)],
                None => whole(reason),
            }
        })?;
    let base = serde_json::to_value(&fragment).unwrap_or_default();
    let mut per_loop = Vec::new();
    for k in 0..loops.len() {
        let mut runs = Vec::new();
        for n in [0, 2] {
            let mut times = once.clone();
            times[k] = n;
            let f = set
                .render_source(name, &rewrite(&marked, Mode::Times(&times)))
                .map_err(|e| {
                    vec![refuse_loop(
                        k,
                        format!("run {n} times, it does not render: {e}"),
                    )]
                })?;
            runs.push(serde_json::to_value(&f).unwrap_or_default());
        }
        let twice = runs.pop().unwrap_or_default();
        let none = runs.pop().unwrap_or_default();
        per_loop.push((none, twice));
    }
    let iters_of: Vec<BTreeSet<usize>> = (0..loops.len())
        .map(|k| {
            iters
                .iter()
                .enumerate()
                .filter(|(_, (l, _))| *l == k)
                .map(|(j, _)| j)
                .collect()
        })
        .collect();
    let json = loops::build(
        &Renders {
            base: base.clone(),
            per_loop,
        },
        &iters_of,
    )
    .map_err(|m| vec![refuse_loop(m.k, m.error.to_string())])?;
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
        let trials: Vec<(String, String)> = match &e.cel.chars {
            Chars::Plain => PLAIN_TRIALS
                .iter()
                .map(|t| (literal(t), (*t).to_owned()))
                .collect(),
            Chars::Any => ANY_TRIALS
                .iter()
                .map(|t| (literal(t), (*t).to_owned()))
                .collect(),
            Chars::Allowed(values) => values.clone(),
        };
        for (trial, text) in &trials {
            let source = rewrite(
                &|j| if j == i { trial.clone() } else { marked(j) },
                Mode::Times(&once),
            );
            let want = substitute(&base, &marker(i), text);
            let got = set
                .render_source(name, &source)
                .map(|f| serde_json::to_value(&f).unwrap_or_default());
            if got.ok().as_ref() != Some(&want) {
                let hint = match (e.tojson, &e.cel.chars) {
                    (true, _) | (_, Chars::Allowed(_)) => "",
                    (false, _) => "; quote it with `| tojson`",
                };
                refusals.push(refuse(
                    e,
                    format!(
                        "for a pod where it is {text:?} the webhook's YAML would not read it as that string{hint}"
                    ),
                ));
                break;
            }
        }
    }
    if !refusals.is_empty() {
        return Err(refusals);
    }
    // The loops, over lists of every length up to three: the webhook's rendering against what
    // the policy computes.
    let samples: Vec<Vec<Vec<Value>>> = loops.iter().map(|l| l.elem.samples()).collect();
    let cases = samples.iter().map(Vec::len).max().unwrap_or(0);
    for c in 0..cases {
        let lists: Vec<Vec<Value>> = samples
            .iter()
            .map(|s| s.get(c % s.len().max(1)).cloned().unwrap_or_default())
            .collect();
        let k = lists.iter().position(|l| !l.is_empty()).unwrap_or(0);
        let shown = serde_json::to_string(&lists[k]).unwrap_or_default();
        let webhook = set
            .render_source(name, &rewrite(&marked, Mode::Lists(&lists)))
            .map(|f| serde_json::to_value(&f).unwrap_or_default())
            .map_err(|e| {
                vec![refuse_loop(
                    k,
                    format!("over {shown}, it does not render: {e}"),
                )]
            })?;
        let policy = loops::instantiate(&json, &lists, &iters, None)
            .map_err(|e| vec![refuse_loop(k, format!("over {shown}: {e}"))])?;
        if policy != webhook {
            return Err(vec![refuse_loop(
                k,
                format!(
                    "over {shown}, the webhook's rendering is not the loop's body repeated (YAML folding, or a key per item?)"
                ),
            )]);
        }
    }
    Ok(Symbolic {
        fragment,
        json,
        exprs: Exprs {
            markers: emits.into_iter().map(|e| e.cel.text).collect(),
            iters,
            loops: loops.into_iter().map(|l| l.cel).collect(),
        },
    })
}

/// Values a plain read (a label value, a name) may have that YAML reads as something else.
const PLAIN_TRIALS: [&str; 6] = ["0", "1.5", "true", "null", "-", "x"];
/// And what an annotation may hold besides.
const ANY_TRIALS: [&str; 12] = [
    "0", "1.5", "true", "null", "-", "x", "a: b", "#c", "'\"", "[1]", "{a: 1}", "x\ny",
];

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
    /// The template's name.
    name: &'a str,
    source: &'a str,
    emits: Vec<Emit>,
    edits: Vec<Edit>,
    iters: Vec<(usize, IterExpr)>,
    loops: Vec<Loop>,
    /// `namespace()` objects the template made, with their attributes.
    namespaces: BTreeMap<String, BTreeSet<String>>,
    /// Lists collected from the pod's into a `namespace()`, by `ns.attr`.
    lists: BTreeMap<String, Collected>,
    /// Inside the body of an output loop.
    scope: Option<Scope>,
    refusals: Vec<Refusal>,
}

/// A list a template collects from the pod's: the CEL lists it is the concatenation of.
struct Collected {
    parts: Vec<String>,
    elem: Elem,
    /// Appends guarded by `x not in ns.attr`, and all appends.
    guarded: usize,
    appends: usize,
}

impl Collected {
    fn cel(&self) -> String {
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
struct Scope {
    k: usize,
    var: String,
    elem: Elem,
}

/// A template variable inside a collecting loop: its name, its CEL name, its item.
type Var = (String, String, Elem);

/// Per `ns.attr`, the CEL lists a collecting block appends.
type Appends = BTreeMap<String, Vec<String>>;

/// Whether an expression reads the pod (or the per-pod overrides, which come from its
/// annotations).
fn reads_pod(e: &Expr<'_>) -> bool {
    reads(e, &["pod", "overrides"])
}

/// Whether an expression reads any of these variables.
fn reads(e: &Expr<'_>, names: &[&str]) -> bool {
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

/// The values of a per-pod override to try a template with: of a few candidates, those the
/// template allows, as minijinja literals (numbers and booleans unquoted, as the webhook
/// passes them) with the text they render as.
fn override_trials(annotation: &str, spec: &overrides::Spec) -> Vec<(String, String)> {
    let mut candidates: Vec<String> = vec![spec.default.to_string()];
    candidates.extend(spec.min.iter().chain(&spec.max).map(ToString::to_string));
    candidates.extend(spec.allowed.iter().cloned());
    let extra: &[&str] = match spec.kind {
        Kind::String if spec.allowed.is_empty() => &ANY_TRIALS,
        Kind::String => &[],
        Kind::Boolean => &["true", "false"],
        Kind::Integer => &["0", "1", "-1", "1000"],
        Kind::Cpu => &["1", "2", "100m", "1500m", "250m"],
        Kind::Memory => &["1Gi", "1536Mi", "100Ki", "64Mi", "1Ti"],
    };
    candidates.extend(extra.iter().map(|s| (*s).to_owned()));
    let mut out: Vec<(String, String)> = Vec::new();
    for c in candidates {
        let Ok(value) = overrides::check(annotation, spec, &c) else {
            continue;
        };
        let literal = match &value {
            Value::String(s) => literal(s),
            other => other.to_string(),
        };
        if !out.iter().any(|(l, _)| *l == literal) {
            out.push((literal, c));
        }
    }
    out
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
        const SHAPE: &str = "the fragment's shape would depend on the pod; only loops over the pod's lists (and their `else`) can be written as CEL, not a condition outside one";
        match s {
            Stmt::Template(t) => self.stmts(&t.children, captured),
            Stmt::EmitRaw(_) => {}
            Stmt::EmitExpr(e) if self.per_iteration(&e.expr) => {
                match self.iteration_emit(&e.expr) {
                    Ok((range, x, tojson)) => {
                        let j = self.push_iter(x);
                        self.edits.push(Edit {
                            range,
                            kind: EditKind::Iter { j, tojson },
                        });
                    }
                    Err((span, reason)) => self.refuse(span, reason),
                }
            }
            Stmt::EmitExpr(e) if self.tainted(&e.expr) => {
                if captured {
                    self.refuse(full_span(&e.expr), "a value read from the pod inside a block whose output is captured or filtered");
                    return;
                }
                match self.top(&e.expr) {
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
            Stmt::EmitExpr(_) => {}
            Stmt::ForLoop(f) => {
                let on_pod = self.tainted(&f.iter)
                    || f.filter_expr.as_ref().is_some_and(|e| self.tainted(e));
                if self.scope.is_some() {
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
            Stmt::IfCond(c) if self.per_iteration(&c.expr) => match self.iteration_cond(c) {
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
                if self.tainted(&c.expr) {
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
                    if self.tainted(e) {
                        self.refuse(full_span(e), "a value read from the pod kept in a variable");
                    }
                }
                self.stmts(&w.body, captured);
            }
            Stmt::Set(set) => {
                if self.scope.is_some() {
                    self.refuse(
                        set.span(),
                        "a variable set inside a loop over a list of the pod",
                    );
                } else if self.tainted(&set.expr) {
                    self.refuse(
                        full_span(&set.expr),
                        "a value read from the pod kept in a variable (only lists collected in a loop over the pod's lists are written as CEL)",
                    );
                } else if let Some((var, attrs)) = namespace_decl(set) {
                    self.namespaces.insert(var, attrs);
                } else if let Some(key) = attr_key(&set.target)
                    && self.lists.contains_key(&key)
                {
                    self.refuse(
                        set.span(),
                        "a list collected from the pod changed outside its loop",
                    );
                }
            }
            Stmt::SetBlock(b) => self.stmts(&b.body, true),
            Stmt::AutoEscape(a) => self.stmts(&a.body, captured),
            Stmt::FilterBlock(f) => self.stmts(&f.body, true),
            Stmt::Do(d) => {
                if self.tainted(&d.call.expr) {
                    self.refuse(d.call.span(), "a call with a value read from the pod");
                }
            }
            Stmt::Macro(m) => self.stmts(&m.body, true),
            Stmt::CallBlock(c) => {
                if c.call.args.iter().any(|a| match a {
                    CallArg::Pos(e)
                    | CallArg::Kwarg(_, e)
                    | CallArg::PosSplat(e)
                    | CallArg::KwargSplat(e) => self.tainted(e),
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

    /// The variables whose values depend on the pod: the pod, its overrides, the namespaces
    /// holding lists collected from it, and inside an output loop its variable and `loop`.
    fn tainted(&self, e: &Expr<'_>) -> bool {
        let mut names: Vec<&str> = vec!["pod", "overrides"];
        names.extend(self.lists.keys().filter_map(|k| k.split('.').next()));
        if let Some(scope) = &self.scope {
            names.push(&scope.var);
            names.push("loop");
        }
        reads(e, &names)
    }

    /// Whether, inside an output loop, an expression reads its item or `loop`.
    fn per_iteration(&self, e: &Expr<'_>) -> bool {
        self.scope
            .as_ref()
            .is_some_and(|s| reads(e, &[s.var.as_str(), "loop"]))
    }

    fn push_iter(&mut self, x: IterExpr) -> usize {
        let k = self.scope.as_ref().map_or(0, |s| s.k);
        self.iters.push((k, x));
        self.iters.len() - 1
    }

    /// A `{{ ... }}` that reads the iteration: its range, expression and `| tojson`.
    #[allow(clippy::type_complexity)]
    fn iteration_emit(
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
    fn iteration_cond(
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
    fn iteration(&self, e: &Expr<'_>) -> Result<IterExpr, (Span, String)> {
        const SUPPORTED: &str = "of an item, only its fields, `loop.index0`, `loop.index`, `loop.first`, `loop.last`, `loop.length`, `+`, `-`, `~`, `==`, `!=`, `and`, `or`, `not` and `| default(...)` can be written as CEL";
        let Some(scope) = &self.scope else {
            return Err((full_span(e), SUPPORTED.into()));
        };
        let b = Box::new;
        let field = |name: &str, default: Option<Value>| -> Result<IterExpr, (Span, String)> {
            match scope.elem.field(name) {
                Some(loops::Field::One(elem, present)) if elem.scalar() => {
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
        let (cel, elem) = self.list(&f.iter, &[])?;
        let k = self.loops.len();
        self.loops.push(Loop {
            cel,
            elem,
            line: span.start_line as usize,
            construct: self.text(span).trim().to_owned(),
        });
        self.scope = Some(Scope {
            k,
            var: var.id.to_owned(),
            elem,
        });
        self.stmts(&f.body, false);
        self.scope = None;
        self.stmts(&f.else_body, false);
        Ok(EditKind::Iterable(k))
    }

    /// A loop that writes nothing and collects items into `namespace()` lists.
    fn collect(&mut self, f: &ast::Spanned<ast::ForLoop<'_>>) -> Result<(), (Span, String)> {
        let mut counts = BTreeMap::new();
        let appends = self.collect_for(f, &[], &mut counts)?;
        for (key, parts) in appends {
            let (guarded, all, elem) = counts.get(&key).copied().unwrap_or((0, 0, Elem::Str));
            let entry = self.lists.entry(key.clone()).or_insert(Collected {
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
        counts: &mut BTreeMap<String, (usize, usize, Elem)>,
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
        let (list, elem) = self.list(&f.iter, vars)?;
        let v = format!("a{}", vars.len());
        let mut inner = vars.to_vec();
        inner.push((target.id.to_owned(), v.clone(), elem));
        let list = match &f.filter_expr {
            Some(c) => format!("{list}.filter({v}, {})", self.condition(c, &inner)?),
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
        counts: &mut BTreeMap<String, (usize, usize, Elem)>,
    ) -> Result<Appends, (Span, String)> {
        const SUPPORTED: &str = "a loop that collects a list may hold only loops over lists of the pod's items, `{% if %}` and `{% set ns.x = ns.x + [...] %}`";
        let mut out = Appends::new();
        for s in list {
            match s {
                Stmt::EmitRaw(r) if r.raw.is_empty() => {}
                Stmt::ForLoop(f) => merge(&mut out, self.collect_for(f, vars, counts)?),
                Stmt::IfCond(c) => {
                    // `x not in ns.attr` guards an append of `x` to ns.attr: each once.
                    let all = conjuncts(&c.expr);
                    let guard = all.iter().enumerate().find_map(|(n, e)| match e {
                        Expr::UnaryOp(u) if matches!(u.op, ast::UnaryOpKind::Not) => {
                            match &u.expr {
                                Expr::BinOp(b) if matches!(b.op, ast::BinOpKind::In) => {
                                    let key = attr_key(&b.right)?;
                                    self.namespace_attr(&key).then(|| {
                                        (n, key, self.text(full_span(&b.left)).trim().to_owned())
                                    })
                                }
                                _ => None,
                            }
                        }
                        _ => None,
                    });
                    match guard {
                        Some((n, key, item)) => {
                            let only_append = match &c.true_body[..] {
                                [Stmt::Set(set)] => {
                                    attr_key(&set.target).as_ref() == Some(&key)
                                        && appended(set, &key).is_some_and(|items| {
                                            matches!(items, [one] if self.text(full_span(one)).trim() == item)
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
                                .map(|(_, e)| self.condition(e, vars))
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
                            let cond = self.condition(&c.expr, vars)?;
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
                }
                Stmt::Set(set) => {
                    let key = attr_key(&set.target)
                        .filter(|k| self.namespace_attr(k))
                        .ok_or((set.span(), SUPPORTED.to_owned()))?;
                    let items = appended(set, &key).ok_or((
                        full_span(&set.expr),
                        format!("only `{key} + [...]` can be written as CEL"),
                    ))?;
                    let mut cel = Vec::new();
                    let mut elem = None;
                    for item in items {
                        let (c, e) = self.item_value(item, vars)?;
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
                }
                Stmt::EmitRaw(r) => {
                    return Err((
                        r.span(),
                        "a loop that collects a list writes whitespace for each item: strip it with `{%-` or `-%}`".into(),
                    ));
                }
                other => return Err((stmt_span(other), SUPPORTED.into())),
            }
        }
        Ok(out)
    }

    /// Whether `ns.attr` names an attribute of a `namespace()` the template made.
    fn namespace_attr(&self, key: &str) -> bool {
        key.split_once('.')
            .is_some_and(|(ns, attr)| self.namespaces.get(ns).is_some_and(|a| a.contains(attr)))
    }

    /// A list of the pod, as CEL, with what its items are: the pod's containers, init
    /// containers and volumes as templates see them (without any template's sidecars and
    /// volumes), a list field of an item in scope, or a list collected earlier.
    fn list(&self, e: &Expr<'_>, vars: &[Var]) -> Result<(String, Elem), (Span, String)> {
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
                    Some(loops::Field::List(item, true)) => Ok((format!("{cel}.{}", g.name), item)),
                    Some(loops::Field::List(item, false)) if empty_default => Ok((
                        format!("(has({cel}.{f}) ? {cel}.{f} : [])", f = g.name),
                        item,
                    )),
                    Some(loops::Field::List(..)) => Err((
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
    fn item_value(&self, e: &Expr<'_>, vars: &[Var]) -> Result<(String, Elem), (Span, String)> {
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
                    Some((cel, Some(loops::Field::One(elem, true)))) => {
                        Ok((format!("{cel}.{}", g.name), elem))
                    }
                    Some((_, Some(loops::Field::One(_, false)))) => Err((
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
                    Some((cel, Some(loops::Field::One(elem, _)))) => {
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
    fn condition(&self, e: &Expr<'_>, vars: &[Var]) -> Result<String, (Span, String)> {
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
    fn constant_json(&self, e: &Expr<'_>) -> Result<Value, (Span, String)> {
        let value = self.evaluated(e)?;
        serde_json::to_value(&value).map_err(|err| (full_span(e), err.to_string()))
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
                None if overrides(e) => self.override_value(e),
                None => Err((full_span(e), SUPPORTED.into())),
            },
        }
    }

    /// `overrides["<annotation>"]`: the pod's annotation, or the default. The webhook
    /// refuses a pod whose value the template does not allow, and the mutating policy leaves
    /// such a pod to the backstop (see `export::mutating`), so the value is one of those.
    fn override_value(&self, e: &Expr<'_>) -> Result<Read, (Span, String)> {
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
        Ok(Read::Defined(Cel {
            text: format!(
                "((has(object.metadata.annotations) && {k} in object.metadata.annotations) ? object.metadata.annotations[{k}] : {})",
                cel::string(&spec.default.to_string())
            ),
            chars: Chars::Allowed(override_trials(&key, spec)),
        }))
    }

    /// The value of an expression that reads nothing of the pod, evaluated now.
    fn evaluated(&self, e: &Expr<'_>) -> Result<minijinja::Value, (Span, String)> {
        self.inj
            .templates
            .evaluate(self.text(full_span(e)))
            .map_err(|err| (full_span(e), err))
    }

    /// An expression that reads nothing of the pod, evaluated now.
    fn constant(&self, e: &Expr<'_>) -> Result<Cel, (Span, String)> {
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
        Ok(Cel {
            text: cel::string(&text),
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
                let key = cel::string(key);
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
    match (a, b) {
        (Chars::Plain, Chars::Plain) => Chars::Plain,
        // A value joined to others is tried as any text.
        _ => Chars::Any,
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

/// The marker numbers a fragment holds, for tests.
#[cfg(test)]
pub fn markers(f: &Fragment) -> std::collections::BTreeSet<usize> {
    fn walk(v: &Value, out: &mut std::collections::BTreeSet<usize>) {
        match v {
            Value::String(s) => out.extend(markers::pieces(s).into_iter().filter_map(|p| p.err())),
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            Value::Object(o) => o.values().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = std::collections::BTreeSet::new();
    walk(&serde_json::to_value(f).unwrap_or_default(), &mut out);
    out
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
        assert_eq!(s.exprs.markers[0], "request.namespace");
        assert!(
            s.exprs.markers[1].contains("object.metadata.labels[\"app\"]")
                && s.exprs.markers[1].ends_with(": \"pod\")"),
            "{}",
            s.exprs.markers[1]
        );
        assert!(
            s.exprs.markers[2].contains("object.metadata.annotations[\"a/b\"]"),
            "{}",
            s.exprs.markers[2]
        );
        assert_eq!(markers(&s.fragment).len(), 3);
    }

    #[test]
    fn a_loop_over_a_map_or_a_condition_on_the_pod_is_refused_with_its_line() {
        let src = format!(
            "{HEAD}{{% for k in pod.labels %}}\n{{% endfor %}}\n{{% if pod.labels.x is defined %}}\n{{% endif %}}\n"
        );
        let r = refusals(&src);
        assert_eq!(r.len(), 2, "{r:?}");
        assert_eq!((r[0].line, r[0].construct.as_str()), (4, "pod.labels"));
        assert!(
            r[0].reason.contains("can be looped over in CEL"),
            "{}",
            r[0]
        );
        assert_eq!(r[1].line, 6);
        assert!(r[1].reason.contains("a condition"), "{}", r[1]);
    }

    /// The bundled proxy's shape: TCP ports collected each once, then looped over in a string
    /// (with `loop.first` and an `else`) and in a list of variable length.
    const PORTS: &str = "{%- set app = namespace(ports=[]) %}\n{%- for c in pod.spec.containers %}\n{%- for p in c.ports | default([]) %}\n{%- if (p.protocol | default(\"TCP\")) == \"TCP\" and p.containerPort not in app.ports %}\n{%- set app.ports = app.ports + [p.containerPort] %}\n{%- endif %}\n{%- endfor %}\n{%- endfor %}\ninitContainers:\n  - name: s\n    image: x:1\n    args:\n      - >-\n        [{%- for port in app.ports %}{% if not loop.first %},{% endif %}\n        {\"p\":{{ port }},\"at\":{{ 100 + loop.index0 }}}\n        {%- else %}\n        \"none\"\n        {%- endfor %}]\n    ports:\n    {%- for port in app.ports %}\n      - name: p-{{ port }}\n        containerPort: {{ 100 + loop.index0 }}\n    {%- else %}\n      - name: p\n        containerPort: 100\n    {%- endfor %}\n";

    #[test]
    fn collected_ports_become_one_cel_list_looped_over_in_text_and_in_a_list() {
        let s = read(&injector(PORTS), "t").expect("exports");
        assert_eq!(s.exprs.loops.len(), 2);
        let list = &s.exprs.loops[0];
        assert_eq!(list, &s.exprs.loops[1], "the same list");
        assert!(
            list.starts_with("object.spec.containers.filter(c, !(c.name in [\"s\"]))")
                && list.contains("(has(a0.ports) ? a0.ports : [])")
                && list.contains("(has(a1.protocol) ? a1.protocol : \"TCP\") == \"TCP\"")
                && list.ends_with(".flatten().distinct()"),
            "{list}"
        );
        let arg = s.json["initContainers"][0]["args"][0]
            .as_str()
            .unwrap_or_default();
        assert!(
            arg.contains(markers::LOOP_OPEN) && arg.contains(markers::LOOP_ELSE),
            "{arg:?}"
        );
        let ports = &s.json["initContainers"][0]["ports"][0];
        assert_eq!(ports[LOOP_KEY], 1, "{ports}");
        assert_eq!(ports["else"][0]["containerPort"], 100);
        // The port is an int in the list, a decimal in the text.
        let exprs = &s.exprs;
        let int = ports["each"][0]["containerPort"]
            .as_str()
            .unwrap_or_default();
        let j: usize = int
            .trim_matches([markers::INT, markers::CLOSE])
            .parse()
            .expect("a marker");
        assert_eq!(exprs.iter(j, false), Ok("(100 + li1)".into()));
        assert_eq!(exprs.iter(j, true), Ok("string((100 + li1))".into()));
        let cel = text(arg, exprs).expect("CEL");
        assert!(
            cel.contains(&format!(
                "{list}.size() == 0 ? \" \\\"none\\\"\" : {list}.transformList(li0, lv0, "
            )),
            "{cel}"
        );
        assert!(cel.contains("(!(li0 == 0) ? \",\" : \"\")"), "{cel}");
    }

    #[test]
    fn what_cel_cannot_repeat_is_refused_with_its_line() {
        // A loop inside a loop over the pod's lists.
        let nested = format!(
            "{HEAD}    args:\n{{%- for c in pod.spec.containers %}}{{% for x in [1, 2] %}}\n      - {{{{ c.name | tojson }}}}\n{{%- endfor %}}{{% endfor %}}\n"
        );
        let r = refusals(&nested);
        assert!(r[0].reason.contains("a loop inside a loop"), "{r:?}");
        // A field templates do not see (env is not part of the context).
        let env = format!(
            "{HEAD}    args:\n{{%- for c in pod.spec.containers %}}\n      - {{{{ c.securityContext | default(\"x\") | tojson }}}}\n{{%- endfor %}}\n"
        );
        let r = refusals(&env);
        assert!(r[0].reason.contains("not a field templates see"), "{r:?}");
        // An append guarded by `not in` together with one that is not.
        let mixed = PORTS.replace(
            "{%- endfor %}\n{%- endfor %}\ninitContainers",
            "{%- set app.ports = app.ports + [p.containerPort] %}\n{%- endfor %}\n{%- endfor %}\ninitContainers",
        );
        let r = refusals(&mixed);
        assert!(r[0].reason.contains("both with and without"), "{r:?}");
    }

    #[test]
    fn overrides_are_read_from_the_annotation_or_the_default_and_tried_with_what_is_allowed() {
        let src = "{#- overrides:\n  a/level: {type: string, allowed: [info, \"off\"], default: info}\n  a/cpu: {type: cpu, max: 2, default: 50m}\n  a/n: {type: integer, min: 1, max: 5, default: 2}\n-#}\ncontainers:\n  - name: s\n    image: x:1\n    args: [{{ overrides[\"a/level\"] | tojson }}, \"n={{ overrides[\"a/n\"] }}\"]\n    resources:\n      requests:\n        cpu: {{ overrides[\"a/cpu\"] | tojson }}\n";
        let inj = Injector::from_sources(
            "test",
            "defaultTemplates: [t]\n",
            vec![("t".into(), src.into())],
            None,
        )
        .expect("loads");
        let s = read(&inj, "t").expect("exports");
        assert_eq!(
            s.exprs.markers[0],
            "((has(object.metadata.annotations) && \"a/level\" in object.metadata.annotations) ? object.metadata.annotations[\"a/level\"] : \"info\")"
        );
        assert!(
            s.exprs.markers[1].ends_with(": \"2\")"),
            "{}",
            s.exprs.markers[1]
        );
        // Unquoted, a whole number of cores is a YAML integer, which the fragment reads back
        // as the same quantity: tried with `1` and `2`, it exports too.
        let bare = src.replace(
            "cpu: {{ overrides[\"a/cpu\"] | tojson }}",
            "cpu: {{ overrides[\"a/cpu\"] }}",
        );
        let inj = Injector::from_sources(
            "test",
            "defaultTemplates: [t]\n",
            vec![("t".into(), bare)],
            None,
        )
        .expect("loads");
        read(&inj, "t").expect("exports");
        // A value that is not a string where the YAML needs one is refused, with the value.
        let level = src.replace(
            "args: [{{ overrides[\"a/level\"] | tojson }}",
            "args: [{{ overrides[\"a/level\"] }}",
        );
        let level = level.replace("[info, \"off\"]", "[info, \"[1]\"]");
        let inj = Injector::from_sources(
            "test",
            "defaultTemplates: [t]\n",
            vec![("t".into(), level)],
            None,
        )
        .expect("loads");
        let r = read(&inj, "t").expect_err("refused");
        assert!(r[0].reason.contains("where it is \"[1]\""), "{r:?}");
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
}
