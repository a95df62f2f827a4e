//! The apiserver's audit log: which mutating webhook it called, in which round, and whether the
//! call changed the pod. The apiserver records each call as the annotation
//! `mutation.webhook.admission.k8s.io/round_<R>_index_<I>` with the JSON value
//! `{"configuration": ..., "webhook": ..., "mutated": ...}` (pods are logged at Request level).

use std::path::Path;

use anyhow::Context as _;
use serde::Deserialize;
use serde_json::Value;

use crate::cluster::WAIT;
use crate::eventually;

const MUTATION_PREFIX: &str = "mutation.webhook.admission.k8s.io/round_";
const FAILED_OPEN_PREFIX: &str = "failed-open.mutation.webhook.admission.k8s.io/round_";

/// One call of a mutating webhook, as the apiserver recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub round: u32,
    pub index: u32,
    pub configuration: String,
    pub webhook: String,
    pub mutated: bool,
}

/// What the audit log says about one pod create.
#[derive(Clone, Debug, Default)]
pub struct Record {
    /// Mutating webhook calls in the order the apiserver made them.
    pub calls: Vec<Call>,
    /// Calls that failed and were ignored (failurePolicy Ignore), as (round, index, webhook).
    pub failed_open: Vec<(u32, u32, String)>,
    /// The HTTP code the create got.
    pub code: Option<u16>,
}

impl Record {
    /// The calls of webhooks in configuration `configuration`.
    pub fn calls_of<'a>(&'a self, configuration: &'a str) -> impl Iterator<Item = &'a Call> {
        self.calls
            .iter()
            .filter(move |c| c.configuration == configuration)
    }

    /// One line per call, for failure messages.
    pub fn describe(&self) -> String {
        self.calls
            .iter()
            .map(|c| {
                format!(
                    "round {} index {}: {}/{} mutated={}",
                    c.round, c.index, c.configuration, c.webhook, c.mutated
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    stage: String,
    verb: String,
    #[serde(default)]
    request_uri: String,
    #[serde(default)]
    object_ref: Option<ObjectRef>,
    #[serde(default)]
    request_object: Option<Value>,
    #[serde(default)]
    response_status: Option<ResponseStatus>,
    #[serde(default)]
    annotations: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct ObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    name: String,
    /// `binding` when the scheduler binds the pod to a node (also a create of "pods").
    #[serde(default)]
    subresource: String,
}

#[derive(Deserialize)]
struct ResponseStatus {
    #[serde(default)]
    code: Option<u16>,
}

#[derive(Deserialize)]
struct Annotation {
    configuration: String,
    webhook: String,
    mutated: bool,
}

fn round_index(rest: &str) -> Option<(u32, u32)> {
    let (round, index) = rest.split_once("_index_")?;
    Some((round.parse().ok()?, index.parse().ok()?))
}

/// Parses the audit log's text for the (not dry-run) create of pod `ns/name`.
pub fn find_create(log: &str, ns: &str, name: &str) -> Option<Record> {
    let mut found = None;
    for line in log.lines() {
        let Ok(event) = serde_json::from_str::<Event>(line) else {
            continue;
        };
        let Some(object) = &event.object_ref else {
            continue;
        };
        let object_name = if object.name.is_empty() {
            event
                .request_object
                .as_ref()
                .and_then(|o| o.pointer("/metadata/name"))
                .and_then(Value::as_str)
                .unwrap_or_default()
        } else {
            object.name.as_str()
        };
        if event.stage != "ResponseComplete"
            || event.verb != "create"
            || object.resource != "pods"
            || !object.subresource.is_empty()
            || object.namespace != ns
            || object_name != name
            || event.request_uri.contains("dryRun")
        {
            continue;
        }
        let mut record = Record {
            code: event.response_status.and_then(|s| s.code),
            ..Default::default()
        };
        for (key, value) in &event.annotations {
            if let Some(rest) = key.strip_prefix(MUTATION_PREFIX) {
                let (Some((round, index)), Ok(a)) =
                    (round_index(rest), serde_json::from_str::<Annotation>(value))
                else {
                    continue;
                };
                record.calls.push(Call {
                    round,
                    index,
                    configuration: a.configuration,
                    webhook: a.webhook,
                    mutated: a.mutated,
                });
            } else if let Some(rest) = key.strip_prefix(FAILED_OPEN_PREFIX)
                && let Some((round, index)) = round_index(rest)
            {
                let webhook = serde_json::from_str::<Value>(value)
                    .ok()
                    .and_then(|v| v["webhook"].as_str().map(str::to_owned))
                    .unwrap_or_else(|| value.clone());
                record.failed_open.push((round, index, webhook));
            }
        }
        record.calls.sort_by_key(|c| (c.round, c.index));
        found = Some(record);
    }
    found
}

/// Waits (bounded) until the audit log at `path` has the create of pod `ns/name`.
pub async fn pod_create(path: &Path, ns: &str, name: &str) -> anyhow::Result<Record> {
    eventually(
        &format!(
            "the audit event of the create of pod {ns}/{name} in {}",
            path.display()
        ),
        WAIT,
        || async {
            let text = tokio::fs::read_to_string(path)
                .await
                .with_context(|| format!("cannot read {}", path.display()))?;
            Ok(find_create(&text, ns, name))
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rounds_and_skips_dry_runs_and_bindings() {
        let ours = r#"{\"configuration\":\"sidecar-injector\",\"webhook\":\"inject.sidecar-injector.io\",\"mutated\":true}"#;
        let again = r#"{\"configuration\":\"sidecar-injector\",\"webhook\":\"inject.sidecar-injector.io\",\"mutated\":false}"#;
        let log = format!(
            concat!(
                r#"{{"stage":"ResponseComplete","verb":"create","requestURI":"/api/v1/namespaces/n/pods?dryRun=All","objectRef":{{"resource":"pods","namespace":"n","name":"p"}},"annotations":{{}}}}"#,
                "\n",
                r#"{{"stage":"ResponseComplete","verb":"create","requestURI":"/api/v1/namespaces/n/pods","objectRef":{{"resource":"pods","namespace":"n","name":"p"}},"responseStatus":{{"code":201}},"annotations":{{"mutation.webhook.admission.k8s.io/round_1_index_0":"{}","mutation.webhook.admission.k8s.io/round_0_index_0":"{}"}}}}"#,
                "\n",
                // The scheduler's binding, after the create, on a node.
                r#"{{"stage":"ResponseComplete","verb":"create","requestURI":"/api/v1/namespaces/n/pods/p/binding","objectRef":{{"resource":"pods","namespace":"n","name":"p","subresource":"binding"}},"responseStatus":{{"code":201}},"annotations":{{}}}}"#,
                "\n"
            ),
            again, ours
        );
        let record = find_create(&log, "n", "p").expect("record");
        assert_eq!(record.code, Some(201));
        assert_eq!(record.calls.len(), 2);
        assert_eq!((record.calls[0].round, record.calls[0].mutated), (0, true));
        assert_eq!((record.calls[1].round, record.calls[1].mutated), (1, false));
        assert!(find_create(&log, "n", "other").is_none());
    }
}
