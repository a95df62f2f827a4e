//! End-to-end scenarios of sidecar-injector against a real kube-apiserver.
//!
//! The suite (`tests/scenarios.rs`) runs against whatever cluster `KUBECONFIG` names, with the
//! webhooks already registered and answering: `e2e/run.sh` sets that up on a local control plane
//! (etcd + kube-apiserver + kube-controller-manager on 127.0.0.1, no kubelet), `e2e/kind/run.sh`
//! on a kind cluster. Pods are never run: every check reads what the apiserver stored.
//!
//! - [`env`]: what the runner tells the suite (mode, audit log, how to stop the server).
//! - [`cluster`]: a temporary namespace per scenario, pod builders, `accepts`/`rejects`.
//! - [`pods`]: what an injected or untouched pod looks like.
//! - [`webhooks`]: reading, changing and restoring the webhook configurations.
//! - [`audit`]: the apiserver's record of which webhook ran in which round.
//! - [`check`]: running `sidecar-injector check` and reading its JSON report.
//! - [`metrics`]: the apiserver's own admission metrics.
//! - [`adder`]: a second mutating webhook, served from the test binary, that adds a container.
//! - [`outdated`]: running `sidecar-injector outdated`; changing the running server's template.
//! - [`prometheus`]: the node suite's Prometheus, and the chart's dashboard and rule queries.
//! - [`policies`]: the admission policies `sidecar-injector export` writes, installed for a
//!   scenario, and a second server serving their configuration.
//! - [`certs`]: self-managed certificates: the server's Secret, both caBundles, failed calls.

pub mod adder;
pub mod audit;
pub mod certs;
pub mod check;
pub mod cluster;
pub mod env;
pub mod metrics;
pub mod node;
pub mod outdated;
pub mod pods;
pub mod policies;
pub mod prometheus;
pub mod webhooks;

use std::future::Future;
use std::time::Duration;

/// Polls `check` until it returns `Some`, at most `timeout`. The error names `what` and the last
/// reason `check` gave, so a timeout says what was being waited for and what was seen instead.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let last = match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => String::from("condition not met yet"),
            Err(error) => format!("{error:#}"),
        };
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}; last: {last}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
