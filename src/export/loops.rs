//! Loops over the pod's lists, read for every pod at once.
//!
//! A template that loops over a list of the pod (its containers, their ports, its init
//! containers and volumes, or a list it collected from them) writes text whose length depends
//! on the pod. The policy writes it with CEL: the loop's list as a CEL list, its body once, as
//! CEL over the index and the item, repeated with `transformList` and joined (in a string) or
//! flattened (in a list), and its `{% else %}` when the list is empty.
//!
//! Where the body lands in the fragment is found by rendering the template three times, with
//! the loop run zero, one and two times over stand-in items, every value it reads of the item
//! or the index replaced by a marker that names the iteration: the renderings differ in one
//! string or one list only, and the difference is the body (and the `else`). Then the template
//! is rendered again over real lists of every length up to three (the webhook's own rendering)
//! and compared with what the markers give for the same lists: a loop whose output is not a
//! plain repetition of its body (YAML folding across iterations, a key written per item) is
//! refused, never guessed.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::export::cel;
use crate::export::markers::{
    self, CLOSE, ITER, LOOP_ELSE, LOOP_END, LOOP_KEY, LOOP_OPEN, MarkerError, Piece, int_marker,
    parse,
};

/// Why a value an iteration reads cannot be computed for given lists.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    #[error("not an integer")]
    NotAnInteger,
    #[error("not a boolean")]
    NotABoolean,
    #[error("a field the item lacks")]
    MissingField,
    #[error("an unknown marker")]
    UnknownMarker,
    #[error("an unknown loop")]
    UnknownLoop,
    #[error("a value of an item outside its loop")]
    OutsideItsLoop,
    #[error(transparent)]
    Marker(#[from] MarkerError),
}

/// Why a loop's output cannot be found as its body repeated, or put back in its place.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LoopError {
    #[error("it writes keys whose presence depends on the list")]
    KeysDependOnTheList,
    #[error("its output reaches more than one field")]
    MoreThanOneField,
    #[error("its output reaches more than one item")]
    MoreThanOneItem,
    #[error("its output changes a value's type")]
    ChangesType,
    #[error("one iteration writes nothing that two do not")]
    WritesNothing,
    #[error("its output is not its body repeated")]
    NotRepeated,
    #[error("its output overlaps another loop's")]
    Overlaps,
    #[error("its output is inside another loop's")]
    Inside,
    #[error("lost its place")]
    LostItsPlace,
    #[error("a value of its item reaches the fragment outside the loop's output")]
    OutsideItsOutput,
    #[error("a broken marker")]
    BrokenMarker,
}

/// A loop [`build`] cannot write: its number (`usize::MAX` when not known), and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{error}")]
pub struct Misplaced {
    pub k: usize,
    pub error: LoopError,
}

impl Misplaced {
    fn of(k: usize, error: LoopError) -> Self {
        Self { k, error }
    }
}

/// What an item of a pod's list is, as templates see it (see `inject::project_spec`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    Container,
    Port,
    Volume,
    Int,
    Str,
    Bool,
}

/// A field of an item: one value or a list, and whether every item has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    One(Elem, bool),
    List(Elem, bool),
}

impl Elem {
    pub fn field(self, name: &str) -> Option<Field> {
        use Elem::*;
        Some(match (self, name) {
            (Container, "name") => Field::One(Str, true),
            (Container, "image" | "workingDir") => Field::One(Str, false),
            (Container, "command" | "args") => Field::List(Str, false),
            (Container, "ports") => Field::List(Port, false),
            (Port, "containerPort") => Field::One(Int, true),
            (Port, "hostPort") => Field::One(Int, false),
            (Port, "name" | "protocol" | "hostIP") => Field::One(Str, false),
            (Volume, "name") => Field::One(Str, true),
            _ => return None,
        })
    }

    pub fn scalar(self) -> bool {
        matches!(self, Self::Int | Self::Str | Self::Bool)
    }

