//! Pods admitted a second through a real API server: `admission_rate NAMESPACE COUNT
//! CONCURRENCY`. Creates COUNT opted-in pods (generateName) in NAMESPACE, CONCURRENCY at a
//! time, and prints `pods=N seconds=S rate=R failed=F`. The pod is shaped for the bundled
//! proxy's loops: an init container and two containers declaring five ports, of which three
//! distinct TCP ports (9090 declared by both containers, once in the proxy's list) and one UDP
//! port (skipped), so the proxy renders three listeners and three clusters. Whatever
//! injects them (a MutatingAdmissionPolicy, a webhook, nothing) is the namespace's business:
//! bench/admission.sh labels one namespace per road. Bounded by COUNT; talks only to the
//! API server KUBECONFIG names.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;
use sidecar_injector_e2e::pods::{INJECT_LABEL, app_image, from_json};

/// An opted-in web service: `app` serves http, https and metrics; `worker` shares the metrics
/// port (a duplicate, a warning from the API server, not an error) and sends statsd over UDP.
fn pod() -> anyhow::Result<Pod> {
    let image = app_image();
    from_json(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "rate-", "labels": {"app": "web", INJECT_LABEL: "true"}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "initContainers": [{"name": "app-init", "image": image}],
            "containers": [
                {"name": "app", "image": image, "ports": [
                    {"name": "http", "containerPort": 8080},
                    {"name": "https", "containerPort": 8443, "protocol": "TCP"},
                    {"name": "metrics", "containerPort": 9090},
                ]},
                {"name": "worker", "image": image, "ports": [
                    {"name": "metrics", "containerPort": 9090},
                    {"name": "statsd", "containerPort": 8125, "protocol": "UDP"},
                ]},
            ],
        },
    }))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, ns, count, concurrency] = &args[..] else {
        anyhow::bail!("usage: admission_rate NAMESPACE COUNT CONCURRENCY");
    };
    let count: usize = count.parse().context("COUNT")?;
    let concurrency: usize = concurrency.parse().context("CONCURRENCY")?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = Client::try_default().await?;
    let pods: Api<Pod> = Api::namespaced(client, ns);
    let pod = pod()?;
    let next = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (pods, pod, next, failed) = (pods.clone(), pod.clone(), next.clone(), failed.clone());
        workers.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < count {
                if pods.create(&PostParams::default(), &pod).await.is_err() {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for w in workers {
        w.await?;
    }
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "pods={count} seconds={seconds:.2} rate={:.0} failed={}",
        count as f64 / seconds,
        failed.load(Ordering::Relaxed)
    );
    Ok(())
}
