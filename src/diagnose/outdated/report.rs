//! The report: every judged pod, grouped by workload, as a table for people or JSON for scripts.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use super::check::{PodState, check};
use super::workload::{Owners, Workload};
use crate::engine::config::Injector;

/// Labels by namespace name: what decides whether a namespace opted its pods in.
pub type NamespaceLabels = BTreeMap<String, BTreeMap<String, String>>;

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodReport {
    pub name: String,
    #[serde(flatten)]
    pub state: PodState,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadReport {
    #[serde(flatten)]
    pub workload: Workload,
    /// The worst state among its pods (outdated, notInjected, refused, unknown, otherRevision,
    /// current).
    pub state: &'static str,
    pub pods: Vec<PodReport>,
}

impl WorkloadReport {
    /// Whether a restart would bring pods current.
    pub fn needs_restart(&self) -> bool {
        self.pods.iter().any(|p| p.state.needs_restart())
    }
}

/// Pods per state, over the whole report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    pub current: usize,
    pub outdated: usize,
    pub not_injected: usize,
    /// Left out when none, so reports without required namespaces read as they did.
    #[serde(skip_serializing_if = "is_zero")]
    pub refused: usize,
    pub other_revision: usize,
    pub unknown: usize,
}

/// What `--restart` did (or would do) with one workload.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RestartRecord {
    #[serde(flatten)]
    pub workload: Workload,
    /// `restarted`, `wouldRestart` (dry run), `notRestartable`, `overLimit`, `notReached`
    /// (an earlier rollout did not finish) or `failed`.
    pub action: &'static str,
    /// The rollout's end (`finished`, `not waited for`, `not finished after ...`) or why
    /// the workload was left alone.
    pub detail: String,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The configuration's revision (empty: the default one).
    pub revision: String,
    pub counts: Counts,
    pub workloads: Vec<WorkloadReport>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub restarts: Vec<RestartRecord>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

const SEVERITY: [&str; 6] = [
    "outdated",
    "notInjected",
    "refused",
    "unknown",
    "otherRevision",
    "current",
];

impl Report {
    /// Judges every pod and groups the judged ones by workload, sorted by namespace, kind and
    /// name (pods by name), so equal clusters give equal reports. `namespaces` holds the labels
    /// of the pods' namespaces (a namespace missing from it has none).
    pub fn build(
        inj: &Injector,
        pods: &[Pod],
        owners: &Owners,
        namespaces: &NamespaceLabels,
    ) -> Self {
        let none = BTreeMap::new();
        let mut groups: BTreeMap<Workload, Vec<PodReport>> = BTreeMap::new();
        let mut counts = Counts::default();
        for pod in pods {
            let labels = pod
                .metadata
                .namespace
                .as_ref()
                .and_then(|ns| namespaces.get(ns))
                .unwrap_or(&none);
            let Some(state) = check(inj, pod, labels) else {
                continue;
            };
            match state {
                PodState::Current => counts.current += 1,
                PodState::Outdated { .. } => counts.outdated += 1,
                PodState::NotInjected => counts.not_injected += 1,
                PodState::Refused { .. } => counts.refused += 1,
                PodState::OtherRevision { .. } => counts.other_revision += 1,
                PodState::Unknown { .. } => counts.unknown += 1,
            }
            groups
                .entry(owners.workload_of(pod))
                .or_default()
                .push(PodReport {
                    name: pod.metadata.name.clone().unwrap_or_default(),
                    state,
                });
        }
        let workloads = groups
            .into_iter()
            .map(|(workload, mut pods)| {
                pods.sort_by(|a, b| a.name.cmp(&b.name));
                let state = SEVERITY
                    .into_iter()
                    .find(|s| pods.iter().any(|p| p.state.as_str() == *s))
                    .unwrap_or("current");
                WorkloadReport {
                    workload,
                    state,
                    pods,
                }
            })
            .collect();
        Self {
            revision: inj.config.revision.clone(),
            counts,
            workloads,
            restarts: Vec::new(),
        }
    }

    /// Whether any pod needs a restart to be current (outdated, or opted in but not injected),
    /// or runs without the sidecars its namespace requires (which a restart does not mend).
    pub fn anything_outdated(&self) -> bool {
        self.counts.outdated + self.counts.not_injected + self.counts.refused > 0
    }

    pub fn json(&self) -> String {
        // Derived serialization of strings and numbers cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }

    /// One line per workload, with what changed for the pods that are not current.
    pub fn table(&self) -> String {
        let mut rows: Vec<[String; 5]> = vec![[
            "NAMESPACE".into(),
            "WORKLOAD".into(),
            "PODS".into(),
            "STATE".into(),
            "DETAIL".into(),
        ]];
        for w in &self.workloads {
            let mut details: Vec<String> = Vec::new();
            for p in &w.pods {
                let lines = match &p.state {
                    PodState::Current => Vec::new(),
                    PodState::Outdated { changes } => {
                        changes.iter().map(ToString::to_string).collect()
                    }
                    PodState::NotInjected => {
                        vec!["opted in, but has no status annotation: created while the webhook was not called".into()]
                    }
                    PodState::Refused { reason } => vec![format!(
                        "runs without sidecars: {reason}; recreating it does not help: remove its label, or exempt its service account"
                    )],
                    PodState::OtherRevision { revision } => {
                        vec![format!("injected by revision {revision:?}")]
                    }
                    PodState::Unknown { reason } => vec![reason.clone()],
                };
                for line in lines {
                    if !details.contains(&line) {
                        details.push(line);
                    }
                }
            }
            let not_current = w
                .pods
                .iter()
                .filter(|p| p.state != PodState::Current)
                .count();
            let pods = if not_current == 0 {
                w.pods.len().to_string()
            } else {
                format!("{not_current}/{}", w.pods.len())
            };
            let mut first = true;
            for detail in details
                .iter()
                .map(String::as_str)
                .chain(details.is_empty().then_some(""))
            {
                rows.push(if first {
                    [
                        w.workload.namespace.clone(),
                        w.workload.to_string(),
                        pods.clone(),
                        w.state.into(),
                        detail.into(),
                    ]
                } else {
                    [
                        String::new(),
                        String::new(),
                        String::new(),
                        String::new(),
                        detail.into(),
                    ]
                });
                first = false;
            }
        }
        let widths: Vec<usize> = (0..4)
            .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for row in &rows {
            let mut line = String::new();
            for (i, width) in widths.iter().enumerate() {
                let _ = write!(line, "{:<width$}  ", row[i]);
            }
            line.push_str(&row[4]);
            out.push_str(line.trim_end());
            out.push('\n');
        }
        let c = &self.counts;
        let _ = writeln!(
            out,
            "\n{} pods: {} current, {} outdated, {} not injected, {} other revision, {} unknown",
            c.current + c.outdated + c.not_injected + c.other_revision + c.unknown,
            c.current,
            c.outdated,
            c.not_injected,
            c.other_revision,
            c.unknown
        );
        for r in &self.restarts {
            let _ = writeln!(
                out,
                "restart {} -n {}: {}: {}",
                r.workload, r.workload.namespace, r.action, r.detail
            );
        }
        out
    }
}
