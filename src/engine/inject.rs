//! The injection decision: whether a pod is injected, with what, and the edits that get it there.
//!
//! Everything is decided once, as a list of [`Edit`]s. The edits are then written either as a
//! JSONPatch ([`to_patch`]) for the API server or applied to a typed pod ([`apply`]); a property
//! test holds the two encodings equal.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use arrayvec::ArrayVec;
use foldhash::HashSet;

use k8s_openapi::api::core::v1::{
    Container, EnvVar, LocalObjectReference, Pod, Volume, VolumeMount,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::engine::config::{Injector, NAMESPACE_ENABLED};
use crate::engine::json;
use crate::engine::overrides::BadValue;
use crate::engine::template::{
    Fragment, Keys, Owner, Piece, PodContext, Quoted, Reads, SpecField, TemplateError,
};
use crate::engine::view::{ContainerView, PodView, Raw, SpecView, Str, StrMap, VolumeView};

/// Why an opted-in pod was not injected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SkipReason {
    ExcludedNamespace(String),
    HostNetwork,
    Windows,
    /// The API server will refuse the pod whatever is added (no spec, no containers...): it is
    /// let through unchanged, so that the person sees the API server's own error.
    Malformed(&'static str),
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
            Self::Malformed(what) => write!(
                f,
                "{what}, so the API server refuses it whatever is added; it is left as it is, for the API server to say what to fix, and injected once it can be created"
            ),
        }
    }
}

/// One rendered template.
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    pub name: String,
    pub fragment: Arc<Fragment>,
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
    /// Value of the status annotation, and its JSON.
    pub status: Arc<Quoted>,
    /// Templates left out (with the reason), reported as warnings.
    pub notes: Vec<String>,
}

/// The status annotation's value.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct Status {
    pub templates: Vec<String>,
    pub hash: String,
    /// The digest of the configuration that injected the pod ([`Injector::digest`]): the
    /// backstop holds the pod to the contract of its own export only under the same one.
    /// Absent in a status written before it existed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub config: String,
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

/// The names a rendering saw, however they are held: lists 0, 1 and 2 are the containers, the
/// init containers and the volumes. The status of a rendering is remembered by these names, so
/// a review reads them from the request without copying them; they are copied into a [`Seen`]
/// only when a status is new.
trait SeenNames {
    fn len(&self, list: usize) -> usize;
    fn name(&self, list: usize, index: usize) -> &str;

    fn to_seen(&self) -> Seen {
        let list = |l| {
            (0..self.len(l))
                .map(|i| self.name(l, i).to_owned())
                .collect()
        };
        Seen {
            containers: list(0),
            init_containers: list(1),
            volumes: list(2),
        }
    }
}

impl Seen {
    /// Every list, destructured: a field added to `Seen` must be added here (and to the
    /// literal in [`SeenNames::to_seen`]), so it cannot be left out of a status's key.
    fn lists(&self) -> [&Vec<String>; 3] {
        let Seen {
            containers,
            init_containers,
            volumes,
        } = self;
        [containers, init_containers, volumes]
    }
}

impl SeenNames for Seen {
    fn len(&self, list: usize) -> usize {
        self.lists()[list].len()
    }

    fn name(&self, list: usize, index: usize) -> &str {
        &self.lists()[list][index]
    }
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
    /// A field the injector reads has a value k8s-openapi would not accept.
    #[error("the pod cannot be read: {0}")]
    Unread(#[from] serde_json::Error),
}

/// The pod fields the decision reads, with the request's namespace filled in.
pub struct PodFacts<'a> {
    pub pod: &'a PodView<'a>,
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

/// Appends tagged, length-prefixed fields: two keys are equal only if they hold the same
/// fields with the same bytes.
struct Key(Vec<u8>);

impl Key {
    /// Out of line: the key is built from some thirty fields, and a copy of this for each was
    /// code a cold review fetched.
    #[inline(never)]
    fn field(&mut self, tag: u8, bytes: &[u8]) {
        self.0.push(tag);
        self.0
            .extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        self.0.extend_from_slice(bytes);
    }

    fn raw(&mut self, tag: u8, raw: Option<Raw<'_>>) {
        if let Some(raw) = raw {
            self.field(tag, raw.get().as_bytes());
        }
    }

    fn text(&mut self, tag: u8, text: Option<&Str<'_>>) {
        if let Some(text) = text {
            self.field(tag, text.as_bytes());
        }
    }

    /// Labels or annotations: every entry (`all`, or [`Keys::All`]), each entry read, present
    /// or not ([`Keys::Some`]), or none.
    fn map<'e>(
        &mut self,
        tag: u8,
        keys: &Keys,
        all: bool,
        entries: impl Iterator<Item = (&'e str, &'e str)>,
    ) {
        match keys {
            Keys::None if !all => {}
            Keys::Some(read) if !all => {
                // Sized from the start (the iterator filters, so `collect` would start small
                // and grow).
                let mut list = Vec::with_capacity(entries.size_hint().1.unwrap_or(0));
                list.extend(entries);
                let entries = list;
                for k in read {
                    self.field(tag, k.as_bytes());
                    match entries.iter().find(|(have, _)| have == k) {
                        Some((_, v)) => self.field(tag + 1, v.as_bytes()),
                        None => self.field(40, b""),
                    }
                }
            }
            _ => {
                for (k, v) in entries {
                    self.field(tag, k.as_bytes());
                    self.field(tag + 1, v.as_bytes());
                }
            }
        }
    }
}

impl<'a> PodFacts<'a> {
    /// `request_namespace` is used when the object carries none (pods created in a namespace
    /// through the API often have `metadata.namespace` unset at admission).
    pub fn new(pod: &'a PodView<'a>, request_namespace: Option<&'a str>) -> Self {
        let namespace = pod
            .meta()
            .namespace
            .as_ref()
            .map(|ns| ns.as_str())
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

    fn labels(&self) -> &'a StrMap<'a> {
        self.pod.labels()
    }

    fn annotations(&self) -> &'a StrMap<'a> {
        self.pod.annotations()
    }

    /// The status annotation, when it parses.
    fn status(&self, inj: &Injector) -> Option<Status> {
        self.pod
            .annotation(&inj.config.status_annotation)
            .and_then(|v| serde_json::from_str::<Status>(v).ok())
    }

    /// The name templates see: empty under `generateName`. The API server names a
    /// generateName pod after mutating admission: the mutator sees no name and the validator
    /// sees the generated one. Both render with no name so that they agree.
    fn context_name(&self) -> &'a str {
        match self.pod.generate_name() {
            "" => self.pod.name(),
            _ => "",
        }
    }

    fn context_labels(&self, inj: &Injector) -> impl Iterator<Item = (&'a str, &'a str)> {
        let owned = &inj.templates.owned().labels;
        self.labels()
            .iter()
            .filter(move |(k, _)| !owned.contains(k.as_str()))
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }

