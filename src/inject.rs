//! The injection decision: whether a pod is injected, with what, and the edits that get it there.
//!
//! Everything is decided once, as a list of [`Edit`]s. The edits are then written either as a
//! JSONPatch ([`to_patch`]) for the API server or applied to a typed pod ([`apply`]); a property
//! test holds the two encodings equal.

use std::collections::{BTreeMap, BTreeSet};

use json_patch::{AddOperation, Patch, PatchOperation};
use jsonptr::PointerBuf;
use k8s_openapi::api::core::v1::{
    Container, EnvVar, LocalObjectReference, Pod, PodSpec, Volume, VolumeMount,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::{Injector, NAMESPACE_ENABLED};
use crate::overrides::BadValue;
use crate::template::{Fragment, Owner, PodContext, TemplateError};

/// Why an opted-in pod was not injected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SkipReason {
    ExcludedNamespace(String),
    HostNetwork,
    Windows,
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ExcludedNamespace(ns) => {
                write!(f, "namespace {ns:?} is excluded from injection (excludedNamespaces)")
            }
            Self::HostNetwork => f.write_str("hostNetwork pods are skipped (skip.hostNetwork)"),
            Self::Windows => f.write_str(
                "Windows pods are skipped: no selected template sets supportsWindows (skip.windows)",
            ),
        }
    }
}

/// One rendered template.
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    pub name: String,
    pub fragment: std::sync::Arc<Fragment>,
}

/// What the injector decided for a pod.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// The pod does not carry the opt-in label with the value "true".
    NotOptedIn,
    /// The pod opted in but a rule says it is not injected.
    Skip(SkipReason),
    /// The pod gets these templates.
    Inject(Plan),
}

/// Which of the chart's webhook entries sent a request, that is, which selectors the API server
/// matched. A review carries no namespace labels, so the engine cannot check a namespace's
/// opt-in itself: the chart registers one entry per rule with selectors that cannot overlap,
/// each calling its own path, and the path tells the engine which rule the API server applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Entry {
    /// The pod's own label opted it in (`/mutate`, `/validate`): the pod carries
    /// `inject: "true"`, its namespace is not opted in, and its revision label names this
    /// installation's revision (absent for the default revision).
    #[default]
    Pod,
    /// Its namespace is labelled `inject: enabled` and names this installation's revision
    /// (`/mutate/namespace`, `/validate/namespace`); the pod does not say `inject: "false"`.
    Namespace,
}

impl Entry {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pod => "pod",
            Self::Namespace => "namespace",
        }
    }

    /// The rule, in words, for `explain` and logs.
    pub fn describe(self, inj: &Injector) -> String {
        let cfg = &inj.config;
        let revision = match cfg.revision.as_str() {
            "" => String::new(),
            r => format!(" with {}={r}", cfg.revision_label),
        };
        match self {
            Self::Pod => format!("the pod's label {}=\"true\"{revision}", cfg.inject_label),
            Self::Namespace => format!(
                "its namespace's label {}={NAMESPACE_ENABLED}{revision}",
                cfg.inject_label
            ),
        }
    }
}

/// The templates a pod gets, rendered, and the status annotation describing them.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The rule that opted the pod in.
    pub entry: Entry,
    pub templates: Vec<Rendered>,
    /// Value of the status annotation.
    pub status: String,
    /// Templates left out (with the reason), reported as warnings.
    pub notes: Vec<String>,
}

/// The status annotation's value.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct Status {
    pub templates: Vec<String>,
    pub hash: String,
    /// Sidecar names the pod already had when it was first injected: the injector left those
    /// containers alone, so the validator does not hold them to the template.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<String>,
    /// The revision of the installation that injected the pod; absent for the default one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub revision: String,
    /// What of the pod the rendering saw, so that the validator and a reinvocation render from
    /// the same containers and volumes, whatever was added to the pod after us. Always written
    /// (`{}` when it saw nothing); absent only in a status written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Seen>,
}

/// The names of the pod's own containers, init containers and volumes a rendering saw.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Seen {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub init_containers: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<String>,
}

/// A request the injector cannot honour; the user sees the message.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error(
        "annotation {annotation} asks for template {name:?}, which does not exist (known templates: {known})"
    )]
    UnknownTemplate {
        annotation: String,
        name: String,
        known: String,
    },
    #[error("template {template:?}: {source}")]
    BadOverride {
        template: String,
        #[source]
        source: Box<BadValue>,
    },
    #[error(transparent)]
    Template(#[from] TemplateError),
}

/// The pod fields the decision reads, with the request's namespace filled in.
pub struct PodFacts<'a> {
    pub pod: &'a Pod,
    pub namespace: &'a str,
    /// The webhook entry that sent the pod (from the path the API server called).
    pub entry: Entry,
    /// The namespace's labels, when they are known (offline, from a Namespace document or the
    /// command line). Then they decide the entry, as the chart's selectors would; a webhook
    /// never knows them and goes by [`Self::entry`].
    pub namespace_labels: Option<&'a BTreeMap<String, String>>,
    /// The controlling workload, when known better than the pod says (offline: the workload
    /// document a pod template comes from).
    pub workload: Option<Owner>,
}