    /// Lists of this item a pod may hold, for the trials: every length up to three, and
    /// values a YAML reader would take for something else.
    pub fn samples(self) -> Vec<Vec<Value>> {
        let lists: Vec<Value> = match self {
            Self::Int => vec![json!([8080]), json!([8080, 53, 9090]), json!([1, 65535])],
            Self::Str | Self::Bool => vec![
                json!(["web"]),
                json!(["0", "true", "a: b"]),
                json!(["#c", "'\"", "x\ny"]),
                json!(["1.5", "[1]"]),
            ],
            Self::Port => vec![
                json!([{"containerPort": 8080, "protocol": "TCP", "name": "http"}]),
                json!([{"containerPort": 53, "protocol": "UDP"}, {"containerPort": 9090, "protocol": "TCP"}, {"containerPort": 1, "protocol": "SCTP", "name": "x"}]),
            ],
            Self::Container => vec![
                json!([{"name": "app", "image": "nginx:1", "ports": [{"containerPort": 8080, "protocol": "TCP"}]}]),
                json!([{"name": "a", "image": "1.5"}, {"name": "b", "image": "x: y", "args": ["-v", "true"]}, {"name": "c", "ports": [{"containerPort": 53, "protocol": "UDP", "name": "dns"}]}]),
            ],
            Self::Volume => vec![
                json!([{"name": "data", "emptyDir": {}}]),
                json!([{"name": "a", "emptyDir": {}}, {"name": "b", "configMap": {"name": "c"}}, {"name": "c", "emptyDir": {"medium": "Memory"}}]),
            ],
        };
        let mut out = vec![Vec::new()];
        out.extend(
            lists
                .into_iter()
                .map(|l| l.as_array().cloned().unwrap_or_default()),
        );
        out
    }
}

/// The type of a value an iteration reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    Int,
    Str,
    Bool,
}

/// A value an iteration reads: of the item, the index and constants.
#[derive(Clone, Debug, PartialEq)]
pub enum IterExpr {
    Const(Value),
    /// A field of the item (the item itself when empty), or the default when it is absent.
    Item(Option<String>, Ty, Option<Value>),
    Index0,
    Length,
    Add(Box<IterExpr>, Box<IterExpr>),
    Sub(Box<IterExpr>, Box<IterExpr>),
    Concat(Box<IterExpr>, Box<IterExpr>),
    Eq(Box<IterExpr>, Box<IterExpr>),
    Ne(Box<IterExpr>, Box<IterExpr>),
    And(Box<IterExpr>, Box<IterExpr>),
    Or(Box<IterExpr>, Box<IterExpr>),
    Not(Box<IterExpr>),
    /// `{% if c %}a{% else %}b{% endif %}` around text.
    Cond(Box<IterExpr>, String, String),
}

/// What one iteration sees: its index, the list's length and the item.
pub struct Iteration<'v> {
    pub index: usize,
    pub len: usize,
    pub item: &'v Value,
}

impl IterExpr {
    pub fn ty(&self) -> Ty {
        match self {
            Self::Const(Value::Number(_)) | Self::Index0 | Self::Length => Ty::Int,
            Self::Const(Value::Bool(_)) => Ty::Bool,
            Self::Const(_) | Self::Concat(..) | Self::Cond(..) => Ty::Str,
            Self::Item(_, ty, _) => *ty,
            Self::Add(a, _) | Self::Sub(a, _) => a.ty(),
            Self::Eq(..) | Self::Ne(..) | Self::And(..) | Self::Or(..) | Self::Not(_) => Ty::Bool,
        }
    }

    /// The value for one iteration, as the webhook's rendering computes it.
    pub fn eval(&self, it: &Iteration<'_>) -> Result<Value, EvalError> {
        let int = |e: &IterExpr| -> Result<i64, EvalError> {
            e.eval(it)?.as_i64().ok_or(EvalError::NotAnInteger)
        };
        let truth = |e: &IterExpr| -> Result<bool, EvalError> {
            e.eval(it)?.as_bool().ok_or(EvalError::NotABoolean)
        };
        Ok(match self {
            Self::Const(v) => v.clone(),
            Self::Item(field, _, default) => {
                let v = match field {
                    Some(f) => it.item.get(f),
                    None => Some(it.item),
                };
                match (v, default) {
                    (Some(v), _) => v.clone(),
                    (None, Some(d)) => d.clone(),
                    (None, None) => return Err(EvalError::MissingField),
                }
            }
            Self::Index0 => json!(it.index),
            Self::Length => json!(it.len),
            Self::Add(a, b) => json!(int(a)? + int(b)?),
            Self::Sub(a, b) => json!(int(a)? - int(b)?),
            Self::Concat(a, b) => json!(format!("{}{}", text(&a.eval(it)?), text(&b.eval(it)?))),
            Self::Eq(a, b) => json!(a.eval(it)? == b.eval(it)?),
            Self::Ne(a, b) => json!(a.eval(it)? != b.eval(it)?),
            Self::And(a, b) => json!(truth(a)? && truth(b)?),
            Self::Or(a, b) => json!(truth(a)? || truth(b)?),
            Self::Not(a) => json!(!truth(a)?),
            Self::Cond(c, yes, no) => json!(if truth(c)? { yes } else { no }),
        })
    }