    fn context_annotations<'s>(
        &self,
        inj: &'s Injector,
    ) -> impl Iterator<Item = (&'a str, &'a str)> + use<'a, 's> {
        let owned = &inj.templates.owned().annotations;
        let status = inj.config.status_annotation.as_str();
        self.annotations()
            .iter()
            .filter(move |(k, _)| !owned.contains(k.as_str()) && k.as_str() != status)
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }

    fn service_account(&self) -> &'a str {
        self.pod
            .spec
            .as_ref()
            .map(|s| s.service_account_name())
            .filter(|s| !s.is_empty())
            .unwrap_or("default")
    }

    /// Which of the pod's own containers, init containers and volumes the template context
    /// shows: not the sidecars or volumes of any template, not a ServiceAccount token volume
    /// (its name is random), and with `only`, just those an earlier rendering saw.
    fn seen(&self, inj: &Injector, only: Option<&Seen>) -> Result<Shown<'a>, serde_json::Error> {
        let owned = inj.templates.owned();
        let keep = |name: &str, listed: Option<&Vec<String>>| {
            !owned.sidecars.contains(name) && listed.is_none_or(|l| l.iter().any(|n| n == name))
        };
        let volumes = self.pod.spec.as_ref().map_or(&[][..], |s| s.volumes());
        let mut shown = Shown {
            containers: self
                .pod
                .containers()
                .iter()
                .filter(|c| keep(&c.name, only.map(|o| &o.containers)))
                .collect(),
            init_containers: self
                .pod
                .init_containers()
                .iter()
                .filter(|c| keep(&c.name, only.map(|o| &o.init_containers)))
                .collect(),
            // Room for all of them at once: pushed one by one from empty, the list was
            // reallocated as it grew, on every review.
            volumes: Vec::with_capacity(volumes.len()),
        };
        for v in volumes {
            if !owned.volumes.contains(v.name.as_str())
                && only.is_none_or(|o| o.volumes.iter().any(|n| *n == *v.name))
                && !v.is_token_volume()?
            {
                shown.volumes.push(v);
            }
        }
        Ok(shown)
    }

    /// The key of the template context (see [`Self::context`]) for the render cache of a
    /// template that reads `reads` of it, built from the request's own bytes: equal keys, equal
    /// contexts as far as the template can tell.
    fn context_key(
        &self,
        inj: &Injector,
        shown: &Shown<'a>,
        reads: &Reads,
        start: Vec<u8>,
    ) -> Vec<u8> {
        let all = reads.all;
        let wants = |field: SpecField| reads.spec_field(field);
        let mut key = Key(start);
        key.0.push(b'V');
        if all || reads.name {
            key.field(1, self.context_name().as_bytes());
        }
        if all || reads.generate_name {
            key.field(2, self.pod.generate_name().as_bytes());
        }
        if all || reads.namespace {
            key.field(3, self.namespace.as_bytes());
        }
        key.map(4, &reads.labels, all, self.context_labels(inj));
        key.map(6, &reads.annotations, all, self.context_annotations(inj));
        if all || reads.service_account {
            key.field(8, self.service_account().as_bytes());
        }
        if all || reads.owner {
            let owner = self.owner();
            key.field(9, owner.kind.as_bytes());
            key.field(10, owner.name.as_bytes());
        }
        let lists = [
            (11, SpecField::Containers, &shown.containers),
            (12, SpecField::InitContainers, &shown.init_containers),
        ];
        for (tag, field, list) in lists {
            if !wants(field) {
                continue;
            }
            key.field(tag, b"");
            for c in list {
                key.field(tag, c.name.as_bytes());
                key.raw(13, c.image);
                key.raw(14, c.command);
                key.raw(15, c.args);
                key.raw(16, c.working_dir);
                key.raw(17, c.ports);
            }
        }
        if wants(SpecField::Volumes) {
            for v in &shown.volumes {
                key.field(18, b"");
                for (name, raw) in &v.members {
                    key.field(18, name.as_bytes());
                    key.field(18, raw.get().as_bytes());
                }
            }
        }
        if let Some(spec) = &self.pod.spec {
            if wants(SpecField::NodeSelector) {
                for (k, v) in spec.node_selector.iter().flatten() {
                    key.field(19, k.as_bytes());
                    key.field(20, v.as_bytes());
                }
                if spec.node_selector.is_some() {
                    key.field(21, b"");
                }
            }
            if wants(SpecField::SecurityContext) {
                key.raw(22, spec.security_context);
            }
            if wants(SpecField::HostNetwork)
                && let Some(host) = spec.host_network
            {
                key.field(23, &[u8::from(host)]);
            }
            if wants(SpecField::Os) {
                key.raw(24, spec.os);
            }
            let texts = [
                (25, SpecField::PriorityClassName, &spec.priority_class_name),
                (26, SpecField::RuntimeClassName, &spec.runtime_class_name),
                (27, SpecField::RestartPolicy, &spec.restart_policy),
                (29, SpecField::Hostname, &spec.hostname),
                (30, SpecField::Subdomain, &spec.subdomain),
            ];
            for (tag, field, value) in texts {
                if wants(field) {
                    key.text(tag, value.as_ref());
                }
            }
            if wants(SpecField::ShareProcessNamespace)
                && let Some(share) = spec.share_process_namespace
            {
                key.field(28, &[u8::from(share)]);
            }
        }
        key.0
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
    ///
    /// Fields are read as k8s-openapi types, so a value of the wrong type is an error here.
    fn context(
        &self,
        inj: &Injector,
        shown: &Shown<'a>,
    ) -> Result<PodContext<'a>, serde_json::Error> {
        Ok(PodContext {
            name: self.context_name(),
            generate_name: self.pod.generate_name(),
            namespace: self.namespace,
            labels: self.context_labels(inj).collect(),
            annotations: self.context_annotations(inj).collect(),
            service_account: self.service_account(),
            spec: match &self.pod.spec {
                Some(spec) => project_spec(spec, shown)?,
                None => serde_json::Value::Object(Default::default()),
            },
            owner: self.owner(),
        })
    }

    /// The controlling workload: the controller owner reference, with a ReplicaSet named
    /// `<deployment>-<pod-template-hash>` read as its Deployment.
    fn owner(&self) -> Owner {
        if let Some(workload) = &self.workload {
            return workload.clone();
        }
        let Some(owner) = self
            .pod
            .meta()
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
        else {
            return Owner::default();
        };
        if owner.kind() == "ReplicaSet" && owner.api_version().starts_with("apps/") {
            let deployment = self
                .labels()
                .get("pod-template-hash")
                .filter(|h| !h.is_empty())
                .and_then(|hash| owner.name().strip_suffix(hash.as_str()))
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
            kind: owner.kind().to_owned(),
            name: owner.name().to_owned(),
        }
    }

    fn is_windows(&self) -> Result<bool, serde_json::Error> {
        let Some(spec) = self.pod.spec.as_ref() else {
            return Ok(false);
        };
        Ok(spec.os_name()?.is_some_and(|os| os == "windows")
            || spec
                .node_selector
                .as_ref()
                .and_then(|s| s.get("kubernetes.io/os"))
                .is_some_and(|os| os.as_str() == "windows"))
    }
}

/// The pod's own containers, init containers and volumes a template context shows.
#[derive(Default)]
struct Shown<'a> {
    containers: Vec<&'a ContainerView<'a>>,
    init_containers: Vec<&'a ContainerView<'a>>,
    volumes: Vec<&'a VolumeView<'a>>,
}

impl SeenNames for Shown<'_> {
    fn len(&self, list: usize) -> usize {
        match list {
            0 => self.containers.len(),
            1 => self.init_containers.len(),
            _ => self.volumes.len(),
        }
    }

    fn name(&self, list: usize, index: usize) -> &str {
        match list {
            0 => &self.containers[index].name,
            1 => &self.init_containers[index].name,
            _ => &self.volumes[index].name,
        }
    }
}

/// Reads a field the typed way (k8s-openapi), as JSON for the template context.
fn typed<T: serde::de::DeserializeOwned + Serialize>(
    json: &str,
) -> Result<serde_json::Value, serde_json::Error> {
    serde_json::to_value(serde_json::from_str::<T>(json)?)
}