static EMPTY: BTreeMap<String, String> = BTreeMap::new();

impl<'a> PodFacts<'a> {
    /// `request_namespace` is used when the object carries none (pods created in a namespace
    /// through the API often have `metadata.namespace` unset at admission).
    pub fn new(pod: &'a Pod, request_namespace: Option<&'a str>) -> Self {
        let namespace = pod
            .metadata
            .namespace
            .as_deref()
            .filter(|ns| !ns.is_empty())
            .or(request_namespace)
            .unwrap_or("default");
        Self {
            pod,
            namespace,
            entry: Entry::Pod,
            namespace_labels: None,
            workload: None,
        }
    }

    /// The same pod, sent by `entry`.
    pub fn with_entry(mut self, entry: Entry) -> Self {
        self.entry = entry;
        self
    }

    fn labels(&self) -> &'a BTreeMap<String, String> {
        self.pod.metadata.labels.as_ref().unwrap_or(&EMPTY)
    }

    fn annotations(&self) -> &'a BTreeMap<String, String> {
        self.pod.metadata.annotations.as_ref().unwrap_or(&EMPTY)
    }

    /// The status annotation, when it parses.
    fn status(&self, inj: &Injector) -> Option<Status> {
        self.annotations()
            .get(&inj.config.status_annotation)
            .and_then(|v| serde_json::from_str::<Status>(v).ok())
    }

    /// The template context: a projection of the pod that reads the same in the mutating and
    /// the validating webhook and on reinvocation.
    ///
    /// - The name is empty under `generateName` (the API server names the pod in between).
    /// - Labels and annotations leave out the status annotation and every key the templates
    ///   set themselves.
    /// - `spec` keeps the pod's own containers and init containers (not the sidecars of any
    ///   template) with the fields other admission plugins leave alone (name, image, command,
    ///   args, workingDir, ports: not env, mounts, resources or imagePullPolicy), the pod's own
    ///   volumes (not the templates', not a ServiceAccount token volume, whose name is random),
    ///   and the scheduling and security fields a person writes.
    /// - With `only` (from the status annotation of an earlier rendering), just the containers
    ///   and volumes that rendering saw: what another webhook or plugin added after it is not
    ///   part of the context.
    fn context(&self, inj: &Injector, only: Option<&Seen>) -> (PodContext<'a>, Seen) {
        let meta = &self.pod.metadata;
        let generate_name = meta.generate_name.as_deref().unwrap_or("");
        // The API server names a generateName pod after mutating admission: the mutator sees no
        // name and the validator sees the generated one. Render both with no name so they agree.
        let name = if generate_name.is_empty() {
            meta.name.as_deref().unwrap_or("")
        } else {
            ""
        };
        let owned = inj.templates.owned();
        let labels = self
            .labels()
            .iter()
            .filter(|(k, _)| !owned.labels.contains(*k))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let annotations = self
            .annotations()
            .iter()
            .filter(|(k, _)| !owned.annotations.contains(*k) && **k != inj.config.status_annotation)
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let spec = self.pod.spec.as_ref();
        let (spec_value, seen) = match spec {
            Some(spec) => project_spec(spec, owned, only),
            None => (
                serde_json::Value::Object(Default::default()),
                Seen::default(),
            ),
        };
        let ctx = PodContext {
            name,
            generate_name,
            namespace: self.namespace,
            labels,
            annotations,
            service_account: spec
                .and_then(|s| s.service_account_name.as_deref())
                .filter(|s| !s.is_empty())
                .unwrap_or("default"),
            spec: spec_value,
            owner: self.owner(),
        };
        (ctx, seen)
    }

    /// The controlling workload: the controller owner reference, with a ReplicaSet named
    /// `<deployment>-<pod-template-hash>` read as its Deployment.
    fn owner(&self) -> Owner {
        if let Some(workload) = &self.workload {
            return workload.clone();
        }
        let Some(owner) = self
            .pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
        else {
            return Owner::default();
        };
        if owner.kind == "ReplicaSet" && owner.api_version.starts_with("apps/") {
            let deployment = self
                .labels()
                .get("pod-template-hash")
                .filter(|h| !h.is_empty())
                .and_then(|hash| owner.name.strip_suffix(hash.as_str()))
                .and_then(|n| n.strip_suffix('-'))
                .filter(|n| !n.is_empty());
            if let Some(name) = deployment {
                return Owner {
                    kind: "Deployment".into(),
                    name: name.into(),
                };
            }
        }
        Owner {
            kind: owner.kind.clone(),
            name: owner.name.clone(),
        }
    }

    fn is_windows(&self) -> bool {
        let Some(spec) = self.pod.spec.as_ref() else {
            return false;
        };
        spec.os.as_ref().is_some_and(|os| os.name == "windows")
            || spec
                .node_selector
                .as_ref()
                .and_then(|s| s.get("kubernetes.io/os"))
                .is_some_and(|os| os == "windows")
    }
}

