//! One pod against the current configuration: current, outdated (and what changed), opted in
//! but not injected, or injected by another revision. Pure: a pod and an injector in, a verdict
//! out, decided by the same engine the webhooks use.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Pod};
use serde::Serialize;
use serde_json::Value;

use crate::engine::config::Injector;
use crate::engine::inject::{
    Decision, OptOut, Plan, PodFacts, Rendered, Status, decide, opt_in, required_opt_out,
};
use crate::engine::validate::{OWNED_FIELDS, field_problems};

/// Where a pod stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum PodState {
    /// The pod carries exactly what the current configuration injects.
    Current,
    /// The pod was injected, but the current configuration would inject something else.
    Outdated { changes: Vec<Change> },
    /// The pod opted in and would be injected now, but carries no status annotation: it was
    /// created while the webhook was not called (down, or registered later).
    NotInjected,
    /// The pod runs without sidecars where its namespace requires them (it opts out, and its
    /// service account is not exempt): a pod like it is refused now, so recreating it does
    /// not help; the pod's label or the configuration must change.
    Refused { reason: String },
    /// The pod was injected by an injector of another revision; not this one's to judge.
    OtherRevision { revision: String },
    /// The pod cannot be judged (its status annotation is unreadable, or rendering fails).
    Unknown { reason: String },
}

impl PodState {
    /// Short name, as in the JSON output.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Current => "current",
            Self::Outdated { .. } => "outdated",
            Self::NotInjected => "notInjected",
            Self::Refused { .. } => "refused",
            Self::OtherRevision { .. } => "otherRevision",
            Self::Unknown { .. } => "unknown",
        }
    }

    /// Whether recreating the pod brings it current.
    pub fn needs_restart(&self) -> bool {
        matches!(self, Self::Outdated { .. } | Self::NotInjected)
    }
}

/// One way an injected pod differs from what would be injected now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Change {
    /// A template the pod has renders differently now; `sidecars` lists the containers whose
    /// rendering changed (empty when only volumes, env, mounts or metadata changed).
    Changed {
        template: String,
        sidecars: Vec<SidecarChange>,
    },
    /// The pod would get this template now but was not injected with it.
    Added { template: String },
    /// The pod was injected with this template but would not get it now.
    Removed { template: String },
    /// The recorded hash differs, but nothing the pod carries shows which template changed.
    Unattributed { templates: Vec<String> },
    /// The pod would not be injected at all now.
    NotInjectedNow { reason: String },
}

/// A sidecar container whose rendering changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SidecarChange {
    pub container: String,
    /// The image the pod runs; `None` when the container is gone from the pod.
    pub old_image: Option<String>,
    pub new_image: Option<String>,
    /// The container fields that differ (`missing` when the pod lacks the container).
    pub fields: Vec<String>,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Changed { template, sidecars } if sidecars.is_empty() => write!(
                f,
                "template {template}: changed outside its sidecars (volumes, env, mounts or metadata)"
            ),
            Self::Changed { template, sidecars } => {
                write!(f, "template {template}:")?;
                for (i, s) in sidecars.iter().enumerate() {
                    let sep = if i == 0 { " " } else { "; " };
                    let new = s.new_image.as_deref().unwrap_or("unset");
                    match s.old_image.as_deref() {
                        None => write!(f, "{sep}sidecar {} missing (image {new})", s.container)?,
                        Some(old) if old != new => {
                            write!(f, "{sep}sidecar {} image {old} -> {new}", s.container)?;
                            let others: Vec<&str> = s
                                .fields
                                .iter()
                                .map(String::as_str)
                                .filter(|f| *f != "image")
                                .collect();
                            if !others.is_empty() {
                                write!(f, " (and {})", others.join(", "))?;
                            }
                        }
                        Some(_) => write!(
                            f,
                            "{sep}sidecar {} {} changed",
                            s.container,
                            s.fields.join(", ")
                        )?,
                    }
                }
                Ok(())
            }
            Self::Added { template } => write!(f, "template {template}: would be added"),
            Self::Removed { template } => write!(f, "template {template}: would be removed"),
            Self::Unattributed { templates } => write!(
                f,
                "templates [{}]: rendered hash changed (not visible in the pod's fields)",
                templates.join(", ")
            ),
            Self::NotInjectedNow { reason } => write!(f, "would not be injected now: {reason}"),
        }
    }
}

/// Whether a pod is still running or may run again; finished pods are not judged.
fn is_live(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Succeeded" | "Failed"))
}

