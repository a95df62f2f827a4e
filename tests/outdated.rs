//! `outdated` on recorded API objects, no cluster needed.
//!
//! `tests/inputs/outdated/*.json` were recorded (managedFields dropped) from the local control
//! plane of the e2e suite with the injector running: in namespace `shop`, Deployment `web`
//! (2 replicas), StatefulSet `db`, Job `migrate`, a Job `nightly-29400000` owned by CronJob
//! `nightly`, bare pods `debug` (opted in) and `plain` (not) were created with the bundled
//! configuration of the time (before the templates saw the whole pod: [`recorded`], which is
//! `tests/inputs/outdated/config/` with the proxy image put back); then the proxy template's
//! image was changed to envoy v1.33.0 (`tests/inputs/outdated/config/`, which the server
//! reloaded) and Deployment `api` was created. The Deployments and StatefulSets were recorded
//! after `outdated --restart` had restarted `web` (no kubelet: its rollout stays unfinished).
//! The statuses carry no `context` (written before it existed), so these tests also show that
//! such pods are judged by rendering from the whole pod.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use serde::de::DeserializeOwned;
use sidecar_injector::config::Injector;
use sidecar_injector::outdated::check::{Change, PodState, SidecarChange, check};
use sidecar_injector::outdated::report::{NamespaceLabels, Report};
use sidecar_injector::outdated::workload::{
    Owners, RESTARTED_AT, Rollout, Workload, daemonset_rollout, deployment_rollout, restart_patch,
    statefulset_rollout,
};

const OLD_PROXY: &str = "docker.io/envoyproxy/envoy:v1.32.3";
const NEW_PROXY: &str = "docker.io/envoyproxy/envoy:v1.33.0";

fn input(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/inputs/outdated")
        .join(name)
}

fn items<K: DeserializeOwned>(file: &str) -> Vec<K> {
    let text = std::fs::read_to_string(input(file)).expect("fixture");
    let list: serde_json::Value = serde_json::from_str(&text).expect("json");
    serde_json::from_value(list["items"].clone()).expect("items")
}

fn pods() -> Vec<Pod> {
    items("pods.json")
}

/// The namespaces' labels: `shop` did not opt in (every pod there opted in by its own label).
fn namespaces() -> NamespaceLabels {
    [("shop".to_owned(), BTreeMap::new())].into()
}

fn no_labels() -> BTreeMap<String, String> {
    BTreeMap::new()
}

fn owners() -> Owners {
    Owners::new(
        &items::<ReplicaSet>("replicasets.json"),
        &items::<Job>("jobs.json"),
    )
}

/// The configuration the server ran when `api` was created: proxy image changed.
fn changed() -> Injector {
    sidecar_injector::load::injector(Some(&input("config/config.yaml"))).expect("loads")
}

/// The configuration file the pods were injected with.
fn recorded_config() -> String {
    std::fs::read_to_string(input("config/config.yaml")).expect("fixture")
}

/// The templates the pods were injected with: the ones in `config/`, proxy image put back.
fn recorded_templates() -> Vec<(String, String)> {
    sidecar_injector::load::read_templates(&input("config"))
        .expect("templates")
        .into_iter()
        .map(|(name, source)| (name, source.replace(NEW_PROXY, OLD_PROXY)))
        .collect()
}

/// The configuration the server ran when all but `api` were created.
fn recorded() -> Injector {
    Injector::from_sources(
        "recorded.yaml",
        &recorded_config(),
        recorded_templates(),
        None,
    )
    .expect("loads")
}

fn pod(name: &str) -> Pod {
    pods()
        .into_iter()
        .find(|p| p.metadata.name.as_deref() == Some(name))
        .expect("the pod is in the fixture")
}

fn named_pod(prefix: &str) -> Pod {
    pods()
        .into_iter()
        .find(|p| {
            p.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(prefix))
        })
        .expect("a pod with that prefix is in the fixture")
}

fn states(report: &Report) -> Vec<(String, &'static str)> {
    report
        .workloads
        .iter()
        .map(|w| (w.workload.to_string(), w.state))
        .collect()
}

fn proxy_change(old: &str, new: &str) -> PodState {
    PodState::Outdated {
        changes: vec![Change::Changed {
            template: "proxy".into(),
            sidecars: vec![SidecarChange {
                container: "proxy".into(),
                old_image: Some(old.into()),
                new_image: Some(new.into()),
                fields: vec!["image".into()],
            }],
        }],
    }
}