    /// The value as CEL, the loop's index, item and list named `index`, `item`, `list`.
    pub fn cel(&self, index: &str, item: &str, list: &str) -> String {
        let c = |e: &IterExpr| e.cel(index, item, list);
        match self {
            Self::Const(v) => literal(v),
            Self::Item(None, _, _) => item.to_owned(),
            Self::Item(Some(f), _, None) => format!("{item}.{f}"),
            Self::Item(Some(f), _, Some(d)) => {
                format!("(has({item}.{f}) ? {item}.{f} : {})", literal(d))
            }
            Self::Index0 => index.to_owned(),
            Self::Length => format!("size({list})"),
            Self::Add(a, b) => format!("({} + {})", c(a), c(b)),
            Self::Sub(a, b) => format!("({} - {})", c(a), c(b)),
            Self::Concat(a, b) => format!(
                "({} + {})",
                a.text_cel(index, item, list),
                b.text_cel(index, item, list)
            ),
            Self::Eq(a, b) => format!("({} == {})", c(a), c(b)),
            Self::Ne(a, b) => format!("({} != {})", c(a), c(b)),
            Self::And(a, b) => format!("({} && {})", c(a), c(b)),
            Self::Or(a, b) => format!("({} || {})", c(a), c(b)),
            Self::Not(a) => format!("!{}", c(a)),
            Self::Cond(x, yes, no) => {
                format!("({} ? {} : {})", c(x), cel::string(yes), cel::string(no))
            }
        }
    }

    /// The value as CEL, as the text the webhook writes of it.
    pub fn text_cel(&self, index: &str, item: &str, list: &str) -> String {
        match self.ty() {
            Ty::Str => self.cel(index, item, list),
            Ty::Int | Ty::Bool => format!("string({})", self.cel(index, item, list)),
        }
    }
}

/// A value as minijinja writes it.
pub fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn literal(v: &Value) -> String {
    match v {
        Value::String(s) => cel::string(s),
        other => other.to_string(),
    }
}