/// Judges one pod. `namespace_labels` are the labels of the pod's namespace, read from the
/// cluster: with them the engine picks the rule that opts the pod in exactly as the chart's
/// webhook entries select it (the namespace entry for a namespace labelled
/// `inject: enabled` with this revision, else the pod's own label), so a pod opted in through
/// its namespace is judged as the namespace entry judged it when it was created.
///
/// `None`: the pod is none of the injector's business (not injected and not opted in, skipped
/// by a rule, finished, or being deleted); a pod that opts out where its namespace requires
/// sidecars, its service account not exempt, is its business ([`PodState::Refused`]).
pub fn check(
    inj: &Injector,
    pod: &Pod,
    namespace_labels: &BTreeMap<String, String>,
) -> Option<PodState> {
    if !is_live(pod) {
        return None;
    }
    let pod_json = crate::engine::view::pod_json(pod);
    let view = match crate::engine::view::PodView::parse(&pod_json) {
        Ok(view) => view,
        Err(error) => {
            return Some(PodState::Unknown {
                reason: format!("the pod cannot be read: {error}"),
            });
        }
    };
    let mut facts = PodFacts::new(&view, None);
    facts.namespace_labels = Some(namespace_labels);
    let recorded = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&inj.config.status_annotation));
    let Some(recorded) = recorded else {
        return unrecorded(inj, &facts);
    };
    let status = match recorded_status(inj, recorded) {
        Ok(status) => status,
        Err(state) => return Some(state),
    };
    // A status without `revision` (the default revision's, or one written before revisions
    // existed) reads as the default, unnamed revision.
    if status.revision != inj.config.revision {
        return Some(PodState::OtherRevision {
            revision: status.revision,
        });
    }
    let plan = match injected_now(inj, &facts) {
        Ok(plan) => plan,
        Err(state) => return Some(state),
    };
    Some(against_plan(pod, &status, &plan))
}

// === the steps of check ===

/// A pod with no status annotation: not injected, and the injector's business only if it
/// would be injected now.
fn unrecorded(inj: &Injector, facts: &PodFacts<'_>) -> Option<PodState> {
    match decide(inj, facts) {
        Ok(Decision::Inject(_)) => Some(PodState::NotInjected),
        Ok(Decision::NotOptedIn) if required_opt_out(inj, facts) == Some(OptOut::Refused) => {
            Some(PodState::Refused {
                reason: opt_in(inj, facts).err().unwrap_or_default(),
            })
        }
        Ok(Decision::NotOptedIn | Decision::Skip(_)) => None,
        Err(error) => Some(PodState::Unknown {
            reason: error.to_string(),
        }),
    }
}

/// The status annotation the pod carries, read; `Unknown` when the injector did not write it.
fn recorded_status(inj: &Injector, recorded: &str) -> Result<Status, PodState> {
    serde_json::from_str::<Status>(recorded).map_err(|_| PodState::Unknown {
        reason: format!(
            "annotation {} is not a status the injector wrote",
            inj.config.status_annotation
        ),
    })
}

/// What the current configuration injects into an injected pod, or its state when that is
/// nothing (no longer opted in, skipped by a rule) or cannot be told.
fn injected_now(inj: &Injector, facts: &PodFacts<'_>) -> Result<Plan, PodState> {
    match decide(inj, facts) {
        Err(error) => Err(PodState::Unknown {
            reason: error.to_string(),
        }),
        Ok(Decision::NotOptedIn) => {
            let reason = match opt_in(inj, facts) {
                Err(reason) => reason,
                Ok(_) => "it is no longer opted in".to_owned(),
            };
            Err(PodState::Outdated {
                changes: vec![Change::NotInjectedNow { reason }],
            })
        }
        Ok(Decision::Skip(reason)) => Err(PodState::Outdated {
            changes: vec![Change::NotInjectedNow {
                reason: reason.to_string(),
            }],
        }),
        Ok(Decision::Inject(plan)) => Ok(plan),
    }
}

