//! The template context: what a template sees of a pod as `pod.*`, defined once.
//!
//! [`Field`] is the one list of the context's fields. What a template reads of it
//! ([`Reads`]), the projection of a request into it ([`Source::context`]), the render-cache key
//! that stands for it ([`Source::key`]), how the exporter reads each field in CEL
//! ([`Field::cel`]) and the sample pods every template is rendered for at load
//! ([`PodContext::sample`]) are all derived from it here: each is a match over [`Field`], so a
//! field added to the enum is added to all of them, or the build fails. A test renders, for
//! every field, two pods that differ only in it, and holds the renderings apart.
//!
//! The projection reads the same in the mutating and the validating webhook and on
//! reinvocation:
//! - the name is empty under `generateName` (the API server names the pod in between);
//! - labels and annotations leave out the status annotation and every key the templates set
//!   themselves ([`Owned`]);
//! - `spec` keeps the pod's own containers and init containers (not the sidecars of any
//!   template) with the fields other admission plugins leave alone (name, image, command, args,
//!   workingDir, ports: not env, mounts, resources or imagePullPolicy), the pod's own volumes
//!   (not the templates', not a ServiceAccount token volume, whose name is random), and the
//!   scheduling and security fields a person writes;
//! - with the names an earlier rendering saw ([`Seen`], from the status annotation), just those
//!   containers and volumes: what another webhook or plugin added after it is not part of it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::engine::view::{ContainerView, PodView, Raw, SpecView, Str, StrMap, VolumeView};

/// A field of the template context, in the order the context is written (a template that
/// prints `pod` sees them in this order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// `pod.name`: empty for pods named by `generateName`.
    Name,
    GenerateName,
    Namespace,
    /// `pod.labels`: without the keys the templates set themselves.
    Labels,
    /// `pod.annotations`: without the status annotation and the keys the templates set.
    Annotations,
    ServiceAccount,
    Containers,
    InitContainers,
    Volumes,
    NodeSelector,
    SecurityContext,
    HostNetwork,
    Os,
    PriorityClassName,
    RuntimeClassName,
    RestartPolicy,
    ShareProcessNamespace,
    Hostname,
    Subdomain,
    /// `pod.owner`: the controlling workload (a Deployment rather than its ReplicaSet).
    Owner,
}

/// How the exporter reads a field in CEL over the admission request (`object` is the pod).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cel {
    /// One expression, always defined.
    Value(&'static str),
    /// An entry of `object.metadata.<map>`, present or not; `plain` when its values are
    /// restricted to the characters of a label value.
    Entry { map: &'static str, plain: bool },
    /// Not written in CEL, with the reason.
    Refused(&'static str),
}

/// How the exporter reads the value at `path` under `pod` (a field, or an entry of a map field
/// with its key): `None` for a path that names no field as a whole (`pod.labels`, a method on a
/// string). Every path under `pod.spec` is refused alike.
pub fn cel_at<'p>(path: &[&'p str]) -> Option<(Cel, Option<&'p str>)> {
    let (first, rest) = path.split_first()?;
    if *first == "spec" {
        return Some((Cel::Refused(CEL_SPEC), None));
    }
    let cel = Field::named(first, false)?.cel();
    match (cel, rest) {
        (Cel::Value(_), []) | (Cel::Refused(_), _) => Some((cel, None)),
        (Cel::Entry { .. }, [key]) => Some((cel, Some(key))),
        _ => None,
    }
}

/// `pod.name` as templates see it: empty under `generateName` (the API server names the pod
/// between the mutating and the validating policies).
const CEL_NAME: &str = "((has(object.metadata.generateName) && object.metadata.generateName != \"\") ? \"\" : (has(object.metadata.name) ? object.metadata.name : \"\"))";
const CEL_GENERATE_NAME: &str =
    "(has(object.metadata.generateName) ? object.metadata.generateName : \"\")";
const CEL_SERVICE_ACCOUNT: &str = "((has(object.spec.serviceAccountName) && object.spec.serviceAccountName != \"\") ? object.spec.serviceAccountName : \"default\")";
const CEL_SPEC: &str = "reads the pod's spec: export supports the pod's metadata only";