/// A loop's place in the fragment: one string or one list, found by [`region`].
#[derive(Clone, Debug, PartialEq)]
struct Region {
    path: Vec<Seg>,
    /// Where the body starts, in characters or items of the one-iteration rendering.
    at: usize,
    /// The body's length.
    len: usize,
    /// What the loop writes when the list is empty.
    other: Value,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Seg {
    Key(String),
    Index(usize),
}

/// The same rendering with the markers of `iters` (one loop's) moved to the next iteration.
fn retag(v: &Value, iters: &BTreeSet<usize>) -> Value {
    match v {
        Value::String(s) => Value::String(retag_str(s, iters)),
        Value::Number(n) => match n.as_i64().and_then(|n| int_marker(n).map(|m| (n, m))) {
            Some((n, (j, _))) if iters.contains(&j) => json!(n + 1),
            _ => v.clone(),
        },
        Value::Array(a) => Value::Array(a.iter().map(|v| retag(v, iters)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), retag(v, iters)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn retag_str(s: &str, iters: &BTreeSet<usize>) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    loop {
        let next_iter = rest.find(ITER);
        let next_digit = rest.find(|c: char| c.is_ascii_digit());
        match (next_iter, next_digit) {
            (Some(i), d) if d.is_none_or(|d| i < d) => {
                // ITER j.t CLOSE
                out.push_str(&rest[..i]);
                let after = &rest[i + ITER.len_utf8()..];
                let end = after.find(CLOSE).unwrap_or(after.len());
                let body = &after[..end];
                match body.split_once('.') {
                    Some((j, t)) if j.parse().is_ok_and(|j: usize| iters.contains(&j)) => {
                        let t: usize = t.parse().unwrap_or(0);
                        out.push(ITER);
                        out.push_str(&format!("{j}.{}", t + 1));
                    }
                    _ => {
                        out.push(ITER);
                        out.push_str(body);
                    }
                }
                rest = &after[end..];
            }
            (_, Some(d)) => {
                out.push_str(&rest[..d]);
                let run = &rest[d..];
                let len = run.find(|c: char| !c.is_ascii_digit()).unwrap_or(run.len());
                let digits = &run[..len];
                match digits
                    .parse::<i64>()
                    .ok()
                    .and_then(|n| int_marker(n).map(|m| (n, m)))
                {
                    Some((n, (j, _))) if iters.contains(&j) => out.push_str(&(n + 1).to_string()),
                    _ => out.push_str(digits),
                }
                rest = &run[len..];
            }
            _ => {
                out.push_str(rest);
                return out;
            }
        }
    }
}

/// Where `base` (the loop run once), `none` (not run) and `twice` (run twice) differ: the
/// loop's region, or `None` when its output never reaches the fragment.
fn region(
    base: &Value,
    none: &Value,
    twice: &Value,
    iters: &BTreeSet<usize>,
) -> Result<Option<Region>, LoopError> {
    fn walk(
        a: &Value,
        z: &Value,
        b: &Value,
        iters: &BTreeSet<usize>,
        path: &mut Vec<Seg>,
    ) -> Result<Option<Region>, LoopError> {
        if a == z && a == b {
            return Ok(None);
        }
        match (a, z, b) {
            (Value::Object(x), Value::Object(y), Value::Object(w)) => {
                let keys: BTreeSet<&String> = x.keys().collect();
                if keys != y.keys().collect() || keys != w.keys().collect() {
                    return Err(LoopError::KeysDependOnTheList);
                }
                let differ: Vec<&String> = keys
                    .into_iter()
                    .filter(|k| x[*k] != y[*k] || x[*k] != w[*k])
                    .collect();
                let [k] = differ[..] else {
                    return Err(LoopError::MoreThanOneField);
                };
                path.push(Seg::Key(k.clone()));
                walk(&x[k], &y[k], &w[k], iters, path)
            }
            (Value::Array(x), Value::Array(y), Value::Array(w))
                if x.len() == y.len() && x.len() == w.len() =>
            {
                let differ: Vec<usize> = (0..x.len())
                    .filter(|&i| x[i] != y[i] || x[i] != w[i])
                    .collect();
                let [i] = differ[..] else {
                    return Err(LoopError::MoreThanOneItem);
                };
                path.push(Seg::Index(i));
                walk(&x[i], &y[i], &w[i], iters, path)
            }
            (Value::Array(x), Value::Array(y), Value::Array(w)) => {
                let at = split(x, y, w, |at, len| {
                    x[at..at + len]
                        .iter()
                        .zip(&w[at + len..at + 2 * len])
                        .all(|(a, b)| retag(a, iters) == *b)
                })?;
                Ok(Some(Region {
                    path: path.clone(),
                    at: at.0,
                    len: at.1,
                    other: Value::Array(y[at.0..y.len() - (x.len() - at.0 - at.1)].to_vec()),
                }))
            }
            (Value::String(x), Value::String(y), Value::String(w)) => {
                let (x, y, w): (Vec<char>, Vec<char>, Vec<char>) = (
                    x.chars().collect(),
                    y.chars().collect(),
                    w.chars().collect(),
                );
                let at = split(&x, &y, &w, |at, len| {
                    // Retagged as a whole: a marker spans characters.
                    let body: String = x[at..at + len].iter().collect();
                    let next: Vec<char> = retag_str(&body, iters).chars().collect();
                    w[at + len..at + 2 * len] == next[..]
                })?;
                let tail = x.len() - at.0 - at.1;
                Ok(Some(Region {
                    path: path.clone(),
                    at: at.0,
                    len: at.1,
                    other: Value::String(y[at.0..y.len() - tail].iter().collect()),
                }))
            }
            _ => Err(LoopError::ChangesType),
        }
    }
    walk(base, none, twice, iters, &mut Vec::new())
}

/// `(at, len)` such that `once = A + X + C`, `twice = A + X + next(X) + C` and `none = A + Y
/// + C`: the first that fits.
fn split<T: PartialEq>(
    once: &[T],
    none: &[T],
    twice: &[T],
    repeats: impl Fn(usize, usize) -> bool,
) -> Result<(usize, usize), LoopError> {
    let len = twice
        .len()
        .checked_sub(once.len())
        .filter(|l| *l > 0)
        .ok_or(LoopError::WritesNothing)?;
    for at in 0..=once.len() - len {
        let tail = &once[at + len..];
        let fits = twice[..at + len] == once[..at + len]
            && twice[at + 2 * len..] == *tail
            && none.len() >= at + tail.len()
            && none[..at] == once[..at]
            && none[none.len() - tail.len()..] == *tail
            && repeats(at, len);
        if fits {
            return Ok((at, len));
        }
    }
    Err(LoopError::NotRepeated)
}

/// The renderings the loops are found from: all loops run once, and per loop, that loop run
/// zero and two times.
pub struct Renders {
    pub base: Value,
    pub per_loop: Vec<(Value, Value)>,
}

/// The fragment as the policy writes it: `base` with each loop's region replaced by the loop
/// (a string's part between loop markers, or an object [`LOOP_KEY`] among a list's items),
/// and every iteration marker back to its emit's number. `iters_of[k]`: the emits of loop k.
pub fn build(renders: &Renders, iters_of: &[BTreeSet<usize>]) -> Result<Value, Misplaced> {
    let mut regions = Vec::new();
    for (k, (none, twice)) in renders.per_loop.iter().enumerate() {
        if let Some(r) =
            region(&renders.base, none, twice, &iters_of[k]).map_err(|e| Misplaced::of(k, e))?
        {
            regions.push((k, r));
        }
    }
    // Rightmost first, so that earlier positions hold.
    regions.sort_by(|a, b| (&b.1.path, b.1.at).cmp(&(&a.1.path, a.1.at)));
    for pair in regions.windows(2) {
        let (later, earlier) = (&pair[0].1, &pair[1].1);
        if later.path == earlier.path && earlier.at + earlier.len > later.at {
            return Err(Misplaced::of(pair[0].0, LoopError::Overlaps));
        }
        if later.path != earlier.path
            && (later.path.starts_with(&earlier.path) || earlier.path.starts_with(&later.path))
        {
            return Err(Misplaced::of(pair[0].0, LoopError::Inside));
        }
    }
    let mut out = renders.base.clone();
    for (k, r) in &regions {
        let at = pointer(&mut out, &r.path).ok_or(Misplaced::of(*k, LoopError::LostItsPlace))?;
        match (at, &r.other) {
            (Value::String(s), Value::String(other)) => {
                let chars: Vec<char> = s.chars().collect();
                let mut new: String = chars[..r.at].iter().collect();
                new.push_str(&markers::loop_open(*k));
                new.extend(&chars[r.at..r.at + r.len]);
                new.push(LOOP_ELSE);
                new.push_str(other);
                new.push(LOOP_END);
                new.extend(&chars[r.at + r.len..]);
                *s = new;
            }
            (Value::Array(items), Value::Array(other)) => {
                let each: Vec<Value> = items.drain(r.at..r.at + r.len).collect();
                items.insert(r.at, json!({LOOP_KEY: k, "each": each, "else": other}));
            }
            _ => return Err(Misplaced::of(*k, LoopError::LostItsPlace)),
        }
    }
    let owner: Vec<usize> = {
        let mut owner = Vec::new();
        for (k, iters) in iters_of.iter().enumerate() {
            for &j in iters {
                if owner.len() <= j {
                    owner.resize(j + 1, usize::MAX);
                }
                owner[j] = k;
            }
        }
        owner
    };
    untag(&out, None, &owner)
}

fn pointer<'v>(v: &'v mut Value, path: &[Seg]) -> Option<&'v mut Value> {
    path.iter().try_fold(v, |v, seg| match seg {
        Seg::Key(k) => v.get_mut(k.as_str()),
        Seg::Index(i) => v.get_mut(*i),
    })
}

/// Iteration markers back to their emit's number (`ITER j CLOSE` in text, `INT j CLOSE` for a
/// whole number), each checked to be inside its own loop's body.
fn untag(v: &Value, inside: Option<usize>, owner: &[usize]) -> Result<Value, Misplaced> {
    let check = |j: usize, inside: Option<usize>| -> Result<(), Misplaced> {
        let k = owner.get(j).copied().unwrap_or(usize::MAX);
        if inside == Some(k) {
            Ok(())
        } else {
            Err(Misplaced::of(k, LoopError::OutsideItsOutput))
        }
    };
    Ok(match v {
        Value::Number(n) => match n.as_i64().and_then(int_marker) {
            Some((j, _)) => {
                check(j, inside)?;
                Value::String(markers::int(j))
            }
            None => v.clone(),
        },
        Value::String(s) => {
            let mut out = String::with_capacity(s.len());
            let mut inside = inside;
            let mut rest = s.as_str();
            while let Some(c) = rest.chars().next() {
                let w = c.len_utf8();
                if c == ITER {
                    let after = &rest[w..];
                    let end = after.find(CLOSE).unwrap_or(after.len());
                    let j = after[..end].split('.').next().unwrap_or("");
                    let j: usize = j
                        .parse()
                        .map_err(|_| Misplaced::of(usize::MAX, LoopError::BrokenMarker))?;
                    check(j, inside)?;
                    out.push_str(&markers::iter(j));
                    rest = after.get(end + CLOSE.len_utf8()..).unwrap_or("");
                } else if c.is_ascii_digit() {
                    let len = rest
                        .find(|c: char| !c.is_ascii_digit())
                        .unwrap_or(rest.len());
                    let digits = &rest[..len];
                    match digits.parse::<i64>().ok().and_then(int_marker) {
                        Some((j, _)) => {
                            check(j, inside)?;
                            out.push_str(&markers::iter(j));
                        }
                        None => out.push_str(digits),
                    }
                    rest = &rest[len..];
                } else {
                    if c == LOOP_OPEN {
                        let after = &rest[w..];
                        let end = after.find(CLOSE).unwrap_or(after.len());
                        inside = after[..end].parse().ok();
                    } else if c == LOOP_ELSE || c == LOOP_END {
                        inside = None;
                    }
                    out.push(c);
                    rest = &rest[w..];
                }
            }
            Value::String(out)
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|i| match i.get(LOOP_KEY).and_then(Value::as_u64) {
                    Some(k) => {
                        let k = k as usize;
                        Ok(json!({
                            LOOP_KEY: k,
                            "each": untag(&i["each"], Some(k), owner)?,
                            "else": untag(&i["else"], None, owner)?,
                        }))
                    }
                    None => untag(i, inside, owner),
                })
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| Ok((k.clone(), untag(v, inside, owner)?)))
                .collect::<Result<_, _>>()?,
        ),
        other => other.clone(),
    })
}

