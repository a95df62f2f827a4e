//! Which workload owns a pod, how it is restarted, and whether its rollout has finished.
//! Pure: recorded API objects in, answers out.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::Serialize;

/// The pod-template annotation `kubectl rollout restart` sets; its change makes the controller
/// roll the workload.
pub const RESTARTED_AT: &str = "kubectl.kubernetes.io/restartedAt";

/// The object that owns a pod's lifecycle: what a person restarts, or the pod itself.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Workload {
    pub namespace: String,
    pub kind: String,
    pub name: String,
}

impl Workload {
    /// Whether `outdated --restart` may restart it: only controllers that replace their pods
    /// on a pod-template change. Bare pods would have to be deleted, and a Job's pods run to
    /// completion; those are reported and left to a person.
    pub fn restartable(&self) -> bool {
        matches!(
            self.kind.as_str(),
            "Deployment" | "StatefulSet" | "DaemonSet"
        )
    }

    /// Why `--restart` leaves it alone, when it does.
    pub fn why_not_restartable(&self) -> Option<&'static str> {
        match self.kind.as_str() {
            "Deployment" | "StatefulSet" | "DaemonSet" => None,
            "Pod" => Some("a bare pod is never deleted by this command: recreate it yourself"),
            "Job" | "CronJob" => Some(
                "a Job's pods run to completion: the next run is injected with the current configuration",
            ),
            _ => Some("not a Deployment, StatefulSet or DaemonSet: recreate its pods yourself"),
        }
    }
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.kind, self.name)
    }
}

fn controller(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

type Key = (String, String);

fn key(meta: &ObjectMeta) -> Key {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// The owners of ReplicaSets (a Deployment) and Jobs (a CronJob), to walk from a pod to the
/// workload a person knows.
#[derive(Debug, Default)]
pub struct Owners {
    replica_sets: BTreeMap<Key, Option<String>>,
    jobs: BTreeMap<Key, Option<String>>,
}

impl Owners {
    pub fn new(replica_sets: &[ReplicaSet], jobs: &[Job]) -> Self {
        let owned_by = |meta: &ObjectMeta, kind: &str| {
            controller(meta)
                .filter(|o| o.kind == kind)
                .map(|o| o.name.clone())
        };
        Self {
            replica_sets: replica_sets
                .iter()
                .map(|rs| (key(&rs.metadata), owned_by(&rs.metadata, "Deployment")))
                .collect(),
            jobs: jobs
                .iter()
                .map(|j| (key(&j.metadata), owned_by(&j.metadata, "CronJob")))
                .collect(),
        }
    }

    /// The workload `pod` belongs to. A ReplicaSet or Job that is not in the lists (deleted
    /// meanwhile) stands for itself.
    pub fn workload_of(&self, pod: &Pod) -> Workload {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let Some(owner) = controller(&pod.metadata) else {
            return Workload {
                namespace,
                kind: "Pod".into(),
                name: pod.metadata.name.clone().unwrap_or_default(),
            };
        };
        let lookup = (namespace.clone(), owner.name.clone());
        let parent = match owner.kind.as_str() {
            "ReplicaSet" => self
                .replica_sets
                .get(&lookup)
                .cloned()
                .flatten()
                .map(|name| ("Deployment", name)),
            "Job" => self
                .jobs
                .get(&lookup)
                .cloned()
                .flatten()
                .map(|name| ("CronJob", name)),
            _ => None,
        };
        let (kind, name) = parent.unwrap_or((owner.kind.as_str(), owner.name.clone()));
        Workload {
            namespace,
            kind: kind.to_owned(),
            name,
        }
    }
}

/// The merge patch `kubectl rollout restart` applies: a new value of the restart annotation on
/// the pod template, so the controller replaces every pod.
pub fn restart_patch(now: &str) -> serde_json::Value {
    serde_json::json!({
        "spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: now}}}}
    })
}

/// Where a rollout stands, judged as `kubectl rollout status` judges it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rollout {
    Done,
    /// Still rolling, with what it waits for.
    Waiting(String),
    /// The controller gave up (a Deployment past its progress deadline).
    Failed(String),
}

fn generation_observed(meta: &ObjectMeta, observed: Option<i64>) -> bool {
    meta.generation.unwrap_or(0) <= observed.unwrap_or(0)
}

pub fn deployment_rollout(d: &Deployment) -> Rollout {
    let Some(status) = d.status.as_ref() else {
        return Rollout::Waiting("no status yet".into());
    };
    if !generation_observed(&d.metadata, status.observed_generation) {
        return Rollout::Waiting("the controller has not seen the restart yet".into());
    }
    if let Some(c) = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Progressing")
        && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
    {
        return Rollout::Failed("progress deadline exceeded".into());
    }
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let updated = status.updated_replicas.unwrap_or(0);
    let total = status.replicas.unwrap_or(0);
    let available = status.available_replicas.unwrap_or(0);
    if updated < want {
        Rollout::Waiting(format!("{updated} of {want} new replicas updated"))
    } else if total > updated {
        Rollout::Waiting(format!(
            "{} old replicas pending termination",
            total - updated
        ))
    } else if available < updated {
        Rollout::Waiting(format!(
            "{available} of {updated} updated replicas available"
        ))
    } else {
        Rollout::Done
    }
}

pub fn statefulset_rollout(s: &StatefulSet) -> Rollout {
    let Some(status) = s.status.as_ref() else {
        return Rollout::Waiting("no status yet".into());
    };
    if !generation_observed(&s.metadata, status.observed_generation) {
        return Rollout::Waiting("the controller has not seen the restart yet".into());
    }
    let spec = s.spec.as_ref();
    if spec
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.type_.as_deref())
        == Some("OnDelete")
    {
        return Rollout::Failed(
            "updateStrategy OnDelete: its pods are replaced only when deleted".into(),
        );
    }
    let want = spec.and_then(|s| s.replicas).unwrap_or(1);
    let ready = status.ready_replicas.unwrap_or(0);
    let updated = status.updated_replicas.unwrap_or(0);
    if ready < want {
        Rollout::Waiting(format!("{ready} of {want} replicas ready"))
    } else if updated < want || status.update_revision != status.current_revision {
        Rollout::Waiting(format!("{updated} of {want} replicas at the new revision"))
    } else {
        Rollout::Done
    }
}

pub fn daemonset_rollout(d: &DaemonSet) -> Rollout {
    let Some(status) = d.status.as_ref() else {
        return Rollout::Waiting("no status yet".into());
    };
    if !generation_observed(&d.metadata, status.observed_generation) {
        return Rollout::Waiting("the controller has not seen the restart yet".into());
    }
    let want = status.desired_number_scheduled;
    let updated = status.updated_number_scheduled.unwrap_or(0);
    let available = status.number_available.unwrap_or(0);
    if updated < want {
        Rollout::Waiting(format!("{updated} of {want} pods updated"))
    } else if available < want {
        Rollout::Waiting(format!("{available} of {want} updated pods available"))
    } else {
        Rollout::Done
    }
}