impl Field {
    /// Every field, in context order.
    pub const ALL: [Field; 20] = [
        Self::Name,
        Self::GenerateName,
        Self::Namespace,
        Self::Labels,
        Self::Annotations,
        Self::ServiceAccount,
        Self::Containers,
        Self::InitContainers,
        Self::Volumes,
        Self::NodeSelector,
        Self::SecurityContext,
        Self::HostNetwork,
        Self::Os,
        Self::PriorityClassName,
        Self::RuntimeClassName,
        Self::RestartPolicy,
        Self::ShareProcessNamespace,
        Self::Hostname,
        Self::Subdomain,
        Self::Owner,
    ];

    /// Its name in a template (`pod.<name>`, or `pod.spec.<name>` for a [`Self::in_spec`]
    /// field), which is its name in the pod's JSON.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Name => "name",
            Self::GenerateName => "generateName",
            Self::Namespace => "namespace",
            Self::Labels => "labels",
            Self::Annotations => "annotations",
            Self::ServiceAccount => "serviceAccount",
            Self::Containers => "containers",
            Self::InitContainers => "initContainers",
            Self::Volumes => "volumes",
            Self::NodeSelector => "nodeSelector",
            Self::SecurityContext => "securityContext",
            Self::HostNetwork => "hostNetwork",
            Self::Os => "os",
            Self::PriorityClassName => "priorityClassName",
            Self::RuntimeClassName => "runtimeClassName",
            Self::RestartPolicy => "restartPolicy",
            Self::ShareProcessNamespace => "shareProcessNamespace",
            Self::Hostname => "hostname",
            Self::Subdomain => "subdomain",
            Self::Owner => "owner",
        }
    }

    /// Whether it lives under `pod.spec`.
    pub const fn in_spec(self) -> bool {
        match self {
            Self::Name
            | Self::GenerateName
            | Self::Namespace
            | Self::Labels
            | Self::Annotations
            | Self::ServiceAccount
            | Self::Owner => false,
            Self::Containers
            | Self::InitContainers
            | Self::Volumes
            | Self::NodeSelector
            | Self::SecurityContext
            | Self::HostNetwork
            | Self::Os
            | Self::PriorityClassName
            | Self::RuntimeClassName
            | Self::RestartPolicy
            | Self::ShareProcessNamespace
            | Self::Hostname
            | Self::Subdomain => true,
        }
    }

    /// How the exporter reads it.
    pub const fn cel(self) -> Cel {
        match self {
            Self::Name => Cel::Value(CEL_NAME),
            Self::GenerateName => Cel::Value(CEL_GENERATE_NAME),
            Self::Namespace => Cel::Value("request.namespace"),
            Self::Labels => Cel::Entry {
                map: "labels",
                plain: true,
            },
            Self::Annotations => Cel::Entry {
                map: "annotations",
                plain: false,
            },
            Self::ServiceAccount => Cel::Value(CEL_SERVICE_ACCOUNT),
            Self::Owner => Cel::Refused(
                "reads the pod's owner: export does not write the Deployment-from-ReplicaSet rule in CEL yet",
            ),
            Self::Containers
            | Self::InitContainers
            | Self::Volumes
            | Self::NodeSelector
            | Self::SecurityContext
            | Self::HostNetwork
            | Self::Os
            | Self::PriorityClassName
            | Self::RuntimeClassName
            | Self::RestartPolicy
            | Self::ShareProcessNamespace
            | Self::Hostname
            | Self::Subdomain => Cel::Refused(CEL_SPEC),
        }
    }

    /// The field a template names with `pod.<first>` (`first` not `spec`), or with
    /// `pod.spec.<first>` (`in_spec`).
    pub fn named(first: &str, in_spec: bool) -> Option<Field> {
        Self::ALL
            .into_iter()
            .find(|f| f.in_spec() == in_spec && f.name() == first)
    }

    const fn bit(self) -> u32 {
        1 << self as u32
    }

    /// Its tags in the render-cache key: eight of its own, so that no two fields' bytes can
    /// be read as each other's.
    const fn tag(self) -> u8 {
        self as u8 * 8
    }
}

