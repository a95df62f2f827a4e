//! Offline injection of manifests: multi-document YAML (or JSON, as `kubectl get -o yaml|json`
//! prints it) in, injected YAML out.
//!
//! Pods and the pod templates of workloads go through the same [`decide`] and edits as the
//! webhook; the edits are applied as the same JSONPatch. The items of a `kind: List` are
//! injected in place. A document that is not changed, or cannot be read, is written back byte
//! for byte, comments and markers included, so injecting the output again changes nothing.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use serde_json::Value;

use crate::engine::config::Injector;
use crate::engine::context::Owner;
use crate::engine::inject::{
    Decision, Edit, Entry, InjectError, OptOut, PodFacts, SkipReason, decide, opt_in, plan_edits,
    required_opt_out, to_patch,
};
use crate::engine::view::PodView;

/// Where each kind keeps its pod template (JSON pointer tokens; empty: the object is a pod).
pub fn pod_template_path(api_version: &str, kind: &str) -> Option<&'static [&'static str]> {
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    match (group, kind) {
        ("", "Pod") => Some(&[]),
        ("", "ReplicationController")
        | ("apps", "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet") => Some(TEMPLATE),
        ("batch", "Job") => Some(TEMPLATE),
        ("batch", "CronJob") => Some(JOB_TEMPLATE),
        _ => None,
    }
}

const TEMPLATE: &[&str] = &["spec", "template"];
const JOB_TEMPLATE: &[&str] = &["spec", "jobTemplate", "spec", "template"];

/// Where an object keeps its pod template: where its kind keeps it ([`pod_template_path`]),
/// else, whatever the kind (an OpenShift DeploymentConfig, an Argo Rollout...), at
/// `spec.template` or `spec.jobTemplate.spec.template` when that holds what every pod template
/// holds and few other things do: a `spec.containers` list. An object without `kind` or
/// `apiVersion` is not a Kubernetes object, and has none.
pub fn template_path(object: &Value) -> Option<&'static [&'static str]> {
    let (kind, api_version) = (str_at(object, "/kind"), str_at(object, "/apiVersion"));
    if let Some(path) = pod_template_path(api_version, kind) {
        return Some(path);
    }
    if kind.is_empty() || api_version.is_empty() || list_items(object).is_some() {
        return None;
    }
    [TEMPLATE, JOB_TEMPLATE].into_iter().find(|path| {
        at(object, path)
            .and_then(|t| t.pointer("/spec/containers"))
            .is_some_and(Value::is_array)
    })
}

/// The value at `tokens` (none: `value` itself).
pub(crate) fn at<'a>(value: &'a Value, tokens: &[&str]) -> Option<&'a Value> {
    tokens.iter().try_fold(value, |v, token| v.get(*token))
}

/// The items of a `kind: List` (apiVersion v1), as `kubectl get -o yaml|json` prints several
/// objects.
pub(crate) fn list_items(value: &Value) -> Option<&Vec<Value>> {
    if str_at(value, "/kind") == "List" && str_at(value, "/apiVersion") == "v1" {
        value.get("items").and_then(Value::as_array)
    } else {
        None
    }
}

/// What happened to one object.
#[derive(Debug)]
pub enum DocOutcome {
    /// Not a pod or a workload with a pod template (or an empty document).
    Passthrough,
    /// Why no rule opts it in.
    NotOptedIn(String),
    Skipped(SkipReason),
    /// Opted in and already carrying everything: nothing to add.
    AlreadyInjected {
        templates: Vec<String>,
    },
    Injected {
        /// The rule that opted it in.
        entry: Entry,
        templates: Vec<String>,
        /// What it gets, in words ([`crate::engine::inject::Edit::describe`]).
        changes: Vec<String>,
    },
    /// A kind the injector does not know whose `spec.template` (or
    /// `spec.jobTemplate.spec.template`) carries the opt-in label, but is not a pod template:
    /// what it is instead.
    NotATemplate(String),
    Failed(InjectError),
}

/// One object of the input: a document, or an item of a `kind: List` document.
#[derive(Debug)]
pub struct Object {
    /// `Kind/name`, for reports.
    pub id: String,
    pub outcome: DocOutcome,
    /// Its pod template carries the opt-in label with "true" (the configuration's `injectLabel`).
    pub labelled: bool,
    /// It opts out where its namespace requires sidecars, and nothing exempts it: the webhooks
    /// would refuse it.
    pub refused: bool,
    /// The object names no namespace and none was given: it was rendered for `default`.
    pub namespace_guessed: bool,
    /// What the webhook would answer as admission warnings for it (a kept container, a
    /// regular sidecar in a pod that runs to completion...).
    pub warnings: Vec<String>,
}