/// A ServiceAccount token volume as the ServiceAccount admission plugin adds it: its name is
/// random per pod, so it is never part of the template context.
fn is_token_volume(v: &Volume) -> bool {
    v.name.starts_with("kube-api-access-")
        && v.projected.as_ref().is_some_and(|p| {
            p.sources
                .iter()
                .flatten()
                .any(|s| s.service_account_token.is_some())
        })
}

/// The spec as templates see it (see [`PodFacts::context`]) and the names it was built from.
fn project_spec(
    spec: &PodSpec,
    owned: &crate::template::Owned,
    only: Option<&Seen>,
) -> (serde_json::Value, Seen) {
    use serde_json::{Map, Value};
    let mut seen = Seen::default();
    let mut out = Map::new();
    let keep = |name: &str, listed: Option<&Vec<String>>| {
        !owned.sidecars.contains(name) && listed.is_none_or(|l| l.iter().any(|n| n == name))
    };
    let project = |c: &Container| {
        let mut m = Map::new();
        m.insert("name".into(), c.name.clone().into());
        if let Some(image) = &c.image {
            m.insert("image".into(), image.clone().into());
        }
        if let Some(command) = &c.command {
            m.insert("command".into(), json(command));
        }
        if let Some(args) = &c.args {
            m.insert("args".into(), json(args));
        }
        if let Some(dir) = &c.working_dir {
            m.insert("workingDir".into(), dir.clone().into());
        }
        if let Some(ports) = &c.ports {
            m.insert("ports".into(), json(ports));
        }
        Value::Object(m)
    };
    let containers: Vec<Value> = spec
        .containers
        .iter()
        .filter(|c| keep(&c.name, only.map(|o| &o.containers)))
        .inspect(|c| seen.containers.push(c.name.clone()))
        .map(project)
        .collect();
    out.insert("containers".into(), Value::Array(containers));
    let init: Vec<Value> = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| keep(&c.name, only.map(|o| &o.init_containers)))
        .inspect(|c| seen.init_containers.push(c.name.clone()))
        .map(project)
        .collect();
    out.insert("initContainers".into(), Value::Array(init));
    let volumes: Vec<Value> = spec
        .volumes
        .iter()
        .flatten()
        .filter(|v| {
            !owned.volumes.contains(&v.name)
                && !is_token_volume(v)
                && only.is_none_or(|o| o.volumes.contains(&v.name))
        })
        .inspect(|v| seen.volumes.push(v.name.clone()))
        .map(json)
        .collect();
    out.insert("volumes".into(), Value::Array(volumes));
    let mut field = |key: &str, value: Option<Value>| {
        if let Some(value) = value {
            out.insert(key.into(), value);
        }
    };
    field("nodeSelector", spec.node_selector.as_ref().map(json));
    field("securityContext", spec.security_context.as_ref().map(json));
    field("hostNetwork", spec.host_network.map(Value::from));
    field("os", spec.os.as_ref().map(json));
    field(
        "priorityClassName",
        spec.priority_class_name.clone().map(Value::from),
    );
    field(
        "runtimeClassName",
        spec.runtime_class_name.clone().map(Value::from),
    );
    field(
        "restartPolicy",
        spec.restart_policy.clone().map(Value::from),
    );
    field(
        "shareProcessNamespace",
        spec.share_process_namespace.map(Value::from),
    );
    field("hostname", spec.hostname.clone().map(Value::from));
    field("subdomain", spec.subdomain.clone().map(Value::from));
    (Value::Object(out), seen)
}

fn revision_name(revision: &str) -> String {
    match revision {
        "" => "the default revision".into(),
        r => format!("revision {r:?}"),
    }
}

/// Which rule opts the pod in, or why none does (in words, for `explain`).
pub fn opt_in(inj: &Injector, facts: &PodFacts<'_>) -> Result<Entry, String> {
    let cfg = &inj.config;
    let label = facts.labels().get(&cfg.inject_label).map(String::as_str);
    let entry = match facts.namespace_labels {
        None => facts.entry,
        Some(ns) if ns.get(&cfg.inject_label).map(String::as_str) == Some(NAMESPACE_ENABLED) => {
            let revision = ns.get(&cfg.revision_label).map_or("", String::as_str);
            if revision != cfg.revision {
                return Err(format!(
                    "its namespace {:?} opts in ({}={NAMESPACE_ENABLED}) for {}, and this injector is {}",
                    facts.namespace,
                    cfg.inject_label,
                    revision_name(revision),
                    revision_name(&cfg.revision)
                ));
            }
            Entry::Namespace
        }
        Some(_) => Entry::Pod,
    };
    match entry {
        Entry::Pod => {
            if label != Some("true") {
                let namespace = match facts.namespace_labels {
                    Some(_) => format!(
                        " and its namespace does not carry {}={NAMESPACE_ENABLED}",
                        cfg.inject_label
                    ),
                    None => String::new(),
                };
                return Err(format!(
                    "it does not carry the label {}=\"true\"{namespace}",
                    cfg.inject_label
                ));
            }
            let revision = facts
                .labels()
                .get(&cfg.revision_label)
                .map_or("", String::as_str);
            if revision != cfg.revision {
                return Err(format!(
                    "it asks for {} ({}), and this injector is {}",
                    revision_name(revision),
                    cfg.revision_label,
                    revision_name(&cfg.revision)
                ));
            }
        }
        Entry::Namespace => {
            if label == Some("false") {
                return Err(format!(
                    "its namespace opts it in, but the pod opts out with {}=\"false\"",
                    cfg.inject_label
                ));
            }
        }
    }
    Ok(entry)
}

