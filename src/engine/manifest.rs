//! Offline injection of manifests: multi-document YAML (or JSON, as `kubectl get -o yaml|json`
//! prints it) in, injected YAML out.
//!
//! Pods and the pod templates of workloads go through the same [`decide`] and edits as the
//! webhook; the edits are applied as the same JSONPatch. The items of a `kind: List` are
//! injected in place. A document that is not changed is written back byte for byte, comments
//! included, so injecting the output again changes nothing.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use serde_json::Value;

use crate::engine::config::Injector;
use crate::engine::context::Owner;
use crate::engine::inject::{
    Decision, Edit, Entry, InjectError, PodFacts, SkipReason, decide, opt_in, plan_edits, to_patch,
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
fn at<'a>(value: &'a Value, tokens: &[&str]) -> Option<&'a Value> {
    tokens.iter().try_fold(value, |v, token| v.get(*token))
}

/// The items of a `kind: List` (apiVersion v1), as `kubectl get -o yaml|json` prints several
/// objects.
fn list_items(value: &Value) -> Option<&Vec<Value>> {
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
            // Its label asks, but another revision's, or a namespace rule, decides.
            DocOutcome::NotOptedIn(_) => self.labelled,
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
    /// The document's text as it came in.
    pub source: String,
    /// `Kind/name` of its one object, or `List`, for reports.
    pub id: String,
    /// What it holds: itself, or the items of a `kind: List`, in their order.
    pub objects: Vec<Object>,
    /// The document with its pod templates injected, when something was added.
    pub output: Option<Value>,
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

/// Splits a YAML stream at its `---` document markers, keeping each document's text exact.
pub fn split_documents(text: &str) -> Vec<&str> {
    let mut docs = Vec::new();
    let mut start = 0;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let body = line.trim_end_matches(['\n', '\r']);
        if body == "---" || body.starts_with("--- ") || body.starts_with("---\t") {
            if offset > start {
                docs.push(&text[start..offset]);
            }
            // Content after the marker on the same line belongs to the new document.
            start = offset + 3;
        }
        offset += line.len();
    }
    if offset > start {
        docs.push(&text[start..]);
    }
    docs
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

/// Decides every document. A document that cannot be read stops here; a pod the injector
/// cannot honour (an unknown template) is reported in its object's [`Object::outcome`].
/// `namespace` is used for documents that name none (as `kubectl apply -n`).
pub fn process(
    inj: &Injector,
    text: &str,
    namespace: Option<&str>,
) -> Result<Vec<Doc>, ManifestError> {
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
pub fn process_for(
    inj: &Injector,
    text: &str,
    target: &Target<'_>,
) -> Result<Vec<Doc>, ManifestError> {
    let docs = split_documents(text);
    let mut values = Vec::with_capacity(docs.len());
    for (i, source) in docs.iter().enumerate() {
        let value = serde_saphyr::from_str::<Option<Value>>(source)
            .map_err(|e| ManifestError::Yaml {
                index: i + 1,
                message: e.to_string(),
            })?
            .unwrap_or(Value::Null);
        values.push(value);
    }
    let namespaces: BTreeMap<String, BTreeMap<String, String>> = values
        .iter()
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
    docs.into_iter()
        .zip(values)
        .enumerate()
        .map(|(i, (source, value))| {
            let index = i + 1;
            let (id, objects, output) = match list_items(&value) {
                Some(items) => {
                    let mut objects = Vec::with_capacity(items.len());
                    let mut injected = Vec::new();
                    for (position, item) in items.iter().enumerate() {
                        let (object, output) = process_one(inj, index, item, target, &namespaces)?;
                        objects.push(object);
                        injected.extend(output.map(|o| (position, o)));
                    }
                    let output = (!injected.is_empty()).then(|| {
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
                    ("List".to_owned(), objects, output)
                }
                None => {
                    let (object, output) = process_one(inj, index, &value, target, &namespaces)?;
                    (object.id.clone(), vec![object], output)
                }
            };
            Ok(Doc {
                source: source.to_owned(),
                id,
                objects,
                output,
            })
        })
        .collect()
}

/// What `inject` writes: the YAML stream, and one line for each opted-in pod or pod template
/// it leaves as it is, saying why (for standard error: nothing is left alone silently).
#[derive(Debug)]
pub struct Injected {
    pub yaml: String,
    pub left_alone: Vec<String>,
    /// The admission warnings of the injected objects, each after its `Kind/name`.
    pub warnings: Vec<String>,
}

/// `inject -f`: the injected YAML stream, or the first object that cannot be injected.
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
    let mut docs = process_for(inj, text, target)?;
    for (index, doc) in docs.iter_mut().enumerate() {
        if let Some(object) = doc
            .objects
            .iter()
            .find(|o| o.namespace_guessed && matches!(o.outcome, DocOutcome::Injected { .. }))
        {
            return Err(ManifestError::NoNamespace {
                index: index + 1,
                id: object.id.clone(),
            });
        }
        if let Some(position) = doc
            .objects
            .iter()
            .position(|o| matches!(o.outcome, DocOutcome::Failed(_)))
        {
            let object = doc.objects.swap_remove(position);
            if let DocOutcome::Failed(source) = object.outcome {
                return Err(ManifestError::Inject {
                    index: index + 1,
                    id: object.id,
                    source,
                });
            }
        }
    }
    let left_alone = docs
        .iter()
        .flat_map(|d| &d.objects)
        .filter(|o| o.left_alone())
        .filter_map(|o| o.verdict(inj))
        .collect();
    let warnings = docs
        .iter()
        .flat_map(|d| &d.objects)
        .flat_map(|o| o.warnings.iter().map(|w| format!("{}: {w}", o.id)))
        .collect();
    Ok(Injected {
        yaml: render(&docs)?,
        left_alone,
        warnings,
    })
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
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
    let name = match str_at(value, "/metadata/name") {
        "" => str_at(value, "/metadata/generateName"),
        n => n,
    };
    let id = format!("{kind}/{name}");
    let passthrough = |id: String, outcome| {
        let object = Object {
            id,
            outcome,
            labelled: false,
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
            json_patch::patch(target, &patch).map_err(|e| ManifestError::Patch {
                index,
                id: id.clone(),
                message: e.to_string(),
            })?;
            Some(value)
        }
        None => None,
    };
    let object = Object {
        id,
        outcome,
        labelled,
        namespace_guessed,
        warnings,
    };
    Ok((object, output))
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
fn to_pod(template: &Value) -> Result<Pod, String> {
    let t: PodTemplateSpec = serde_json::from_value(template.clone()).map_err(|e| e.to_string())?;
    Ok(Pod {
        metadata: t.metadata.unwrap_or_default(),
        spec: t.spec,
        status: None,
    })
}

/// Writes the documents back as one YAML stream: unchanged documents verbatim, injected ones
/// re-serialized.
pub fn render(docs: &[Doc]) -> Result<String, ManifestError> {
    let mut out = String::new();
    for (i, doc) in docs.iter().enumerate() {
        let text = match &doc.output {
            Some(value) => serde_saphyr::to_string(value).map_err(|e| ManifestError::Write {
                index: i + 1,
                id: doc.id.clone(),
                message: e.to_string(),
            })?,
            None => doc.source.trim_start_matches(['\n']).to_owned(),
        };
        if i > 0 || docs.len() > 1 {
            out.push_str("---");
            if !text.starts_with(['\n', ' ']) {
                out.push('\n');
            }
        }
        out.push_str(&text);
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEPLOYMENT: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  template:\n    metadata:\n      labels:\n        sidecar-injector.io/inject: \"true\"\n    spec:\n      containers:\n        - name: app\n          image: nginx:1.27\n";

    #[test]
    fn splits_on_markers_only() {
        let docs = split_documents("a: 1\n---\nb: |\n  ---x\n--- \nc: 3\n");
        assert_eq!(docs, ["a: 1\n", "\nb: |\n  ---x\n", " \nc: 3\n"]);
    }

    #[test]
    fn injects_a_deployment_and_is_idempotent() {
        let inj = Injector::embedded(None).expect("embedded");
        let input = format!(
            "# a comment kept\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n---\n{DEPLOYMENT}"
        );
        let once = render(&process(&inj, &input, None).expect("first")).expect("render");
        assert!(once.starts_with("---\n# a comment kept\n"), "{once}");
        assert!(once.contains("name: log-shipper"), "{once}");
        assert!(
            once.contains("sidecar-injector.io/inject: 'true'")
                || once.contains("sidecar-injector.io/inject: \"true\""),
            "{once}"
        );
        let docs = process(&inj, &once, None).expect("second");
        assert!(
            matches!(
                docs[1].objects[0].outcome,
                DocOutcome::AlreadyInjected { .. }
            ),
            "{:?}",
            docs[1].objects[0].outcome
        );
        assert_eq!(render(&docs).expect("render"), once);
    }

    #[test]
    fn bad_yaml_names_the_document() {
        let inj = Injector::embedded(None).expect("embedded");
        let err = process(&inj, "a: 1\n---\nb: [\n", None).expect_err("bad yaml");
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
        let docs = process(&inj, &list, None).expect("reads");
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
        let docs = process(&inj, &json, None).expect("reads JSON");
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