/// What of the pod context a template reads, told from its source (minijinja's list of the
/// variables it uses, with their attribute paths, [`Reads::read`]). The render cache keys a
/// rendering by these parts alone, so that pods differing elsewhere (a new ReplicaSet's
/// `pod-template-hash`, a `generateName`) share it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reads {
    /// The whole context, or a use the analysis cannot follow (`pod` as a value, a variable
    /// it does not know, an `include`, `import` or `extends` of another template).
    pub all: bool,
    /// Bit `f as u32`: whether it reads field `f` ([`Reads::field`]).
    fields: u32,
    pub labels: Keys,
    pub annotations: Keys,
}

impl Reads {
    /// Reads of everything.
    pub const ALL: Reads = Reads {
        all: true,
        fields: u32::MAX,
        labels: Keys::None,
        annotations: Keys::None,
    };

    /// Reads of the whole context (or none, `all: false`), to which [`Self::read`] adds.
    pub fn new(all: bool) -> Self {
        Self {
            all,
            ..Self::default()
        }
    }

    /// Adds a path the template reads under `pod`: its parts after `pod`. A deeper path on a
    /// string (`pod.namespace.upper`) is a method on it: the string. A field of `pod.spec` the
    /// context does not have reads nothing (the template sees it undefined).
    pub fn read<'p>(&mut self, mut parts: impl Iterator<Item = &'p str>) {
        match (parts.next(), parts.next()) {
            (Some("labels"), key) => {
                self.labels.add(key);
                self.fields |= Field::Labels.bit();
            }
            (Some("annotations"), key) => {
                self.annotations.add(key);
                self.fields |= Field::Annotations.bit();
            }
            (Some("spec"), None) => {
                for f in Field::ALL.into_iter().filter(|f| f.in_spec()) {
                    self.fields |= f.bit();
                }
            }
            (Some("spec"), Some(name)) => {
                if let Some(f) = Field::named(name, true) {
                    self.fields |= f.bit();
                }
            }
            (Some(name), _) => match Field::named(name, false) {
                Some(f) => self.fields |= f.bit(),
                None => self.all = true,
            },
            (None, _) => self.all = true,
        }
    }

    /// Whether the template reads `field`: one it names, every field when it reads the whole
    /// context.
    pub fn field(&self, field: Field) -> bool {
        self.bits() & field.bit() != 0
    }

    /// Bit `f as u32` for each field `f` it reads.
    fn bits(&self) -> u32 {
        match self.all {
            true => u32::MAX,
            false => self.fields,
        }
    }

    /// The fields it reads, in [`Field::ALL`]'s order: the set bits only, so that a review
    /// keys a template that reads two fields in two steps, not twenty.
    fn fields(&self) -> impl Iterator<Item = Field> {
        let mut rest = self.bits() & ((1 << Field::ALL.len()) - 1);
        std::iter::from_fn(move || {
            let i = rest.trailing_zeros() as usize;
            rest &= rest.wrapping_sub(1);
            Field::ALL.get(i).copied()
        })
    }
}

/// Which entries of a map a template reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Keys {
    #[default]
    None,
    Some(BTreeSet<String>),
    All,
}

impl Keys {
    fn add(&mut self, key: Option<&str>) {
        match (key, &mut *self) {
            (_, Keys::All) => {}
            (None, _) => *self = Keys::All,
            (Some(k), Keys::Some(keys)) => {
                keys.insert(k.to_owned());
            }
            (Some(k), Keys::None) => *self = Keys::Some([k.to_owned()].into()),
        }
    }
}

/// The pod as templates see it (see the module's opening for what it leaves out).
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodContext<'a> {
    pub name: &'a str,
    pub generate_name: &'a str,
    pub namespace: &'a str,
    pub labels: BTreeMap<&'a str, &'a str>,
    pub annotations: BTreeMap<&'a str, &'a str>,
    pub service_account: &'a str,
    /// The [`Field::in_spec`] fields the pod has, in [`Field::ALL`]'s order.
    pub spec: serde_json::Value,
    pub owner: Owner,
}

/// The workload that controls a pod: a Deployment rather than its ReplicaSet. Empty strings for
/// a pod nothing controls.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Owner {
    pub kind: String,
    pub name: String,
}