/// Decides whether and how a pod is injected. Pure: the same pod and configuration always give
/// the same decision.
pub fn decide(inj: &Injector, facts: &PodFacts<'_>) -> Result<Decision, InjectError> {
    let cfg = &inj.config;
    let Ok(entry) = opt_in(inj, facts) else {
        return Ok(Decision::NotOptedIn);
    };
    if inj.is_excluded_namespace(facts.namespace) {
        return Ok(Decision::Skip(SkipReason::ExcludedNamespace(
            facts.namespace.to_owned(),
        )));
    }
    let spec = facts.pod.spec.as_ref();
    if cfg.skip.host_network && spec.and_then(|s| s.host_network).unwrap_or(false) {
        return Ok(Decision::Skip(SkipReason::HostNetwork));
    }
    let names = selected_templates(inj, facts)?;
    let mut overrides = Vec::with_capacity(names.len());
    for name in &names {
        let values = inj
            .templates
            .overrides_for(name, facts.annotations())
            .map_err(|source| InjectError::BadOverride {
                template: name.clone(),
                source: Box::new(source),
            })?;
        overrides.push(values);
    }
    let windows = cfg.skip.windows && facts.is_windows();
    let render = |ctx: &PodContext<'_>| -> Result<(Vec<Rendered>, Vec<String>), InjectError> {
        let mut templates = Vec::with_capacity(names.len());
        let mut notes = Vec::new();
        for (name, overrides) in names.iter().zip(&overrides) {
            let fragment = inj.templates.render(name, ctx, overrides)?;
            if windows && !fragment.supports_windows {
                notes.push(format!(
                    "template {name:?} was not injected: it does not support Windows pods"
                ));
                continue;
            }
            templates.push(Rendered {
                name: name.clone(),
                fragment,
            });
        }
        Ok((templates, notes))
    };
    // An earlier rendering (the mutator's, seen again by a reinvocation or the validator) is
    // repeated from what it saw, so that what was added to the pod since does not change it.
    // Its status is trusted only if that reproduces it exactly.
    let previous = facts.status(inj).filter(|p| p.revision == cfg.revision);
    let mut again = None;
    if let Some((previous, context)) = previous
        .as_ref()
        .and_then(|p| Some((p, p.context.as_ref()?)))
    {
        let (ctx, seen) = facts.context(inj, Some(context));
        let (templates, notes) = render(&ctx)?;
        let same = fragment_hash(&templates) == previous.hash
            && templates
                .iter()
                .map(|t| &t.name)
                .eq(previous.templates.iter());
        if same {
            again = Some((templates, notes, seen));
        }
    }
    let (templates, mut notes, seen) = match again {
        Some(again) => again,
        None => {
            let (ctx, seen) = facts.context(inj, None);
            let (templates, notes) = render(&ctx)?;
            (templates, notes, seen)
        }
    };
    if templates.is_empty() && windows {
        return Ok(Decision::Skip(SkipReason::Windows));
    }
    let hash = fragment_hash(&templates);
    let kept = kept_containers(inj, facts, &templates, &hash, &mut notes);
    let status = serde_json::to_string(&Status {
        templates: templates.iter().map(|t| t.name.clone()).collect(),
        hash,
        kept,
        revision: cfg.revision.clone(),
        context: Some(seen),
    })
    .unwrap_or_default();
    Ok(Decision::Inject(Plan {
        entry,
        templates,
        status,
        notes,
    }))
}