/// The spec as templates see it (see [`PodFacts::context`]).
fn project_spec(
    spec: &SpecView<'_>,
    shown: &Shown<'_>,
) -> Result<serde_json::Value, serde_json::Error> {
    use k8s_openapi::api::core::v1::{ContainerPort, PodOS, PodSecurityContext};
    use serde_json::{Map, Value};
    let mut out = Map::new();
    let project = |c: &ContainerView<'_>| -> Result<Value, serde_json::Error> {
        let mut m = Map::new();
        m.insert("name".into(), c.name.as_str().into());
        if let Some(image) = c.image {
            m.insert("image".into(), typed::<String>(image.get())?);
        }
        if let Some(command) = c.command {
            m.insert("command".into(), typed::<Vec<String>>(command.get())?);
        }
        if let Some(args) = c.args {
            m.insert("args".into(), typed::<Vec<String>>(args.get())?);
        }
        if let Some(dir) = c.working_dir {
            m.insert("workingDir".into(), typed::<String>(dir.get())?);
        }
        if let Some(ports) = c.ports {
            m.insert("ports".into(), typed::<Vec<ContainerPort>>(ports.get())?);
        }
        Ok(Value::Object(m))
    };
    let containers = shown
        .containers
        .iter()
        .map(|c| project(c))
        .collect::<Result<_, _>>()?;
    out.insert("containers".into(), Value::Array(containers));
    let init = shown
        .init_containers
        .iter()
        .map(|c| project(c))
        .collect::<Result<_, _>>()?;
    out.insert("initContainers".into(), Value::Array(init));
    let volumes = shown
        .volumes
        .iter()
        .map(|v| typed::<Volume>(&v.json()))
        .collect::<Result<_, _>>()?;
    out.insert("volumes".into(), Value::Array(volumes));
    let text = |s: &Option<Str<'_>>| s.as_ref().map(|s| Value::from(s.as_str()));
    let fields = [
        (
            "nodeSelector",
            spec.node_selector.as_ref().map(|m| {
                Value::Object(
                    m.iter()
                        .map(|(k, v)| (k.to_string(), Value::from(v.as_str())))
                        .collect(),
                )
            }),
        ),
        (
            "securityContext",
            spec.security_context
                .map(|raw| typed::<PodSecurityContext>(raw.get()))
                .transpose()?,
        ),
        ("hostNetwork", spec.host_network.map(Value::from)),
        (
            "os",
            spec.os.map(|raw| typed::<PodOS>(raw.get())).transpose()?,
        ),
        ("priorityClassName", text(&spec.priority_class_name)),
        ("runtimeClassName", text(&spec.runtime_class_name)),
        ("restartPolicy", text(&spec.restart_policy)),
        (
            "shareProcessNamespace",
            spec.share_process_namespace.map(Value::from),
        ),
        ("hostname", text(&spec.hostname)),
        ("subdomain", text(&spec.subdomain)),
    ];
    for (key, value) in fields {
        if let Some(value) = value {
            out.insert(key.into(), value);
        }
    }
    Ok(Value::Object(out))
}

/// A revision in words: "the default revision" or `revision "canary"`.
pub fn revision_name(revision: &str) -> String {
    match revision {
        "" => "the default revision".into(),
        r => format!("revision {r:?}"),
    }
}

/// Which rule opts the pod in, or why none does (in words, for `explain`).
pub fn opt_in(inj: &Injector, facts: &PodFacts<'_>) -> Result<Entry, String> {
    let cfg = &inj.config;
    let label = facts.pod.label(&cfg.inject_label);
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
            let revision = facts.pod.label(&cfg.revision_label).unwrap_or("");
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
    if let Some(what) = malformed(facts.pod) {
        return Ok(Decision::Skip(SkipReason::Malformed(what)));
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
                template: (*name).to_owned(),
                source: Box::new(source),
            })?;
        overrides.push(values);
    }
    let windows = cfg.skip.windows && facts.is_windows()?;
    let render =
        |only: Option<&Seen>| -> Result<(Vec<Rendered>, Vec<String>, Shown<'_>), InjectError> {
            let shown = facts.seen(inj, only)?;
            let mut templates = Vec::with_capacity(names.len());
            let mut notes = Vec::new();
            for (name, overrides) in names.iter().zip(&overrides) {
                let reads = inj.templates.reads(name);
                let key = |start| facts.context_key(inj, &shown, reads, start);
                let fragment = inj.templates.render_with(name, overrides, key, || {
                    facts.context(inj, &shown).map_err(InjectError::Unread)
                })?;
                if windows && !fragment.supports_windows {
                    notes.push(format!(
                        "template {name:?} was not injected: it does not support Windows pods"
                    ));
                    continue;
                }
                templates.push(Rendered {
                    name: (*name).to_owned(),
                    fragment,
                });
            }
            Ok((templates, notes, shown))
        };
    // An earlier rendering (the mutator's, seen again by a reinvocation or the validator) is
    // repeated from what it saw, so that what was added to the pod since does not change it.
    // Its status is trusted only if that reproduces it exactly.
    let previous = facts.status(inj);
    let mut again = None;
    if let Some((previous, context)) = previous
        .as_ref()
        .filter(|p| p.revision == cfg.revision)
        .and_then(|p| Some((p, p.context.as_ref()?)))
    {
        let (templates, notes, seen) = render(Some(context))?;
        let same = fragment_hash(inj, &templates) == previous.hash
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
        None => render(None)?,
    };
    if templates.is_empty() && windows {
        return Ok(Decision::Skip(SkipReason::Windows));
    }
    let hash = fragment_hash(inj, &templates);
    let kept = kept_containers(facts, previous.as_ref(), &templates, &hash, &mut notes);
    completion_notes(facts, &templates, &kept, &mut notes);
    let status = status_json(inj, &templates, hash, kept, &cfg.revision, &seen);
    Ok(Decision::Inject(Plan {
        entry,
        templates,
        status,
        notes,
    }))
}

/// What makes a pod one the API server refuses whatever a patch adds, and that a patch could
/// not even be written for: no metadata, no spec, no containers, a container with no name.
/// (A field of the wrong type is refused where it is read: see [`InjectError::Unread`].)
fn malformed(pod: &PodView<'_>) -> Option<&'static str> {
    if pod.metadata.is_none() {
        return Some("the pod has no metadata");
    }
    let Some(spec) = &pod.spec else {
        return Some("the pod has no spec");
    };
    if spec.containers().is_empty() {
        return Some("the pod has no spec.containers");
    }
    if spec
        .containers()
        .iter()
        .chain(spec.init_containers())
        .any(|c| c.name.is_empty())
    {
        return Some("a container of the pod has no name");
    }
    None
}

/// The template names a pod asks for: its annotation, else the configured default.
fn selected_templates<'s>(
    inj: &'s Injector,
    facts: &PodFacts<'s>,
) -> Result<Vec<&'s str>, InjectError> {
    let cfg = &inj.config;
    let Some(list) = facts.pod.annotation(&cfg.templates_annotation) else {
        return Ok(cfg.default_templates.iter().map(String::as_str).collect());
    };
    let mut names: Vec<&str> = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !inj.templates.contains(name) {
            return Err(InjectError::UnknownTemplate {
                annotation: cfg.templates_annotation.clone(),
                name: name.to_owned(),
                known: inj.templates.names().collect::<Vec<_>>().join(", "),
            });
        }
        if !names.contains(&name) {
            names.push(name);
        }
    }
    Ok(names)
}

