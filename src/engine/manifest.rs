//! Offline injection of manifests: multi-document YAML in, injected YAML out.
//!
//! Pods and the pod templates of workload kinds go through the same [`decide`] and edits as the
//! webhook; the edits are applied as the same JSONPatch. A document that is not changed is
//! written back byte for byte, comments included, so injecting the output again changes nothing.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use serde_json::Value;

use crate::engine::config::Injector;
use crate::engine::inject::{
    Decision, Edit, Entry, InjectError, PodFacts, SkipReason, decide, opt_in, plan_edits, to_patch,
};
use crate::engine::template::Owner;
use crate::engine::view::PodView;

/// Where each kind keeps its pod template (JSON pointer tokens; empty: the object is a pod).
pub fn pod_template_path(api_version: &str, kind: &str) -> Option<&'static [&'static str]> {
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    match (group, kind) {
        ("", "Pod") => Some(&[]),
        ("", "ReplicationController")
        | ("apps", "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet") => {
            Some(&["spec", "template"])
        }
        ("batch", "Job") => Some(&["spec", "template"]),
        ("batch", "CronJob") => Some(&["spec", "jobTemplate", "spec", "template"]),
        _ => None,
    }
}

/// What happened to one document.
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
    Failed(InjectError),
}

/// One document of the input and its result.
#[derive(Debug)]
pub struct Doc {
    /// The document's text as it came in.
    pub source: String,
    /// `Kind/name`, for reports.
    pub id: String,
    pub outcome: DocOutcome,
    /// The injected object, when something was added.
    pub output: Option<Value>,
    /// The document names no namespace and none was given: it was rendered for `default`.
    pub namespace_guessed: bool,
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
/// cannot honour (an unknown template) is reported in its [`Doc::outcome`].
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

/// [`process`], with namespace labels: from the input's Namespace documents, else from
/// `target`. They decide namespace opt-in and revision as the chart's webhook entries would.
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
        .map(|(i, (source, value))| process_one(inj, i + 1, source, value, target, &namespaces))
        .collect()
}

/// `inject -f`: the injected YAML stream, or the first document that cannot be injected.
pub fn inject(
    inj: &Injector,
    text: &str,
    namespace: Option<&str>,
) -> Result<String, ManifestError> {
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
) -> Result<String, ManifestError> {
    let mut docs = process_for(inj, text, target)?;
    if let Some(index) = docs
        .iter()
        .position(|d| d.namespace_guessed && d.output.is_some())
    {
        return Err(ManifestError::NoNamespace {
            index: index + 1,
            id: docs.swap_remove(index).id,
        });
    }
    if let Some(index) = docs
        .iter()
        .position(|d| matches!(d.outcome, DocOutcome::Failed(_)))
    {
        let doc = docs.swap_remove(index);
        if let DocOutcome::Failed(source) = doc.outcome {
            return Err(ManifestError::Inject {
                index: index + 1,
                id: doc.id,
                source,
            });
        }
    }
    render(&docs)
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn process_one(
    inj: &Injector,
    index: usize,
    source: &str,
    value: Value,
    target: &Target<'_>,
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
) -> Result<Doc, ManifestError> {
    let namespace = target.namespace;
    let passthrough = |id: String| Doc {
        source: source.to_owned(),
        id,
        outcome: DocOutcome::Passthrough,
        output: None,
        namespace_guessed: false,
    };
    let (kind, api_version) = (str_at(&value, "/kind"), str_at(&value, "/apiVersion"));
    let name = match str_at(&value, "/metadata/name") {
        "" => str_at(&value, "/metadata/generateName"),
        n => n,
    };
    let id = format!("{kind}/{name}");
    let Some(tokens) = pod_template_path(api_version, kind) else {
        return Ok(passthrough(id));
    };
    let pointer = jsonptr::PointerBuf::from_tokens(tokens.iter().copied());
    let Some(template) = value.pointer(pointer.as_str()) else {
        return Ok(passthrough(id));
    };
    let pod = to_pod(template).map_err(|message| ManifestError::PodTemplate {
        index,
        id: id.clone(),
        message,
    })?;
    let own = Some(str_at(&value, "/metadata/namespace")).filter(|ns| !ns.is_empty());
    let namespace_guessed = own.is_none() && namespace.is_none();
    let pod_json = crate::engine::view::pod_json(&pod);
    let view = PodView::parse(&pod_json).map_err(|e| ManifestError::PodTemplate {
        index,
        id: id.clone(),
        message: e.to_string(),
    })?;
    let mut facts = PodFacts::new(&view, own.or(namespace));
    facts.namespace_labels = namespaces
        .get(facts.namespace)
        .or(target.namespace_labels.as_ref());
    if !tokens.is_empty() {
        // In the cluster the pod's controller is this workload (for a Deployment, through its
        // ReplicaSet), so templates see it as `pod.owner`.
        facts.workload = Some(Owner {
            kind: kind.to_owned(),
            name: str_at(&value, "/metadata/name").to_owned(),
        });
    }
    let mut patch = None;
    let outcome = match decide(inj, &facts) {
        Err(error) => DocOutcome::Failed(error),
        Ok(Decision::NotOptedIn) => {
            DocOutcome::NotOptedIn(opt_in(inj, &facts).err().unwrap_or_default())
        }
        Ok(Decision::Skip(reason)) => DocOutcome::Skipped(reason),
        Ok(Decision::Inject(plan)) => {
            let templates = plan.templates.iter().map(|t| t.name.clone()).collect();
            let edits = plan_edits(inj, &view, &plan);
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
    Ok(Doc {
        source: source.to_owned(),
        id,
        outcome,
        output,
        namespace_guessed,
    })
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
            matches!(docs[1].outcome, DocOutcome::AlreadyInjected { .. }),
            "{:?}",
            docs[1].outcome
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