/// The pod's recorded injection against what would be injected now: current, or outdated and
/// what changed.
fn against_plan(pod: &Pod, status: &Status, plan: &Plan) -> PodState {
    let wanted: Vec<&str> = plan.templates.iter().map(|t| t.name.as_str()).collect();
    let hash = serde_json::from_str::<Status>(&plan.status.text)
        .map(|s| s.hash)
        .unwrap_or_default();
    if status.hash == hash && status.templates == wanted {
        return PodState::Current;
    }
    let mut changes = membership_changes(status, &wanted);
    let kept: BTreeSet<&str> = status.kept.iter().map(String::as_str).collect();
    let common: Vec<&Rendered> = plan
        .templates
        .iter()
        .filter(|t| status.templates.contains(&t.name))
        .collect();
    // Templates added or removed change the hash by themselves: then a common template that
    // shows no difference needs no further explanation.
    let membership_changed = !changes.is_empty();
    let mut attributed = false;
    for t in &common {
        if let Some(change) = template_change(pod, t, &plan.templates, &kept) {
            attributed = true;
            changes.push(change);
        }
    }
    if !attributed && !membership_changed && !common.is_empty() {
        changes.push(Change::Unattributed {
            templates: common.iter().map(|t| t.name.clone()).collect(),
        });
    }
    PodState::Outdated { changes }
}

/// The templates the pod would get now but was not injected with, then those it was injected
/// with but would not get now.
fn membership_changes(status: &Status, wanted: &[&str]) -> Vec<Change> {
    let mut changes = Vec::new();
    for name in wanted {
        if !status.templates.iter().any(|t| t == name) {
            changes.push(Change::Added {
                template: (*name).to_owned(),
            });
        }
    }
    for name in &status.templates {
        if !wanted.contains(&name.as_str()) {
            changes.push(Change::Removed {
                template: name.clone(),
            });
        }
    }
    changes
}

/// How one template's current rendering differs from what the pod carries, if it does.
fn template_change(
    pod: &Pod,
    t: &Rendered,
    all: &[Rendered],
    kept: &BTreeSet<&str>,
) -> Option<Change> {
    let empty = Default::default();
    let spec = pod.spec.as_ref().unwrap_or(&empty);
    let init = spec.init_containers.as_deref().unwrap_or_default();
    let mut sidecars = Vec::new();
    for (wanted, present) in [
        (&t.fragment.containers, spec.containers.as_slice()),
        (&t.fragment.init_containers, init),
    ] {
        for want in wanted {
            if kept.contains(want.name.as_str()) {
                continue;
            }
            let have = present.iter().find(|c| c.name == want.name);
            let fields = match have {
                None => vec!["missing".to_owned()],
                Some(have) => differing_fields(want, have),
            };
            if !fields.is_empty() {
                sidecars.push(SidecarChange {
                    container: want.name.clone(),
                    old_image: have.and_then(|c| c.image.clone()),
                    new_image: want.image.clone(),
                    fields,
                });
            }
        }
    }
    let rest_changed = !sidecars.is_empty() || pod_side_changed(pod, t, all);
    rest_changed.then(|| Change::Changed {
        template: t.name.clone(),
        sidecars,
    })
}

/// The top-level container fields whose rendering is not what the pod carries: the fields the
/// validator owns (compared as it compares them) and any other field the template sets that
/// the stored container does not carry unchanged (API-server defaults only add, so they pass).
fn differing_fields(want: &Container, have: &Container) -> Vec<String> {
    let mut fields: BTreeSet<String> = field_problems(want, have)
        .into_iter()
        .map(|(field, _)| field.to_owned())
        .collect();
    let (Ok(Value::Object(w)), Ok(h)) = (serde_json::to_value(want), serde_json::to_value(have))
    else {
        return fields.into_iter().collect();
    };
    for (key, value) in w {
        if OWNED_FIELDS.contains(&key.as_str()) {
            continue;
        }
        if !covers(&value, h.get(&key).unwrap_or(&Value::Null)) {
            fields.insert(key);
        }
    }
    fields.into_iter().collect()
}