/// Sidecar names the pod brought itself. Decided when a template is first injected and carried
/// in the status annotation afterwards, so a reinvocation (which sees our own sidecars) agrees.
/// A status is trusted only if it describes exactly this rendering (same templates, same hash);
/// any other status (stale, copied, hand-written) is ignored and what exists now is kept.
fn kept_containers(
    facts: &PodFacts<'_>,
    previous: Option<&Status>,
    templates: &[Rendered],
    hash: &str,
    notes: &mut Vec<String>,
) -> Vec<String> {
    let previous = previous.filter(|p| {
        p.hash == hash
            && p.templates.len() == templates.len()
            && p.templates.iter().zip(templates).all(|(p, t)| *p == t.name)
    });
    let (before, kept_before): (&[String], &[String]) = match previous {
        Some(p) => (&p.templates, &p.kept),
        None => (&[], &[]),
    };
    let existing = |name: &str| {
        facts
            .pod
            .containers()
            .iter()
            .chain(facts.pod.init_containers())
            .any(|c| c.name.as_str() == name)
    };
    let mut kept = Vec::new();
    for t in templates {
        let injected_before = before.contains(&t.name);
        for name in t.fragment.sidecar_names() {
            let keep = if injected_before {
                kept_before.iter().any(|k| k == name)
            } else {
                existing(name)
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

/// Why a pod runs to completion (its phase ends `Succeeded` or `Failed`), if it does: its
/// `restartPolicy`, else its controller. A Job's pods always say `Never` or `OnFailure`; the
/// owner covers a pod template read offline with that field left out.
fn runs_to_completion(facts: &PodFacts<'_>) -> Option<String> {
    let policy = facts
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_ref())
        .map(|p| p.as_str());
    if let Some(policy @ ("Never" | "OnFailure")) = policy {
        return Some(format!("restartPolicy: {policy}"));
    }
    let owner = facts.owner();
    matches!(owner.kind.as_str(), "Job" | "CronJob")
        .then(|| format!("it belongs to {} {:?}", owner.kind, owner.name))
}

/// A regular container added to a pod that runs to completion keeps it running after the
/// application ends: the pod never completes, nor does its Job. Such a sidecar is injected as
/// its template says (the template is the author's), with a note naming it, never silently.
fn completion_notes(
    facts: &PodFacts<'_>,
    templates: &[Rendered],
    kept: &[String],
    notes: &mut Vec<String>,
) {
    // Collected first, so that the pod's owner is read only when there is something to say
    // (collecting nothing allocates nothing).
    let regular: Vec<(&str, &str)> = templates
        .iter()
        .flat_map(|t| {
            t.fragment
                .containers
                .iter()
                .filter(|c| !kept.contains(&c.name))
                .map(move |c| (t.name.as_str(), c.name.as_str()))
        })
        .collect();
    if regular.is_empty() {
        return;
    }
    let Some(why) = runs_to_completion(facts) else {
        return;
    };
    for (template, container) in regular {
        notes.push(crate::engine::fit::regular_sidecar_in_finite_pod(
            template, container, &why,
        ));
    }
}

/// The status annotation's value, serialized once per distinct status: the pods of one shape
/// given the same renderings carry the same bytes. The key writes every part with its length,
/// so that two statuses share a key only when they are equal.
fn status_json(
    inj: &Injector,
    templates: &[Rendered],
    hash: String,
    kept: Vec<String>,
    revision: &str,
    seen: &impl SeenNames,
) -> Arc<Quoted> {
    fn put(key: &mut Vec<u8>, text: &str) {
        key.extend_from_slice(&(text.len() as u64).to_le_bytes());
        key.extend_from_slice(text.as_bytes());
    }
    fn list<'s>(key: &mut Vec<u8>, texts: impl ExactSizeIterator<Item = &'s str>) {
        key.extend_from_slice(&(texts.len() as u64).to_le_bytes());
        texts.for_each(|text| put(key, text));
    }
    let mut key = Vec::with_capacity(256);
    list(&mut key, templates.iter().map(|t| t.name.as_str()));
    put(&mut key, &hash);
    list(&mut key, kept.iter().map(String::as_str));
    put(&mut key, revision);
    // Every list of the `Seen` a status records, so that none can be left out of the key.
    for l in 0..3 {
        list(&mut key, (0..seen.len(l)).map(|i| seen.name(l, i)));
    }
    inj.templates.quoted_with(key, || {
        serde_json::to_string(&Status {
            templates: templates.iter().map(|t| t.name.clone()).collect(),
            hash,
            config: inj.digest.clone(),
            kept,
            revision: revision.to_owned(),
            context: Some(seen.to_seen()),
        })
        .unwrap_or_default()
    })
}

/// A short hash of what the templates rendered, for the status annotation.
fn fragment_hash(inj: &Injector, templates: &[Rendered]) -> String {
    let mut input = Vec::with_capacity(templates.len() * 48);
    for t in templates {
        input.extend_from_slice(t.name.as_bytes());
        input.push(0);
        input.extend_from_slice(&t.fragment.digest);
    }
    // The same templates rendering the same fragments: the digest is remembered.
    let digest = inj.templates.digest_with(input, |input| {
        let sum = Sha256::digest(input);
        sum[..8].iter().map(|b| format!("{b:02x}")).collect()
    });
    // Copied as it is (`to_string` went through the formatter, growing a string from empty).
    String::from(&*digest)
}

// === Edits ===

/// An item of a rendered fragment: the typed value and its JSON.
#[derive(Debug, PartialEq)]
pub struct Part<'p, T> {
    pub value: &'p T,
    pub piece: &'p Piece,
}

impl<T> Clone for Part<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Part<'_, T> {}

fn parts<'p, T>(values: &'p [T], pieces: &'p [Piece]) -> impl Iterator<Item = Part<'p, T>> {
    values
        .iter()
        .zip(pieces)
        .map(|(value, piece)| Part { value, piece })
}

/// One change to a pod. Indices refer to `spec.containers` of the pod as it arrived. Edits
/// borrow from the [`Plan`] (and the configuration) they were planned from.
#[derive(Clone, Debug, PartialEq)]
pub enum Edit<'p> {
    /// Init containers placed, in this order, before the pod's own.
    PrependInitContainers(Vec<Part<'p, Container>>),
    AppendContainer(Part<'p, Container>),
    AddVolume(Part<'p, Volume>),
    AddImagePullSecret(Part<'p, LocalObjectReference>),
    AddVolumeMount {
        container: usize,
        mount: Part<'p, VolumeMount>,
    },
    AddEnv {
        container: usize,
        env: Part<'p, EnvVar>,
    },
    SetLabel {
        key: &'p str,
        value: &'p str,
    },
    SetAnnotation {
        key: &'p str,
        value: &'p str,
        /// The value as a JSON string, when it was written once for many patches.
        json: Option<&'p str>,
    },
}

/// A set of names: a list kept inline while it is short (most pods have a handful of
/// containers, volumes and mounts, where a scan beats hashing, and a planning builds a dozen
/// such sets: on the heap each was an allocation, whose memory a cold review fetched), hashed
/// once it is long (thousands of env vars). The inline list starts empty without writing its
/// sixteen slots, and adding is one function for every set: a planning runs each of its
/// loops once or twice, so the code it runs through, not the instructions, is what a review
/// pays for (docs/benchmarks-history.md, "At 733d418").
// The inline list is the point: a set lives on the stack for one planning.
#[allow(clippy::large_enum_variant)]
enum Names<'a> {
    Few(ArrayVec<&'a str, { Names::FEW }>),
    Many(HashSet<&'a str>),
}

impl<'a> Names<'a> {
    const FEW: usize = 16;

    fn new() -> Self {
        Names::Few(ArrayVec::new())
    }

    /// A set for `n` names: hashed from the start when they will not fit the inline list.
    fn with_capacity(n: usize) -> Self {
        if n <= Self::FEW {
            Self::new()
        } else {
            Names::Many(HashSet::with_capacity_and_hasher(n, Default::default()))
        }
    }

    fn contains(&self, name: &str) -> bool {
        match self {
            Names::Few(list) => list.contains(&name),
            Names::Many(set) => set.contains(name),
        }
    }

    /// Adds a name; false when it was there already.
    #[inline(never)]
    fn insert(&mut self, name: &'a str) -> bool {
        let list = match self {
            Names::Many(set) => return set.insert(name),
            Names::Few(list) if list.contains(&name) => return false,
            Names::Few(list) => list,
        };
        if list.try_push(name).is_ok() {
            return true;
        }
        let mut set: HashSet<&str> =
            HashSet::with_capacity_and_hasher(list.len() * 2, Default::default());
        set.extend(list.iter().copied());
        set.insert(name);
        *self = Names::Many(set);
        true
    }
}

/// The edits that take `pod` to its injected state: only what is missing. Applying the
/// edits and planning again yields no edits (the fixed point).
pub fn plan_edits<'p>(inj: &'p Injector, pod: &PodView<'_>, plan: &'p Plan) -> Vec<Edit<'p>> {
    let spec = pod.spec.as_ref();
    // The sets are filled by plain loops: a `collect` for each was an iterator's code of its
    // own, run once.
    let (containers, inits) = (pod.containers(), pod.init_containers());
    let mut taken = Names::with_capacity(containers.len() + inits.len());
    for c in containers.iter().chain(inits) {
        taken.insert(c.name.as_str());
    }
    let mut sidecars = Names::new();
    for t in &plan.templates {
        for name in t.fragment.sidecar_names() {
            sidecars.insert(name);
        }
    }
    let pod_volumes = spec.map(|s| s.volumes()).unwrap_or_default();
    let mut volumes = Names::with_capacity(pod_volumes.len());
    for v in pod_volumes {
        volumes.insert(v.name.as_str());
    }
    let pod_secrets = spec.map(|s| s.image_pull_secrets()).unwrap_or_default();
    let mut secrets = Names::with_capacity(pod_secrets.len());
    for s in pod_secrets {
        secrets.insert(s.name());
    }

    // A typical injection makes about a dozen edits.
    let mut edits = Vec::with_capacity(16);
    let mut new_init = Vec::with_capacity(plan.templates.len());
    let mut appended = Vec::with_capacity(plan.templates.len());
    for t in &plan.templates {
        let f = &*t.fragment;
        for c in parts(&f.init_containers, &f.json.init_containers) {
            if taken.insert(&c.value.name) {
                new_init.push(c);
            }
        }
        for c in parts(&f.containers, &f.json.containers) {
            if taken.insert(&c.value.name) {
                appended.push(Edit::AppendContainer(c));
            }
        }
    }
    if !new_init.is_empty() {
        edits.push(Edit::PrependInitContainers(new_init));
    }
    edits.extend(appended);
    for t in &plan.templates {
        let f = &*t.fragment;
        for v in parts(&f.volumes, &f.json.volumes) {
            if volumes.insert(&v.value.name) {
                edits.push(Edit::AddVolume(v));
            }
        }
        for s in parts(&f.image_pull_secrets, &f.json.image_pull_secrets) {
            if secrets.insert(&s.value.name) {
                edits.push(Edit::AddImagePullSecret(s));
            }
        }
    }

    // Mounts and env reach every application container present now, including containers
    // another webhook added after us, so that reinvocation converges.
    let mut template_env = Names::new();
    for t in &plan.templates {
        for e in parts(&t.fragment.env, &t.fragment.json.env) {
            template_env.insert(e.value.name.as_str());
        }
    }
    for (index, container) in containers.iter().enumerate() {
        if sidecars.contains(container.name.as_str()) {
            continue;
        }
        let mounts = container.volume_mounts.as_deref().unwrap_or_default();
        let mut mount_names = Names::with_capacity(mounts.len());
        let mut mount_paths = Names::with_capacity(mounts.len());
        for m in mounts {
            mount_names.insert(m.name());
            mount_paths.insert(m.mount_path());
        }
        // Of the container's env (thousands, in a large pod) only the names the templates add
        // matter: one pass keeps those, instead of a set of them all.
        let env = container.env.as_deref().unwrap_or_default();
        let mut env_names = Names::new();
        for e in env {
            let name = e.name();
            if template_env.contains(name) {
                env_names.insert(name);
            }
        }
        for t in &plan.templates {
            let f = &*t.fragment;
            for m in parts(&f.volume_mounts, &f.json.volume_mounts) {
                if !mount_names.contains(m.value.name.as_str())
                    && !mount_paths.contains(m.value.mount_path.as_str())
                {
                    mount_names.insert(&m.value.name);
                    mount_paths.insert(&m.value.mount_path);
                    edits.push(Edit::AddVolumeMount {
                        container: index,
                        mount: m,
                    });
                }
            }
            for e in parts(&f.env, &f.json.env) {
                if env_names.insert(&e.value.name) {
                    edits.push(Edit::AddEnv {
                        container: index,
                        env: e,
                    });
                }
            }
        }
    }

    let labels = pod.labels();
    let annotations = pod.annotations();
    let status_key = inj.config.status_annotation.as_str();
    let mut new_labels = Names::new();
    let mut new_annotations = Names::new();
    for t in &plan.templates {
        for (key, value) in &t.fragment.labels {
            if !labels.contains_key(key.as_str()) && new_labels.insert(key) {
                edits.push(Edit::SetLabel { key, value });
            }
        }
        for (key, value) in &t.fragment.annotations {
            if key != status_key
                && !annotations.contains_key(key.as_str())
                && new_annotations.insert(key)
            {
                edits.push(Edit::SetAnnotation {
                    key,
                    value,
                    json: None,
                });
            }
        }
    }
    // The status annotation is ours: it always describes the current injection.
    if pod.annotation(status_key) != Some(plan.status.text.as_str()) {
        edits.push(Edit::SetAnnotation {
            key: status_key,
            value: &plan.status.text,
            json: Some(&plan.status.json),
        });
    }
    edits
}

impl Edit<'_> {
    /// The edit in words, for `explain`.
    pub fn describe(&self) -> String {
        let image = |c: &k8s_openapi::api::core::v1::Container| c.image.clone().unwrap_or_default();
        match self {
            Edit::PrependInitContainers(cs) => cs
                .iter()
                .map(|c| {
                    let native = c.value.restart_policy.as_deref() == Some("Always");
                    format!(
                        "init container {} ({}){}, before the pod's own init containers",
                        c.value.name,
                        image(c.value),
                        if native { " as a native sidecar" } else { "" }
                    )
                })
                .collect::<Vec<_>>()
                .join("\n  + "),
            Edit::AppendContainer(c) => format!("container {} ({})", c.value.name, image(c.value)),
            Edit::AddVolume(v) => format!("volume {}", v.value.name),
            Edit::AddImagePullSecret(s) => format!("image pull secret {}", s.value.name),
            Edit::AddVolumeMount { container, mount } => {
                format!(
                    "mount {} at {} in container #{container}",
                    mount.value.name, mount.value.mount_path
                )
            }
            Edit::AddEnv { container, env } => {
                format!("env {} in container #{container}", env.value.name)
            }
            Edit::SetLabel { key, value } => format!("label {key}={value}"),
            Edit::SetAnnotation { key, value, .. } => format!("annotation {key}={value}"),
        }
    }
}

/// Applies edits to a typed pod.
pub fn apply(pod: &mut Pod, edits: &[Edit<'_>]) {
    for edit in edits {
        let spec = pod.spec.get_or_insert_with(Default::default);
        match edit {
            Edit::PrependInitContainers(cs) => {
                let init = spec.init_containers.get_or_insert_with(Vec::new);
                init.splice(0..0, cs.iter().map(|c| c.value.clone()));
            }
            Edit::AppendContainer(c) => spec.containers.push(c.value.clone()),
            Edit::AddVolume(v) => spec
                .volumes
                .get_or_insert_with(Vec::new)
                .push(v.value.clone()),
            Edit::AddImagePullSecret(s) => {
                spec.image_pull_secrets
                    .get_or_insert_with(Vec::new)
                    .push(s.value.clone());
            }
            Edit::AddVolumeMount { container, mount } => {
                if let Some(c) = spec.containers.get_mut(*container) {
                    c.volume_mounts
                        .get_or_insert_with(Vec::new)
                        .push(mount.value.clone());
                }
            }
            Edit::AddEnv { container, env } => {
                if let Some(c) = spec.containers.get_mut(*container) {
                    c.env.get_or_insert_with(Vec::new).push(env.value.clone());
                }
            }
            Edit::SetLabel { key, value } => {
                pod.metadata
                    .labels
                    .get_or_insert_with(Default::default)
                    .insert((*key).to_owned(), (*value).to_owned());
            }
            Edit::SetAnnotation { key, value, .. } => {
                pod.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert((*key).to_owned(), (*value).to_owned());
            }
        }
    }
}

/// A JSONPatch: the bytes written for it, with each long fragment piece left out and noted
/// where it belongs. A long piece's JSON is copied only if the whole JSON is asked for
/// ([`Patch::json`]); its base64, kept with the piece, is what an AdmissionReview answer
/// copies ([`Patch::base64_into`]). Copying the piece's JSON into the patch as well was half
/// of what a review copied, and a cold review fetches every byte it copies from memory
/// (docs/benchmarks-history.md, "What the goals needed").
#[derive(Debug, Default)]
pub struct Patch<'p> {
    /// The patch's bytes, long pieces left out.
    written: Vec<u8>,
    /// Each long piece, with the offset in `written` where it belongs (in order).
    pieces: Vec<(usize, &'p Piece)>,
}

impl From<Vec<u8>> for Patch<'_> {
    /// A patch's JSON, with no piece kept: its base64 is encoded whole.
    fn from(json: Vec<u8>) -> Self {
        Self {
            written: json,
            pieces: Vec::new(),
        }
    }
}

/// Base64 written in groups of three bytes, from pieces of any length: the bytes of a group
/// that is not complete yet wait in `carry`.
struct Base64Writer<'o> {
    out: &'o mut Vec<u8>,
    carry: [u8; 3],
    carried: usize,
}

impl Base64Writer<'_> {
    fn plain(&mut self, mut bytes: &[u8]) {
        if self.carried > 0 {
            let take = (3 - self.carried).min(bytes.len());
            self.carry[self.carried..self.carried + take].copy_from_slice(&bytes[..take]);
            self.carried += take;
            bytes = &bytes[take..];
            if self.carried < 3 {
                return;
            }
            base64_simd::STANDARD.encode_append(self.carry, self.out);
            self.carried = 0;
        }
        let whole = bytes.len() / 3 * 3;
        base64_simd::STANDARD.encode_append(&bytes[..whole], self.out);
        let rest = &bytes[whole..];
        self.carry[..rest.len()].copy_from_slice(rest);
        self.carried = rest.len();
    }

    /// The last group, padded.
    fn finish(self) {
        base64_simd::STANDARD.encode_append(&self.carry[..self.carried], self.out);
    }
}

