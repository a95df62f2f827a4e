//! The renderings a reading makes of the template's source, rewritten (a marker for each value
//! read of the pod, the loops run zero, one and two times or over given lists), and the trials:
//! every marker replaced by awkward values (`0`, `true`, `null`, a YAML colon..., or every
//! value a per-pod override allows), so that a value the webhook's YAML would read as another
//! type or another structure is refused; and the loops over lists of every length up to three,
//! the webhook's rendering against what the policy computes.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::engine::config::Injector;
use crate::engine::overrides;
use crate::engine::template::{Fragment, TemplateError};
use crate::export::loops::{self, Renders, Ty};
use crate::export::markers::{iteration_marker, marker};
use crate::export::symbolic::Refusal;
use crate::export::translate::Chars;
use crate::export::walk::{EditKind, Walked};

/// How the loops run in one rendering.
#[derive(Clone, Copy)]
enum Mode<'m> {
    /// Loop k over `range(n[k])`, every value its iterations read as a marker.
    Times(&'m [usize]),
    /// Loop k over `lists[k]`, as the webhook renders it.
    Lists(&'m [Vec<Value>]),
}

/// The template's source, rewritten and rendered by the set's own environment.
pub(super) struct Renderer<'a> {
    inj: &'a Injector,
    name: &'a str,
    source: &'a str,
    walked: &'a Walked,
    /// Every loop run once.
    once: Vec<usize>,
}

impl<'a> Renderer<'a> {
    pub(super) fn new(
        inj: &'a Injector,
        name: &'a str,
        source: &'a str,
        walked: &'a Walked,
    ) -> Self {
        Self {
            inj,
            name,
            source,
            walked,
            once: vec![1; walked.loops.len()],
        }
    }