#[test]
fn after_a_template_change_exactly_the_older_workloads_are_outdated() {
    let report = Report::build(&changed(), &pods(), &owners(), &namespaces());
    assert_eq!(
        states(&report),
        [
            ("CronJob/nightly".to_owned(), "outdated"),
            ("Deployment/api".to_owned(), "current"),
            ("Deployment/web".to_owned(), "outdated"),
            ("Job/migrate".to_owned(), "outdated"),
            ("Pod/debug".to_owned(), "outdated"),
            ("StatefulSet/db".to_owned(), "outdated"),
        ]
    );
    assert_eq!(report.counts.current, 1);
    assert_eq!(report.counts.outdated, 6);
    assert!(report.anything_outdated());
    // Only the proxy changed, and the report says so with both images, for every pod.
    for w in report.workloads.iter().filter(|w| w.state == "outdated") {
        for p in &w.pods {
            assert_eq!(p.state, proxy_change(OLD_PROXY, NEW_PROXY), "{}", p.name);
        }
    }
    let web = report
        .workloads
        .iter()
        .find(|w| w.workload.name == "web")
        .expect("web");
    assert_eq!(web.pods.len(), 2);
    insta::assert_snapshot!("table_after_change", report.table());
    insta::assert_snapshot!("json_after_change", report.json());
}

#[test]
fn against_the_old_configuration_only_the_newer_workload_is_outdated() {
    let report = Report::build(&recorded(), &pods(), &owners(), &namespaces());
    let outdated: Vec<String> = report
        .workloads
        .iter()
        .filter(|w| w.state != "current")
        .map(|w| w.workload.to_string())
        .collect();
    assert_eq!(outdated, ["Deployment/api"]);
    assert_eq!(
        check(&recorded(), &named_pod("api-"), &no_labels()),
        Some(proxy_change(NEW_PROXY, OLD_PROXY))
    );
}

#[test]
fn pods_that_are_not_the_injectors_business_are_not_listed() {
    let inj = changed();
    assert_eq!(
        check(&inj, &pod("plain"), &no_labels()),
        None,
        "not opted in"
    );
    let mut done = pod("debug");
    if let Some(s) = done.status.as_mut() {
        s.phase = Some("Succeeded".into());
    }
    assert_eq!(check(&inj, &done, &no_labels()), None, "finished");
    let mut deleting = pod("debug");
    deleting.metadata.deletion_timestamp = pod("debug").metadata.creation_timestamp;
    assert_eq!(check(&inj, &deleting, &no_labels()), None, "being deleted");
    let mut skipped = pod("plain");
    skipped.metadata.namespace = Some("kube-system".into());
    assert_eq!(check(&inj, &skipped, &no_labels()), None);
}

#[test]
fn opted_in_pod_without_status_is_not_injected() {
    let inj = changed();
    let mut p = pod("debug");
    p.metadata
        .annotations
        .as_mut()
        .map(|a| a.remove("sidecar-injector.io/status"));
    assert_eq!(check(&inj, &p, &no_labels()), Some(PodState::NotInjected));
    let report = Report::build(&inj, &[p], &owners(), &namespaces());
    assert_eq!(report.counts.not_injected, 1);
    assert!(report.anything_outdated());
    assert!(report.workloads[0].needs_restart());
    assert_eq!(report.workloads[0].state, "notInjected");
}

fn with_revision(mut p: Pod, revision: &str) -> Pod {
    let annotations = p.metadata.annotations.get_or_insert_with(Default::default);
    let status = annotations
        .get("sidecar-injector.io/status")
        .expect("status");
    let mut v: serde_json::Value = serde_json::from_str(status).expect("json");
    v["revision"] = revision.into();
    annotations.insert("sidecar-injector.io/status".into(), v.to_string());
    p
}