impl Patch<'_> {
    /// The length of the patch's JSON.
    pub fn len(&self) -> usize {
        self.written.len() + self.pieces.iter().map(|(_, p)| p.json.len()).sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The patch's JSON, long pieces copied in.
    pub fn json(&self) -> Cow<'_, [u8]> {
        if self.pieces.is_empty() {
            return Cow::Borrowed(&self.written);
        }
        let mut json = Vec::with_capacity(self.len());
        let mut done = 0;
        for &(at, piece) in &self.pieces {
            json.extend_from_slice(&self.written[done..at]);
            json.extend_from_slice(piece.json.as_bytes());
            done = at;
        }
        json.extend_from_slice(&self.written[done..]);
        Cow::Owned(json)
    }

    /// Appends the base64 of the patch to `out`: the written bytes are encoded (SIMD), each
    /// long piece's bytes are copied from its kept base64 but for the zero to two bytes at
    /// each end that share a group of three with the bytes around it, so the stretches join
    /// as one encoding of the whole JSON would write them.
    pub fn base64_into(&self, out: &mut Vec<u8>) {
        out.reserve(self.len().div_ceil(3) * 4);
        let mut w = Base64Writer {
            out,
            carry: [0; 3],
            carried: 0,
        };
        let mut done = 0;
        for &(at, piece) in &self.pieces {
            w.plain(&self.written[done..at]);
            done = at;
            let json = piece.json.as_bytes();
            // The piece's first `k` bytes complete the group before it.
            let k = ((3 - w.carried) % 3).min(json.len());
            w.plain(&json[..k]);
            let whole = (json.len() - k) / 3 * 3;
            if whole > 0 {
                w.out.extend_from_slice(&piece.base64(k));
            }
            w.plain(&json[k + whole..]);
        }
        w.plain(&self.written[done..]);
        w.finish();
    }
}