/// The template names a pod asks for: its annotation, else the configured default.
fn selected_templates(inj: &Injector, facts: &PodFacts<'_>) -> Result<Vec<String>, InjectError> {
    let cfg = &inj.config;
    let Some(list) = facts.annotations().get(&cfg.templates_annotation) else {
        return Ok(cfg.default_templates.clone());
    };
    let mut names: Vec<String> = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !inj.templates.contains(name) {
            return Err(InjectError::UnknownTemplate {
                annotation: cfg.templates_annotation.clone(),
                name: name.to_owned(),
                known: inj.templates.names().collect::<Vec<_>>().join(", "),
            });
        }
        if !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

/// Sidecar names the pod brought itself. Decided when a template is first injected and carried
/// in the status annotation afterwards, so a reinvocation (which sees our own sidecars) agrees.
/// A status is trusted only if it describes exactly this rendering (same templates, same hash);
/// any other status (stale, copied, hand-written) is ignored and what exists now is kept.
fn kept_containers(
    inj: &Injector,
    facts: &PodFacts<'_>,
    templates: &[Rendered],
    hash: &str,
    notes: &mut Vec<String>,
) -> Vec<String> {
    let names: Vec<&str> = templates.iter().map(|t| t.name.as_str()).collect();
    let previous = facts
        .annotations()
        .get(&inj.config.status_annotation)
        .and_then(|v| serde_json::from_str::<Status>(v).ok())
        .filter(|p| p.hash == hash && p.templates == names)
        .unwrap_or(Status {
            templates: Vec::new(),
            hash: String::new(),
            kept: Vec::new(),
            revision: String::new(),
            context: None,
        });
    let spec = facts.pod.spec.as_ref();
    let existing: BTreeSet<&str> = spec
        .map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
                .map(|c| c.name.as_str())
                .collect()
        })
        .unwrap_or_default();
    let mut kept = Vec::new();
    for t in templates {
        let injected_before = previous.templates.contains(&t.name);
        for name in t.fragment.sidecar_names() {
            let keep = if injected_before {
                previous.kept.iter().any(|k| k == name)
            } else {
                existing.contains(name)
            };
            if keep {
                if !injected_before {
                    notes.push(format!(
                        "the pod already has a container named {name:?}; it was kept and template {:?}'s sidecar was not injected",
                        t.name
                    ));
                }
                kept.push(name.to_owned());
            }
        }
    }
    kept
}

/// A short hash of what the templates rendered, for the status annotation.
fn fragment_hash(templates: &[Rendered]) -> String {
    let mut hasher = Sha256::new();
    for t in templates {
        hasher.update(t.name.as_bytes());
        hasher.update([0]);
        hasher.update(t.fragment.digest);
    }
    hasher
        .finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

// === Edits ===

/// One change to a pod. Indices refer to `spec.containers` of the pod as it arrived.
// A handful of edits live for one request; boxing the container would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Edit {
    /// Init containers placed, in this order, before the pod's own.
    PrependInitContainers(Vec<Container>),
    AppendContainer(Container),
    AddVolume(Volume),
    AddImagePullSecret(LocalObjectReference),
    AddVolumeMount {
        container: usize,
        mount: VolumeMount,
    },
    AddEnv {
        container: usize,
        env: EnvVar,
    },
    SetLabel {
        key: String,
        value: String,
    },
    SetAnnotation {
        key: String,
        value: String,
    },
}

/// The edits that take `pod` to its injected state: only what is missing. Applying the
/// edits and planning again yields no edits (the fixed point).
pub fn plan_edits(inj: &Injector, pod: &Pod, plan: &Plan) -> Vec<Edit> {
    let empty_spec = Default::default();
    let spec = pod.spec.as_ref().unwrap_or(&empty_spec);
    let init = spec.init_containers.as_deref().unwrap_or_default();
    let mut taken: BTreeSet<&str> = spec
        .containers
        .iter()
        .chain(init)
        .map(|c| c.name.as_str())
        .collect();
    let sidecars: BTreeSet<&str> = plan
        .templates
        .iter()
        .flat_map(|t| t.fragment.sidecar_names())
        .collect();
    let mut volumes: BTreeSet<&str> = spec
        .volumes
        .iter()
        .flatten()
        .map(|v| v.name.as_str())
        .collect();
    let mut secrets: BTreeSet<&str> = spec
        .image_pull_secrets
        .iter()
        .flatten()
        .map(|s| s.name.as_str())
        .collect();

    let mut edits = Vec::new();
    let mut new_init = Vec::new();
    let mut appended = Vec::new();
    for t in &plan.templates {
        for c in &t.fragment.init_containers {
            if taken.insert(&c.name) {
                new_init.push(c.clone());
            }
        }
        for c in &t.fragment.containers {
            if taken.insert(&c.name) {
                appended.push(Edit::AppendContainer(c.clone()));
            }
        }
    }
    if !new_init.is_empty() {
        edits.push(Edit::PrependInitContainers(new_init));
    }
    edits.extend(appended);
    for t in &plan.templates {
        for v in &t.fragment.volumes {
            if volumes.insert(&v.name) {
                edits.push(Edit::AddVolume(v.clone()));
            }
        }
        for s in &t.fragment.image_pull_secrets {
            if secrets.insert(&s.name) {
                edits.push(Edit::AddImagePullSecret(s.clone()));
            }
        }
    }

    // Mounts and env reach every application container present now, including containers
    // another webhook added after us, so that reinvocation converges.
    for (index, container) in spec.containers.iter().enumerate() {
        if sidecars.contains(container.name.as_str()) {
            continue;
        }
        let mounts = container.volume_mounts.as_deref().unwrap_or_default();
        let mut mount_names: BTreeSet<&str> = mounts.iter().map(|m| m.name.as_str()).collect();
        let mut mount_paths: BTreeSet<&str> =
            mounts.iter().map(|m| m.mount_path.as_str()).collect();
        let mut env_names: BTreeSet<&str> = container
            .env
            .iter()
            .flatten()
            .map(|e| e.name.as_str())
            .collect();
        for t in &plan.templates {
            for m in &t.fragment.volume_mounts {
                if !mount_names.contains(m.name.as_str())
                    && !mount_paths.contains(m.mount_path.as_str())
                {
                    mount_names.insert(&m.name);
                    mount_paths.insert(&m.mount_path);
                    edits.push(Edit::AddVolumeMount {
                        container: index,
                        mount: m.clone(),
                    });
                }
            }
            for e in &t.fragment.env {
                if env_names.insert(&e.name) {
                    edits.push(Edit::AddEnv {
                        container: index,
                        env: e.clone(),
                    });
                }
            }
        }
    }

    let labels = pod.metadata.labels.as_ref().unwrap_or(&EMPTY);
    let annotations = pod.metadata.annotations.as_ref().unwrap_or(&EMPTY);
    let mut new_labels = BTreeSet::new();
    let mut new_annotations = BTreeSet::new();
    for t in &plan.templates {
        for (key, value) in &t.fragment.labels {
            if !labels.contains_key(key) && new_labels.insert(key) {
                edits.push(Edit::SetLabel {
                    key: key.clone(),
                    value: value.clone(),
                });
            }
        }
        for (key, value) in &t.fragment.annotations {
            if *key != inj.config.status_annotation
                && !annotations.contains_key(key)
                && new_annotations.insert(key)
            {
                edits.push(Edit::SetAnnotation {
                    key: key.clone(),
                    value: value.clone(),
                });
            }
        }
    }
    // The status annotation is ours: it always describes the current injection.
    if annotations.get(&inj.config.status_annotation) != Some(&plan.status) {
        edits.push(Edit::SetAnnotation {
            key: inj.config.status_annotation.clone(),
            value: plan.status.clone(),
        });
    }
    edits
}

