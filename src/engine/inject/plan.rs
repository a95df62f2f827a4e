//! The edits that take a pod to its injected state (only what is missing), and the same edits
//! applied to a typed pod.

use arrayvec::ArrayVec;
use foldhash::HashSet;
use k8s_openapi::api::core::v1::{
    Container, EnvVar, LocalObjectReference, Pod, Volume, VolumeMount,
};

use crate::engine::config::Injector;
use crate::engine::fit;
use crate::engine::inject::decide::Plan;
use crate::engine::inject::rules::targets;
use crate::engine::template::Piece;
use crate::engine::view::{ContainerView, PodView};

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
    /// A mount for container `container` of `spec.containers` or, with `init`, of the pod's
    /// own `spec.initContainers` as it arrived (placed after the init containers added).
    AddVolumeMount {
        container: usize,
        init: bool,
        mount: Part<'p, VolumeMount>,
    },
    AddEnv {
        container: usize,
        init: bool,
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
    /// An amount of the pod-level budget (`spec.resources.<list>.<resource>`), grown by the
    /// sidecars added.
    SetPodResource {
        list: &'static str,
        resource: &'static str,
        value: String,
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
pub(super) enum Names<'a> {
    Few(ArrayVec<&'a str, { Names::FEW }>),
    Many(HashSet<&'a str>),
}

impl<'a> Names<'a> {
    const FEW: usize = 16;

    pub(super) fn new() -> Self {
        Names::Few(ArrayVec::new())
    }

    /// A set for `n` names: hashed from the start when they will not fit the inline list.
    pub(super) fn with_capacity(n: usize) -> Self {
        if n <= Self::FEW {
            Self::new()
        } else {
            Names::Many(HashSet::with_capacity_and_hasher(n, Default::default()))
        }
    }

    pub(super) fn contains(&self, name: &str) -> bool {
        match self {
            Names::Few(list) => list.contains(&name),
            Names::Many(set) => set.contains(name),
        }
    }

    /// Adds a name; false when it was there already.
    #[inline(never)]
    pub(super) fn insert(&mut self, name: &'a str) -> bool {
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
    // A typical injection makes about a dozen edits.
    let mut edits = Vec::with_capacity(16);
    let sidecars = add_sidecars_and_volumes(pod, plan, &mut edits);
    grow_budget(pod, &mut edits);
    let targets = targets(inj, pod);
    add_mounts_and_env(pod, plan, &sidecars, targets.as_deref(), &mut edits);
    set_metadata(inj, pod, plan, &mut edits);
    edits
}

/// The sidecars (init containers before the pod's own, then regular ones), volumes and image
/// pull secrets the pod lacks. Returns every sidecar name of the plan.
fn add_sidecars_and_volumes<'p>(
    pod: &PodView<'_>,
    plan: &'p Plan,
    edits: &mut Vec<Edit<'p>>,
) -> Names<'p> {
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
    sidecars
}

/// A pod-level budget grows by what the sidecars added ask for ([`fit::grown_budget`]); one
/// already injected adds nothing, so injecting again changes nothing.
fn grow_budget<'p>(pod: &PodView<'_>, edits: &mut Vec<Edit<'p>>) {
    let Some(budget) = pod.spec.as_ref().and_then(|s| s.resources) else {
        return;
    };
    let mut inits = Vec::new();
    let mut containers = Vec::new();
    for e in edits.iter() {
        match e {
            Edit::PrependInitContainers(cs) => inits.extend(cs.iter().map(|c| c.value)),
            Edit::AppendContainer(c) => containers.push(c.value),
            _ => {}
        }
    }
    let grown = fit::grown_budget(Some(budget.get()), &inits, &containers);
    edits.extend(
        grown
            .into_iter()
            .map(|(list, resource, value)| Edit::SetPodResource {
                list,
                resource,
                value,
            }),
    );
}

/// The template mounts and env each container that receives them lacks: every application
/// container, or those `targets` names (application and init containers) when the pod names
/// any. A template's own sidecars never do.
fn add_mounts_and_env<'p>(
    pod: &PodView<'_>,
    plan: &'p Plan,
    sidecars: &Names<'_>,
    targets: Option<&[&str]>,
    edits: &mut Vec<Edit<'p>>,
) {
    // Mounts and env reach every application container present now, including containers
    // another webhook added after us, so that reinvocation converges.
    let mut template_env = Names::new();
    for t in &plan.templates {
        for e in parts(&t.fragment.env, &t.fragment.json.env) {
            template_env.insert(e.value.name.as_str());
        }
    }
    let lists: [(&[ContainerView<'_>], bool); 2] = [
        (pod.containers(), false),
        (
            if targets.is_some() {
                pod.init_containers()
            } else {
                &[]
            },
            true,
        ),
    ];
    for (containers, init) in lists {
        for (index, container) in containers.iter().enumerate() {
            let name = container.name.as_str();
            if sidecars.contains(name) || targets.is_some_and(|t| !t.contains(&name)) {
                continue;
            }
            add_to_container(plan, container, index, init, &template_env, edits);
        }
    }
}

fn add_to_container<'p>(
    plan: &'p Plan,
    container: &ContainerView<'_>,
    index: usize,
    init: bool,
    template_env: &Names<'_>,
    edits: &mut Vec<Edit<'p>>,
) {
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
                    init,
                    mount: m,
                });
            }
        }
        for e in parts(&f.env, &f.json.env) {
            if env_names.insert(&e.value.name) {
                edits.push(Edit::AddEnv {
                    container: index,
                    init,
                    env: e,
                });
            }
        }
    }
}