/// What the templates of a set put on a pod under names that do not depend on the pod: the
/// names of their sidecars and volumes and the keys of their labels and annotations. The
/// template context leaves these out, so a pod reads the same before and after injection.
#[derive(Clone, Debug, Default)]
pub struct Owned {
    pub sidecars: BTreeSet<String>,
    pub volumes: BTreeSet<String>,
    pub labels: BTreeSet<String>,
    pub annotations: BTreeSet<String>,
}

/// The sample pods every template must render for when it is loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sample {
    /// The plainest pod.
    Bare,
    /// A Deployment's pod: ports, labels, an annotation, an owner, a generated name.
    Busy,
}

impl PodContext<'_> {
    /// A context with every field empty (`spec: {}`), for the fields to be filled in.
    fn empty() -> Self {
        PodContext {
            name: "",
            generate_name: "",
            namespace: "",
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            service_account: "",
            spec: serde_json::Value::Object(Default::default()),
            owner: Owner::default(),
        }
    }
}

impl PodContext<'static> {
    /// A sample pod, field by field.
    pub fn sample(which: Sample) -> Self {
        let mut ctx = PodContext::empty();
        for f in Field::ALL {
            ctx.set_sample(f, which);
        }
        ctx
    }

    fn set_sample(&mut self, field: Field, which: Sample) {
        use serde_json::json;
        let bare = which == Sample::Bare;
        let spec = |ctx: &mut Self, value| {
            if let serde_json::Value::Object(spec) = &mut ctx.spec {
                spec.insert(field.name().into(), value);
            }
        };
        match field {
            Field::Name => self.name = if bare { "example" } else { "" },
            Field::GenerateName => self.generate_name = if bare { "" } else { "web-7d4b9c-" },
            Field::Namespace => self.namespace = if bare { "default" } else { "shop" },
            Field::Labels if !bare => {
                self.labels = [("app", "web"), ("pod-template-hash", "7d4b9c")].into();
            }
            Field::Annotations if !bare => self.annotations = [("example.com/note", "x")].into(),
            Field::ServiceAccount => self.service_account = if bare { "default" } else { "web" },
            Field::Containers if bare => {
                spec(self, json!([{"name": "app", "image": "example:1"}]));
            }
            Field::Containers => spec(
                self,
                json!([
                    {"name": "app", "image": "example:1", "ports": [
                        {"name": "http", "containerPort": 8080, "protocol": "TCP"},
                        {"containerPort": 9090, "protocol": "TCP"},
                        {"name": "dns", "containerPort": 53, "protocol": "UDP"}]},
                    {"name": "worker", "image": "example:1", "ports": [{"containerPort": 8443}]}
                ]),
            ),
            Field::Owner if !bare => {
                self.owner = Owner {
                    kind: "Deployment".into(),
                    name: "web".into(),
                };
            }
            // Neither sample has them.
            Field::Labels
            | Field::Annotations
            | Field::Owner
            | Field::InitContainers
            | Field::Volumes
            | Field::NodeSelector
            | Field::SecurityContext
            | Field::HostNetwork
            | Field::Os
            | Field::PriorityClassName
            | Field::RuntimeClassName
            | Field::RestartPolicy
            | Field::ShareProcessNamespace
            | Field::Hostname
            | Field::Subdomain => {}
        }
    }
}

/// The names of the pod's own containers, init containers and volumes a rendering saw,
/// recorded in the status annotation.
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
pub trait SeenNames {
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

/// The pod's own containers, init containers and volumes a template context shows.
#[derive(Default)]
pub struct Shown<'a> {
    containers: Vec<&'a ContainerView<'a>>,
    init_containers: Vec<&'a ContainerView<'a>>,
    volumes: Vec<&'a VolumeView<'a>>,
}