/// Applies edits to a typed pod.
pub fn apply(pod: &mut Pod, edits: &[Edit]) {
    for edit in edits {
        let spec = pod.spec.get_or_insert_with(Default::default);
        match edit {
            Edit::PrependInitContainers(cs) => {
                let init = spec.init_containers.get_or_insert_with(Vec::new);
                init.splice(0..0, cs.iter().cloned());
            }
            Edit::AppendContainer(c) => spec.containers.push(c.clone()),
            Edit::AddVolume(v) => spec.volumes.get_or_insert_with(Vec::new).push(v.clone()),
            Edit::AddImagePullSecret(s) => {
                spec.image_pull_secrets
                    .get_or_insert_with(Vec::new)
                    .push(s.clone());
            }
            Edit::AddVolumeMount { container, mount } => {
                if let Some(c) = spec.containers.get_mut(*container) {
                    c.volume_mounts
                        .get_or_insert_with(Vec::new)
                        .push(mount.clone());
                }
            }
            Edit::AddEnv { container, env } => {
                if let Some(c) = spec.containers.get_mut(*container) {
                    c.env.get_or_insert_with(Vec::new).push(env.clone());
                }
            }
            Edit::SetLabel { key, value } => {
                pod.metadata
                    .labels
                    .get_or_insert_with(Default::default)
                    .insert(key.clone(), value.clone());
            }
            Edit::SetAnnotation { key, value } => {
                pod.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(key.clone(), value.clone());
            }
        }
    }
}

/// Writes edits as a JSONPatch against the pod they were planned for. Pointers are built from
/// tokens, so `~` and `/` in keys are escaped by construction; a missing array or map is created
/// whole instead of appended to.
pub fn to_patch(pod: &Pod, edits: &[Edit]) -> Patch {
    let mut ops = Vec::with_capacity(edits.len());
    let mut created: BTreeSet<PointerBuf> = BTreeSet::new();
    let spec = pod.spec.as_ref();
    let has_init = spec.is_some_and(|s| s.init_containers.is_some());
    let has_volumes = spec.is_some_and(|s| s.volumes.is_some());
    let has_secrets = spec.is_some_and(|s| s.image_pull_secrets.is_some());
    let container = |i: usize| spec.and_then(|s| s.containers.get(i));
    let has_labels = pod.metadata.labels.is_some();
    let has_annotations = pod.metadata.annotations.is_some();

    // Appends `value` to the array at `array`, creating the array if the pod had none.
    let mut append = |ops: &mut Vec<PatchOperation>,
                      exists: bool,
                      array: PointerBuf,
                      value: serde_json::Value| {
        if exists || created.contains(&array) {
            let mut path = array;
            path.push_back("-");
            ops.push(add(path, value));
        } else {
            created.insert(array.clone());
            ops.push(add(array, serde_json::Value::Array(vec![value])));
        }
    };
    let mut map_created = (false, false);

    for edit in edits {
        match edit {
            Edit::PrependInitContainers(cs) => {
                let array = PointerBuf::from_tokens(["spec", "initContainers"]);
                if has_init {
                    for (i, c) in cs.iter().enumerate() {
                        let mut path = array.clone();
                        path.push_back(i);
                        ops.push(add(path, json(c)));
                    }
                } else {
                    ops.push(add(
                        array,
                        serde_json::Value::Array(cs.iter().map(json).collect()),
                    ));
                }
            }
            Edit::AppendContainer(c) => {
                append(
                    &mut ops,
                    true,
                    PointerBuf::from_tokens(["spec", "containers"]),
                    json(c),
                );
            }
            Edit::AddVolume(v) => {
                append(
                    &mut ops,
                    has_volumes,
                    PointerBuf::from_tokens(["spec", "volumes"]),
                    json(v),
                );
            }
            Edit::AddImagePullSecret(s) => {
                let array = PointerBuf::from_tokens(["spec", "imagePullSecrets"]);
                append(&mut ops, has_secrets, array, json(s));
            }
            Edit::AddVolumeMount {
                container: i,
                mount,
            } => {
                let exists = container(*i).is_some_and(|c| c.volume_mounts.is_some());
                let array =
                    PointerBuf::from_tokens(["spec", "containers", &i.to_string(), "volumeMounts"]);
                append(&mut ops, exists, array, json(mount));
            }
            Edit::AddEnv { container: i, env } => {
                let exists = container(*i).is_some_and(|c| c.env.is_some());
                let array = PointerBuf::from_tokens(["spec", "containers", &i.to_string(), "env"]);
                append(&mut ops, exists, array, json(env));
            }
            Edit::SetLabel { key, value } => {
                set_entry(
                    &mut ops,
                    has_labels,
                    &mut map_created.0,
                    "labels",
                    key,
                    value,
                );
            }
            Edit::SetAnnotation { key, value } => {
                set_entry(
                    &mut ops,
                    has_annotations,
                    &mut map_created.1,
                    "annotations",
                    key,
                    value,
                );
            }
        }
    }
    Patch(ops)
}