/// The template labels and annotations the pod lacks, and the status annotation.
fn set_metadata<'p>(
    inj: &'p Injector,
    pod: &PodView<'_>,
    plan: &'p Plan,
    edits: &mut Vec<Edit<'p>>,
) {
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
            Edit::AddVolumeMount {
                container,
                init,
                mount,
            } => {
                format!(
                    "mount {} at {} in {} #{container}",
                    mount.value.name,
                    mount.value.mount_path,
                    if *init { "init container" } else { "container" }
                )
            }
            Edit::AddEnv {
                container,
                init,
                env,
            } => {
                format!(
                    "env {} in {} #{container}",
                    env.value.name,
                    if *init { "init container" } else { "container" }
                )
            }
            Edit::SetLabel { key, value } => format!("label {key}={value}"),
            Edit::SetAnnotation { key, value, .. } => format!("annotation {key}={value}"),
            Edit::SetPodResource {
                list,
                resource,
                value,
            } => format!("pod-level {list} {resource}={value} (grown by the sidecars')"),
        }
    }
}

/// The container an edit names: of `spec.containers`, or of the pod's own init containers,
/// after the `prepended` ones the same edits placed before them.
fn target(
    spec: &mut k8s_openapi::api::core::v1::PodSpec,
    index: usize,
    init: bool,
    prepended: usize,
) -> Option<&mut Container> {
    match init {
        false => spec.containers.get_mut(index),
        true => spec.init_containers.as_mut()?.get_mut(index + prepended),
    }
}

/// Applies edits to a typed pod.
pub fn apply(pod: &mut Pod, edits: &[Edit<'_>]) {
    let mut prepended = 0;
    for edit in edits {
        let spec = pod.spec.get_or_insert_with(Default::default);
        match edit {
            Edit::PrependInitContainers(cs) => {
                let init = spec.init_containers.get_or_insert_with(Vec::new);
                init.splice(0..0, cs.iter().map(|c| c.value.clone()));
                prepended += cs.len();
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
            Edit::AddVolumeMount {
                container,
                init,
                mount,
            } => {
                if let Some(c) = target(spec, *container, *init, prepended) {
                    c.volume_mounts
                        .get_or_insert_with(Vec::new)
                        .push(mount.value.clone());
                }
            }
            Edit::AddEnv {
                container,
                init,
                env,
            } => {
                if let Some(c) = target(spec, *container, *init, prepended) {
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
            Edit::SetPodResource {
                list,
                resource,
                value,
            } => {
                let r = spec.resources.get_or_insert_with(Default::default);
                let amounts = match *list {
                    "requests" => &mut r.requests,
                    _ => &mut r.limits,
                };
                amounts.get_or_insert_with(Default::default).insert(
                    (*resource).to_owned(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity(value.clone()),
                );
            }
        }
    }
}