impl Object {
    /// Opted in, by a rule or by its own label, and yet left as it is: `inject` names it.
    pub fn left_alone(&self) -> bool {
        match &self.outcome {
            DocOutcome::Skipped(_)
            | DocOutcome::AlreadyInjected { .. }
            | DocOutcome::NotATemplate(_) => true,
            // Its label asks, but another revision's, or a namespace rule, decides; or it opts
            // out where that is refused.
            DocOutcome::NotOptedIn(_) => self.labelled || self.refused,
            DocOutcome::Passthrough | DocOutcome::Injected { .. } | DocOutcome::Failed(_) => false,
        }
    }

    /// What the injector does to it, in one line (`explain` lists the changes of an injected
    /// object after it). `None` for an object that is no pod and has no pod template.
    pub fn verdict(&self, inj: &Injector) -> Option<String> {
        let id = &self.id;
        Some(match &self.outcome {
            DocOutcome::Passthrough => return None,
            DocOutcome::NotOptedIn(why) | DocOutcome::NotATemplate(why) => {
                format!("{id}: not injected: {why}")
            }
            DocOutcome::Skipped(reason) => format!("{id}: not injected: opted in, but {reason}"),
            DocOutcome::AlreadyInjected { templates } => format!(
                "{id}: already injected with [{}]: nothing to add",
                templates.join(", ")
            ),
            DocOutcome::Failed(error) => format!("{id}: cannot be injected: {error}"),
            DocOutcome::Injected {
                entry, templates, ..
            } => format!(
                "{id}: injected with [{}] (opted in by {}); it would get:",
                templates.join(", "),
                entry.describe(inj)
            ),
        })
    }
}

/// One document of the input and its result.
#[derive(Debug)]
pub struct Doc {
    /// The `---` that opened it, as written (empty: none).
    pub marker: String,
    /// The document's text as it came in (after its marker).
    pub source: String,
    /// `Kind/name` of its one object, or `List`, for reports.
    pub id: String,
    /// What it holds: itself, or the items of a `kind: List`, in their order.
    pub objects: Vec<Object>,
    /// The document with its pod templates injected, when something was added.
    pub output: Option<Value>,
    /// Why it cannot be read, or an object of it cannot be injected: it is then written back
    /// as it came, and the other documents are still read and injected.
    pub error: Option<ManifestError>,
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("document {index}: invalid YAML: {message}")]
    Yaml { index: usize, message: String },
    #[error("document {index} ({id}): the pod template does not parse: {message}")]
    PodTemplate {
        index: usize,
        id: String,
        message: String,
    },
    #[error("document {index} ({id}): {source}")]
    Inject {
        index: usize,
        id: String,
        #[source]
        source: InjectError,
    },
    #[error("document {index} ({id}): the patch does not apply: {message}")]
    Patch {
        index: usize,
        id: String,
        message: String,
    },
    #[error(
        "document {index} ({id}) has no metadata.namespace: sidecars are rendered for the pod's namespace, \
         so pass --namespace (-n) with the namespace it will be applied to"
    )]
    NoNamespace { index: usize, id: String },
    #[error("document {index} ({id}): cannot write YAML: {message}")]
    Write {
        index: usize,
        id: String,
        message: String,
    },
}

/// One document of a YAML stream, as written: the `---` marker that opens it (empty for a
/// first document written without one) and the text after it, up to the next marker (the
/// rest of the marker's line included). The pieces of a stream, joined, are the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DocText<'a> {
    pub marker: &'a str,
    pub text: &'a str,
}

/// Splits a YAML stream at its `---` document markers, keeping every byte: the pieces joined
/// are `text` exactly.
pub fn split_documents(text: &str) -> Vec<DocText<'_>> {
    let mut docs = Vec::new();
    let (mut start, mut marker) = (0, "");
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let body = line.trim_end_matches(['\n', '\r']);
        if body == "---" || body.starts_with("--- ") || body.starts_with("---\t") {
            if offset > start || !marker.is_empty() {
                docs.push(DocText {
                    marker,
                    text: &text[start..offset],
                });
            }
            marker = &text[offset..offset + 3];
            // Content after the marker on the same line belongs to the new document.
            start = offset + 3;
        }
        offset += line.len();
    }
    if offset > start || !marker.is_empty() {
        docs.push(DocText {
            marker,
            text: &text[start..],
        });
    }
    docs
}

/// Reads one YAML document as Kubernetes tooling does (kubectl's sigs.k8s.io/yaml, YAML 1.1):
/// integers written `0644` are octal, as are `0o644`, `0x1F` hexadecimal and `0b101` binary;
/// a whole number written as a float (`1.0`, or `08`, which is no octal) is the integer
/// (sigs.k8s.io/yaml writes it to JSON as `1`, which an integer field takes); `yes`, `no`,
/// `on` and `off` are booleans. What kubectl reads otherwise: `1_000` is a string here, 1000
/// there.
pub fn read_document(text: &str) -> Result<Value, serde_saphyr::Error> {
    let mut options = serde_saphyr::Options::default();
    options.legacy_octal_numbers = true;
    let mut value =
        serde_saphyr::from_str_with_options::<Option<Value>>(text, options)?.unwrap_or(Value::Null);
    whole_numbers(&mut value);
    Ok(value)
}