fn set_entry(
    ops: &mut Vec<PatchOperation>,
    exists: bool,
    created: &mut bool,
    map: &str,
    key: &str,
    value: &str,
) {
    if !exists && !*created {
        *created = true;
        let mut object = serde_json::Map::new();
        object.insert(key.to_owned(), value.into());
        ops.push(add(
            PointerBuf::from_tokens(["metadata", map]),
            object.into(),
        ));
    } else {
        // `add` on an existing member replaces it, which is what the status annotation needs.
        ops.push(add(
            PointerBuf::from_tokens(["metadata", map, key]),
            value.into(),
        ));
    }
}

fn add(path: PointerBuf, value: serde_json::Value) -> PatchOperation {
    PatchOperation::Add(AddOperation { path, value })
}

fn json<T: Serialize>(value: &T) -> serde_json::Value {
    // k8s-openapi types always serialize; Null would only ever reach a test's eyes.
    serde_json::to_value(value).unwrap_or(serde_json::Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn injector() -> Injector {
        Injector::embedded(Some("sidecar-injector".into())).expect("embedded config loads")
    }

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).expect("valid pod")
    }

    fn opted_in() -> Pod {
        pod(serde_json::json!({
            "metadata": {"name": "web", "labels": {"sidecar-injector.io/inject": "true"}},
            "spec": {"containers": [{"name": "app", "image": "nginx:1.27"}]}
        }))
    }

    #[test]
    fn label_must_be_exactly_true() {
        let inj = injector();
        for value in ["false", "True", "yes", ""] {
            let mut p = opted_in();
            p.metadata.labels =
                Some([("sidecar-injector.io/inject".to_owned(), value.to_owned())].into());
            let d = decide(&inj, &PodFacts::new(&p, Some("default"))).expect("decides");
            assert_eq!(d, Decision::NotOptedIn, "value {value:?}");
        }
    }

    fn canary() -> Injector {
        let config = crate::config::DEFAULT_CONFIG.replace("revision: \"\"", "revision: canary");
        Injector::from_sources(
            "canary.yaml",
            &config,
            crate::config::bundled_templates(),
            None,
        )
        .expect("canary config loads")
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// Which rule opts a pod in, for every combination of pod label, revision label and entry
    /// (the path the API server called), as the chart's selectors route them.
    #[test]
    fn the_entry_and_the_revision_decide_the_opt_in() {
        let (default, canary) = (injector(), canary());
        let pod_with = |pairs: &[(&str, &str)]| {
            let mut p = opted_in();
            p.metadata.labels = Some(labels(pairs));
            p
        };
        let inject = "sidecar-injector.io/inject";
        let rev = "sidecar-injector.io/rev";
        // Pod labels, the entry that sent the pod, and which entry opts it in for the default
        // and the canary revision.
        type Case<'a> = (
            &'a [(&'a str, &'a str)],
            Entry,
            Option<Entry>,
            Option<Entry>,
        );
        let cases: [Case<'_>; 8] = [
            (&[(inject, "true")], Entry::Pod, Some(Entry::Pod), None),
            (
                &[(inject, "true"), (rev, "canary")],
                Entry::Pod,
                None,
                Some(Entry::Pod),
            ),
            (&[], Entry::Pod, None, None),
            (&[(inject, "false")], Entry::Pod, None, None),
            (
                &[],
                Entry::Namespace,
                Some(Entry::Namespace),
                Some(Entry::Namespace),
            ),
            (
                &[(inject, "yes")],
                Entry::Namespace,
                Some(Entry::Namespace),
                Some(Entry::Namespace),
            ),
            (&[(inject, "false")], Entry::Namespace, None, None),
            (
                &[(inject, "true"), (rev, "other")],
                Entry::Namespace,
                Some(Entry::Namespace),
                Some(Entry::Namespace),
            ),
        ];
        for (pairs, entry, for_default, for_canary) in cases {
            let p = pod_with(pairs);
            let facts = PodFacts::new(&p, Some("shop")).with_entry(entry);
            assert_eq!(
                opt_in(&default, &facts).ok(),
                for_default,
                "{pairs:?} {entry:?}"
            );
            assert_eq!(
                opt_in(&canary, &facts).ok(),
                for_canary,
                "{pairs:?} {entry:?}"
            );
        }
    }

    /// With the namespace's labels known (offline), they pick the entry as the chart would.
    #[test]
    fn known_namespace_labels_pick_the_entry() {
        let (default, canary) = (injector(), canary());
        let p = pod(
            serde_json::json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "app"}]}}),
        );
        let enabled = labels(&[("sidecar-injector.io/inject", "enabled")]);
        let enabled_canary = labels(&[
            ("sidecar-injector.io/inject", "enabled"),
            ("sidecar-injector.io/rev", "canary"),
        ]);
        let plain = labels(&[("team", "a")]);
        let decide_with = |inj: &Injector, ns: &BTreeMap<String, String>| {
            let mut facts = PodFacts::new(&p, Some("shop"));
            facts.namespace_labels = Some(ns);
            opt_in(inj, &facts)
        };
        assert_eq!(decide_with(&default, &enabled), Ok(Entry::Namespace));
        assert_eq!(decide_with(&canary, &enabled_canary), Ok(Entry::Namespace));
        let why = decide_with(&default, &enabled_canary).expect_err("another revision's");
        assert!(why.contains("revision \"canary\""), "{why}");
        assert!(decide_with(&canary, &enabled).is_err());
        let why = decide_with(&default, &plain).expect_err("not opted in");
        assert!(why.contains("its namespace does not carry"), "{why}");
    }

    #[test]
    fn excluded_namespaces_and_own_namespace_are_skipped() {
        let inj = injector();
        let p = opted_in();
        for ns in [
            "kube-system",
            "kube-public",
            "kube-node-lease",
            "sidecar-injector",
        ] {
            let d = decide(&inj, &PodFacts::new(&p, Some(ns))).expect("decides");
            assert_eq!(d, Decision::Skip(SkipReason::ExcludedNamespace(ns.into())));
        }
    }

    #[test]
    fn object_namespace_wins_over_request_namespace() {
        let mut p = opted_in();
        p.metadata.namespace = Some("kube-system".into());
        let facts = PodFacts::new(&p, Some("default"));
        assert_eq!(facts.namespace, "kube-system");
    }

    #[test]
    fn host_network_and_windows_are_skipped() {
        let inj = injector();
        let mut p = opted_in();
        if let Some(s) = p.spec.as_mut() {
            s.host_network = Some(true);
        }
        assert_eq!(
            decide(&inj, &PodFacts::new(&p, Some("default"))).expect("decides"),
            Decision::Skip(SkipReason::HostNetwork)
        );
        let mut p = opted_in();
        if let Some(s) = p.spec.as_mut() {
            s.node_selector = Some([("kubernetes.io/os".into(), "windows".into())].into());
        }
        assert_eq!(
            decide(&inj, &PodFacts::new(&p, Some("default"))).expect("decides"),
            Decision::Skip(SkipReason::Windows)
        );
    }

    #[test]
    fn unknown_template_is_an_error_naming_it() {
        let inj = injector();
        let mut p = opted_in();
        p.metadata.annotations =
            Some([("sidecar-injector.io/templates".into(), "proxy, nope".into())].into());
        let err = decide(&inj, &PodFacts::new(&p, Some("default"))).expect_err("unknown");
        assert!(err.to_string().contains("\"nope\""), "{err}");
    }

    #[test]
    fn missing_arrays_are_created_and_keys_escaped() {
        let inj = injector();
        let mut p = opted_in();
        p.metadata.annotations = None;
        let Decision::Inject(plan) =
            decide(&inj, &PodFacts::new(&p, Some("default"))).expect("decides")
        else {
            unreachable!("opted-in pod is injected")
        };
        let patch = serde_json::to_value(to_patch(&p, &plan_edits(&inj, &p, &plan))).expect("json");
        let paths: Vec<&str> = patch
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|op| op["path"].as_str())
            .collect();
        assert!(paths.contains(&"/spec/initContainers"), "{paths:?}");
        assert!(paths.contains(&"/spec/volumes"), "{paths:?}");
        assert!(paths.contains(&"/metadata/annotations"), "{paths:?}");
        assert!(
            paths.contains(&"/metadata/annotations/sidecar-injector.io~1status"),
            "{paths:?}"
        );
    }
}