/// Whether the template's additions to the rest of the pod (volumes, app containers' env and
/// mounts, pull secrets, labels, annotations) are missing or different on the pod.
fn pod_side_changed(pod: &Pod, t: &Rendered, all: &[Rendered]) -> bool {
    let Ok(p) = serde_json::to_value(pod) else {
        return false;
    };
    let sidecars: BTreeSet<&str> = all
        .iter()
        .flat_map(|r| r.fragment.sidecar_names())
        .collect();
    let f = &t.fragment;
    let named = |list: &Value, name: &str| -> Option<Value> {
        list.as_array()?
            .iter()
            .find(|v| v.get("name").and_then(Value::as_str) == Some(name))
            .cloned()
    };
    for v in &f.volumes {
        let have = named(&p["spec"]["volumes"], &v.name).unwrap_or(Value::Null);
        if !covers(&serde_json::to_value(v).unwrap_or_default(), &have) {
            return true;
        }
    }
    for s in &f.image_pull_secrets {
        if named(&p["spec"]["imagePullSecrets"], &s.name).is_none() {
            return true;
        }
    }
    let apps = p["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| {
            c.get("name")
                .and_then(Value::as_str)
                .is_some_and(|n| !sidecars.contains(n))
        });
    // Only entries the container has under the template's name are compared: a container
    // without them may be a sidecar of a template the pod no longer asks for.
    for app in apps {
        for e in &f.env {
            if let Some(have) = named(&app["env"], &e.name)
                && !covers(&serde_json::to_value(e).unwrap_or_default(), &have)
            {
                return true;
            }
        }
        for m in &f.volume_mounts {
            let moved = app["volumeMounts"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|h| {
                    let same_path =
                        h.get("mountPath").and_then(Value::as_str) == Some(&m.mount_path);
                    let same_name = h.get("name").and_then(Value::as_str) == Some(&m.name);
                    same_path != same_name
                });
            if moved {
                return true;
            }
        }
    }
    let meta = &pod.metadata;
    f.labels
        .keys()
        .any(|k| !meta.labels.as_ref().is_some_and(|l| l.contains_key(k)))
        || f.annotations
            .keys()
            .any(|k| !meta.annotations.as_ref().is_some_and(|a| a.contains_key(k)))
}

/// Whether `have` carries everything `want` sets, unchanged. Objects may have extra keys (API
/// server defaults); arrays of scalars must be equal; in arrays of objects every wanted element
/// must be covered by some element of `have` (other admission plugins append to lists).
fn covers(want: &Value, have: &Value) -> bool {
    match (want, have) {
        (Value::Null, _) => true,
        (Value::Object(w), Value::Object(h)) => w
            .iter()
            .all(|(k, v)| covers(v, h.get(k).unwrap_or(&Value::Null))),
        (Value::Object(w), Value::Null) => w.values().all(|v| covers(v, &Value::Null)),
        (Value::Array(w), Value::Array(h)) if w.iter().all(Value::is_object) => {
            w.iter().all(|wv| h.iter().any(|hv| covers(wv, hv)))
        }
        (Value::Array(w), Value::Null) => w.is_empty(),
        (w, h) => w == h,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn covers_allows_defaults_but_not_changes() {
        let want = json!({"a": 1, "b": {"c": [1, 2]}, "d": [{"n": "x"}]});
        let have = json!({"a": 1, "z": 9, "b": {"c": [1, 2], "e": 0}, "d": [{"n": "y"}, {"n": "x", "p": 1}]});
        assert!(covers(&want, &have));
        assert!(!covers(
            &want,
            &json!({"a": 2, "b": {"c": [1, 2]}, "d": [{"n": "x"}]})
        ));
        assert!(!covers(
            &want,
            &json!({"a": 1, "b": {"c": [2, 1]}, "d": [{"n": "x"}]})
        ));
        assert!(!covers(
            &want,
            &json!({"a": 1, "b": {"c": [1, 2]}, "d": [{"n": "y"}]})
        ));
        assert!(covers(&json!({"a": {}}), &Value::Null));
    }

    /// In a namespace labelled `required`, a pod without its sidecars is not injected (a
    /// restart brings it current); one that opts out is refused unless its service account is
    /// exempt, and an exempt one is none of the injector's business.
    #[test]
    fn a_required_namespace_names_the_pods_that_run_without_their_sidecars() {
        let inj = Injector::exempting("shop/backup");
        let ns = BTreeMap::from([(
            "sidecar-injector.io/inject".to_owned(),
            "required".to_owned(),
        )]);
        let pod = |labels: Value, account: &str| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": "web", "namespace": "shop", "labels": labels},
                "spec": {"serviceAccountName": account, "containers": [{"name": "app", "image": "app"}]},
                "status": {"phase": "Running"}
            }))
            .expect("a pod")
        };
        assert_eq!(
            check(&inj, &pod(json!({}), "app"), &ns),
            Some(PodState::NotInjected)
        );
        let out = json!({"sidecar-injector.io/inject": "false"});
        let Some(PodState::Refused { reason }) = check(&inj, &pod(out.clone(), "app"), &ns) else {
            panic!("an opt-out in a required namespace is refused")
        };
        assert!(reason.contains("is not exempt"), "{reason}");
        assert!(!PodState::Refused { reason }.needs_restart());
        assert_eq!(check(&inj, &pod(out.clone(), "backup"), &ns), None);
        assert_eq!(check(&inj, &pod(out, "app"), &BTreeMap::new()), None);
    }
}