#[test]
fn another_revisions_pods_are_reported_as_such_and_not_restarted() {
    // A pod that asked for the canary revision (its label) and was injected by it.
    let mut canary = with_revision(pod("debug"), "canary");
    canary
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("sidecar-injector.io/rev".into(), "canary".into());
    assert_eq!(
        check(&changed(), &canary, &no_labels()),
        Some(PodState::OtherRevision {
            revision: "canary".into()
        })
    );
    // An injector of revision "canary" judges that pod, and leaves the default revision's.
    let config = format!("{}\nrevision: canary\n", recorded_config());
    let inj =
        Injector::from_sources("canary.yaml", &config, recorded_templates(), None).expect("loads");
    assert_eq!(check(&inj, &canary, &no_labels()), Some(PodState::Current));
    assert_eq!(
        check(&inj, &pod("debug"), &no_labels()),
        Some(PodState::OtherRevision {
            revision: String::new()
        })
    );
    let report = Report::build(&changed(), &[canary], &owners(), &namespaces());
    assert!(!report.anything_outdated());
    assert!(!report.workloads[0].needs_restart());
}

#[test]
fn templates_added_or_removed_are_named() {
    let only_proxy = recorded_config().replace(
        "defaultTemplates: [log-shipper, proxy]",
        "defaultTemplates: [proxy]",
    );
    assert_ne!(only_proxy, recorded_config());
    let inj =
        Injector::from_sources("c.yaml", &only_proxy, recorded_templates(), None).expect("loads");
    assert_eq!(
        check(&inj, &pod("debug"), &no_labels()),
        Some(PodState::Outdated {
            changes: vec![Change::Removed {
                template: "log-shipper".into()
            }]
        })
    );
}

#[test]
fn a_change_outside_the_sidecars_is_attributed_to_its_template() {
    let templates: Vec<(String, String)> = recorded_templates()
        .into_iter()
        .map(|(name, source)| {
            let source = source.replace("sizeLimit: 256Mi", "sizeLimit: 512Mi");
            (name, source)
        })
        .collect();
    let inj = Injector::from_sources("c.yaml", &recorded_config(), templates, None).expect("loads");
    assert_eq!(
        check(&inj, &pod("debug"), &no_labels()),
        Some(PodState::Outdated {
            changes: vec![Change::Changed {
                template: "log-shipper".into(),
                sidecars: vec![]
            }]
        })
    );
}

#[test]
fn a_changed_non_owned_sidecar_field_is_named() {
    let templates: Vec<(String, String)> = recorded_templates()
        .into_iter()
        .map(|(name, source)| {
            (
                name,
                source.replace("failureThreshold: 30", "failureThreshold: 60"),
            )
        })
        .collect();
    let inj = Injector::from_sources("c.yaml", &recorded_config(), templates, None).expect("loads");
    let Some(PodState::Outdated { changes }) = check(&inj, &pod("debug"), &no_labels()) else {
        panic!("outdated expected");
    };
    assert_eq!(
        changes,
        [Change::Changed {
            template: "proxy".into(),
            sidecars: vec![SidecarChange {
                container: "proxy".into(),
                old_image: Some(OLD_PROXY.into()),
                new_image: Some(OLD_PROXY.into()),
                fields: vec!["startupProbe".into()],
            }]
        }]
    );
    assert_eq!(
        changes[0].to_string(),
        "template proxy: sidecar proxy startupProbe changed"
    );
}

#[test]
fn a_broken_status_or_a_template_gone_is_unknown() {
    let mut p = pod("debug");
    p.metadata
        .annotations
        .as_mut()
        .map(|a| a.insert("sidecar-injector.io/status".into(), "{oops".into()));
    assert!(matches!(
        check(&changed(), &p, &no_labels()),
        Some(PodState::Unknown { .. })
    ));
    let mut p = pod("debug");
    p.metadata
        .annotations
        .as_mut()
        .map(|a| a.insert("sidecar-injector.io/templates".into(), "gone".into()));
    let Some(PodState::Unknown { reason }) = check(&changed(), &p, &no_labels()) else {
        panic!("unknown expected");
    };
    assert!(reason.contains("\"gone\""), "{reason}");
}

#[test]
fn pods_are_grouped_by_the_workload_a_person_knows() {
    let owners = owners();
    let workload = |p: &Pod| owners.workload_of(p).to_string();
    assert_eq!(workload(&named_pod("web-")), "Deployment/web");
    assert_eq!(workload(&named_pod("nightly-")), "CronJob/nightly");
    assert_eq!(workload(&named_pod("migrate-")), "Job/migrate");
    assert_eq!(workload(&pod("db-0")), "StatefulSet/db");
    assert_eq!(workload(&pod("debug")), "Pod/debug");
    // A ReplicaSet that is not in the list (deleted meanwhile) stands for itself.
    let alone = Owners::new(&[], &[]).workload_of(&named_pod("web-"));
    assert_eq!(alone.kind, "ReplicaSet");
    let restartable = |kind: &str| {
        Workload {
            namespace: "shop".into(),
            kind: kind.into(),
            name: "x".into(),
        }
        .restartable()
    };
    assert!(restartable("Deployment") && restartable("StatefulSet") && restartable("DaemonSet"));
    assert!(!restartable("Pod") && !restartable("Job") && !restartable("CronJob"));
    assert!(!restartable("ReplicaSet"));
}