/// A JSONPatch written into one buffer, one `add` operation at a time.
struct PatchWriter<'p> {
    out: Vec<u8>,
    pieces: Vec<(usize, &'p Piece)>,
}

impl<'p> PatchWriter<'p> {
    #[inline]
    fn text(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }

    fn piece(&mut self, piece: &'p Piece) {
        if piece.json.len() >= Piece::BASE64_KEPT {
            self.pieces.push((self.out.len(), piece));
        } else {
            self.text(piece.json.as_bytes());
        }
    }

    /// An `add` operation at `path`, then `key` when given. The path's tokens are field
    /// names, indexes and `-`, written as they are; the key (a label or annotation name) is
    /// escaped, as RFC 6901 and then JSON say.
    fn op(&mut self, path: &[&str], key: Option<&str>, value: impl FnOnce(&mut Self)) {
        self.text(if self.out.is_empty() {
            br#"[{"op":"add","path":""#
        } else {
            br#",{"op":"add","path":""#
        });
        for token in path {
            debug_assert!(
                token
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-'),
                "{token:?} needs escaping"
            );
            self.text(b"/");
            self.text(token.as_bytes());
        }
        if let Some(key) = key {
            self.text(b"/");
            // `~` is written `~0` and `/` is written `~1`; then JSON string escaping, of the
            // parts between them (`~0` and `~1` need none). A key with nothing to escape for
            // JSON (every key a Kubernetes name allows) is written in one pass.
            if json::is_plain(key) {
                self.out.reserve(key.len() + 4);
                for b in key.bytes() {
                    match b {
                        b'~' => self.out.extend_from_slice(b"~0"),
                        b'/' => self.out.extend_from_slice(b"~1"),
                        _ => self.out.push(b),
                    }
                }
            } else {
                self.escaped_key(key);
            }
        }
        self.text(br#"","value":"#);
        value(self);
        self.text(b"}");
    }

    /// A key as a pointer token, part by part (see [`Self::op`]).
    fn escaped_key(&mut self, key: &str) {
        for (i, run) in key.split('/').enumerate() {
            if i > 0 {
                self.text(b"~1");
            }
            for (j, part) in run.split('~').enumerate() {
                if j > 0 {
                    self.text(b"~0");
                }
                json::write_str_body(&mut self.out, part);
            }
        }
    }

    fn json_str(&mut self, s: &str) {
        json::write_str(&mut self.out, s);
    }

    fn finish(mut self) -> Patch<'p> {
        if self.out.is_empty() {
            self.text(b"[");
        }
        self.text(b"]");
        Patch {
            written: self.out,
            pieces: self.pieces,
        }
    }
}