/// The fragment [`build`] wrote, for given lists (`lists[k]`, loop k's): what the policy's CEL
/// computes, here computed by the same expressions' evaluator, to compare with the webhook's
/// rendering for the same lists. Markers of values read of the pod stay as they are.
pub fn instantiate(
    v: &Value,
    lists: &[Vec<Value>],
    iters: &[(usize, IterExpr)],
    at: Option<&Iteration<'_>>,
) -> Result<Value, EvalError> {
    let eval = |j: usize, at: Option<&Iteration<'_>>| -> Result<Value, EvalError> {
        let (_, e) = iters.get(j).ok_or(EvalError::UnknownMarker)?;
        e.eval(at.ok_or(EvalError::OutsideItsLoop)?)
    };
    Ok(match v {
        Value::String(s) => {
            if let Some(j) = markers::int_ref(s) {
                return eval(j, at);
            }
            let pieces = parse(s)?;
            Value::String(expand(&pieces, lists, iters, at)?)
        }
        Value::Array(items) => {
            let mut out = Vec::new();
            for i in items {
                match i.get(LOOP_KEY).and_then(Value::as_u64) {
                    Some(k) => {
                        let list = lists.get(k as usize).ok_or(EvalError::UnknownLoop)?;
                        if list.is_empty() {
                            for e in i["else"].as_array().into_iter().flatten() {
                                out.push(instantiate(e, lists, iters, at)?);
                            }
                        }
                        for (index, item) in list.iter().enumerate() {
                            let it = Iteration {
                                index,
                                len: list.len(),
                                item,
                            };
                            for e in i["each"].as_array().into_iter().flatten() {
                                out.push(instantiate(e, lists, iters, Some(&it))?);
                            }
                        }
                    }
                    None => out.push(instantiate(i, lists, iters, at)?),
                }
            }
            Value::Array(out)
        }
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| Ok((k.clone(), instantiate(v, lists, iters, at)?)))
                .collect::<Result<_, EvalError>>()?,
        ),
        other => other.clone(),
    })
}