impl<'a> Shown<'a> {
    /// Which of the pod's own containers, init containers and volumes the template context
    /// shows: not the sidecars or volumes of any template, not a ServiceAccount token volume
    /// (its name is random), and with `only`, just those an earlier rendering saw.
    pub fn of(
        pod: &'a PodView<'a>,
        owned: &Owned,
        only: Option<&Seen>,
    ) -> Result<Self, serde_json::Error> {
        let keep = |name: &str, listed: Option<&Vec<String>>| {
            !owned.sidecars.contains(name) && listed.is_none_or(|l| l.iter().any(|n| n == name))
        };
        let volumes = pod.spec.as_ref().map_or(&[][..], |s| s.volumes());
        let mut shown = Shown {
            containers: pod
                .containers()
                .iter()
                .filter(|c| keep(&c.name, only.map(|o| &o.containers)))
                .collect(),
            init_containers: pod
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

/// The controlling workload of `pod`: `workload` when it is known better than the pod says
/// (offline, the document a pod template comes from), else the controller owner reference,
/// with a ReplicaSet named `<deployment>-<pod-template-hash>` read as its Deployment.
pub fn owner(pod: &PodView<'_>, workload: Option<&Owner>) -> Owner {
    if let Some(workload) = workload {
        return workload.clone();
    }
    let Some(owner) = pod
        .meta()
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
    else {
        return Owner::default();
    };
    if owner.kind() == "ReplicaSet" && owner.api_version().starts_with("apps/") {
        let deployment = pod
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

/// A pod of a request, with what its context leaves out: everything the context and its key
/// are made from.
pub struct Source<'a> {
    pub pod: &'a PodView<'a>,
    /// The pod's namespace (the request's when the object carries none).
    pub namespace: &'a str,
    pub owned: &'a Owned,
    pub status_annotation: &'a str,
    pub workload: Option<&'a Owner>,
    pub shown: &'a Shown<'a>,
}

impl<'a> Source<'a> {
    /// The name templates see: empty under `generateName`. The API server names a
    /// generateName pod after mutating admission: the mutator sees no name and the validator
    /// sees the generated one. Both render with no name so that they agree.
    fn name(&self) -> &'a str {
        match self.pod.generate_name() {
            "" => self.pod.name(),
            _ => "",
        }
    }

    fn labels(&self) -> impl Iterator<Item = (&'a str, &'a str)> + use<'a> {
        let owned = &self.owned.labels;
        self.pod
            .labels()
            .iter()
            .filter(move |(k, _)| !owned.contains(k.as_str()))
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }

    fn annotations(&self) -> impl Iterator<Item = (&'a str, &'a str)> + use<'a> {
        let owned = &self.owned.annotations;
        let status = self.status_annotation;
        let all: &'a StrMap<'a> = self.pod.annotations();
        all.iter()
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

    /// The key of the context (see [`Self::context`]) for the render cache of a template that
    /// reads `reads` of it, appended to `start`, built from the request's own bytes: equal keys,
    /// equal contexts as far as the template can tell.
    pub fn key(&self, reads: &Reads, start: Vec<u8>) -> Vec<u8> {
        let mut key = Key(start);
        key.0.push(b'V');
        for field in reads.fields() {
            self.key_field(field, reads, &mut key);
        }
        key.0
    }

    fn key_field(&self, field: Field, reads: &Reads, key: &mut Key) {
        let tag = field.tag();
        let spec = self.pod.spec.as_ref();
        match field {
            Field::Name => key.field(tag, self.name().as_bytes()),
            Field::GenerateName => key.field(tag, self.pod.generate_name().as_bytes()),
            Field::Namespace => key.field(tag, self.namespace.as_bytes()),
            Field::Labels => key.map(tag, &reads.labels, reads.all, self.labels()),
            Field::Annotations => key.map(tag, &reads.annotations, reads.all, self.annotations()),
            Field::ServiceAccount => key.field(tag, self.service_account().as_bytes()),
            Field::Owner => {
                let owner = owner(self.pod, self.workload);
                key.field(tag, owner.kind.as_bytes());
                key.field(tag + 1, owner.name.as_bytes());
            }
            Field::Containers => key.containers(tag, &self.shown.containers),
            Field::InitContainers => key.containers(tag, &self.shown.init_containers),
            Field::Volumes => {
                for v in &self.shown.volumes {
                    key.field(tag, b"");
                    for (name, raw) in &v.members {
                        key.field(tag + 1, name.as_bytes());
                        key.field(tag + 2, raw.get().as_bytes());
                    }
                }
            }
            Field::NodeSelector => {
                let Some(selector) = spec.and_then(|s| s.node_selector.as_ref()) else {
                    return;
                };
                for (k, v) in selector {
                    key.field(tag, k.as_bytes());
                    key.field(tag + 1, v.as_bytes());
                }
                key.field(tag + 2, b"");
            }
            Field::SecurityContext => key.raw(tag, spec.and_then(|s| s.security_context)),
            Field::Os => key.raw(tag, spec.and_then(|s| s.os)),
            Field::HostNetwork => key.flag(tag, spec.and_then(|s| s.host_network)),
            Field::ShareProcessNamespace => {
                key.flag(tag, spec.and_then(|s| s.share_process_namespace));
            }
            Field::PriorityClassName
            | Field::RuntimeClassName
            | Field::RestartPolicy
            | Field::Hostname
            | Field::Subdomain => key.text(tag, spec.and_then(|s| spec_text(s, field))),
        }
    }

    /// The template context. Fields are read as k8s-openapi types, so a value of the wrong type
    /// is an error here.
    pub fn context(&self) -> Result<PodContext<'a>, serde_json::Error> {
        let mut ctx = PodContext::empty();
        for field in Field::ALL {
            self.project(field, &mut ctx)?;
        }
        Ok(ctx)
    }

    fn project(&self, field: Field, ctx: &mut PodContext<'a>) -> Result<(), serde_json::Error> {
        match field {
            Field::Name => ctx.name = self.name(),
            Field::GenerateName => ctx.generate_name = self.pod.generate_name(),
            Field::Namespace => ctx.namespace = self.namespace,
            Field::Labels => ctx.labels = self.labels().collect(),
            Field::Annotations => ctx.annotations = self.annotations().collect(),
            Field::ServiceAccount => ctx.service_account = self.service_account(),
            Field::Owner => ctx.owner = owner(self.pod, self.workload),
            Field::Containers
            | Field::InitContainers
            | Field::Volumes
            | Field::NodeSelector
            | Field::SecurityContext
            | Field::HostNetwork
            | Field::Os
            | Field::PriorityClassName
            | Field::RuntimeClassName
            | Field::RestartPolicy
            | Field::ShareProcessNamespace
            | Field::Hostname
            | Field::Subdomain => {
                // A pod without a spec shows `spec: {}`.
                let (Some(spec), serde_json::Value::Object(out)) = (&self.pod.spec, &mut ctx.spec)
                else {
                    return Ok(());
                };
                if let Some(value) = self.spec_value(field, spec)? {
                    out.insert(field.name().into(), value);
                }
            }
        }
        Ok(())
    }

    /// A field of `pod.spec` as the context shows it, if the pod has it (the lists always).
    fn spec_value(
        &self,
        field: Field,
        spec: &SpecView<'_>,
    ) -> Result<Option<serde_json::Value>, serde_json::Error> {
        use k8s_openapi::api::core::v1::{PodOS, PodSecurityContext, Volume};
        use serde_json::Value;
        Ok(match field {
            Field::Name
            | Field::GenerateName
            | Field::Namespace
            | Field::Labels
            | Field::Annotations
            | Field::ServiceAccount
            | Field::Owner => None,
            Field::Containers => Some(containers(&self.shown.containers)?),
            Field::InitContainers => Some(containers(&self.shown.init_containers)?),
            Field::Volumes => Some(Value::Array(
                self.shown
                    .volumes
                    .iter()
                    .map(|v| typed::<Volume>(&v.json()))
                    .collect::<Result<_, _>>()?,
            )),
            Field::NodeSelector => spec.node_selector.as_ref().map(|m| {
                Value::Object(
                    m.iter()
                        .map(|(k, v)| (k.to_string(), Value::from(v.as_str())))
                        .collect(),
                )
            }),
            Field::SecurityContext => spec
                .security_context
                .map(|raw| typed::<PodSecurityContext>(raw.get()))
                .transpose()?,
            Field::Os => spec.os.map(|raw| typed::<PodOS>(raw.get())).transpose()?,
            Field::HostNetwork => spec.host_network.map(Value::from),
            Field::ShareProcessNamespace => spec.share_process_namespace.map(Value::from),
            Field::PriorityClassName
            | Field::RuntimeClassName
            | Field::RestartPolicy
            | Field::Hostname
            | Field::Subdomain => spec_text(spec, field).map(|s| Value::from(s.as_str())),
        })
    }
}

/// A text field of the spec.
fn spec_text<'s, 'a>(spec: &'s SpecView<'a>, field: Field) -> Option<&'s Str<'a>> {
    match field {
        Field::PriorityClassName => spec.priority_class_name.as_ref(),
        Field::RuntimeClassName => spec.runtime_class_name.as_ref(),
        Field::RestartPolicy => spec.restart_policy.as_ref(),
        Field::Hostname => spec.hostname.as_ref(),
        Field::Subdomain => spec.subdomain.as_ref(),
        _ => None,
    }
}

/// Reads a field the typed way (k8s-openapi), as JSON for the template context.
fn typed<T: serde::de::DeserializeOwned + Serialize>(
    json: &str,
) -> Result<serde_json::Value, serde_json::Error> {
    serde_json::to_value(serde_json::from_str::<T>(json)?)
}

/// Containers as the context shows them: the fields other admission plugins leave alone.
fn containers(list: &[&ContainerView<'_>]) -> Result<serde_json::Value, serde_json::Error> {
    use k8s_openapi::api::core::v1::ContainerPort;
    use serde_json::{Map, Value};
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
    Ok(Value::Array(
        list.iter().map(|c| project(c)).collect::<Result<_, _>>()?,
    ))
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

    fn flag(&mut self, tag: u8, flag: Option<bool>) {
        if let Some(flag) = flag {
            self.field(tag, &[u8::from(flag)]);
        }
    }

    fn containers(&mut self, tag: u8, list: &[&ContainerView<'_>]) {
        self.field(tag, b"");
        for c in list {
            self.field(tag + 1, c.name.as_bytes());
            self.raw(tag + 2, c.image);
            self.raw(tag + 3, c.command);
            self.raw(tag + 4, c.args);
            self.raw(tag + 5, c.working_dir);
            self.raw(tag + 6, c.ports);
        }
    }

    /// Labels or annotations: every entry (`all`, or [`Keys::All`]), or each entry read,
    /// present or not ([`Keys::Some`]).
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
                        None => self.field(tag + 2, b""),
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

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::engine::config::Injector;
    use crate::engine::inject::{Decision, PodFacts, decide};

    /// Two pods that differ only in `field` (as the API server would send them).
    fn pods_differing_in(field: Field) -> [Value; 2] {
        let base = || {
            json!({
                "metadata": {
                    "name": "p",
                    "namespace": "ns",
                    "labels": {"sidecar-injector.io/inject": "true", "app": "a"},
                    "annotations": {"example.com/note": "a"}
                },
                "spec": {"containers": [{"name": "app", "image": "img:1"}]}
            })
        };
        let with = |edit: &dyn Fn(&mut Value, &str)| {
            ["a", "b"].map(|v| {
                let mut pod = base();
                edit(&mut pod, v);
                pod
            })
        };
        let spec = |key: &'static str, a: Value, b: Value| {
            [a, b].map(|value| {
                let mut pod = base();
                if !value.is_null() {
                    pod["spec"][key] = value;
                }
                pod
            })
        };
        match field {
            Field::Name => with(&|p, v| p["metadata"]["name"] = v.into()),
            Field::GenerateName => with(&|p, v| {
                p["metadata"]["name"] = "".into();
                p["metadata"]["generateName"] = format!("{v}-").into();
            }),
            Field::Namespace => with(&|p, v| p["metadata"]["namespace"] = v.into()),
            Field::Labels => with(&|p, v| p["metadata"]["labels"]["app"] = v.into()),
            Field::Annotations => {
                with(&|p, v| p["metadata"]["annotations"]["example.com/note"] = v.into())
            }
            Field::ServiceAccount => with(&|p, v| p["spec"]["serviceAccountName"] = v.into()),
            Field::Owner => with(&|p, v| {
                p["metadata"]["ownerReferences"] = json!([{"apiVersion": "batch/v1",
                    "kind": "Job", "name": v, "uid": "u", "controller": true}]);
            }),
            Field::Containers => with(&|p, v| p["spec"]["containers"][0]["image"] = v.into()),
            Field::InitContainers => spec(
                "initContainers",
                json!([{"name": "init", "image": "i:1"}]),
                json!([{"name": "init", "image": "i:2"}]),
            ),
            Field::Volumes => spec(
                "volumes",
                json!([{"name": "data", "emptyDir": {}}]),
                json!([{"name": "data", "emptyDir": {"medium": "Memory"}}]),
            ),
            Field::NodeSelector => spec("nodeSelector", json!({"disk": "a"}), json!({"disk": "b"})),
            Field::SecurityContext => spec(
                "securityContext",
                json!({"runAsUser": 1}),
                json!({"runAsUser": 2}),
            ),
            // `true` and `windows` would be skipped by default.
            Field::HostNetwork => spec("hostNetwork", json!(false), Value::Null),
            Field::Os => spec("os", json!({"name": "linux"}), Value::Null),
            Field::ShareProcessNamespace => {
                spec("shareProcessNamespace", json!(true), json!(false))
            }
            Field::RestartPolicy => spec("restartPolicy", json!("Always"), json!("OnFailure")),
            Field::PriorityClassName
            | Field::RuntimeClassName
            | Field::Hostname
            | Field::Subdomain => spec(field.name(), json!("a"), json!("b")),
        }
    }

    /// For every field of the context: a template that reads that field alone renders two pods
    /// that differ only in it differently, one after the other in one injector, so the render
    /// cache can never answer one pod with the other's rendering.
    #[test]
    fn every_field_sets_renderings_apart() {
        for field in Field::ALL {
            let path = match field.in_spec() {
                true => format!("pod.spec.{}", field.name()),
                false => format!("pod.{}", field.name()),
            };
            let template = format!(
                "annotations:\n  example.com/seen: {{{{ {path} | default(none) | tojson | tojson }}}}\n"
            );
            let inj = Injector::from_sources(
                "test.yaml",
                "defaultTemplates: [t]\n",
                vec![("t".into(), template)],
                None,
            )
            .unwrap_or_else(|e| panic!("{path}: {e}"));
            let reads = inj.templates.reads("t");
            assert!(!reads.all, "{path}");
            for other in Field::ALL {
                assert_eq!(reads.field(other), other == field, "{path} reads {other:?}");
            }
            let seen = pods_differing_in(field).map(|pod| {
                let json = pod.to_string();
                let view = crate::engine::view::PodView::parse(json.as_bytes()).expect("view");
                match decide(&inj, &PodFacts::new(&view, None)) {
                    Ok(Decision::Inject(plan)) => {
                        plan.templates[0].fragment.annotations["example.com/seen"].clone()
                    }
                    other => panic!("{path}: {other:?}"),
                }
            });
            assert_ne!(seen[0], seen[1], "{path}");
        }
    }

    /// The table's order is the enum's, and every field is in it once.
    #[test]
    fn the_table_holds_every_field_once_in_order() {
        for (i, f) in Field::ALL.into_iter().enumerate() {
            assert_eq!(f as usize, i, "{f:?}");
            assert_eq!(Field::named(f.name(), f.in_spec()), Some(f));
        }
        assert_eq!(Field::ALL.len(), Field::Owner as usize + 1);
    }

    /// The samples and a projected pod write the context in the table's order.
    #[test]
    fn the_context_is_written_in_the_table_order() {
        let ctx = serde_json::to_value(PodContext::sample(Sample::Busy)).expect("serializes");
        let top: Vec<&str> = ctx
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        let mut expected: Vec<&str> = Field::ALL
            .into_iter()
            .filter(|f| !f.in_spec())
            .map(Field::name)
            .collect();
        expected.insert(expected.len() - 1, "spec");
        assert_eq!(top, expected);
    }

    /// docs/CONFIGURATION.md's table of the template context names every field.
    #[test]
    fn the_configuration_docs_name_every_field() {
        let doc = include_str!("../../docs/CONFIGURATION.md");
        let spec_row = doc
            .lines()
            .find(|l| l.starts_with("| `pod.spec` |"))
            .expect("a row for pod.spec");
        for f in Field::ALL {
            let named = match f.in_spec() {
                true => spec_row.contains(&format!("`{}`", f.name())),
                false => doc.contains(&format!("`pod.{}`", f.name())),
            };
            assert!(named, "docs/CONFIGURATION.md does not name {f:?}");
        }
    }
}