/// Every float with no fraction (within the integers a float holds exactly) made an integer.
fn whole_numbers(value: &mut Value) {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    match value {
        Value::Number(n) if n.is_f64() => {
            if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() <= EXACT) {
                // Exact within 2^53: the cast loses nothing.
                *value = Value::from(f as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(whole_numbers),
        Value::Object(fields) => fields.values_mut().for_each(whole_numbers),
        _ => {}
    }
}

/// Where the documents go: the namespace for documents that name none (as `kubectl apply
/// -n`), and the labels of namespaces the input does not describe.
#[derive(Clone, Debug, Default)]
pub struct Target<'a> {
    pub namespace: Option<&'a str>,
    /// Labels of every namespace without a Namespace document in the input. `None`: unknown,
    /// and only the pod's own label can opt it in (the webhook's pod-label entry).
    pub namespace_labels: Option<BTreeMap<String, String>>,
}

/// Decides every document. A document that cannot be read, or whose pod template cannot be
/// read or injected, has its [`Doc::error`] and no output; the others are decided as they
/// would be alone. A pod the injector cannot honour (an unknown template) is reported in its
/// object's [`Object::outcome`]. `namespace` is used for documents that name none (as
/// `kubectl apply -n`).
pub fn process(inj: &Injector, text: &str, namespace: Option<&str>) -> Vec<Doc> {
    process_for(
        inj,
        text,
        &Target {
            namespace,
            namespace_labels: None,
        },
    )
}

/// [`process`], with namespace labels: from the input's Namespace documents (or List items),
/// else from `target`. They decide namespace opt-in and revision as the chart's webhook
/// entries would.
pub fn process_for(inj: &Injector, text: &str, target: &Target<'_>) -> Vec<Doc> {
    let pieces = split_documents(text);
    let values: Vec<Result<Value, ManifestError>> = pieces
        .iter()
        .enumerate()
        .map(|(i, piece)| {
            read_document(piece.text).map_err(|e| ManifestError::Yaml {
                index: i + 1,
                message: e.to_string(),
            })
        })
        .collect();
    let namespaces: BTreeMap<String, BTreeMap<String, String>> = values
        .iter()
        .flatten()
        .flat_map(|v| match list_items(v) {
            Some(items) => items.iter().collect(),
            None => vec![v],
        })
        .filter(|v| str_at(v, "/kind") == "Namespace" && str_at(v, "/apiVersion") == "v1")
        .map(|v| {
            let labels = v
                .pointer("/metadata/labels")
                .and_then(|l| serde_json::from_value(l.clone()).ok())
                .unwrap_or_default();
            (str_at(v, "/metadata/name").to_owned(), labels)
        })
        .collect();
    pieces
        .into_iter()
        .zip(values)
        .enumerate()
        .map(|(i, (piece, value))| {
            let mut doc = Doc {
                marker: piece.marker.to_owned(),
                source: piece.text.to_owned(),
                id: String::new(),
                objects: Vec::new(),
                output: None,
                error: None,
            };
            match value {
                Ok(value) => decide_document(inj, i + 1, &value, target, &namespaces, &mut doc),
                Err(error) => doc.error = Some(error),
            }
            doc
        })
        .collect()
}

/// Decides document `index` (`value`, read) into `doc`: its objects, its output, or its error.
fn decide_document(
    inj: &Injector,
    index: usize,
    value: &Value,
    target: &Target<'_>,
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
    doc: &mut Doc,
) {
    let Some(items) = list_items(value) else {
        match process_one(inj, index, value, target, namespaces) {
            Ok((object, output)) => {
                doc.id.clone_from(&object.id);
                doc.objects.push(object);
                doc.output = output;
            }
            Err(error) => {
                doc.id = object_id(value);
                doc.error = Some(error);
            }
        }
        return;
    };
    doc.id = "List".to_owned();
    let mut injected = Vec::new();
    for (position, item) in items.iter().enumerate() {
        match process_one(inj, index, item, target, namespaces) {
            Ok((object, output)) => {
                doc.objects.push(object);
                injected.extend(output.map(|o| (position, o)));
            }
            // One item that cannot be injected leaves the whole List as it came: a List is
            // one document, written back whole or not at all.
            Err(error) => {
                doc.error = Some(error);
                return;
            }
        }
    }
    doc.output = (!injected.is_empty()).then(|| {
        let mut list = value.clone();
        if let Some(items) = list.get_mut("items").and_then(Value::as_array_mut) {
            for (position, item) in injected {
                if let Some(slot) = items.get_mut(position) {
                    *slot = item;
                }
            }
        }
        list
    });
}

/// `Kind/name` of an object (its `generateName` when it has no name), for reports.
pub(crate) fn object_id(value: &Value) -> String {
    let name = match str_at(value, "/metadata/name") {
        "" => str_at(value, "/metadata/generateName"),
        n => n,
    };
    format!("{}/{name}", str_at(value, "/kind"))
}

/// What `inject` writes: the YAML stream, and one line for each opted-in pod or pod template
/// it leaves as it is, saying why (for standard error: nothing is left alone silently).
#[derive(Debug)]
pub struct Injected {
    /// Every document: injected, or as it came.
    pub yaml: String,
    pub left_alone: Vec<String>,
    /// The admission warnings of the injected objects, each after its `Kind/name`.
    pub warnings: Vec<String>,
    /// The documents written back as they came because they cannot be read or injected.
    pub errors: Vec<ManifestError>,
}

/// `inject -f`: the injected YAML stream, or the first document that cannot be read or
/// injected ([`inject_each`] writes the others all the same).
pub fn inject(
    inj: &Injector,
    text: &str,
    namespace: Option<&str>,
) -> Result<Injected, ManifestError> {
    inject_for(
        inj,
        text,
        &Target {
            namespace,
            namespace_labels: None,
        },
    )
}

/// [`inject`] with namespace labels (see [`process_for`]).
pub fn inject_for(
    inj: &Injector,
    text: &str,
    target: &Target<'_>,
) -> Result<Injected, ManifestError> {
    let mut injected = inject_each(inj, text, target);
    if injected.errors.is_empty() {
        Ok(injected)
    } else {
        Err(injected.errors.swap_remove(0))
    }
}

/// Every document injected that can be; one that cannot be read or injected is written back
/// as it came, with its error in [`Injected::errors`]. The stream keeps every byte of the
/// documents left as they are (markers and comments included).
pub fn inject_each(inj: &Injector, text: &str, target: &Target<'_>) -> Injected {
    let mut docs = process_for(inj, text, target);
    for (index, doc) in docs.iter_mut().enumerate() {
        if doc.error.is_some() {
            continue;
        }
        if let Some(object) = doc
            .objects
            .iter()
            .find(|o| o.namespace_guessed && matches!(o.outcome, DocOutcome::Injected { .. }))
        {
            doc.error = Some(ManifestError::NoNamespace {
                index: index + 1,
                id: object.id.clone(),
            });
        } else if let Some(position) = doc
            .objects
            .iter()
            .position(|o| matches!(o.outcome, DocOutcome::Failed(_)))
        {
            let object = doc.objects.swap_remove(position);
            if let DocOutcome::Failed(source) = object.outcome {
                doc.error = Some(ManifestError::Inject {
                    index: index + 1,
                    id: object.id,
                    source,
                });
            }
        }
        if doc.error.is_some() {
            doc.output = None;
        }
    }
    let written = || docs.iter().filter(|d| d.error.is_none());
    let left_alone = written()
        .flat_map(|d| &d.objects)
        .filter(|o| o.left_alone())
        .filter_map(|o| o.verdict(inj))
        .collect();
    let warnings = written()
        .flat_map(|d| &d.objects)
        .flat_map(|o| o.warnings.iter().map(|w| format!("{}: {w}", o.id)))
        .collect();
    let mut yaml = String::with_capacity(text.len() * 2);
    let mut errors = Vec::new();
    for (i, doc) in docs.into_iter().enumerate() {
        let error = match &doc.output {
            Some(value) => write_changed(&doc.marker, &doc.source, value, &mut yaml)
                .err()
                .map(|message| ManifestError::Write {
                    index: i + 1,
                    id: doc.id.clone(),
                    message,
                }),
            None => None,
        };
        if doc.output.is_none() || error.is_some() {
            yaml.push_str(&doc.marker);
            yaml.push_str(&doc.source);
        }
        errors.extend(doc.error.or(error));
    }
    Injected {
        yaml,
        left_alone,
        warnings,
        errors,
    }
}

/// Writes a changed document in its place: its marker, the comments and blank lines before
/// and after its content as they were, and between them its new content, as JSON when it was
/// written as JSON, else as YAML (its other comments are not kept). The stream's last byte
/// stays what it was.
pub(crate) fn write_changed(
    marker: &str,
    source: &str,
    value: &Value,
    out: &mut String,
) -> Result<(), String> {
    let lines: Vec<&str> = source.split_inclusive('\n').collect();
    let comment = |line: &str| {
        let t = line.trim();
        t.is_empty() || t.starts_with('#')
    };
    let lead = lines.iter().take_while(|l| comment(l)).count();
    // At the end, only comments at the first column: an indented `#` line there may be a
    // block scalar's.
    let trail = lines[lead..]
        .iter()
        .rev()
        .take_while(|l| l.trim().is_empty() || l.starts_with('#'))
        .count();
    let head: String = lines[..lead].concat();
    let tail: String = lines[lines.len() - trail..].concat();
    let body = lines[lead..lines.len() - trail].concat();
    let mut text = if body.trim_start().starts_with('{') {
        serde_json::to_string_pretty(value).map_err(|e| e.to_string())? + "\n"
    } else {
        serde_saphyr::to_string(value).map_err(|e| e.to_string())?
    };
    if !text.ends_with('\n') {
        text.push('\n');
    }
    out.push_str(marker);
    if !marker.is_empty() && head.is_empty() {
        // The content started on the marker's line (`--- {...}`): it goes on the next.
        out.push('\n');
    }
    out.push_str(&head);
    out.push_str(&text);
    out.push_str(&tail);
    if tail.is_empty() && !source.ends_with('\n') && !source.is_empty() {
        out.pop();
    }
    Ok(())
}

pub(crate) fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// Decides one object (a document, or a List's item) of document `index`; the object with its
/// pod template injected, when something was added.
fn process_one(
    inj: &Injector,
    index: usize,
    value: &Value,
    target: &Target<'_>,
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
) -> Result<(Object, Option<Value>), ManifestError> {
    let namespace = target.namespace;
    let (kind, api_version) = (str_at(value, "/kind"), str_at(value, "/apiVersion"));
    let id = object_id(value);
    let passthrough = |id: String, outcome| {
        let object = Object {
            id,
            outcome,
            labelled: false,
            refused: false,
            namespace_guessed: false,
            warnings: Vec::new(),
        };
        Ok((object, None))
    };
    let Some(tokens) = template_path(value) else {
        return passthrough(id, not_a_template(inj, value, kind, api_version));
    };
    let Some(template) = at(value, tokens) else {
        return passthrough(id, DocOutcome::Passthrough);
    };
    let pointer = jsonptr::PointerBuf::from_tokens(tokens.iter().copied());
    let pod = to_pod(template).map_err(|message| ManifestError::PodTemplate {
        index,
        id: id.clone(),
        message,
    })?;
    let own = Some(str_at(value, "/metadata/namespace")).filter(|ns| !ns.is_empty());
    let namespace_guessed = own.is_none() && namespace.is_none();
    let pod_json = crate::engine::view::pod_json(&pod);
    let view = PodView::parse(&pod_json).map_err(|e| ManifestError::PodTemplate {
        index,
        id: id.clone(),
        message: e.to_string(),
    })?;
    let labelled = view.label(&inj.config.inject_label) == Some("true");
    let mut facts = PodFacts::new(&view, own.or(namespace));
    facts.namespace_labels = namespaces
        .get(facts.namespace)
        .or(target.namespace_labels.as_ref());
    if !tokens.is_empty() {
        // In the cluster the pod's controller is this workload (for a Deployment, through its
        // ReplicaSet), so templates see it as `pod.owner`.
        facts.workload = Some(Owner {
            kind: kind.to_owned(),
            name: str_at(value, "/metadata/name").to_owned(),
        });
    }
    let refused = required_opt_out(inj, &facts) == Some(OptOut::Refused);
    let mut patch = None;
    let mut warnings = Vec::new();
    let outcome = match decide(inj, &facts) {
        Err(error) => DocOutcome::Failed(error),
        Ok(Decision::NotOptedIn) => {
            DocOutcome::NotOptedIn(opt_in(inj, &facts).err().unwrap_or_default())
        }
        Ok(Decision::Skip(reason)) => DocOutcome::Skipped(reason),
        Ok(Decision::Inject(plan)) => {
            let templates = plan.templates.iter().map(|t| t.name.clone()).collect();
            let edits = plan_edits(inj, &view, &plan);
            warnings.clone_from(&plan.notes);
            if edits.is_empty() {
                DocOutcome::AlreadyInjected { templates }
            } else {
                patch = Some(to_patch(&view, &edits).json().into_owned());
                DocOutcome::Injected {
                    entry: plan.entry,
                    templates,
                    changes: edits.iter().map(Edit::describe).collect(),
                }
            }
        }
    };
    let output = match patch {
        Some(patch) => {
            let mut value = value.clone();
            let target =
                value
                    .pointer_mut(pointer.as_str())
                    .ok_or_else(|| ManifestError::Patch {
                        index,
                        id: id.clone(),
                        message: "pod template vanished".into(),
                    })?;
            let patch: json_patch::Patch =
                serde_json::from_slice(&patch).map_err(|e| ManifestError::Patch {
                    index,
                    id: id.clone(),
                    message: e.to_string(),
                })?;
            // One operation at a time, each with the members it adds into made first (an
            // earlier operation may create them).
            for op in patch.0 {
                make_parents(target, &op);
                json_patch::patch(target, &[op]).map_err(|e| ManifestError::Patch {
                    index,
                    id: id.clone(),
                    message: e.to_string(),
                })?;
            }
            Some(value)
        }
        None => None,
    };
    let object = Object {
        id,
        outcome,
        labelled,
        refused,
        namespace_guessed,
        warnings,
    };
    Ok((object, output))
}

/// Creates, as empty objects, the members an operation adds into that are missing or `null` in
/// `target` (a pod template written without `metadata`, or with `metadata: null`): the
/// engine read the template as a typed pod, which always has them.
fn make_parents(target: &mut Value, op: &json_patch::PatchOperation) {
    let json_patch::PatchOperation::Add(add) = op else {
        return;
    };
    let Some(parent) = add.path.parent() else {
        return;
    };
    let mut at = target;
    for token in parent.tokens() {
        at = match at {
            Value::Object(fields) => {
                let slot = fields
                    .entry(token.decoded().into_owned())
                    .or_insert(Value::Null);
                if slot.is_null() {
                    *slot = Value::Object(serde_json::Map::new());
                }
                slot
            }
            Value::Array(items) => match token
                .to_index()
                .ok()
                .and_then(|i| i.for_len(items.len()).ok())
            {
                Some(i) => &mut items[i],
                None => return,
            },
            _ => return,
        };
    }
}

/// For an object without a pod template ([`template_path`]): [`DocOutcome::NotATemplate`] when
/// it is of a kind the injector does not know and its `spec.template` (or
/// `spec.jobTemplate.spec.template`) carries the opt-in label, so that it is not left alone
/// silently; else [`DocOutcome::Passthrough`].
fn not_a_template(inj: &Injector, value: &Value, kind: &str, api_version: &str) -> DocOutcome {
    if kind.is_empty() || api_version.is_empty() || pod_template_path(api_version, kind).is_some() {
        return DocOutcome::Passthrough;
    }
    let label = &inj.config.inject_label;
    let opted_in = [TEMPLATE, JOB_TEMPLATE].into_iter().find(|path| {
        at(value, path)
            .and_then(|t| t.pointer("/metadata/labels"))
            .and_then(|labels| labels.get(label))
            .and_then(Value::as_str)
            == Some("true")
    });
    match opted_in {
        Some(path) => DocOutcome::NotATemplate(format!(
            "its {} carries {label}=\"true\", but it is not a pod template (its spec.containers is not a list), so it is left as it is",
            path.join(".")
        )),
        None => DocOutcome::Passthrough,
    }
}

/// Reads a pod template (or a pod) as a pod: the two share `metadata` and `spec`.
pub(crate) fn to_pod(template: &Value) -> Result<Pod, String> {
    let t: PodTemplateSpec = serde_json::from_value(template.clone()).map_err(|e| e.to_string())?;
    Ok(Pod {
        metadata: t.metadata.unwrap_or_default(),
        spec: t.spec,
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEPLOYMENT: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  template:\n    metadata:\n      labels:\n        sidecar-injector.io/inject: \"true\"\n    spec:\n      containers:\n        - name: app\n          image: nginx:1.27\n";

    #[test]
    fn splits_on_markers_only() {
        let text = "a: 1\n---\nb: |\n  ---x\n--- \nc: 3\n---";
        let docs = split_documents(text);
        let texts: Vec<&str> = docs.iter().map(|d| d.text).collect();
        assert_eq!(texts, ["a: 1\n", "\nb: |\n  ---x\n", " \nc: 3\n", ""]);
        let joined: String = docs.iter().flat_map(|d| [d.marker, d.text]).collect();
        assert_eq!(joined, text);
        assert_eq!(split_documents("---\n{}\n")[0].marker, "---");
        assert!(split_documents("").is_empty());
    }

    #[test]
    fn yaml_1_1_integers_are_read_as_kubectl_reads_them() {
        let v = read_document(
            "a: 0400\nb: 0644\nc: 0x1F\nd: 0o17\ne: 0b101\nf: 08\ng: 1.0\nh: 1.5\ni: '0644'\nj: 0\nk: -012\n",
        )
        .expect("YAML");
        assert_eq!(
            v,
            serde_json::json!({"a": 256, "b": 420, "c": 31, "d": 15, "e": 5, "f": 8, "g": 1,
                               "h": 1.5, "i": "0644", "j": 0, "k": -10})
        );
    }

    const JOB_NO_METADATA: &str = "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: pi\n  namespace: shop\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n        - name: pi\n          image: perl:5.34\n";

    #[test]
    fn a_template_without_metadata_is_given_it() {
        let inj = Injector::embedded(None).expect("embedded");
        let target = Target {
            namespace: None,
            namespace_labels: Some(BTreeMap::from([(
                "sidecar-injector.io/inject".to_owned(),
                "enabled".to_owned(),
            )])),
        };
        for template in [
            "",
            "    metadata:\n",
            "    metadata: null\n",
            "    metadata: {}\n",
        ] {
            let text =
                JOB_NO_METADATA.replace("  template:\n", &format!("  template:\n{template}"));
            let once = inject_each(&inj, &text, &target);
            assert!(once.errors.is_empty(), "{template:?}: {:?}", once.errors);
            let out = read_document(&once.yaml).expect("YAML");
            assert!(
                out.pointer("/spec/template/metadata/annotations").is_some(),
                "{template:?}: {}",
                once.yaml
            );
            let twice = inject_each(&inj, &once.yaml, &target);
            assert_eq!(twice.yaml, once.yaml, "{template:?}: a fixed point");
        }
    }

    #[test]
    fn markers_comments_and_the_last_byte_are_kept() {
        let inj = Injector::embedded(None).expect("embedded");
        let deployment = DEPLOYMENT.replace("  name: web\n", "  name: web\n  namespace: shop\n");
        // A single document with a leading marker, a flow-style JSON one, and a file without
        // a final newline.
        for text in [
            format!("---\n# leading\n{deployment}# trailing\n"),
            format!("--- # on the marker\n{deployment}"),
            format!("a: 1\n---\n{deployment}---\nb: 2"),
            format!("{}\n", deployment.trim_end()),
        ] {
            let once = inject_each(&inj, &text, &Target::default());
            assert!(once.errors.is_empty(), "{:?}", once.errors);
            let before = split_documents(&text);
            let after = split_documents(&once.yaml);
            assert_eq!(before.len(), after.len(), "{}", once.yaml);
            for (b, a) in before.iter().zip(&after) {
                assert_eq!(a.marker, b.marker, "{}", once.yaml);
                let injected = read_document(a.text).expect("YAML")["kind"] == "Deployment";
                if !injected {
                    assert_eq!(a.text, b.text);
                }
            }
            assert_eq!(once.yaml.ends_with('\n'), text.ends_with('\n'));
            for kept in ["# leading\n", "# trailing\n", "--- # on the marker\n"] {
                assert_eq!(once.yaml.contains(kept), text.contains(kept), "{kept}");
            }
            let twice = inject_each(&inj, &once.yaml, &Target::default());
            assert_eq!(twice.yaml, once.yaml);
        }
        let json = format!(
            "---\n{}\n",
            serde_json::to_string(&read_document(&deployment).expect("YAML")).expect("JSON")
        );
        let once = inject_each(&inj, &json, &Target::default());
        assert!(once.yaml.starts_with("---\n{"), "{}", once.yaml);
        serde_json::from_str::<Value>(&once.yaml[4..]).expect("still JSON");
    }

    #[test]
    fn a_document_that_cannot_be_read_is_left_as_it_was() {
        let inj = Injector::embedded(None).expect("embedded");
        let deployment = DEPLOYMENT.replace("  name: web\n", "  name: web\n  namespace: shop\n");
        let broken = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: bad}\nspec:\n  template:\n    spec:\n      containers: 7\n";
        let text = format!("b: [\n---\n{broken}---\n{deployment}");
        let out = inject_each(&inj, &text, &Target::default());
        let errors: Vec<String> = out.errors.iter().map(ToString::to_string).collect();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(
            errors[0].starts_with("document 1: invalid YAML"),
            "{errors:?}"
        );
        assert!(
            errors[1].starts_with("document 2 (Deployment/bad)"),
            "{errors:?}"
        );
        let docs = split_documents(&out.yaml);
        assert_eq!(docs[0].text, "b: [\n");
        assert_eq!(docs[1].text, format!("\n{broken}"));
        assert!(docs[2].text.contains("log-shipper"), "{}", out.yaml);
        let report = crate::engine::explain::explain_for(&inj, &text, &Target::default());
        assert_eq!(report.errors.len(), 2);
        assert!(
            report.text.contains("Deployment/web: injected"),
            "{}",
            report.text
        );
        assert!(
            report.text.contains("document 1: invalid YAML"),
            "{}",
            report.text
        );
    }

    #[test]
    fn injects_a_deployment_and_is_idempotent() {
        let inj = Injector::embedded(None).expect("embedded");
        let input = format!(
            "# a comment kept\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n---\n{DEPLOYMENT}"
        );
        let shop = Target {
            namespace: Some("shop"),
            namespace_labels: None,
        };
        let once = inject_each(&inj, &input, &shop).yaml;
        assert!(once.starts_with("# a comment kept\n"), "{once}");
        assert!(once.contains("name: log-shipper"), "{once}");
        assert!(
            once.contains("sidecar-injector.io/inject: 'true'")
                || once.contains("sidecar-injector.io/inject: \"true\""),
            "{once}"
        );
        let docs = process_for(&inj, &once, &shop);
        assert!(
            matches!(
                docs[1].objects[0].outcome,
                DocOutcome::AlreadyInjected { .. }
            ),
            "{:?}",
            docs[1].objects[0].outcome
        );
        assert_eq!(inject_each(&inj, &once, &shop).yaml, once);
    }

    #[test]
    fn bad_yaml_names_the_document() {
        let inj = Injector::embedded(None).expect("embedded");
        let err = inject(&inj, "a: 1\n---\nb: [\n", None).expect_err("bad yaml");
        assert!(
            err.to_string().starts_with("document 2: invalid YAML"),
            "{err}"
        );
    }

    fn object(text: &str) -> Value {
        serde_saphyr::from_str(text).expect("YAML")
    }

    #[test]
    fn any_kind_with_a_pod_template_has_one() {
        let rollout = object(
            "apiVersion: argoproj.io/v1alpha1\nkind: Rollout\nspec: {template: {spec: {containers: []}}}\n",
        );
        assert_eq!(template_path(&rollout), Some(TEMPLATE));
        let scheduled = object(
            "apiVersion: example.com/v1\nkind: Nightly\nspec: {jobTemplate: {spec: {template: {spec: {containers: [{name: a}]}}}}}\n",
        );
        assert_eq!(template_path(&scheduled), Some(JOB_TEMPLATE));
        for text in [
            // No containers list: a VM, a template of something else.
            "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nspec: {template: {spec: {domain: {}}}}\n",
            "apiVersion: example.com/v1\nkind: Thing\nspec: {template: {spec: {containers: {a: 1}}}}\n",
            // Not a Kubernetes object (a Helm values file, say).
            "spec: {template: {spec: {containers: []}}}\n",
            "apiVersion: v1\nkind: List\nitems: []\nspec: {template: {spec: {containers: []}}}\n",
        ] {
            assert_eq!(template_path(&object(text)), None, "{text}");
        }
        // Known kinds keep their own place, whatever else they hold.
        let job = object(
            "apiVersion: batch/v1\nkind: Job\nspec: {jobTemplate: {spec: {template: {spec: {containers: []}}}}}\n",
        );
        assert_eq!(template_path(&job), Some(TEMPLATE));
    }

    #[test]
    fn a_list_is_injected_item_by_item_and_keeps_its_shape() {
        let inj = Injector::embedded(None).expect("embedded");
        let item = DEPLOYMENT
            .replace(
                "metadata:\n  name: web\n",
                "metadata:\n  name: web\n  namespace: shop\n",
            )
            .lines()
            .map(|l| format!("  {l}\n"))
            .collect::<String>();
        let list = format!(
            "apiVersion: v1\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {{name: web, namespace: shop}}\n-{}kind: List\nmetadata:\n  resourceVersion: \"\"\n",
            &item[1..]
        );
        let docs = process(&inj, &list, None);
        assert_eq!(docs.len(), 1);
        let ids: Vec<&str> = docs[0].objects.iter().map(|o| o.id.as_str()).collect();
        assert_eq!(ids, ["Service/web", "Deployment/web"]);
        assert!(matches!(
            docs[0].objects[0].outcome,
            DocOutcome::Passthrough
        ));
        assert!(matches!(
            docs[0].objects[1].outcome,
            DocOutcome::Injected { .. }
        ));
        let out = docs[0].output.as_ref().expect("injected");
        assert_eq!(out["kind"], "List");
        assert_eq!(out["metadata"]["resourceVersion"], "");
        assert_eq!(out["items"][0], object(&list)["items"][0]);
        assert!(
            out.pointer("/items/1/spec/template/spec/initContainers/0")
                .is_some()
        );

        // The same List as kubectl's JSON: one document, read as YAML.
        let json = serde_json::to_string_pretty(&object(&list)).expect("JSON");
        let docs = process(&inj, &json, None);
        assert_eq!(docs[0].output.as_ref(), Some(out));

        // An empty List is a document with nothing in it.
        let empty = "apiVersion: v1\nitems: []\nkind: List\nmetadata:\n  resourceVersion: \"\"\n";
        let injected = inject(&inj, empty, None).expect("reads");
        assert_eq!(injected.yaml, empty);
        assert!(injected.left_alone.is_empty());
    }

    #[test]
    fn an_item_without_a_namespace_is_refused_by_its_document() {
        let inj = Injector::embedded(None).expect("embedded");
        let item = DEPLOYMENT
            .lines()
            .map(|l| format!("  {l}\n"))
            .collect::<String>();
        let list = format!("apiVersion: v1\nkind: List\nitems:\n-{}", &item[1..]);
        let err = inject(&inj, &format!("a: 1\n---\n{list}"), None).expect_err("no namespace");
        assert!(
            err.to_string()
                .starts_with("document 2 (Deployment/web) has no metadata.namespace"),
            "{err}"
        );
    }

    #[test]
    fn cronjob_template_is_found() {
        assert_eq!(
            pod_template_path("batch/v1", "CronJob"),
            Some(&["spec", "jobTemplate", "spec", "template"][..])
        );
        assert_eq!(pod_template_path("v1", "Service"), None);
        assert_eq!(pod_template_path("example.com/v1", "Deployment"), None);
    }
}