    /// The source with its edits: value `i` read of the pod as `substitute(i)`, the loops
    /// as `mode` says.
    fn rewrite(&self, substitute: &dyn Fn(usize) -> String, mode: Mode<'_>) -> String {
        let (source, w) = (self.source, self.walked);
        let mut out = String::with_capacity(source.len());
        let mut at = 0;
        for e in &w.edits {
            out.push_str(&source[at..e.range.start]);
            let original = &source[e.range.clone()];
            match (&e.kind, mode) {
                (EditKind::Marker(i), _) => {
                    out.push_str(&substitute(*i));
                    if w.emits[*i].tojson {
                        out.push_str(" | tojson");
                    }
                }
                (EditKind::Iter { j, tojson }, Mode::Times(_)) => {
                    out.push_str(&iteration_marker(*j, w.iters[*j].1.ty() == Ty::Int));
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
    }

    /// The rendering of the rewritten source.
    fn render(
        &self,
        substitute: &dyn Fn(usize) -> String,
        mode: Mode<'_>,
    ) -> Result<Fragment, TemplateError> {
        self.inj
            .templates
            .render_source(self.name, &self.rewrite(substitute, mode))
    }

    /// The rendering with every loop run once and a marker for each value read of the pod.
    pub(super) fn once(&self) -> Result<Fragment, Vec<Refusal>> {
        self.render(&marked, Mode::Times(&self.once))
            .map_err(|err| {
                let reason = format!(
                    "a value read from the pod is used where the fragment needs another type: {err}"
                );
                vec![match self.walked.emits.first() {
                    Some(e) => e.refusal(reason),
                    None => Refusal::whole(reason),
                }]
            })
    }

    /// Per loop, the renderings with that loop run zero and two times, and `base` (all run
    /// once): where each loop's body lands ([`loops::build`]).
    pub(super) fn per_loop(&self, base: Value) -> Result<Renders, Vec<Refusal>> {
        let mut per_loop = Vec::new();
        for k in 0..self.walked.loops.len() {
            let mut runs = Vec::new();
            for n in [0, 2] {
                let mut times = self.once.clone();
                times[k] = n;
                let f = self.render(&marked, Mode::Times(&times)).map_err(|e| {
                    vec![
                        self.walked
                            .loop_refusal(k, format!("run {n} times, it does not render: {e}")),
                    ]
                })?;
                runs.push(serde_json::to_value(&f).unwrap_or_default());
            }
            let twice = runs.pop().unwrap_or_default();
            let none = runs.pop().unwrap_or_default();
            per_loop.push((none, twice));
        }
        Ok(Renders { base, per_loop })
    }

    /// Each value read of the pod: in the fragment as a string (`json`, as the policy writes
    /// it), not in a name, and rendered alike with every trial value in place of its marker.
    pub(super) fn try_values(
        &self,
        fragment: &Fragment,
        base: &Value,
        json: &Value,
    ) -> Result<(), Vec<Refusal>> {
        let mut refusals = Vec::new();
        for (i, e) in self.walked.emits.iter().enumerate() {
            if !contains_marker(json, i) {
                refusals.push(e.refusal(
                    "the value does not reach the fragment as a string (used as a number, a key or a comment)"
                        .into(),
                ));
                continue;
            }
            if let Some(field) = in_a_name(fragment, i) {
                refusals.push(e.refusal(format!(
                    "{field} may not depend on the pod: the policy finds what it added by these"
                )));
                continue;
            }
            if let Some(text) = self.misread(i, &e.cel.chars, base) {
                let hint = match (e.tojson, &e.cel.chars) {
                    (true, _) | (_, Chars::Override(_)) => "",
                    (false, _) => "; quote it with `| tojson`",
                };
                refusals.push(e.refusal(format!(
                    "for a pod where it is {text:?} the webhook's YAML would not read it as that string{hint}"
                )));
            }
        }
        match refusals.is_empty() {
            true => Ok(()),
            false => Err(refusals),
        }
    }

    /// The first trial value of value `i` whose rendering is not `base` with that value in
    /// place of the marker.
    fn misread(&self, i: usize, chars: &Chars, base: &Value) -> Option<String> {
        let trials: Vec<(String, String)> = match chars {
            Chars::Plain => PLAIN_TRIALS
                .iter()
                .map(|t| (literal(t), (*t).to_owned()))
                .collect(),
            Chars::Any => ANY_TRIALS
                .iter()
                .map(|t| (literal(t), (*t).to_owned()))
                .collect(),
            Chars::Override(annotation) => self
                .inj
                .templates
                .declared(self.name)
                .and_then(|d| d.get(annotation))
                .map(|spec| of_override(annotation, spec))
                .unwrap_or_default(),
        };
        trials.into_iter().find_map(|(trial, text)| {
            let substitute = |j: usize| if j == i { trial.clone() } else { marked(j) };
            let want = substitute_text(base, &marker(i), &text);
            let got = self
                .render(&substitute, Mode::Times(&self.once))
                .map(|f| serde_json::to_value(&f).unwrap_or_default());
            (got.ok().as_ref() != Some(&want)).then_some(text)
        })
    }

    /// The loops, over lists of every length up to three: the webhook's rendering against
    /// what the policy computes from `json`.
    pub(super) fn try_lists(&self, json: &Value) -> Result<(), Vec<Refusal>> {
        let w = self.walked;
        let samples: Vec<Vec<Vec<Value>>> = w.loops.iter().map(|l| l.elem.samples()).collect();
        let cases = samples.iter().map(Vec::len).max().unwrap_or(0);
        for c in 0..cases {
            let lists: Vec<Vec<Value>> = samples
                .iter()
                .map(|s| s.get(c % s.len().max(1)).cloned().unwrap_or_default())
                .collect();
            let k = lists.iter().position(|l| !l.is_empty()).unwrap_or(0);
            let shown = serde_json::to_string(&lists[k]).unwrap_or_default();
            let webhook = self
                .render(&marked, Mode::Lists(&lists))
                .map(|f| serde_json::to_value(&f).unwrap_or_default())
                .map_err(|e| {
                    vec![w.loop_refusal(k, format!("over {shown}, it does not render: {e}"))]
                })?;
            let policy = loops::instantiate(json, &lists, &w.iters, None)
                .map_err(|e| vec![w.loop_refusal(k, format!("over {shown}: {e}"))])?;
            if policy != webhook {
                return Err(vec![w.loop_refusal(
                    k,
                    format!(
                        "over {shown}, the webhook's rendering is not the loop's body repeated (YAML folding, or a key per item?)"
                    ),
                )]);
            }
        }
        Ok(())
    }
}

/// Loop `k`'s emits: the values its iterations read.
pub(super) fn iters_of(walked: &Walked) -> Vec<BTreeSet<usize>> {
    (0..walked.loops.len())
        .map(|k| {
            walked
                .iters
                .iter()
                .enumerate()
                .filter(|(_, (l, _))| *l == k)
                .map(|(j, _)| j)
                .collect()
        })
        .collect()
}

/// Value `i` as its marker, a minijinja literal.
fn marked(i: usize) -> String {
    literal(&marker(i))
}

/// Values a plain read (a label value, a name) may have that YAML reads as something else.
const PLAIN_TRIALS: [&str; 6] = ["0", "1.5", "true", "null", "-", "x"];

/// And what an annotation may hold besides.
const ANY_TRIALS: [&str; 12] = [
    "0", "1.5", "true", "null", "-", "x", "a: b", "#c", "'\"", "[1]", "{a: 1}", "x\ny",
];

/// The values of a per-pod override to try a template with ([`overrides::Spec::trials`], with
/// the awkward strings of an annotation where the type allows any), as minijinja literals
/// (numbers and booleans unquoted, as the webhook passes them) with the text they render as.
fn of_override(annotation: &str, spec: &overrides::Spec) -> Vec<(String, String)> {
    spec.trials(annotation, &ANY_TRIALS)
        .into_iter()
        .map(|(text, value)| {
            let literal = match &value {
                Value::String(s) => literal(s),
                other => other.to_string(),
            };
            (literal, text)
        })
        .collect()
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

fn substitute_text(v: &Value, from: &str, to: &str) -> Value {
    match v {
        Value::String(s) => Value::String(s.replace(from, to)),
        Value::Array(a) => Value::Array(a.iter().map(|v| substitute_text(v, from, to)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (k.replace(from, to), substitute_text(v, from, to)))
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