/// Writes edits as a JSONPatch (its JSON bytes) against the pod they were planned for. Paths
/// are written token by token, so `~` and `/` in keys are escaped by construction; a missing
/// array or map is created whole instead of appended to. Values are the fragment's JSON,
/// encoded when it was rendered.
pub fn to_patch<'p>(pod: &PodView<'_>, edits: &[Edit<'p>]) -> Patch<'p> {
    write_patch(pod, edits)
}

/// [`to_patch`]'s bytes in base64, as an AdmissionReview response carries them (SIMD: SSSE3
/// or AVX2 where the CPU has them; long pieces copied from their kept base64).
pub fn to_patch_base64(pod: &PodView<'_>, edits: &[Edit<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    write_patch(pod, edits).base64_into(&mut out);
    out
}

/// `i` in decimal, written into `buf`: a patch path's array index without an allocation.
fn index_token(mut i: usize, buf: &mut [u8; 20]) -> &str {
    const DIGITS: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    if let Some(digit) = DIGITS.get(i) {
        return digit;
    }
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (i % 10) as u8;
        i /= 10;
        if i == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    std::str::from_utf8(&buf[at..]).unwrap_or("0")
}

fn write_patch<'p>(pod: &PodView<'_>, edits: &[Edit<'p>]) -> Patch<'p> {
    // The bench's typical patch is 4.7 KB: 3.5 KB of it long pieces, which are not copied in,
    // and 1.2 KB written.
    let mut w = PatchWriter {
        out: Vec::with_capacity(2048),
        pieces: Vec::with_capacity(4),
    };
    let spec = pod.spec.as_ref();
    let has_init = spec.is_some_and(|s| s.init_containers.is_some());
    let has_volumes = spec.is_some_and(|s| s.volumes.is_some());
    let has_secrets = spec.is_some_and(|s| s.image_pull_secrets.is_some());
    let container = |i: usize| pod.containers().get(i);
    let meta = pod.metadata.as_ref();
    let has_labels = meta.is_some_and(|m| m.labels.is_some());
    let has_annotations = meta.is_some_and(|m| m.annotations.is_some());
    // Arrays created by an earlier edit of this patch: appended to from then on.
    let mut created: Vec<(&str, Option<usize>)> = Vec::new();
    let mut append = |w: &mut PatchWriter<'p>,
                      exists: bool,
                      field: &'static str,
                      container: Option<usize>,
                      piece: &'p Piece| {
        let mut buf = [0; 20];
        let digits = container.map(|i| index_token(i, &mut buf));
        let mut path = ["spec", "containers", "", field, "-"];
        let path: &mut [&str] = match &digits {
            Some(d) => {
                path[2] = d;
                &mut path[..]
            }
            None => {
                path[1] = field;
                &mut path[..3]
            }
        };
        let last = path.len() - 1;
        if exists || created.contains(&(field, container)) {
            path[last] = "-";
            w.op(path, None, |w| w.piece(piece));
        } else {
            created.push((field, container));
            w.op(&path[..last], None, |w| {
                w.text(b"[");
                w.piece(piece);
                w.text(b"]");
            });
        }
    };
    let mut map_created = (false, false);

    for edit in edits {
        match edit {
            Edit::PrependInitContainers(cs) => {
                if has_init {
                    for (i, c) in cs.iter().enumerate() {
                        let mut buf = [0; 20];
                        let i = index_token(i, &mut buf);
                        w.op(&["spec", "initContainers", i], None, |w| w.piece(c.piece));
                    }
                } else {
                    w.op(&["spec", "initContainers"], None, |w| {
                        w.text(b"[");
                        for (i, c) in cs.iter().enumerate() {
                            if i > 0 {
                                w.text(b",");
                            }
                            w.piece(c.piece);
                        }
                        w.text(b"]");
                    });
                }
            }
            Edit::AppendContainer(c) => append(&mut w, true, "containers", None, c.piece),
            Edit::AddVolume(v) => append(&mut w, has_volumes, "volumes", None, v.piece),
            Edit::AddImagePullSecret(s) => {
                append(&mut w, has_secrets, "imagePullSecrets", None, s.piece)
            }
            Edit::AddVolumeMount {
                container: i,
                mount,
            } => {
                let exists = container(*i).is_some_and(|c| c.volume_mounts.is_some());
                append(&mut w, exists, "volumeMounts", Some(*i), mount.piece);
            }
            Edit::AddEnv { container: i, env } => {
                let exists = container(*i).is_some_and(|c| c.env.is_some());
                append(&mut w, exists, "env", Some(*i), env.piece);
            }
            Edit::SetLabel { key, value } => {
                set_entry(
                    &mut w,
                    (has_labels, &mut map_created.0),
                    "labels",
                    key,
                    (value, None),
                );
            }
            Edit::SetAnnotation { key, value, json } => {
                set_entry(
                    &mut w,
                    (has_annotations, &mut map_created.1),
                    "annotations",
                    key,
                    (value, *json),
                );
            }
        }
    }
    w.finish()
}

/// A label or an annotation: the map is created with it unless the pod has it or an earlier
/// edit created it (`(exists, created)`). The value comes with its JSON when that was written
/// once for many patches.
fn set_entry(
    w: &mut PatchWriter<'_>,
    (exists, created): (bool, &mut bool),
    map: &str,
    key: &str,
    (value, json): (&str, Option<&str>),
) {
    let value = |w: &mut PatchWriter<'_>| match json {
        Some(json) => w.text(json.as_bytes()),
        None => w.json_str(value),
    };
    if !exists && !*created {
        *created = true;
        w.op(&["metadata", map], None, |w| {
            w.text(b"{");
            w.json_str(key);
            w.text(b":");
            value(w);
            w.text(b"}");
        });
    } else {
        // `add` on an existing member replaces it, which is what the status annotation needs.
        w.op(&["metadata", map], Some(key), value);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    fn injector() -> Injector {
        Injector::embedded(Some("sidecar-injector".into())).expect("embedded config loads")
    }

    fn decide_for(
        inj: &Injector,
        p: &Pod,
        namespace: Option<&str>,
    ) -> Result<Decision, InjectError> {
        let json = crate::engine::view::pod_json(p);
        let view = PodView::parse(&json).expect("view");
        decide(inj, &PodFacts::new(&view, namespace))
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

    /// The base64 of a patch whose long pieces are copied from their kept base64 is the
    /// base64 of its bytes: pieces at every offset against the groups of three, of every length
    /// around a multiple of three, each kept for the first offset asked and encoded anew for
    /// the others.
    #[test]
    fn kept_piece_base64_joins_as_one_encoding() {
        use base64::Engine as _;
        let pieces: Vec<Piece> = (0..6)
            .map(|i| {
                Piece::new(format!(
                    "{{\"n\":\"{}\"}}",
                    "x".repeat(Piece::BASE64_KEPT + i)
                ))
            })
            .collect();
        for lead in 0..6 {
            for between in 0..4 {
                let mut w = PatchWriter {
                    out: Vec::new(),
                    pieces: Vec::new(),
                };
                w.text(&b"["[..]);
                w.text("a".repeat(lead).as_bytes());
                for piece in &pieces {
                    w.piece(piece);
                    w.text("b".repeat(between).as_bytes());
                }
                w.piece(&pieces[0]);
                let patch = w.finish();
                assert_eq!(patch.pieces.len(), pieces.len() + 1);
                let mut ours = Vec::new();
                patch.base64_into(&mut ours);
                let json = patch.json();
                assert_eq!(json.len(), patch.len());
                let reference = base64::engine::general_purpose::STANDARD.encode(&json);
                assert_eq!(
                    String::from_utf8_lossy(&ours),
                    reference,
                    "{lead} {between}"
                );
            }
        }
    }

    proptest::proptest! {
        /// Any bytes, given in stretches of any lengths (a group's bytes split across
        /// stretches, stretches short and long), encode as one standard encoding of them all.
        #[test]
        fn base64_writer_encodes_any_stretches(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400),
            cuts in proptest::collection::vec(0usize..400, 0..8),
        ) {
            use base64::Engine as _;
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
            cuts.push(bytes.len());
            cuts.sort_unstable();
            let mut out = Vec::new();
            let mut w = Base64Writer { out: &mut out, carry: [0; 3], carried: 0 };
            let mut done = 0;
            for cut in cuts {
                w.plain(&bytes[done..cut]);
                done = cut;
            }
            w.finish();
            proptest::prop_assert_eq!(
                String::from_utf8_lossy(&out),
                base64::engine::general_purpose::STANDARD.encode(&bytes)
            );
        }
    }

    #[test]
    fn index_tokens_are_decimal() {
        for i in (0..=1000).chain([usize::MAX]) {
            let mut buf = [0; 20];
            assert_eq!(index_token(i, &mut buf), i.to_string());
        }
    }

    /// A path token is escaped as RFC 6901 and then JSON say, whatever it holds: every ASCII
    /// byte, `~` and `/` together, non-ASCII text.
    #[test]
    fn path_tokens_are_escaped_as_pointers_then_json() {
        let mut tokens: Vec<String> = (0u8..0x80).map(|b| format!("a{}z", b as char)).collect();
        tokens.extend(
            [
                "",
                "plain",
                "example.com/name",
                "a~b/c~/~1",
                "\"quoted\"/~",
                "back\\slash~",
                "é ü 🦀",
                "\u{7f}\u{80}",
            ]
            .map(String::from),
        );
        tokens.push((0u8..0x20).map(char::from).collect());
        for token in tokens {
            let mut w = PatchWriter {
                out: Vec::new(),
                pieces: Vec::new(),
            };
            w.op(&[], Some(&token), |w| w.text(b"1"));
            let ours = String::from_utf8(w.out).expect("UTF-8");
            let pointer = format!("/{}", token.replace('~', "~0").replace('/', "~1"));
            let expected = format!(
                r#"[{{"op":"add","path":{},"value":1}}"#,
                serde_json::to_string(&pointer).expect("serializes")
            );
            assert_eq!(ours, expected, "{token:?}");
        }
    }

    /// Statuses are remembered by a key of their parts: statuses that differ only in how
    /// their names split or which list holds them still get their own bytes.
    #[test]
    fn remembered_statuses_are_told_apart() {
        let inj = injector();
        let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let seen = |c: &[&str], i: &[&str], v: &[&str]| Seen {
            containers: names(c),
            init_containers: names(i),
            volumes: names(v),
        };
        let cases = [
            (names(&[]), seen(&["a", "b"], &[], &[])),
            (names(&[]), seen(&["ab"], &[], &[])),
            (names(&[]), seen(&["a"], &["b"], &[])),
            (names(&[]), seen(&["a"], &[], &["b"])),
            (names(&["a"]), seen(&["b"], &[], &[])),
            (names(&["a", "b"]), seen(&[], &[], &[])),
        ];
        for _ in 0..2 {
            for (kept, seen) in &cases {
                let expected = serde_json::to_string(&Status {
                    templates: vec![],
                    hash: "h".into(),
                    config: inj.digest.clone(),
                    kept: kept.clone(),
                    revision: String::new(),
                    context: Some(seen.clone()),
                })
                .expect("serializes");
                let got = status_json(&inj, &[], "h".into(), kept.clone(), "", seen);
                assert_eq!(got.text, expected);
                assert_eq!(
                    got.json,
                    serde_json::to_string(&expected).expect("serializes")
                );
            }
        }
    }

    #[test]
    fn names_are_a_set_short_or_long() {
        let many: Vec<String> = (0..40).map(|i| format!("n{i}")).collect();
        let mut names = Names::with_capacity(3);
        for name in &many[..3] {
            names.insert(name);
        }
        assert!(matches!(&names, Names::Few(list) if list.len() == 3));
        for (i, name) in many.iter().enumerate() {
            assert_eq!(names.insert(name), i >= 3, "{name}");
        }
        assert!(matches!(names, Names::Many(_)));
        assert!(many.iter().all(|n| names.contains(n)) && !names.contains("n40"));
        // Room asked for more than the inline list holds: hashed from the start.
        let mut long = Names::with_capacity(many.len() + 1);
        assert!(matches!(long, Names::Many(_)));
        for name in many.iter().map(String::as_str).chain(["n0"]) {
            long.insert(name);
        }
        assert!(matches!(long, Names::Many(_)) && long.contains("n39"));
        // The empty name is a name like any other.
        let mut empty = Names::new();
        assert!(!empty.contains(""));
        assert!(empty.insert("") && empty.contains("") && !empty.insert(""));
    }

    #[test]
    fn label_must_be_exactly_true() {
        let inj = injector();
        for value in ["false", "True", "yes", ""] {
            let mut p = opted_in();
            p.metadata.labels =
                Some([("sidecar-injector.io/inject".to_owned(), value.to_owned())].into());
            let d = decide_for(&inj, &p, Some("default")).expect("decides");
            assert_eq!(d, Decision::NotOptedIn, "value {value:?}");
        }
    }

    fn canary() -> Injector {
        let config =
            crate::engine::config::DEFAULT_CONFIG.replace("revision: \"\"", "revision: canary");
        Injector::from_sources(
            "canary.yaml",
            &config,
            crate::engine::config::bundled_templates(),
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
            let json = crate::engine::view::pod_json(&p);
            let view = PodView::parse(&json).expect("view");
            let facts = PodFacts::new(&view, Some("shop")).with_entry(entry);
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
            let json = crate::engine::view::pod_json(&p);
            let view = PodView::parse(&json).expect("view");
            let mut facts = PodFacts::new(&view, Some("shop"));
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
            let d = decide_for(&inj, &p, Some(ns)).expect("decides");
            assert_eq!(d, Decision::Skip(SkipReason::ExcludedNamespace(ns.into())));
        }
    }

    /// A regular sidecar is named, with the reason, for a pod that runs to completion (by its
    /// restart policy or its Job owner) and for no other pod; a native one never is.
    #[test]
    fn a_regular_sidecar_is_noted_only_in_a_pod_that_runs_to_completion() {
        let inj = Injector::from_sources(
            "auditor.yaml",
            "defaultTemplates: [auditor, native]\n",
            vec![
                (
                    "auditor".into(),
                    "containers: [{name: auditor, image: 'auditor:1'}]\n".into(),
                ),
                (
                    "native".into(),
                    "initContainers: [{name: agent, image: 'agent:1', restartPolicy: Always}]\n"
                        .into(),
                ),
            ],
            None,
        )
        .expect("config loads");
        let notes = |p: &Pod| match decide_for(&inj, p, Some("shop")).expect("decides") {
            Decision::Inject(plan) => plan.notes,
            other => panic!("not injected: {other:?}"),
        };
        let with = |policy: Option<&str>, owner: Option<(&str, &str)>| {
            let mut p = opted_in();
            p.spec.as_mut().expect("spec").restart_policy = policy.map(str::to_owned);
            if let Some((kind, name)) = owner {
                p.metadata.owner_references = Some(vec![
                    serde_json::from_value(json!({
                        "apiVersion": "batch/v1", "kind": kind, "name": name, "uid": "u",
                        "controller": true
                    }))
                    .expect("owner"),
                ]);
            }
            p
        };
        for (p, why) in [
            (with(Some("Never"), None), "(restartPolicy: Never)"),
            (with(Some("OnFailure"), None), "(restartPolicy: OnFailure)"),
            (
                with(None, Some(("Job", "migrate"))),
                "(it belongs to Job \"migrate\")",
            ),
        ] {
            let notes = notes(&p);
            assert_eq!(notes.len(), 1, "{notes:?}");
            assert!(
                notes[0]
                    .starts_with("template \"auditor\" adds \"auditor\" as a regular container")
                    && notes[0].contains(why),
                "{notes:?}"
            );
        }
        for p in [
            with(None, None),
            with(Some("Always"), Some(("ReplicaSet", "web-1"))),
        ] {
            assert_eq!(notes(&p), Vec::<String>::new());
        }
        assert_eq!(
            inj.advisories
                .iter()
                .filter(|a| a.contains("regular container"))
                .count(),
            1
        );
        assert!(
            injector().advisories.is_empty(),
            "{:?}",
            injector().advisories
        );
    }

    #[test]
    fn object_namespace_wins_over_request_namespace() {
        let mut p = opted_in();
        p.metadata.namespace = Some("kube-system".into());
        let json = crate::engine::view::pod_json(&p);
        let view = PodView::parse(&json).expect("view");
        let facts = PodFacts::new(&view, Some("default"));
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
            decide_for(&inj, &p, Some("default")).expect("decides"),
            Decision::Skip(SkipReason::HostNetwork)
        );
        let mut p = opted_in();
        if let Some(s) = p.spec.as_mut() {
            s.node_selector = Some([("kubernetes.io/os".into(), "windows".into())].into());
        }
        assert_eq!(
            decide_for(&inj, &p, Some("default")).expect("decides"),
            Decision::Skip(SkipReason::Windows)
        );
    }

    #[test]
    fn unknown_template_is_an_error_naming_it() {
        let inj = injector();
        let mut p = opted_in();
        p.metadata.annotations =
            Some([("sidecar-injector.io/templates".into(), "proxy, nope".into())].into());
        let err = decide_for(&inj, &p, Some("default")).expect_err("unknown");
        assert!(err.to_string().contains("\"nope\""), "{err}");
    }

    #[test]
    fn missing_arrays_are_created_and_keys_escaped() {
        let inj = injector();
        let mut p = opted_in();
        p.metadata.annotations = None;
        let Decision::Inject(plan) = decide_for(&inj, &p, Some("default")).expect("decides") else {
            unreachable!("opted-in pod is injected")
        };
        let json = crate::engine::view::pod_json(&p);
        let view = PodView::parse(&json).expect("view");
        let patch: serde_json::Value =
            serde_json::from_slice(&to_patch(&view, &plan_edits(&inj, &view, &plan)).json())
                .expect("json");
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

    /// Pods that differ only in what a template does not read share its rendering; pods that
    /// differ in what it reads do not.
    #[test]
    fn a_rendering_is_shared_by_pods_that_read_the_same() {
        let inj = crate::engine::config::Injector::embedded(None).expect("embedded");
        let pod = |hash: &str, app: &str| {
            serde_json::to_vec(&json!({
                "metadata": {"generateName": format!("web-{hash}-"), "labels": {
                    "sidecar-injector.io/inject": "true", "app": app, "pod-template-hash": hash}},
                "spec": {"containers": [{"name": "app", "image": "nginx", "ports": [{"containerPort": 8080}]}]}
            }))
            .expect("json")
        };
        let plan = |json: &[u8]| {
            let view = crate::engine::view::PodView::parse(json).expect("view");
            match crate::engine::inject::decide(
                &inj,
                &crate::engine::inject::PodFacts::new(&view, Some("shop")),
            ) {
                Ok(crate::engine::inject::Decision::Inject(plan)) => plan,
                other => panic!("not injected: {other:?}"),
            }
        };
        let (a, b, c) = (pod("aaa", "web"), pod("bbb", "web"), pod("aaa", "api"));
        let (a, b, c) = (plan(&a), plan(&b), plan(&c));
        for i in 0..2 {
            assert!(Arc::ptr_eq(
                &a.templates[i].fragment,
                &b.templates[i].fragment
            ));
        }
        // The log shipper reads the app label; the proxy does not.
        let shipper = |p: &crate::engine::inject::Plan| {
            p.templates
                .iter()
                .position(|t| t.name == "log-shipper")
                .expect("log-shipper")
        };
        let proxy = |p: &crate::engine::inject::Plan| {
            p.templates
                .iter()
                .position(|t| t.name == "proxy")
                .expect("proxy")
        };
        assert_ne!(
            a.templates[shipper(&a)].fragment.init_containers[0].args,
            c.templates[shipper(&c)].fragment.init_containers[0].args
        );
        assert!(Arc::ptr_eq(
            &a.templates[proxy(&a)].fragment,
            &c.templates[proxy(&c)].fragment
        ));
    }
}
