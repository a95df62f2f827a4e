//! The `Symbolic` result: a template read for every pod at once, as the policies write it
//! (its rendering with markers, and the CEL of what each marker stands for), how its strings
//! and values are written as CEL, and why a template, or a part of it, cannot be.
//!
//! The reading itself is in stages: `translate.rs` (the template's expressions as CEL),
//! `walk.rs` (its syntax tree walked: where it reads the pod), `trials.rs` (the
//! renderings and the trials with awkward values) and [`super::read`], which runs them.
//!
//! The API server's CEL checks that list and map literals are homogeneous, so a container
//! cannot be a map literal: objects are written as `Object.spec.containers{...}`, their type
//! named by their path in the pod, and only string-to-string fields (resources, labels) as
//! maps.

use serde_json::Value;

use crate::engine::template::Fragment;
use crate::export::cel;
use crate::export::loops::IterExpr;
use crate::export::markers::{self, LOOP_KEY, Piece};

/// A template as the policy writes it.
#[derive(Debug)]
pub struct Symbolic {
    /// The rendering with every loop run once: names, images, restart policies.
    pub fragment: Fragment,
    /// The rendering as the policy writes it: markers where values read of the pod go, and
    /// each loop's output in its place ([`crate::export::loops::build`]).
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