#[test]
fn restart_is_the_pod_template_annotation_kubectl_sets() {
    assert_eq!(
        restart_patch("2026-11-23T10:00:00Z"),
        serde_json::json!({"spec": {"template": {"metadata": {"annotations": {
            RESTARTED_AT: "2026-11-23T10:00:00Z"
        }}}}})
    );
    assert_eq!(RESTARTED_AT, "kubectl.kubernetes.io/restartedAt");
}

#[test]
fn rollout_status_of_recorded_workloads() {
    let deployments: Vec<Deployment> = items("deployments.json");
    let by_name = |name: &str| {
        deployments
            .iter()
            .find(|d| d.metadata.name.as_deref() == Some(name))
            .expect("deployment")
    };
    // Restarted with no kubelet: one new replica created, never available.
    assert_eq!(
        deployment_rollout(by_name("web")),
        Rollout::Waiting("1 of 2 new replicas updated".into())
    );
    assert_eq!(
        deployment_rollout(by_name("api")),
        Rollout::Waiting("0 of 1 updated replicas available".into())
    );
    // What a node adds: the replicas become available and old ones go away.
    let mut done = by_name("api").clone();
    if let Some(s) = done.status.as_mut() {
        s.available_replicas = Some(1);
        s.ready_replicas = Some(1);
    }
    assert_eq!(deployment_rollout(&done), Rollout::Done);
    let mut unseen = done.clone();
    unseen.metadata.generation = Some(2);
    assert!(matches!(deployment_rollout(&unseen), Rollout::Waiting(_)));
    let mut stuck = done.clone();
    if let Some(c) = stuck
        .status
        .as_mut()
        .and_then(|s| s.conditions.as_mut())
        .and_then(|c| c.iter_mut().find(|c| c.type_ == "Progressing"))
    {
        c.reason = Some("ProgressDeadlineExceeded".into());
    }
    assert!(matches!(deployment_rollout(&stuck), Rollout::Failed(_)));

    let statefulsets: Vec<StatefulSet> = items("statefulsets.json");
    let db = &statefulsets[0];
    assert_eq!(
        statefulset_rollout(db),
        Rollout::Waiting("0 of 1 replicas ready".into())
    );
    let mut ready = db.clone();
    if let Some(s) = ready.status.as_mut() {
        s.ready_replicas = Some(1);
    }
    assert_eq!(statefulset_rollout(&ready), Rollout::Done);
    if let Some(s) = ready.status.as_mut() {
        s.update_revision = Some("db-new".into());
    }
    assert!(matches!(statefulset_rollout(&ready), Rollout::Waiting(_)));
}

#[test]
fn daemonset_rollout_waits_for_every_node() {
    let ds = |generation: i64, observed: i64, updated: i32, available: i32| -> DaemonSet {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "agent", "namespace": "shop", "generation": generation},
            "status": {
                "observedGeneration": observed,
                "desiredNumberScheduled": 3,
                "currentNumberScheduled": 3,
                "numberMisscheduled": 0,
                "numberReady": available,
                "updatedNumberScheduled": updated,
                "numberAvailable": available
            }
        }))
        .expect("daemonset")
    };
    assert!(matches!(
        daemonset_rollout(&ds(2, 1, 3, 3)),
        Rollout::Waiting(_)
    ));
    assert_eq!(
        daemonset_rollout(&ds(2, 2, 1, 3)),
        Rollout::Waiting("1 of 3 pods updated".into())
    );
    assert_eq!(
        daemonset_rollout(&ds(2, 2, 3, 2)),
        Rollout::Waiting("2 of 3 updated pods available".into())
    );
    assert_eq!(daemonset_rollout(&ds(2, 2, 3, 3)), Rollout::Done);
}

