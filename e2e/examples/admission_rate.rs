//! Pods admitted a second through a real API server: `admission_rate NAMESPACE COUNT
//! CONCURRENCY`. Creates COUNT opted-in pods (the e2e suite's app pod, generateName) in
//! NAMESPACE, CONCURRENCY at a time, and prints `pods=N seconds=S rate=R failed=F`. Whatever
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
use sidecar_injector_e2e::pods::opted_in;

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
    let mut pod = opted_in("web");
    pod.metadata.name = None;
    pod.metadata.generate_name = Some("rate-".into());
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