fn expand(
    pieces: &[Piece],
    lists: &[Vec<Value>],
    iters: &[(usize, IterExpr)],
    at: Option<&Iteration<'_>>,
) -> Result<String, EvalError> {
    let mut out = String::new();
    for p in pieces {
        match p {
            Piece::Text(t) => out.push_str(t),
            Piece::Marker(i) => out.push_str(&markers::marker(*i)),
            Piece::Iter(j) => {
                let (_, e) = iters.get(*j).ok_or(EvalError::UnknownMarker)?;
                out.push_str(&text(&e.eval(at.ok_or(EvalError::OutsideItsLoop)?)?));
            }
            Piece::Loop { k, body, other } => {
                let list = lists.get(*k).ok_or(EvalError::UnknownLoop)?;
                if list.is_empty() {
                    out.push_str(&expand(other, lists, iters, at)?);
                }
                for (index, item) in list.iter().enumerate() {
                    let it = Iteration {
                        index,
                        len: list.len(),
                        item,
                    };
                    out.push_str(&expand(body, lists, iters, Some(&it))?);
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::markers::INT_BASE;

    #[test]
    fn a_string_loop_is_found_between_what_its_iterations_share() {
        // The body and the else start alike: only the iteration markers tell them apart.
        let m = |t: usize| format!("{ITER}0.{t}{CLOSE}");
        let base = json!({"a": format!("[,x{}]", m(0))});
        let none = json!({"a": "[,xE]"});
        let twice = json!({"a": format!("[,x{},x{}]", m(0), m(1))});
        let renders = Renders {
            base,
            per_loop: vec![(none, twice)],
        };
        let built = build(&renders, &[BTreeSet::from([0])]).expect("found");
        let s = built["a"].as_str().unwrap_or_default().to_owned();
        let iters = vec![(0, IterExpr::Item(None, Ty::Int, None))];
        for (list, want) in [
            (vec![], "[,xE]"),
            (vec![json!(1)], "[,x1]"),
            (vec![json!(1), json!(2), json!(3)], "[,x1,x2,x3]"),
        ] {
            let got = instantiate(&json!(s), &[list], &iters, None).expect("instantiates");
            assert_eq!(got, json!(want), "{s:?}");
        }
    }

    #[test]
    fn a_list_loop_becomes_an_item_and_integers_come_back() {
        let port = |n: i64| json!({"containerPort": n});
        let base = json!({"ports": [port(1), port(INT_BASE), port(2)]});
        let none = json!({"ports": [port(1), port(7), port(2)]});
        let twice = json!({"ports": [port(1), port(INT_BASE), port(INT_BASE + 1), port(2)]});
        let built = build(
            &Renders {
                base,
                per_loop: vec![(none, twice)],
            },
            &[BTreeSet::from([0])],
        )
        .expect("found");
        let iters = vec![(
            0,
            IterExpr::Add(
                Box::new(IterExpr::Const(json!(100))),
                Box::new(IterExpr::Index0),
            ),
        )];
        let got = instantiate(&built, &[vec![json!("a"), json!("b")]], &iters, None).expect("ok");
        assert_eq!(
            got,
            json!({"ports": [port(1), port(100), port(101), port(2)]})
        );
        let got = instantiate(&built, &[vec![]], &iters, None).expect("ok");
        assert_eq!(got, json!({"ports": [port(1), port(7), port(2)]}));
    }

    #[test]
    fn iteration_expressions_are_the_same_in_cel() {
        let e = IterExpr::Cond(
            Box::new(IterExpr::Not(Box::new(IterExpr::Eq(
                Box::new(IterExpr::Index0),
                Box::new(IterExpr::Const(json!(0))),
            )))),
            ",".into(),
            String::new(),
        );
        assert_eq!(e.cel("i", "v", "l"), "(!(i == 0) ? \",\" : \"\")");
        let it = Iteration {
            index: 1,
            len: 2,
            item: &json!(3),
        };
        assert_eq!(e.eval(&it), Ok(json!(",")));
    }
}