#[test]
fn a_change_the_pod_cannot_show_is_reported_unattributed() {
    // Annotations are set only when absent, so a new value is not visible on an injected pod.
    let templates: Vec<(String, String)> = recorded_templates()
        .into_iter()
        .map(|(name, source)| {
            let source = source.replace(
                "sidecar-injector.io/proxy-port: \"{{ values.proxy.port }}\"",
                "sidecar-injector.io/proxy-port: \"15002\"",
            );
            (name, source)
        })
        .collect();
    assert_ne!(templates, recorded_templates());
    let inj = Injector::from_sources("c.yaml", &recorded_config(), templates, None).expect("loads");
    let state = check(&inj, &pod("debug"), &no_labels());
    assert_eq!(
        state,
        Some(PodState::Outdated {
            changes: vec![Change::Unattributed {
                templates: vec!["log-shipper".into(), "proxy".into()]
            }]
        })
    );
    let Some(PodState::Outdated { changes }) = state else {
        unreachable!()
    };
    assert_eq!(
        changes[0].to_string(),
        "templates [log-shipper, proxy]: rendered hash changed (not visible in the pod's fields)"
    );
}

/// `pod` as the mutating webhook would store it, opted in with its namespace's `labels` (`None`:
/// the engine does not inject it through the namespace entry).
fn injected_in(inj: &Injector, mut pod: Pod, labels: &BTreeMap<String, String>) -> Option<Pod> {
    use sidecar_injector::inject::{Decision, Entry, PodFacts, apply, decide, plan_edits};
    use sidecar_injector::view::{PodView, pod_json};
    let json = pod_json(&pod);
    let view = PodView::parse(&json).expect("a pod reads through the view");
    let mut facts = PodFacts::new(&view, None);
    facts.namespace_labels = Some(labels);
    let plan = match decide(inj, &facts) {
        Ok(Decision::Inject(plan)) if plan.entry == Entry::Namespace => plan,
        _ => return None,
    };
    let edits = plan_edits(inj, &view, &plan);
    apply(&mut pod, &edits);
    Some(pod)
}

/// A pod opted in by its namespace is judged through the namespace entry: current while the
/// namespace is labelled, no longer injected once it is not, or when the pod opts out; another
/// revision's namespace leaves it to that revision.
#[test]
fn a_pod_opted_in_by_its_namespace_is_judged_as_the_namespace_entry() {
    let inj = changed();
    let enabled: BTreeMap<String, String> = [(
        "sidecar-injector.io/inject".to_owned(),
        "enabled".to_owned(),
    )]
    .into();
    let plain = pod("plain");
    assert_eq!(check(&inj, &plain, &no_labels()), None, "not opted in");
    assert_eq!(
        check(&inj, &plain, &enabled),
        Some(PodState::NotInjected),
        "its namespace opts it in"
    );
    let stored = injected_in(&inj, plain, &enabled).expect("injected through its namespace");
    assert_eq!(check(&inj, &stored, &enabled), Some(PodState::Current));
    let by_namespace: NamespaceLabels = [("shop".to_owned(), enabled.clone())].into();
    let report = Report::build(
        &inj,
        std::slice::from_ref(&stored),
        &owners(),
        &by_namespace,
    );
    assert_eq!(report.counts.current, 1);
    assert!(!report.anything_outdated());

    let not_injected_now =
        |labels: &BTreeMap<String, String>, pod: &Pod| match check(&inj, pod, labels) {
            Some(PodState::Outdated { changes }) => match changes.as_slice() {
                [Change::NotInjectedNow { reason }] => reason.clone(),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        };
    let reason = not_injected_now(&no_labels(), &stored);
    assert!(
        reason.contains("sidecar-injector.io/inject=enabled"),
        "{reason}"
    );
    let mut canary = enabled.clone();
    canary.insert("sidecar-injector.io/rev".into(), "canary".into());
    let reason = not_injected_now(&canary, &stored);
    assert!(reason.contains("revision \"canary\""), "{reason}");
    let mut opted_out = stored.clone();
    opted_out
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("sidecar-injector.io/inject".into(), "false".into());
    let reason = not_injected_now(&enabled, &opted_out);
    assert!(reason.contains("opts out"), "{reason}");

    // Injected by the canary revision: not this installation's to judge, whatever the labels.
    let theirs = with_revision(stored, "canary");
    assert_eq!(
        check(&inj, &theirs, &enabled),
        Some(PodState::OtherRevision {
            revision: "canary".into()
        })
    );
}
