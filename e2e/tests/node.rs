//! Scenarios that can only pass on a real node (`e2e/node/run.sh`, also `e2e/kind/run.sh`):
//! injected sidecars run, the injector runs as its chart's Deployment, and admission never fails
//! while that Deployment rolls or its certificate rotates.
//!
//! The bundled templates are used unchanged; their images are stand-ins built from busybox
//! (`e2e/node/standins`): the proxy serves HTTP on the port the template's Envoy config listens
//! on, the log shipper prints what it tails from the shared volume.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;
use serde_json::json;
use sidecar_injector_e2e::cluster::{Ctx, scenario};
use sidecar_injector_e2e::env::Need;
use sidecar_injector_e2e::eventually;
use sidecar_injector_e2e::node::{
    BUSYBOX, Outcome, PodStream, Sample, StreamReport, TimedStream, injector_pods, is_ready,
    line_with, logs, ready_addresses, refusal_kind, served_certificate, service_endpoints,
    wait_rolled_out,
};
use sidecar_injector_e2e::pods::{
    INJECT_LABEL, LOG_DIR, LOG_SHIPPER, PROXY, PROXY_PORT, check_injected,
    check_own_init_after_sidecars, from_json,
};
use sidecar_injector_e2e::webhooks::with_mutating_changed;

/// Bound on a pod of the scenarios reaching Running on the node.
const RUNNING: Duration = Duration::from_secs(90);
/// Bound on the injector's own rollout.
const ROLLOUT: Duration = Duration::from_secs(150);
/// Bound on what n08 waits for: a rollout, a ConfigMap reaching the pod, a policy taking effect.
const WAIT_LONG: Duration = Duration::from_secs(90);

/// The application: an init container of its own that must find the proxy already answering on
/// 127.0.0.1 (and still answering a second later), and a container that reports the env and mount
/// it was given and writes numbered lines into the shared log directory.
fn app_deployment(name: &str) -> anyhow::Result<Deployment> {
    // busybox-static's wget crashes with -T, so `timeout` bounds it instead.
    let probe = format!(
        "timeout 2 wget -q -O - http://127.0.0.1:{PROXY_PORT}/ 2>/dev/null | grep -q 'proxy stand-in'"
    );
    let init = format!(
        "echo init: started; \
         for i in $(seq 1 50); do {probe} && break; sleep 0.2; done; \
         {probe} && echo init: proxy answered; \
         sleep 1; \
         {probe} && echo init: proxy still answering; \
         echo init: done"
    );
    let app = "echo \"app: APP_LOG_DIR=$APP_LOG_DIR SIDECAR_PROXY_PORT=$SIDECAR_PROXY_PORT\"; \
         grep -q \" $APP_LOG_DIR \" /proc/mounts && echo \"app: $APP_LOG_DIR is a mount\"; \
         i=0; while true; do i=$((i+1)); echo \"line $i from the app\" >> \"$APP_LOG_DIR/app.log\"; sleep 0.5; done";
    from_json(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, INJECT_LABEL: "true"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "initContainers": [{
                        "name": "app-init", "image": BUSYBOX, "imagePullPolicy": "Never",
                        "command": ["sh", "-c", init]
                    }],
                    "containers": [{
                        "name": "app", "image": BUSYBOX, "imagePullPolicy": "Never",
                        "command": ["sh", "-c", app]
                    }]
                }
            }
        }
    }))
}

/// Creates the Deployment and returns its pod once it is Running with every container ready.
async fn running_app(cx: &Ctx, name: &str) -> anyhow::Result<Pod> {
    let deployments: Api<Deployment> = Api::namespaced(cx.client.clone(), &cx.ns);
    deployments
        .create(&PostParams::default(), &app_deployment(name)?)
        .await?;
    let pods = cx.pods();
    eventually(
        &format!("the pod of Deployment {name} to run with every container ready"),
        RUNNING,
        || async {
            let list = pods
                .list(&ListParams::default().labels(&format!("app={name}")))
                .await?;
            let Some(pod) = list.items.into_iter().next() else {
                return Ok(None);
            };
            let status = pod.status.clone().unwrap_or_default();
            let containers_ready = status
                .container_statuses
                .iter()
                .flatten()
                .all(|c| c.ready && c.state.as_ref().is_some_and(|s| s.running.is_some()));
            if status.phase.as_deref() == Some("Running") && containers_ready && is_ready(&pod) {
                Ok(Some(pod))
            } else {
                anyhow::bail!(
                    "phase {:?}, init {:?}, containers {:?}",
                    status.phase,
                    status
                        .init_container_statuses
                        .iter()
                        .flatten()
                        .map(|c| (&c.name, c.state.clone()))
                        .collect::<Vec<_>>(),
                    status
                        .container_statuses
                        .iter()
                        .flatten()
                        .map(|c| (&c.name, c.state.clone()))
                        .collect::<Vec<_>>()
                )
            }
        },
    )
    .await
}

/// n01. An opted-in Deployment's pod runs on the node with its sidecars: the native sidecar
/// proxy starts before the pod's own init container and is still running while it runs (the
/// init container reaches it on 127.0.0.1, twice, a second apart); the app container sees the
/// injected env vars and mount from inside.
#[tokio::test]
async fn n01_injected_pod_runs_with_its_sidecars() -> anyhow::Result<()> {
    scenario("n01-sidecars-run", &[Need::Node], |cx| async move {
        let pod = running_app(&cx, "web").await?;
        check_injected(&pod)?;
        check_own_init_after_sidecars(&pod, &["app-init"])?;
        let name = pod.metadata.name.clone().context("pod without a name")?;
        let status = pod.status.clone().unwrap_or_default();
        let init = |n: &str| {
            status
                .init_container_statuses
                .iter()
                .flatten()
                .find(|c| c.name == n)
                .cloned()
                .with_context(|| format!("no status of init container {n}"))
        };
        let proxy = init(PROXY)?;
        let proxy_running = proxy
            .state
            .as_ref()
            .and_then(|s| s.running.as_ref())
            .context("the proxy is not running")?;
        ensure!(
            proxy.restart_count == 0,
            "the proxy restarted {} times",
            proxy.restart_count
        );
        let app_init = init("app-init")?;
        let finished = app_init
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .context("the pod's own init container has not terminated")?;
        ensure!(
            finished.exit_code == 0,
            "app-init exited {}",
            finished.exit_code
        );
        ensure!(
            proxy_running.started_at.as_ref().map(|t| t.0)
                <= finished.started_at.as_ref().map(|t| t.0),
            "the proxy ({:?}) did not start before app-init ({:?})",
            proxy_running.started_at,
            finished.started_at
        );

        let pods = cx.pods();
        let proxy_log = logs(&pods, &name, PROXY).await?;
        let init_log = logs(&pods, &name, "app-init").await?;
        let serving = line_with(
            &proxy_log,
            &format!("serving on port {PROXY_PORT}"),
            "proxy",
        )?;
        let started = line_with(&init_log, "init: started", "app-init")?;
        line_with(&init_log, "init: proxy answered", "app-init")?;
        line_with(&init_log, "init: proxy still answering", "app-init")?;
        ensure!(
            serving.at.len() == started.at.len() && serving.at < started.at,
            "the proxy logged it was serving at {}, after app-init started at {}",
            serving.at,
            started.at
        );
        println!(
            "proxy serving at {}, app-init started at {}, finished {:?}; proxy still running",
            serving.at, started.at, finished.finished_at
        );

        let app_log = logs(&pods, &name, "app").await?;
        line_with(
            &app_log,
            &format!("app: APP_LOG_DIR={LOG_DIR} SIDECAR_PROXY_PORT={PROXY_PORT}"),
            "app",
        )?;
        line_with(&app_log, &format!("app: {LOG_DIR} is a mount"), "app")?;
        Ok(())
    })
    .await
}

/// n02. The log shipper ships: the lines the app writes into the shared volume are the lines the
/// log-shipper container reads and prints, tagged with the pod's namespace and app label.
#[tokio::test]
async fn n02_log_shipper_reads_what_the_app_writes() -> anyhow::Result<()> {
    scenario("n02-log-shipper", &[Need::Node], |cx| async move {
        let pod = running_app(&cx, "writer").await?;
        let name = pod.metadata.name.clone().context("pod without a name")?;
        let pods = cx.pods();
        let tag = format!("[{}.writer]", cx.ns);
        let shipped = eventually(
            "the log shipper to print the app's third line",
            Duration::from_secs(30),
            || async {
                let log = logs(&pods, &name, LOG_SHIPPER).await?;
                Ok(log
                    .iter()
                    .any(|l| l.text == format!("{tag} line 3 from the app"))
                    .then_some(log))
            },
        )
        .await?;
        let lines: Vec<&str> = shipped
            .iter()
            .filter_map(|l| l.text.strip_prefix(&format!("{tag} ")))
            .collect();
        ensure!(
            lines.starts_with(&[
                "line 1 from the app",
                "line 2 from the app",
                "line 3 from the app"
            ]),
            "the shipper printed {lines:?}, expected the app's lines in order from the first"
        );
        Ok(())
    })
    .await
}

/// n03. The injector serves as its chart installed it: a Deployment of 2 ready replicas running
/// the image built from the Dockerfile's layout on this node, a PodDisruptionBudget keeping one,
/// and both pods behind the Service the webhook configurations name.
#[tokio::test]
async fn n03_injector_runs_as_its_charts_deployment() -> anyhow::Result<()> {
    scenario("n03-in-cluster", &[Need::Node], |cx| async move {
        let ns = cx.env.injector_namespace.clone();
        let release = cx.env.webhook_config.clone();
        wait_rolled_out(&cx.client, &ns, &release, ROLLOUT).await?;
        let deployment: Deployment = Api::namespaced(cx.client.clone(), &ns)
            .get(&release)
            .await?;
        ensure!(
            deployment.spec.as_ref().and_then(|s| s.replicas) == Some(2),
            "the chart's Deployment does not ask for 2 replicas"
        );
        let pods = injector_pods(&cx.client, &ns, &release).await?;
        ensure!(
            pods.len() == 2,
            "{} ready injector pods, expected 2",
            pods.len()
        );
        for pod in &pods {
            let spec = pod.spec.as_ref().context("no spec")?;
            ensure!(spec.node_name.is_some(), "injector pod not on a node");
            let image = spec.containers.first().and_then(|c| c.image.clone());
            ensure!(
                image
                    .as_deref()
                    .is_some_and(|i| i.contains("sidecar-injector")),
                "injector pod runs {image:?}"
            );
        }
        if cx.env.two_nodes {
            check_spread(&deployment, &pods)?;
        }
        let pdb: PodDisruptionBudget = Api::namespaced(cx.client.clone(), &ns)
            .get(&release)
            .await?;
        let pdb_status = pdb.status.context("PDB without status")?;
        ensure!(
            pdb_status.current_healthy == 2 && pdb_status.desired_healthy == 1,
            "PDB healthy {} desired {}",
            pdb_status.current_healthy,
            pdb_status.desired_healthy
        );
        let ready = ready_addresses(&cx.client, &ns, &release).await?;
        let mut pod_ips: Vec<String> = pods
            .iter()
            .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
            .collect();
        let mut got = ready.clone();
        got.sort();
        pod_ips.sort();
        ensure!(
            got == pod_ips,
            "Service endpoints {got:?}, injector pods {pod_ips:?}"
        );
        println!("injector pods ready behind the Service: {pod_ips:?}");
        Ok(())
    })
    .await
}

/// With two nodes: the chart's Deployment spreads its pods over `kubernetes.io/hostname` and
/// its ready pods run on two different nodes.
fn check_spread(deployment: &Deployment, pods: &[Pod]) -> anyhow::Result<()> {
    let spread = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.topology_spread_constraints.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.topology_key == "kubernetes.io/hostname" && c.max_skew == 1)
        });
    ensure!(
        spread,
        "the Deployment has no topologySpreadConstraint over kubernetes.io/hostname"
    );
    let mut nodes: Vec<String> = pods
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    println!("injector pods on nodes {nodes:?}");
    nodes.sort();
    nodes.dedup();
    ensure!(
        nodes.len() == pods.len(),
        "the injector's {} pods share nodes: {nodes:?}",
        pods.len()
    );
    Ok(())
}

fn check_stream(report: &StreamReport, during: &str) -> anyhow::Result<()> {
    println!(
        "{during}: {} pods created, {} refused, {} not injected",
        report.created,
        report.failures.len(),
        report.not_injected.len()
    );
    ensure!(
        report.failures.is_empty(),
        "{during}: {} of {} creations failed: {:#?}",
        report.failures.len(),
        report.created + report.failures.len(),
        report.failures
    );
    ensure!(
        report.not_injected.is_empty(),
        "{during}: stored without sidecars: {:?}",
        report.not_injected
    );
    ensure!(
        report.created >= 20,
        "{during}: only {} pods created",
        report.created
    );
    Ok(())
}

/// Pace and bound of the pod streams: 10 creations a second, never more than 1,500.
const STREAM_EVERY: Duration = Duration::from_millis(100);
const STREAM_LIMIT: usize = 1_500;

/// Runs `action` while opted-in pods are created in a steady stream with the mutating webhook's
/// failurePolicy set to Fail (put back afterwards), from 2 s before to 2 s after it; then
/// checks that not one creation failed and that every pod was stored injected.
async fn streaming_while<F, Fut>(cx: &Ctx, during: &str, action: F) -> anyhow::Result<()>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    with_mutating_changed(
        &cx.client,
        &cx.env.webhook_config,
        &cx.ns,
        |hook| {
            hook.failure_policy = Some("Fail".into());
            Ok(())
        },
        || async {
            let stream = PodStream::start(&cx.client, &cx.ns, STREAM_EVERY, STREAM_LIMIT);
            tokio::time::sleep(Duration::from_secs(2)).await;
            let acted = action().await;
            if acted.is_ok() {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            let report = stream.stop().await?;
            acted?;
            check_stream(&report, during)
        },
    )
    .await
}

/// n04. With the mutating webhook's failurePolicy Fail, pod creations go on in a steady stream
/// while one injector pod is deleted and while the Deployment is rolled
/// (`kubectl rollout restart`): not one creation fails and every pod is stored injected.
/// Without the chart's shutdown delay (`server.shutdownDelaySeconds`) this failed about one
/// run in six: the apiserver dialled the deleted pod after its listener had closed.
#[tokio::test]
async fn n04_no_admission_fails_while_the_injector_rolls() -> anyhow::Result<()> {
    scenario("n04-rollout", &[Need::Node], |cx| async move {
        let ns = cx.env.injector_namespace.clone();
        let release = cx.env.webhook_config.clone();
        wait_rolled_out(&cx.client, &ns, &release, ROLLOUT).await?;
        streaming_while(&cx, "pod deleted, then rollout restart", || async {
            let victim = injector_pods(&cx.client, &ns, &release)
                .await?
                .into_iter()
                .next()
                .and_then(|p| p.metadata.name)
                .context("no injector pod to delete")?;
            println!("deleting injector pod {victim}");
            Api::<Pod>::namespaced(cx.client.clone(), &ns)
                .delete(&victim, &DeleteParams::default())
                .await?;
            let replicas = Api::<Deployment>::namespaced(cx.client.clone(), &ns)
                .get(&release)
                .await?
                .spec
                .and_then(|s| s.replicas)
                .unwrap_or(1);
            eventually(
                "the deleted injector pod to be gone and replaced",
                ROLLOUT,
                || async {
                    let ready = injector_pods(&cx.client, &ns, &release).await?.len();
                    let gone = Api::<Pod>::namespaced(cx.client.clone(), &ns)
                        .get_opt(&victim)
                        .await?
                        .is_none();
                    Ok((gone && i32::try_from(ready)? == replicas).then_some(()))
                },
            )
            .await?;
            println!("rollout restart of deployment/{release}");
            let now = k8s_openapi::jiff::Timestamp::now().to_string();
            Api::<Deployment>::namespaced(cx.client.clone(), &ns)
                .patch(
                    &release,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"template": {"metadata": {"annotations": {
                        "kubectl.kubernetes.io/restartedAt": now
                    }}}}})),
                )
                .await?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            wait_rolled_out(&cx.client, &ns, &release, ROLLOUT).await
        })
        .await
    })
    .await
}

/// Signs a new serving certificate for `dns` with the CA (openssl, as the runner does).
async fn new_serving_cert(
    ca_cert: &str,
    ca_key: &str,
    dns: &str,
    dir: &std::path::Path,
) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let key = dir.join("rotated.key");
    let csr = dir.join("rotated.csr");
    let crt = dir.join("rotated.crt");
    let ext = dir.join("rotated.ext");
    tokio::fs::write(
        &ext,
        format!(
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:{dns}\n"
        ),
    )
    .await?;
    let run = |args: Vec<String>| async move {
        let out = tokio::process::Command::new("openssl")
            .args(&args)
            .output()
            .await?;
        ensure!(
            out.status.success(),
            "openssl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        anyhow::Ok(())
    };
    let p = |p: &std::path::Path| p.display().to_string();
    run(vec![
        "req".into(),
        "-new".into(),
        "-newkey".into(),
        "ec".into(),
        "-pkeyopt".into(),
        "ec_paramgen_curve:prime256v1".into(),
        "-nodes".into(),
        "-keyout".into(),
        p(&key),
        "-out".into(),
        p(&csr),
        "-subj".into(),
        "/CN=rotated".into(),
    ])
    .await?;
    run(vec![
        "x509".into(),
        "-req".into(),
        "-in".into(),
        p(&csr),
        "-CA".into(),
        ca_cert.into(),
        "-CAkey".into(),
        ca_key.into(),
        "-set_serial".into(),
        "0x5e7a".into(),
        "-days".into(),
        "2".into(),
        "-sha256".into(),
        "-extfile".into(),
        p(&ext),
        "-out".into(),
        p(&crt),
    ])
    .await?;
    Ok((tokio::fs::read(&crt).await?, tokio::fs::read(&key).await?))
}

/// n05. The serving Secret is replaced with a new certificate (same CA): both injector pods
/// serve it within the kubelet's sync, without restarting, while pod creations go on with the
/// mutating failurePolicy Fail and not one fails.
#[tokio::test]
async fn n05_certificate_rotation_in_the_cluster() -> anyhow::Result<()> {
    scenario(
        "n05-rotation",
        &[Need::Node, Need::PodNetwork, Need::CaKey],
        |cx| async move {
            let ns = cx.env.injector_namespace.clone();
            let release = cx.env.webhook_config.clone();
            let ca_cert = cx.env.ca_cert.clone().context("no CA_CERT")?;
            let ca_key = cx.env.ca_key.clone().context("no E2E_CA_KEY")?;
            let dns = cx.env.service_dns.clone().context("no E2E_SERVICE_DNS")?;
            let ca_pem = tokio::fs::read(&ca_cert).await?;
            wait_rolled_out(&cx.client, &ns, &release, ROLLOUT).await?;
            let before = injector_pods(&cx.client, &ns, &release).await?;
            ensure!(before.len() == 2, "{} ready injector pods", before.len());
            let fingerprint = |p: &Pod| {
                (
                    p.metadata.uid.clone().unwrap_or_default(),
                    p.status
                        .as_ref()
                        .and_then(|s| s.container_statuses.as_ref())
                        .map(|c| c.iter().map(|c| c.restart_count).sum::<i32>())
                        .unwrap_or_default(),
                )
            };
            let mut before_ids: Vec<_> = before.iter().map(fingerprint).collect();
            before_ids.sort();
            let ips: Vec<String> = before
                .iter()
                .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
                .collect();
            let old = served_certificate(&ips[0], 8443, &dns, &ca_pem).await?;

            // Removed when it drops, pass or fail: a run leaves no key behind.
            let dir = tempfile::Builder::new()
                .prefix("sidecar-injector-n05-")
                .tempdir()?;
            let (crt, key) = new_serving_cert(
                &ca_cert.display().to_string(),
                &ca_key.display().to_string(),
                &dns,
                dir.path(),
            )
            .await?;
            let new_der =
                CertificateDer::from_pem_slice(&crt).context("the new certificate is not PEM")?;
            ensure!(new_der != old, "the new certificate equals the old one");

            let secrets: Api<Secret> = Api::namespaced(cx.client.clone(), &ns);
            let secret_name = format!("{release}-tls");
            streaming_while(&cx, "certificate rotation", || async {
                let mut secret = secrets.get(&secret_name).await?;
                let data = secret.data.get_or_insert_with(Default::default);
                data.insert("tls.crt".into(), ByteString(crt.clone()));
                data.insert("tls.key".into(), ByteString(key.clone()));
                secrets
                    .replace(&secret_name, &PostParams::default(), &secret)
                    .await?;
                println!("replaced Secret {ns}/{secret_name}");
                let t0 = tokio::time::Instant::now();
                for ip in &ips {
                    eventually(
                        &format!("the injector pod at {ip} to serve the new certificate"),
                        Duration::from_secs(120),
                        || async {
                            let served = served_certificate(ip, 8443, &dns, &ca_pem).await?;
                            Ok((served == new_der).then_some(()))
                        },
                    )
                    .await?;
                }
                println!(
                    "both pods serve the new certificate {:?} after the Secret changed",
                    t0.elapsed()
                );
                Ok(())
            })
            .await?;
            let after = injector_pods(&cx.client, &ns, &release).await?;
            let mut after_ids: Vec<_> = after.iter().map(fingerprint).collect();
            after_ids.sort();
            ensure!(
                after_ids == before_ids,
                "the injector pods changed or restarted: before {before_ids:?}, after {after_ids:?}"
            );
            Ok(())
        },
    )
    .await
}

/// n06. Policy mode, with no injector pod at all: the suite's injector Deployment is scaled to
/// 0, and the MutatingAdmissionPolicy exported from `policy/config.yaml` (with its backstop) is
/// the only injector. An opted-in Deployment's pod runs on the node with the native sidecar the
/// API server added (`mesh-agent`, before the pod's own init container, running), whose file
/// the app reads through the injected read-only mount, with the injected env and the values
/// the policy computed from the pod (namespace and `app` label); the log shipper ships the
/// app's lines. (p01 holds the policy's output equal to the webhook's on generated pods.)
#[tokio::test]
async fn n06_policy_mode_pods_run_with_no_injector() -> anyhow::Result<()> {
    use sidecar_injector_e2e::policies::{
        CHART_OFF, ROAD_LABEL, export, install, mutating_version, policy_config,
    };
    scenario(
        "n06-policy-mode",
        &[Need::Node, Need::ProcessControl, Need::TemplateChange],
        |cx| async move {
            let version = mutating_version(&cx.client)
                .await?
                .context("this API server serves no MutatingAdmissionPolicy")?;
            let config = policy_config();
            let mut docs =
                export(&cx.env, "mutating", Some(&config), &["--api-version", version]).await?;
            docs.extend(export(&cx.env, "backstop", Some(&config), &[]).await?);
            let policies = install(&cx.client, docs, &["policy-node"]).await?;
            let body = async {
                cx.env.injector("stop").await?;
                let left = injector_pods(&cx.client, &cx.env.injector_namespace, &cx.env.webhook_config).await?;
                ensure!(left.is_empty(), "{} injector pods left after scaling to 0", left.len());
                let ns = cx
                    .extra_namespace("run", &[(ROAD_LABEL, "policy-node"), (CHART_OFF, "true")])
                    .await?;
                let result = async {
                    let app = "sleep 1; echo \"app: MESH_AGENT_SOCKET=$MESH_AGENT_SOCKET\"; \
                         echo \"app: agent-id=$(cat /var/run/mesh/agent-id)\"; \
                         touch /var/run/mesh/x 2>/dev/null || echo 'app: /var/run/mesh is read-only'; \
                         i=0; while true; do i=$((i+1)); echo \"line $i from the app\" >> \"$APP_LOG_DIR/app.log\"; sleep 0.5; done";
                    let deployment: Deployment = from_json(json!({
                        "apiVersion": "apps/v1", "kind": "Deployment",
                        "metadata": {"name": "web"},
                        "spec": {
                            "replicas": 1,
                            "selector": {"matchLabels": {"app": "web"}},
                            "template": {
                                "metadata": {"labels": {"app": "web", INJECT_LABEL: "true"}},
                                "spec": {
                                    "terminationGracePeriodSeconds": 1,
                                    "initContainers": [{"name": "app-init", "image": BUSYBOX, "imagePullPolicy": "Never",
                                        "command": ["sh", "-c", "echo init: done"]}],
                                    "containers": [{"name": "app", "image": BUSYBOX, "imagePullPolicy": "Never",
                                        "command": ["sh", "-c", app]}]
                                }
                            }
                        }
                    }))?;
                    Api::<Deployment>::namespaced(cx.client.clone(), &ns)
                        .create(&PostParams::default(), &deployment)
                        .await?;
                    let pods = cx.pods_in(&ns);
                    let pod = eventually("the policy-injected pod running", RUNNING, || async {
                        let list = pods.list(&ListParams::default().labels("app=web")).await?;
                        let Some(pod) = list.items.into_iter().next() else { return Ok(None) };
                        let status = pod.status.clone().unwrap_or_default();
                        let all_running = status.container_statuses.iter().flatten().all(|c| c.ready);
                        Ok((status.phase.as_deref() == Some("Running") && all_running && is_ready(&pod)).then_some(pod))
                    })
                    .await?;
                    let spec = pod.spec.clone().unwrap_or_default();
                    let inits: Vec<&str> = spec.init_containers.iter().flatten().map(|c| c.name.as_str()).collect();
                    ensure!(inits == [LOG_SHIPPER, "mesh-agent", "app-init"], "init containers {inits:?}");
                    for sidecar in &spec.init_containers.as_deref().unwrap_or_default()[..2] {
                        ensure!(sidecar.restart_policy.as_deref() == Some("Always"), "{} is not a native sidecar", sidecar.name);
                    }
                    let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
                    ensure!(names == ["app"], "containers {names:?}");
                    let status = pod.status.clone().unwrap_or_default();
                    let agent_running = status.init_container_statuses.iter().flatten().any(|c| {
                        c.name == "mesh-agent" && c.state.as_ref().is_some_and(|s| s.running.is_some())
                    });
                    ensure!(agent_running, "the native sidecar is not running: {:?}", status.init_container_statuses);
                    let name = pod.metadata.name.clone().unwrap_or_default();
                    let seen = eventually("the app's report", RUNNING, || async {
                        let log = logs(&pods, &name, "app").await?;
                        Ok(log.iter().any(|l| l.text.contains("read-only")).then_some(log))
                    })
                    .await?;
                    line_with(&seen, "app: MESH_AGENT_SOCKET=/var/run/mesh/agent.sock", "the injected env var")?;
                    line_with(&seen, &format!("app: agent-id={ns}/web"), "the sidecar's file, with the values the policy computed")?;
                    line_with(&seen, "app: /var/run/mesh is read-only", "the injected read-only mount")?;
                    eventually("the log shipper shipping the app's lines", RUNNING, || async {
                        let log = logs(&pods, &name, LOG_SHIPPER).await?;
                        Ok(log.iter().any(|l| l.text.contains("line 1 from the app")).then_some(()))
                    })
                    .await?;
                    let status_annotation = pod.metadata.annotations.clone().unwrap_or_default();
                    let status = status_annotation.get("sidecar-injector.io/status").cloned().unwrap_or_default();
                    ensure!(status.contains("\"templates\":[\"log-shipper\",\"mesh-agent\"]") && status.contains("\"hash\":\"policy-"), "status {status}");
                    anyhow::Ok(())
                }
                .await;
                cx.delete_namespace(&ns).await.ok();
                result
            }
            .await;
            let started = cx.env.injector("start").await;
            let removed = policies.remove().await;
            body.and(started).and(removed)
        },
    )
    .await
}

/// n07. The chart's dashboard and alert rules, checked by the Prometheus e2e/node/run.sh runs
/// against the injector as deployed (it discovers the pods through the apiserver and scrapes
/// their admin ports every second, with the chart's rules): every dashboard query returns data;
/// every alert rule evaluates, and every metric its expressions select exists for the injector
/// (an error or denial counter has no series until the first one, so the metric is asked for by
/// name, job and namespace); SidecarInjectorDown fires once the Deployment is scaled to 0 (the
/// suite loads it with `for: 5s` instead of the chart's 2m) and is gone once it is back.
#[tokio::test]
async fn n07_prometheus_sees_the_injector_and_alerts_when_it_is_gone() -> anyhow::Result<()> {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    use sidecar_injector_e2e::cluster::dry_run;
    use sidecar_injector_e2e::pods::opted_in;
    use sidecar_injector_e2e::prometheus::{
        Prometheus, dashboard_queries, metric_of, rules, selectors,
    };
    /// Bound on a scrape or a rule evaluation (both every second) showing a change.
    const SEEN: Duration = Duration::from_secs(60);
    scenario(
        "n07-prometheus",
        &[Need::Node, Need::Prometheus],
        |cx| async move {
            let url = cx
                .env
                .prometheus_url
                .clone()
                .context("no E2E_PROMETHEUS_URL")?;
            let prometheus = Prometheus::new(&url)?;
            let (ns, release) = (&cx.env.injector_namespace, &cx.env.webhook_config);
            wait_rolled_out(&cx.client, ns, release, ROLLOUT).await?;
            let own = format!(r#"job="{release}",namespace="{ns}""#);

            // Reviews through both webhooks, so that the review series exist.
            for i in 0..4 {
                let pod = dry_run(&cx.pods(), &opted_in(&format!("watched-{}", i % 2))).await?;
                check_injected(&pod)?;
            }
            eventually("Prometheus to scrape both injector pods", SEEN, || async {
                let up = prometheus
                    .query(&format!("count(up{{{own}}} == 1) == 2"))
                    .await?;
                Ok((!up.is_empty()).then_some(()))
            })
            .await?;
            // The reviews above may have been answered by a pod of the rollout n04 just did,
            // which has since gone with its counters: until the scrape shows validating reviews
            // by the pods serving now, each round sends one more.
            let mut round = 0;
            eventually("Prometheus to see the reviews", SEEN, || {
                round += 1;
                let (prometheus, own, pods) = (&prometheus, &own, cx.pods());
                async move {
                    let reviews = prometheus
                        .query(&format!(
                            r#"sum(sidecar_injector_reviews_total{{{own},webhook="validate"}}) > 0"#
                        ))
                        .await?;
                    if reviews.is_empty() {
                        let pod = dry_run(&pods, &opted_in(&format!("watched-{}", round % 2))).await?;
                        check_injected(&pod)?;
                    }
                    Ok((!reviews.is_empty()).then_some(()))
                }
            })
            .await?;

            // The dashboard, with its variables as Grafana would set them for this installation.
            let timeout = Api::<MutatingWebhookConfiguration>::all(cx.client.clone())
                .get(release)
                .await?
                .webhooks
                .iter()
                .flatten()
                .find_map(|w| w.timeout_seconds)
                .context("the mutating webhook has no timeoutSeconds")?
                .to_string();
            let dashboard = std::fs::read_to_string(cx.env.chart.join("files/dashboard.json"))?;
            let queries = dashboard_queries(
                &dashboard,
                &[
                    ("namespace", ns),
                    ("job", release),
                    ("timeout", &timeout),
                    ("__rate_interval", "1m"),
                ],
            )?;
            ensure!(
                queries.len() >= 10,
                "only {} dashboard queries",
                queries.len()
            );
            for (panel, expr) in &queries {
                let samples = eventually(
                    &format!("panel {panel:?}: {expr} to return data"),
                    SEEN,
                    || async {
                        let samples = prometheus.query(expr).await?;
                        Ok((!samples.is_empty()).then_some(samples))
                    },
                )
                .await?;
                println!("dashboard {panel:?}: {} series from {expr}", samples.len());
            }

            // The rules Prometheus loaded are the chart's, and each evaluates.
            let rules_file = cx
                .env
                .prometheus_rules
                .clone()
                .context("no E2E_PROMETHEUS_RULES")?;
            let rules = rules(&std::fs::read_to_string(&rules_file)?)?;
            ensure!(
                rules.len() >= 7,
                "only {} alert rules in {}",
                rules.len(),
                rules_file.display()
            );
            let wanted: Vec<String> = rules.iter().map(|r| r.alert.clone()).collect();
            eventually(
                "every alert rule loaded and evaluated without error",
                SEEN,
                || async {
                    let loaded = prometheus.alerting_rules().await?;
                    let names: Vec<String> = loaded.iter().map(|(n, _, _)| n.clone()).collect();
                    ensure!(names == wanted, "loaded {names:?}, want {wanted:?}");
                    let unhealthy: Vec<_> = loaded
                        .iter()
                        .filter(|(_, health, _)| health != "ok")
                        .collect();
                    ensure!(unhealthy.is_empty(), "not ok: {unhealthy:?}");
                    Ok(Some(()))
                },
            )
            .await?;
            // The backstop's metrics exist only where the server keeps one (`serve --backstop`),
            // the certificate steps' only where it manages its certificates
            // (`--certificates-secret`): the suite's release does neither (node/values.yaml:
            // no backstop, existingSecret), so they must have no series.
            let env: Vec<_> = Api::<Deployment>::namespaced(cx.client.clone(), &cx.env.injector_namespace)
                .get(&cx.env.webhook_config)
                .await?
                .spec
                .and_then(|s| s.template.spec)
                .into_iter()
                .flat_map(|s| s.containers)
                .flat_map(|c| c.env.unwrap_or_default())
                .collect();
            let keeps_backstop = env
                .iter()
                .any(|e| e.name == "SIDECAR_INJECTOR_BACKSTOP" && e.value.as_deref() == Some("true"));
            let manages_certificates = env.iter().any(|e| e.name == "SIDECAR_INJECTOR_CERTIFICATES_SECRET");
            for rule in &rules {
                for selector in selectors(&rule.expr) {
                    let metric = metric_of(&selector)?;
                    ensure!(
                        metric.contains(&own),
                        "{}: {selector} is not the injector's",
                        rule.alert
                    );
                    if metric.starts_with("sidecar_injector_backstop_") && !keeps_backstop {
                        let found = prometheus.query(&metric).await?.len();
                        ensure!(found == 0, "{}: {metric} has {found} series, but the release keeps no backstop", rule.alert);
                        println!("alert {}: {metric} has no series: the release keeps no backstop (policies.backstop.enabled: false)", rule.alert);
                        continue;
                    }
                    if metric.starts_with("sidecar_injector_certificate_steps") && !manages_certificates {
                        let found = prometheus.query(&metric).await?.len();
                        ensure!(found == 0, "{}: {metric} has {found} series, but the release's server does not manage its certificates", rule.alert);
                        println!("alert {}: {metric} has no series: the release's certificates are not self-managed (certificates.mode: existingSecret)", rule.alert);
                        continue;
                    }
                    eventually(
                        &format!("{}: {metric} to have series", rule.alert),
                        SEEN,
                        || async {
                            let samples = prometheus.query(&metric).await?;
                            Ok((!samples.is_empty()).then_some(()))
                        },
                    )
                    .await?;
                    let exact = prometheus.query(&selector).await?.len();
                    println!(
                        "alert {}: {metric} exists; {selector}: {exact} series",
                        rule.alert
                    );
                }
            }
            let firing = |alerts: &[(String, String)]| {
                alerts
                    .iter()
                    .any(|(name, state)| name == "SidecarInjectorDown" && state == "firing")
            };
            // Quiet with the injector up. A scenario before this one may have stopped the
            // injector (n06): its new pods are found and scraped, and the alert resolves, within
            // a few scrape and evaluation intervals, not at once.
            eventually(
                "SidecarInjectorDown to be quiet with the injector up",
                SEEN,
                || async { Ok((!firing(&prometheus.alerts().await?)).then_some(())) },
            )
            .await?;

            // No injector at all: the alert fires, and is gone once the injector is back.
            cx.env.injector("stop").await?;
            let stopped = tokio::time::Instant::now();
            let fired = eventually("SidecarInjectorDown to fire", SEEN, || async {
                Ok(firing(&prometheus.alerts().await?).then_some(()))
            })
            .await;
            if fired.is_ok() {
                println!(
                    "SidecarInjectorDown fired {:?} after the Deployment reached 0 pods",
                    stopped.elapsed()
                );
            }
            let started = cx.env.injector("start").await;
            fired?;
            started?;
            eventually(
                "SidecarInjectorDown to resolve with the injector back",
                SEEN,
                || async { Ok((!firing(&prometheus.alerts().await?)).then_some(())) },
            )
            .await?;
            Ok(())
        },
    )
    .await
}

/// Runs `E2E_INJECTOR_CTL` (`stop` or `start`) for another release of the chart.
async fn release_ctl(
    cx: &Ctx,
    action: &str,
    release_ns: &str,
    release: &str,
) -> anyhow::Result<()> {
    let ctl = cx
        .env
        .injector_ctl
        .as_ref()
        .context("no E2E_INJECTOR_CTL")?;
    let status = tokio::process::Command::new(ctl)
        .arg(action)
        .env("E2E_RELEASE_NAMESPACE", release_ns)
        .env("E2E_WEBHOOK_CONFIG", release)
        .env("E2E_REPLICAS", "1")
        .status()
        .await?;
    ensure!(
        status.success(),
        "{} {action} of {release} failed: {status}",
        ctl.display()
    );
    Ok(())
}

/// The chart's values for n08's release: revision b2, one replica, its own template `agent`
/// (the only default) whose sidecar is named `sidecar`; the server runs `image`, the suite's.
/// Certificates as by default (`selfManaged`): the server issues its own and sets the
/// caBundle, and `helm upgrade` leaves that caBundle alone.
fn b2_values(image: &str, sidecar: &str) -> String {
    release_values("e2e-b2", "b2", 1, image, sidecar, "")
}

/// The values of a release of a scenario's own: its name and revision, `replicas` of the
/// suite's image, JSON logs, no PodDisruptionBudget, and one template of its own, `agent` (a
/// busybox sidecar named `sidecar`), as the only default; `extra` is YAML added at the top level.
fn release_values(
    fullname: &str,
    revision: &str,
    replicas: u32,
    image: &str,
    sidecar: &str,
    extra: &str,
) -> String {
    let (repository, tag) = image.rsplit_once(':').unwrap_or((image, "latest"));
    format!(
        r#"fullnameOverride: {fullname}
revision: {revision}
replicaCount: {replicas}
image:
  repository: {repository}
  tag: {tag}
  pullPolicy: Never
logFormat: json
podDisruptionBudget:
  enabled: false
config:
  defaultTemplates: [agent]
extraTemplates:
  agent: |
    containers:
      - name: {sidecar}
        image: {BUSYBOX}
        command: [sleep, "3600"]
{extra}"#
    )
}

/// The backstop's `sidecar-injector.io/config` annotation and its owners' names, if it exists.
async fn backstop_state(cx: &Ctx, name: &str) -> anyhow::Result<Option<(String, String)>> {
    policy_state(cx, "v1", "ValidatingAdmissionPolicy", name).await
}

/// n08. The backstop follows the release's configuration by itself. A second release of the
/// chart with values of its own (revision `b2`, one replica, its own template `agent` as the
/// only default) and no export command: its server applies the backstop of that configuration,
/// owned by the release's MutatingWebhookConfiguration. With that injector stopped, an opted-in
/// pod is refused by the backstop naming the template's sidecar. `helm upgrade` with the
/// template changed (its sidecar renamed) reaches the running server as a ConfigMap change it
/// reloads in place: while it does, every opted-in pod is admitted (injected under the old
/// template or the new one, never refused), and the backstop follows (with the injector
/// stopped again, the refusal names the new sidecar). `helm uninstall` leaves no policy. The
/// release's certificates are the chart's default, made by its server: no pod is refused
/// across the upgrade, so the upgrade kept the caBundle the server set.
#[tokio::test]
async fn n08_the_backstop_follows_the_release_configuration() -> anyhow::Result<()> {
    use sidecar_injector_e2e::cluster::{dry_run, refusal};
    use sidecar_injector_e2e::pods::{REVISION_LABEL, STATUS_ANNOTATION, labelled, opted_in};
    const RELEASE: &str = "e2e-b2";
    const POLICY: &str = "sidecar-injector-b2-backstop";
    scenario("n08-backstop-follows", &[Need::Node, Need::ProcessControl], |cx| async move {
        let release_ns = cx.extra_namespace("release", &[]).await?;
        let chart = cx.env.chart.display().to_string();
        let dir = tempfile::tempdir()?;
        let (v1, v2) = (dir.path().join("v1.yaml"), dir.path().join("v2.yaml"));
        // The image the suite's own release runs (made by `make image`, never pulled).
        let image = Api::<Deployment>::namespaced(cx.client.clone(), &cx.env.injector_namespace)
            .get(&cx.env.webhook_config)
            .await?
            .spec
            .and_then(|s| s.template.spec)
            .and_then(|s| s.containers.into_iter().next())
            .and_then(|c| c.image)
            .context("the suite's injector Deployment names no image")?;
        std::fs::write(&v1, b2_values(&image, "agent-v1"))?;
        std::fs::write(&v2, b2_values(&image, "agent-v2"))?;
        let (v1, v2) = (v1.display().to_string(), v2.display().to_string());
        let pods = cx.pods();
        let pod = |name: &str| labelled(opted_in(name), REVISION_LABEL, "b2");
        let sidecars = |p: &Pod| -> Vec<String> {
            p.spec.iter().flat_map(|s| s.containers.iter()).map(|c| c.name.clone()).filter(|n| n.starts_with("agent-")).collect()
        };
        let refused_naming = |sidecar: &'static str| {
            let pods = pods.clone();
            async move {
                eventually(&format!("the backstop's refusal naming {sidecar}"), WAIT_LONG, || async {
                    match dry_run(&pods, &pod("unreached")).await {
                        Err(e) if refusal(&e).contains("lacks its sidecar") => Ok(Some(refusal(&e))),
                        Err(e) => anyhow::bail!("refused otherwise: {}", refusal(&e)),
                        Ok(p) => anyhow::bail!("admitted with {:?}", sidecars(&p)),
                    }
                })
                .await
                .and_then(|message| {
                    for needle in [
                        format!("ValidatingAdmissionPolicy '{POLICY}'"),
                        format!("lacks its sidecar(s) {sidecar:?} (template \"agent\")"),
                    ] {
                        ensure!(message.contains(&needle), "expected {needle:?} in: {message}");
                    }
                    Ok(message)
                })
            }
        };
        let body = async {
            cx.helm(&["install", RELEASE, &chart, "-n", &release_ns, "-f", &v1, "--wait", "--timeout", "120s"]).await?;
            let (first, owner) = eventually("the server to apply the backstop", WAIT_LONG, || async {
                Ok(backstop_state(&cx, POLICY).await?.filter(|(d, _)| !d.is_empty()))
            })
            .await?;
            ensure!(owner == format!("MutatingWebhookConfiguration/{RELEASE}"), "the backstop's owner: {owner:?}");
            let injected = eventually("an opted-in pod injected by the release", WAIT_LONG, || async {
                Ok(dry_run(&pods, &pod("injected")).await.ok().filter(|p| !sidecars(p).is_empty()))
            })
            .await?;
            ensure!(sidecars(&injected) == ["agent-v1"], "injected {:?}", sidecars(&injected));
            let status = injected.metadata.annotations.clone().unwrap_or_default().get(STATUS_ANNOTATION).cloned().unwrap_or_default();
            ensure!(status.contains(&format!("\"config\":\"{first}\"")), "the pod's status names another configuration than the backstop's {first}: {status}");
            release_ctl(&cx, "stop", &release_ns, RELEASE).await?;
            let refused = refused_naming("agent-v1").await;
            release_ctl(&cx, "start", &release_ns, RELEASE).await?;
            println!("n08: injector stopped: {}", refused?);
            eventually("the release injecting again", WAIT_LONG, || async {
                Ok(dry_run(&pods, &pod("back")).await.ok().filter(|p| !sidecars(p).is_empty()))
            })
            .await?;
            // The template changes; the server reloads its ConfigMap in place (no rollout:
            // restartOnConfigChange is false). Every pod created meanwhile is admitted.
            cx.helm(&["upgrade", RELEASE, &chart, "-n", &release_ns, "-f", &v2, "--wait", "--timeout", "120s"]).await?;
            let (mut old, mut new, mut tries) = (0, 0, 0);
            let start = std::time::Instant::now();
            loop {
                tries += 1;
                let p = dry_run(&pods, &pod(&format!("during-{tries}")))
                    .await
                    .map_err(|e| anyhow::anyhow!("refused during the reload (after {old} pods with agent-v1, {new} with agent-v2): {}", refusal(&e)))?;
                match sidecars(&p).as_slice() {
                    [s] if s == "agent-v1" => old += 1,
                    [s] if s == "agent-v2" => new += 1,
                    other => anyhow::bail!("injected {other:?} during the reload"),
                }
                if new >= 20 {
                    break;
                }
                ensure!(start.elapsed() < WAIT_LONG, "the server did not reload the new template in {WAIT_LONG:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            println!("n08: during the reload {tries} opted-in pods, all admitted: {old} with agent-v1, then {new} with agent-v2");
            let (second, _) = eventually("the backstop of the new configuration", WAIT_LONG, || async {
                Ok(backstop_state(&cx, POLICY).await?.filter(|(d, _)| !d.is_empty() && *d != first))
            })
            .await?;
            release_ctl(&cx, "stop", &release_ns, RELEASE).await?;
            let refused = refused_naming("agent-v2").await;
            release_ctl(&cx, "start", &release_ns, RELEASE).await?;
            println!("n08: backstop {first} -> {second}; injector stopped: {}", refused?);
            cx.helm(&["uninstall", RELEASE, "-n", &release_ns, "--wait", "--timeout", "120s"]).await?;
            eventually("no policy left after helm uninstall", WAIT_LONG, || async {
                Ok(backstop_state(&cx, POLICY).await?.is_none().then_some(()))
            })
            .await?;
            anyhow::Ok(())
        }
        .await;
        release_cleanup(&cx, RELEASE, &release_ns, body).await
    })
    .await
}

/// The second node's name (e2e/node/node.sh up2).
const NODE2: &str = "e2e-node-2";

/// The injector's ready pods as (pod, node, IP).
async fn replicas(
    cx: &Ctx,
    ns: &str,
    release: &str,
) -> anyhow::Result<Vec<(String, String, String)>> {
    Ok(injector_pods(&cx.client, ns, release)
        .await?
        .into_iter()
        .filter_map(|p| {
            Some((
                p.metadata.name.clone()?,
                p.spec.as_ref()?.node_name.clone()?,
                p.status.as_ref()?.pod_ip.clone()?,
            ))
        })
        .collect())
}

/// Deletes `pod` and waits until it is gone and the Deployment has rolled out again.
async fn replace_pod(cx: &Ctx, ns: &str, release: &str, pod: &str) -> anyhow::Result<()> {
    let pods = Api::<Pod>::namespaced(cx.client.clone(), ns);
    pods.delete(pod, &DeleteParams::default()).await?;
    eventually(
        &format!("injector pod {pod} to be gone"),
        ROLLOUT,
        || async { Ok(pods.get_opt(pod).await?.is_none().then_some(())) },
    )
    .await?;
    wait_rolled_out(&cx.client, ns, release, ROLLOUT).await
}

/// Brings the injector's two replicas back onto two nodes when an earlier scenario's rollout left
/// them on one (the chart's spread is `ScheduleAnyway`: a preference the scheduler weighs when it
/// places a pod, not a rule that moves pods): one of them is deleted, and its replacement must
/// land on the other node. Returns the replicas, one per node.
async fn spread_replicas(
    cx: &Ctx,
    ns: &str,
    release: &str,
) -> anyhow::Result<Vec<(String, String, String)>> {
    wait_rolled_out(&cx.client, ns, release, ROLLOUT).await?;
    let now = replicas(cx, ns, release).await?;
    ensure!(
        now.len() == 2,
        "{} ready injector pods, expected 2",
        now.len()
    );
    if now[0].1 != now[1].1 {
        return Ok(now);
    }
    println!("both replicas on {}: replacing {}", now[0].1, now[0].0);
    replace_pod(cx, ns, release, &now[0].0).await?;
    let now = replicas(cx, ns, release).await?;
    ensure!(
        now.len() == 2 && now[0].1 != now[1].1,
        "the replacement did not go to the empty node: {now:?}"
    );
    Ok(now)
}

/// Runs kubectl with the suite's kubeconfig; its combined output, and whether it succeeded.
async fn kubectl(args: &[&str]) -> anyhow::Result<(bool, String)> {
    let output = tokio::process::Command::new("kubectl")
        .args(args)
        .output()
        .await
        .context("cannot run kubectl")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok((output.status.success(), text))
}

async fn drain(node: &str) -> anyhow::Result<String> {
    let started = std::time::Instant::now();
    let (ok, out) = kubectl(&[
        "drain",
        node,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--force",
        "--timeout=150s",
    ])
    .await?;
    ensure!(ok, "kubectl drain {node} failed:\n{out}");
    println!(
        "kubectl drain {node}: {:.1} s\n  {}",
        started.elapsed().as_secs_f64(),
        out.trim().replace('\n', "\n  ")
    );
    Ok(out)
}

async fn uncordon(node: &str) -> anyhow::Result<()> {
    let (ok, out) = kubectl(&["uncordon", node]).await?;
    ensure!(ok, "kubectl uncordon {node} failed: {out}");
    Ok(())
}

/// After `drained` was drained: the Deployment rolled out again, both replicas on `on`.
async fn both_on_after_drain(
    cx: &Ctx,
    ns: &str,
    release: &str,
    on: &str,
    drained: &str,
) -> anyhow::Result<()> {
    wait_rolled_out(&cx.client, ns, release, ROLLOUT).await?;
    let after = replicas(cx, ns, release).await?;
    ensure!(
        after.len() == 2 && after.iter().all(|r| r.1 == on),
        "after draining {drained} the replicas are not both on {on}: {after:?}"
    );
    println!("after draining {drained}: {after:?}");
    Ok(())
}

/// n09. Nodes are drained under a steady stream of opted-in pod creations (mutating
/// failurePolicy Fail): draining the node of one replica evicts it and the replacement runs on
/// the other node; draining that node, now holding both, waits on the PodDisruptionBudget (the
/// second eviction is refused until the first replica's replacement is ready on the other node).
/// Not one creation fails, every pod is stored injected; at the end the replicas are spread again.
#[tokio::test]
async fn n09_two_nodes_drain_waits_on_the_disruption_budget() -> anyhow::Result<()> {
    scenario("n09-drain", &[Need::Node, Need::TwoNodes], |cx| async move {
        let ns = cx.env.injector_namespace.clone();
        let release = cx.env.webhook_config.clone();
        let node1 = std::env::var("E2E_NODE_NAME").unwrap_or_else(|_| "e2e-node".into());
        let before = spread_replicas(&cx, &ns, &release).await?;
        println!("replicas before: {before:?}");
        let result = streaming_while(&cx, "two drains", || async {
            // 1. The node of one replica: its eviction is allowed (2 healthy, 1 required).
            drain(NODE2).await?;
            both_on_after_drain(&cx, &ns, &release, &node1, NODE2).await?;
            // 2. The node holding both: the budget lets one go at a time.
            uncordon(NODE2).await?;
            let out = drain(&node1).await?;
            ensure!(
                out.contains("disruption budget"),
                "draining {node1}, which held both replicas, never waited on the PodDisruptionBudget:\n{out}"
            );
            both_on_after_drain(&cx, &ns, &release, NODE2, &node1).await?;
            uncordon(&node1).await?;
            Ok(())
        })
        .await;
        // Both nodes schedulable again whatever happened, and the replicas spread: the pod
        // replaced goes to the empty node.
        let _ = uncordon(NODE2).await;
        let _ = uncordon(&node1).await;
        result?;
        let spread = spread_replicas(&cx, &ns, &release).await?;
        println!("replicas spread again: {spread:?}");
        Ok(())
    })
    .await
}

/// The failure policies and timeouts of the release's pod entries, as registered.
async fn webhook_settings(cx: &Ctx) -> anyhow::Result<String> {
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    };
    let name = &cx.env.webhook_config;
    let m: MutatingWebhookConfiguration = Api::all(cx.client.clone()).get(name).await?;
    let v: ValidatingWebhookConfiguration = Api::all(cx.client.clone()).get(name).await?;
    let m = m.webhooks.unwrap_or_default();
    let v = v.webhooks.unwrap_or_default();
    let m = m.first().context("no mutating webhook")?;
    let v = v.first().context("no validating webhook")?;
    Ok(format!(
        "mutating failurePolicy {} timeoutSeconds {}, validating failurePolicy {} timeoutSeconds {}",
        m.failure_policy.as_deref().unwrap_or("?"),
        m.timeout_seconds.unwrap_or_default(),
        v.failure_policy.as_deref().unwrap_or("?"),
        v.timeout_seconds.unwrap_or_default()
    ))
}

/// Per second of creation start (relative to the node's failure): started, answered (stored
/// injected), stored without sidecars, refused, and the callers' waits. Prints it with the
/// refusal kinds and returns the rows.
fn node_loss_table(samples: &[Sample], failed_at: Duration, marks: &[(Duration, &str)]) -> String {
    use std::collections::BTreeMap;
    let secs = |d: Duration| {
        let (d, f) = (d.as_secs_f64(), failed_at.as_secs_f64());
        (d - f).floor() as i64
    };
    let mut rows: BTreeMap<i64, Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        rows.entry(secs(s.started)).or_default().push(s);
    }
    let mut out = String::from(
        "| s | started | answered | refused | no sidecars | waited median | waited max | refusals | event |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for (sec, row) in &rows {
        let answered = row
            .iter()
            .filter(|s| matches!(s.outcome, Outcome::Injected))
            .count();
        let lost = row
            .iter()
            .filter(|s| matches!(s.outcome, Outcome::NotInjected))
            .count();
        let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
        for s in row {
            if let Outcome::Refused(m) = &s.outcome {
                *kinds.entry(refusal_kind(m)).or_default() += 1;
            }
        }
        let refused: usize = kinds.values().sum();
        let mut waits: Vec<f64> = row.iter().map(|s| s.waited.as_secs_f64()).collect();
        waits.sort_by(f64::total_cmp);
        let median = waits.get(waits.len() / 2).copied().unwrap_or_default();
        let max = waits.last().copied().unwrap_or_default();
        let kinds = kinds
            .iter()
            .map(|(k, n)| format!("{n}× {k}"))
            .collect::<Vec<_>>()
            .join("; ");
        let event = marks
            .iter()
            .filter(|(at, _)| secs(*at) == *sec)
            .map(|(_, what)| *what)
            .collect::<Vec<_>>()
            .join("; ");
        out.push_str(&format!(
            "| {sec} | {} | {answered} | {refused} | {lost} | {median:.2} s | {max:.2} s | {kinds} | {event} |\n",
            row.len()
        ));
    }
    let mut examples: BTreeMap<String, &str> = BTreeMap::new();
    for s in samples {
        if let Outcome::Refused(m) = &s.outcome {
            examples.entry(refusal_kind(m)).or_insert(m.as_str());
        }
    }
    for (kind, message) in examples {
        let message: String = message.chars().take(400).collect();
        out.push_str(&format!("{kind}, e.g.: {message}\n"));
    }
    out
}

/// The suite's release has no backstop (e2e/node/values.yaml: other scenarios stop the injector
/// and expect the webhooks' own answers). n10 measures the chart's defaults, backstop included:
/// `helm upgrade --reuse-values` turns it on (the pods roll, and the servers apply it), and off
/// again afterwards, when the policy and its bindings, which the servers leave behind (owned by
/// the MutatingWebhookConfiguration, which stays), are deleted once no server of the backstop
/// release is left to apply them again.
async fn release_backstop(cx: &Ctx, ns: &str, release: &str, on: bool) -> anyhow::Result<()> {
    let chart = cx.env.chart.display().to_string();
    let set = format!("policies.backstop.enabled={on}");
    cx.helm(&[
        "upgrade",
        release,
        &chart,
        "-n",
        ns,
        "--reuse-values",
        "--set",
        &set,
        "--wait",
        "--timeout",
        "150s",
    ])
    .await?;
    wait_rolled_out(&cx.client, ns, release, ROLLOUT).await?;
    // No pod of the release as it was may be left: a terminating pod is a not-ready endpoint,
    // which skews the API server's choice of endpoint (it starts at a random index and takes
    // the next ready one), and a server of the backstop release would apply it again.
    let pods: Api<Pod> = Api::namespaced(cx.client.clone(), ns);
    eventually("the release's earlier pods to be gone", ROLLOUT, || async {
        let list = pods
            .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={release}")))
            .await?;
        let left = list.items.iter().any(|p| {
            p.metadata.deletion_timestamp.is_some()
                || p.spec
                    .as_ref()
                    .and_then(|s| s.automount_service_account_token)
                    != Some(on)
        });
        Ok((!left).then_some(()))
    })
    .await?;
    let policy = format!("{release}-backstop");
    if on {
        let (digest, owner) =
            eventually("the servers to apply the backstop", WAIT_LONG, || async {
                Ok(backstop_state(cx, &policy)
                    .await?
                    .filter(|(d, _)| !d.is_empty()))
            })
            .await?;
        println!("backstop on: {policy} (configuration {digest}, owned by {owner})");
        return Ok(());
    }
    for (kind, name) in [
        ("ValidatingAdmissionPolicyBinding", policy.clone()),
        (
            "ValidatingAdmissionPolicyBinding",
            format!("{policy}-namespace"),
        ),
        (
            "ValidatingAdmissionPolicyBinding",
            format!("{policy}-required"),
        ),
        ("ValidatingAdmissionPolicy", policy.clone()),
    ] {
        match admission_api(cx, "v1", kind)
            .delete(&name, &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e).with_context(|| format!("cannot delete {kind} {name}")),
        }
    }
    ensure!(
        backstop_state(cx, &policy).await?.is_none(),
        "{policy} is still there"
    );
    println!("backstop off again: {policy} deleted");
    Ok(())
}

/// The API server's established TCP connections to each of `ips`, by destination address and
/// port (`ss` in the run's network namespace, where the API server runs): which replicas it
/// holds connections to, and how many.
async fn connections_to(ips: &[&str]) -> String {
    let output = match tokio::process::Command::new("ss")
        .args(["-Htn", "state", "established"])
        .output()
        .await
    {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(e) => return format!("ss failed: {e}"),
    };
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for line in output.lines() {
        // Recv-Q Send-Q Local:Port Peer:Port
        let Some(peer) = line.split_whitespace().nth(3) else {
            continue;
        };
        if ips
            .iter()
            .any(|ip| peer.rsplit_once(':').is_some_and(|(a, _)| a == *ip))
        {
            *counts.entry(peer.to_owned()).or_default() += 1;
        }
    }
    let mut out: Vec<String> = ips
        .iter()
        .map(|ip| {
            let n: usize = counts
                .iter()
                .filter(|(p, _)| p.starts_with(&format!("{ip}:")))
                .map(|(_, n)| n)
                .sum();
            format!("{ip}: {n}")
        })
        .collect();
    out.push(format!("{counts:?}"));
    out.join(", ")
}

/// Pace and bounds of n10's stream: 10 creations a second, at most 1,500, at most 150 s.
const LOSS_EVERY: Duration = Duration::from_millis(100);
const LOSS_LIMIT: usize = 1_500;
const LOSS_MAX: Duration = Duration::from_secs(150);
/// How long n10 waits, after the failure, for the dead replica's endpoint to go: the node
/// controller's grace period (40-50 s by default) and the endpoint controller's sync.
const LOSS_WINDOW_MAX: Duration = Duration::from_secs(110);
/// Creations measured once the endpoint has gone.
const LOSS_AFTER: Duration = Duration::from_secs(8);

/// n10. The node of one replica dies without warning under a stream of opted-in pod creations
/// made at a fixed pace whatever the answers (the chart's failure policies as registered): the
/// node's packets are dropped, then its kubelet, containerd and containers killed. Measured per
/// second until the dead replica's endpoint has left the Service and after: creations answered,
/// refused (and why), and how long callers waited. Not one opted-in pod may be stored without its
/// sidecars; once the endpoint is gone, not one creation may be refused. Then the node comes back
/// and the Deployment is whole again.
#[tokio::test]
async fn n10_two_nodes_one_lost_without_warning() -> anyhow::Result<()> {
    scenario(
        "n10-node-loss",
        &[Need::Node, Need::TwoNodes],
        |cx| async move {
            let ns = cx.env.injector_namespace.clone();
            let release = cx.env.webhook_config.clone();
            let on = release_backstop(&cx, &ns, &release, true).await;
            let measured = match on {
                Ok(()) => node_loss(&cx, &ns, &release).await,
                Err(e) => Err(e),
            };
            // Off again whatever happened: the scenarios after this one expect no backstop.
            let off = release_backstop(&cx, &ns, &release, false).await;
            measured?;
            off
        },
    )
    .await
}

/// n10's measurement, with the release as it is (the backstop on).
async fn node_loss(cx: &Ctx, ns: &str, release: &str) -> anyhow::Result<()> {
    let (ns, release) = (ns.to_owned(), release.to_owned());
    let spread = spread_replicas(cx, &ns, &release).await?;
    let victim = spread
        .iter()
        .find(|r| r.1 == NODE2)
        .cloned()
        .context("no replica on the second node")?;
    println!("replicas: {spread:?}; {NODE2} will die with {}", victim.0);
    println!("webhooks: {}", webhook_settings(cx).await?);
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(cx.client.clone());
    let ips: Vec<&str> = spread.iter().map(|r| r.2.as_str()).collect();
    let stream = TimedStream::start(&cx.client, &cx.ns, LOSS_EVERY, LOSS_LIMIT, LOSS_MAX);
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Which replicas the API server holds connections to when the node dies, and later.
    println!(
        "API server's connections to the replicas before the failure: {}",
        connections_to(&ips).await
    );
    let endpoints: Vec<String> = service_endpoints(&cx.client, &ns, &release)
        .await?
        .into_iter()
        .map(|e| {
            let c = e.conditions.unwrap_or_default();
            format!(
                "{} ready={:?} terminating={:?}",
                e.addresses.join(","),
                c.ready,
                c.terminating
            )
        })
        .collect();
    println!("the Service's endpoints before the failure: {endpoints:?}");
    let failed_at = stream.elapsed();
    let failed = cx.env.node_ctl("fail2").await;
    let mut marks: Vec<(Duration, &str)> = vec![(failed_at, "node killed, packets dropped")];
    let mut not_ready: Option<Duration> = None;
    let mut gone: Option<Duration> = None;
    let watched = async {
            failed?;
            loop {
                let now = stream.elapsed();
                if now - failed_at > LOSS_WINDOW_MAX {
                    anyhow::bail!(
                        "the dead replica's endpoint {} was still ready {LOSS_WINDOW_MAX:?} after its node died",
                        victim.2
                    );
                }
                if not_ready.is_none() {
                    let node = nodes.get(NODE2).await?;
                    let ready = node
                        .status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .into_iter()
                        .find(|c| c.type_ == "Ready")
                        .map(|c| c.status);
                    if ready.as_deref() != Some("True") {
                        not_ready = Some(now);
                    }
                }
                let ready = ready_addresses(&cx.client, &ns, &release).await?;
                if !ready.contains(&victim.2) {
                    gone = Some(now);
                    break;
                }
                if (now - failed_at).as_secs() % 10 == 5 && (now - failed_at).subsec_millis() < 250 {
                    println!(
                        "{:.0} s after the failure, API server's connections: {}",
                        (now - failed_at).as_secs_f64(),
                        connections_to(&ips).await
                    );
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            tokio::time::sleep(LOSS_AFTER).await;
            anyhow::Ok(())
        }
        .await;
    let samples = stream.stop().await?;
    // The node comes back whatever happened: its kubelet restarts the replica.
    let revived = cx.env.node_ctl("revive2").await;
    watched?;
    revived?;
    let (not_ready, gone) = (
        not_ready.context("the node was never seen NotReady")?,
        gone.context("the endpoint never went")?,
    );
    marks.push((not_ready, "node NotReady"));
    marks.push((gone, "endpoint not ready"));
    let table = node_loss_table(&samples, failed_at, &marks);
    let in_window: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.started >= failed_at && s.started < gone)
        .collect();
    let refused_in_window = in_window
        .iter()
        .filter(|s| matches!(s.outcome, Outcome::Refused(_)))
        .count();
    let waited_max = in_window
        .iter()
        .map(|s| s.waited.as_secs_f64())
        .fold(0.0, f64::max);
    println!(
        "node loss: NotReady after {:.1} s, endpoint gone after {:.1} s; in that window {} creations, {} refused, longest wait {:.2} s\n{table}",
        (not_ready - failed_at).as_secs_f64(),
        (gone - failed_at).as_secs_f64(),
        in_window.len(),
        refused_in_window,
        waited_max
    );
    let lost: Vec<&str> = samples
        .iter()
        .filter(|s| matches!(s.outcome, Outcome::NotInjected))
        .map(|s| s.name.as_str())
        .collect();
    ensure!(
        lost.is_empty(),
        "opted-in pods stored without sidecars: {lost:?}"
    );
    // Once the endpoint is gone (and a second for the apiserver's informer), every creation
    // reaches the live replica.
    let late: Vec<String> = samples
        .iter()
        .filter(|s| s.started >= gone + Duration::from_secs(1))
        .filter_map(|s| match &s.outcome {
            Outcome::Refused(m) => Some(format!("{}: {m}", s.name)),
            _ => None,
        })
        .collect();
    ensure!(
        late.is_empty(),
        "refused after the endpoint went: {late:#?}"
    );
    let before = samples.iter().filter(|s| s.started < failed_at).count();
    ensure!(before >= 10, "only {before} creations before the failure");
    // Whole again: the revived node's kubelet restarts its replica.
    wait_rolled_out(&cx.client, &ns, &release, ROLLOUT).await?;
    Ok(())
}

/// Values of the policy-mode release n11 installs: revision `p2`, the chart's defaults (the
/// bundled log shipper and proxy) with the stand-in images, the proxy on `proxy_port`.
fn p2_values(image: &str, proxy_port: u16) -> String {
    let (repository, tag) = image.rsplit_once(':').unwrap_or((image, "latest"));
    format!(
        r#"fullnameOverride: e2e-p2
mode: policy
revision: p2
image:
  repository: {repository}
  tag: {tag}
  pullPolicy: Never
logFormat: json
config:
  values:
    logShipper:
      image: local/log-shipper:1
    proxy:
      image: local/proxy:1
      port: {proxy_port}
"#
    )
}

/// An exported policy's `sidecar-injector.io/config` annotation and its owners, if it exists.
/// n11's release (policy mode, revision `p2`) and the MutatingAdmissionPolicy its keeper applies.
const P2_RELEASE: &str = "e2e-p2";
const P2_POLICY: &str = "sidecar-injector-p2";

/// The objects of an admission-registration `kind` in `version`, read and written untyped (the
/// MutatingAdmissionPolicy is v1 on 1.36+, v1beta1 before).
fn admission_api(cx: &Ctx, version: &str, kind: &str) -> Api<kube::api::DynamicObject> {
    use kube::api::{ApiResource, GroupVersionKind};
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "admissionregistration.k8s.io",
        version,
        kind,
    ));
    Api::all_with(cx.client.clone(), &ar)
}

/// A policy's `sidecar-injector.io/config` annotation and its owners' names, if it exists.
async fn policy_state(
    cx: &Ctx,
    version: &str,
    kind: &str,
    name: &str,
) -> anyhow::Result<Option<(String, String)>> {
    Ok(admission_api(cx, version, kind)
        .get_opt(name)
        .await?
        .map(|o| {
            let annotations = o.metadata.annotations.unwrap_or_default();
            let owners: Vec<String> = o
                .metadata
                .owner_references
                .iter()
                .flatten()
                .map(|r| format!("{}/{}", r.kind, r.name))
                .collect();
            (
                annotations
                    .get("sidecar-injector.io/config")
                    .cloned()
                    .unwrap_or_default(),
                owners.join(","),
            )
        }))
}

/// n11. The chart's policy mode with its defaults and any values, with no export command: the
/// release (revision `p2`, the bundled proxy and log shipper) runs one keeper pod and no webhook;
/// the keeper applies the MutatingAdmissionPolicy (in the version this API server serves) and
/// the backstop exported from the release's ConfigMap, owned by the release's ClusterRole. An
/// opted-in Deployment's pod, with two app ports, runs on the node with the proxy the API
/// server added (a native sidecar listening for each port) and the log shipper. `helm upgrade`
/// with another proxy port reaches the keeper as a ConfigMap change: the policy follows and new
/// pods get the new port. `helm uninstall` leaves no policy.
#[tokio::test]
async fn n11_policy_mode_follows_the_release_configuration() -> anyhow::Result<()> {
    use sidecar_injector_e2e::cluster::{dry_run, refusal};
    use sidecar_injector_e2e::pods::{REVISION_LABEL, STATUS_ANNOTATION, labelled, opted_in};
    use sidecar_injector_e2e::policies::mutating_version;
    const RELEASE: &str = P2_RELEASE;
    const POLICY: &str = P2_POLICY;
    scenario("n11-policy-mode-chart", &[Need::Node], |cx| async move {
        let version = mutating_version(&cx.client)
            .await?
            .context("this API server serves no MutatingAdmissionPolicy")?;
        let release_ns = cx.extra_namespace("release", &[]).await?;
        let chart = cx.env.chart.display().to_string();
        let dir = tempfile::tempdir()?;
        let (v1, v2) = (dir.path().join("v1.yaml"), dir.path().join("v2.yaml"));
        let image = suite_image(&cx).await?;
        std::fs::write(&v1, p2_values(&image, 15001))?;
        std::fs::write(&v2, p2_values(&image, 15101))?;
        let (v1, v2) = (v1.display().to_string(), v2.display().to_string());
        let pods = cx.pods();
        let proxy_port = |p: &Pod| -> Option<i32> {
            let spec = p.spec.as_ref()?;
            let proxy = spec.init_containers.iter().flatten().find(|c| c.name == PROXY)?;
            proxy.ports.iter().flatten().next().map(|p| p.container_port)
        };
        let body = async {
            cx.helm(&["install", RELEASE, &chart, "-n", &release_ns, "-f", &v1, "--wait", "--timeout", "120s"]).await?;
            let kinds = Api::<Deployment>::namespaced(cx.client.clone(), &release_ns).list(&ListParams::default()).await?;
            ensure!(kinds.items.len() == 1, "{} Deployments in the release", kinds.items.len());
            let services = Api::<k8s_openapi::api::core::v1::Service>::namespaced(cx.client.clone(), &release_ns)
                .list(&ListParams::default()).await?;
            ensure!(services.items.is_empty(), "policy mode installed a Service");
            let owner = format!("ClusterRole/{RELEASE}-backstop");
            let (first, owners) = eventually("the keeper to apply the MutatingAdmissionPolicy", WAIT_LONG, || async {
                Ok(policy_state(&cx, version, "MutatingAdmissionPolicy", POLICY).await?.filter(|(d, _)| !d.is_empty()))
            })
            .await?;
            ensure!(owners == owner, "the mutating policy's owners: {owners:?}");
            let (backstop, owners) = eventually("the keeper to apply the backstop", WAIT_LONG, || async {
                Ok(backstop_state(&cx, &format!("{POLICY}-backstop")).await?.filter(|(d, _)| !d.is_empty()))
            })
            .await?;
            ensure!(backstop == first && owners == owner, "the backstop: config {backstop}, owners {owners:?}");
            println!("n11: the keeper applied {POLICY} ({version}) and its backstop, config {first}");
            // The API server loads a new policy a moment after it is stored.
            let pod = |name: &str| labelled(opted_in(name), REVISION_LABEL, "p2");
            eventually("the API server injecting by the policy", WAIT_LONG, || async {
                Ok(dry_run(&pods, &pod("first")).await.ok().filter(|p| proxy_port(p).is_some()))
            })
            .await?;

            let ns = cx.extra_namespace("run", &[]).await?;
            let result = async {
                let app = "i=0; while true; do i=$((i+1)); echo \"line $i from the app\" >> \"$APP_LOG_DIR/app.log\"; sleep 0.5; done";
                let deployment: Deployment = from_json(json!({
                    "apiVersion": "apps/v1", "kind": "Deployment",
                    "metadata": {"name": "web"},
                    "spec": {
                        "replicas": 1,
                        "selector": {"matchLabels": {"app": "web"}},
                        "template": {
                            "metadata": {"labels": {"app": "web", INJECT_LABEL: "true", REVISION_LABEL: "p2"}},
                            "spec": {
                                "terminationGracePeriodSeconds": 1,
                                "containers": [{"name": "app", "image": BUSYBOX, "imagePullPolicy": "Never",
                                    "command": ["sh", "-c", app],
                                    "ports": [{"containerPort": 8080}, {"containerPort": 9090, "name": "metrics"},
                                              {"containerPort": 8080, "protocol": "UDP"}]}]
                            }
                        }
                    }
                }))?;
                let pod = web_pod_running(&cx, &ns, &deployment).await?;
                let run_pods = cx.pods_in(&ns);
                let spec = pod.spec.clone().unwrap_or_default();
                let inits: Vec<&str> = spec.init_containers.iter().flatten().map(|c| c.name.as_str()).collect();
                ensure!(inits == [LOG_SHIPPER, PROXY], "init containers {inits:?}");
                let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
                ensure!(names == ["app"], "containers {names:?}");
                let proxy = &spec.init_containers.as_deref().unwrap_or_default()[1];
                let ports: Vec<(String, i32)> = proxy.ports.iter().flatten()
                    .map(|p| (p.name.clone().unwrap_or_default(), p.container_port)).collect();
                ensure!(ports == [("proxy-8080".to_owned(), 15001), ("proxy-9090".to_owned(), 15002)],
                    "the proxy's listeners: {ports:?} (one per TCP port, in order, each once)");
                let status = pod.status.clone().unwrap_or_default();
                let proxy_running = status.init_container_statuses.iter().flatten()
                    .any(|c| c.name == PROXY && c.started == Some(true) && c.state.as_ref().is_some_and(|s| s.running.is_some()));
                ensure!(proxy_running, "the proxy is not running: {:?}", status.init_container_statuses);
                let annotation = pod.metadata.annotations.clone().unwrap_or_default()
                    .get(STATUS_ANNOTATION).cloned().unwrap_or_default();
                ensure!(annotation.contains("\"templates\":[\"log-shipper\",\"proxy\"]") && annotation.contains("\"hash\":\"policy-")
                    && annotation.contains(&format!("\"config\":\"{first}\"")), "status {annotation}");
                let name = pod.metadata.name.clone().unwrap_or_default();
                eventually("the log shipper shipping the app's lines", RUNNING, || async {
                    let log = logs(&run_pods, &name, LOG_SHIPPER).await?;
                    Ok(log.iter().any(|l| l.text.contains("line 1 from the app")).then_some(()))
                })
                .await?;
                anyhow::Ok(())
            }
            .await;
            cx.delete_namespace(&ns).await.ok();
            result?;
            check_policy_mode(&cx, &release_ns, &kinds.items[0], version).await?;

            // The values change; the keeper reads the new ConfigMap and applies its export.
            cx.helm(&["upgrade", RELEASE, &chart, "-n", &release_ns, "-f", &v2, "--wait", "--timeout", "120s"]).await?;
            let (second, _) = eventually("the MutatingAdmissionPolicy of the new configuration", WAIT_LONG, || async {
                Ok(policy_state(&cx, version, "MutatingAdmissionPolicy", POLICY).await?.filter(|(d, _)| !d.is_empty() && *d != first))
            })
            .await?;
            let after = eventually("a pod injected with the new proxy port", WAIT_LONG, || async {
                let p = dry_run(&pods, &pod("after")).await.map_err(|e| anyhow::anyhow!("refused: {}", refusal(&e)))?;
                Ok((proxy_port(&p) == Some(15101)).then_some(p))
            })
            .await?;
            let annotation = after.metadata.annotations.clone().unwrap_or_default()
                .get(STATUS_ANNOTATION).cloned().unwrap_or_default();
            ensure!(annotation.contains(&format!("\"config\":\"{second}\"")), "status {annotation}");
            println!("n11: helm upgrade: policy {first} -> {second}; new pods get the proxy on 15101");
            cx.helm(&["uninstall", RELEASE, "-n", &release_ns, "--wait", "--timeout", "120s"]).await?;
            eventually("no policy left after helm uninstall", WAIT_LONG, || async {
                let left = (
                    policy_state(&cx, version, "MutatingAdmissionPolicy", POLICY).await?,
                    backstop_state(&cx, &format!("{POLICY}-backstop")).await?,
                );
                Ok((left == (None, None)).then_some(()))
            })
            .await?;
            anyhow::Ok(())
        }
        .await;
        release_cleanup(&cx, RELEASE, &release_ns, body).await
    })
    .await
}

/// n11's `check` in policy mode: in a namespace labelled `required` the keeper's backstop
/// binding refuses an opt-out; `helm test` passes, naming the MutatingAdmissionPolicy, both
/// `-required` bindings and the keeper (and skipping the webhooks, which policy mode has none
/// of); with the keeper stopped
/// and the policy's digest made stale, `check` fails on it and warns of the keeper; once the
/// keeper is back it re-applies the policy and `check` passes again.
async fn check_policy_mode(
    cx: &Ctx,
    release_ns: &str,
    keeper: &Deployment,
    version: &str,
) -> anyhow::Result<()> {
    use kube::api::LogParams;
    use sidecar_injector_e2e::check::check_release;
    const POLICY: &str = P2_POLICY;
    let name = keeper
        .metadata
        .name
        .clone()
        .context("the keeper's Deployment has no name")?;
    use sidecar_injector_e2e::cluster::{dry_run, refusal};
    use sidecar_injector_e2e::pods::{REVISION_LABEL, app_pod, labelled};
    let pods = cx.pods_in(release_ns);
    let test_pod = format!("{name}-test-check");
    // A namespace that requires sidecars, for this revision: the keeper's -required bindings
    // (the chart's default webhook.namespaceOptIn.required) refuse an opt-out there, and
    // `check` finds both bindings.
    let required = cx
        .extra_namespace(
            "required",
            &[(INJECT_LABEL, "required"), (REVISION_LABEL, "p2")],
        )
        .await?;
    let tested = async {
        let opted_out = labelled(app_pod("opted-out"), INJECT_LABEL, "false");
        let refused = eventually(
            "the keeper's -required backstop binding to refuse an opt-out",
            WAIT_LONG,
            || async {
                match dry_run(&cx.pods_in(&required), &opted_out).await {
                    Ok(_) => Ok(None),
                    Err(e) if refusal(&e).contains("requires sidecars") => Ok(Some(refusal(&e))),
                    Err(e) => anyhow::bail!("refused otherwise: {}", refusal(&e)),
                }
            },
        )
        .await?;
        ensure!(
            refused.contains(&format!("binding '{POLICY}-backstop-required'")),
            "the opt-out was refused by another binding: {refused}"
        );
        cx.helm(&["test", P2_RELEASE, "-n", release_ns, "--timeout", "120s"])
            .await
    }
    .await;
    cx.delete_namespace(&required).await.ok();
    let log = pods
        .logs(&test_pod, &LogParams::default())
        .await
        .unwrap_or_default();
    pods.delete(&test_pod, &DeleteParams::default()).await.ok();
    tested.with_context(|| format!("helm test in policy mode; its pod wrote:\n{log}"))?;
    for line in [
        format!(
            "✓ namespaces labelled {INJECT_LABEL}=required: {required}: selected by MutatingAdmissionPolicyBinding {POLICY}-required and ValidatingAdmissionPolicyBinding {POLICY}-backstop-required"
        ),
        format!(
            "✓ MutatingAdmissionPolicy {POLICY} ({version}): the export of the running configuration"
        ),
        format!("✓ MutatingAdmissionPolicyBinding {POLICY}: the export"),
        format!("✓ Deployment {name}: 1 of 1 ready"),
        format!("✓ ValidatingAdmissionPolicy {POLICY}-backstop: the export"),
        "✓ dry-run pod in default: injected".to_owned(),
        format!("- MutatingWebhookConfiguration {name}: skipped: policy mode"),
    ] {
        ensure!(
            log.contains(&line),
            "helm test in policy mode: no line {line:?} in:\n{log}"
        );
    }
    for line in log.lines() {
        println!("n11: helm test in policy mode: {line}");
    }

    let deployments = Api::<Deployment>::namespaced(cx.client.clone(), release_ns);
    let scale = |replicas: i32| {
        let deployments = deployments.clone();
        let name = name.clone();
        async move {
            deployments
                .patch_scale(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"replicas": replicas}})),
                )
                .await
        }
    };
    let selector = keeper
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.clone())
        .unwrap_or_default()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    scale(0).await?;
    let result = async {
        // Gone, not terminating: a keeper in its shutdown could still apply.
        eventually("the keeper's pods gone", WAIT_LONG, || async {
            Ok(pods
                .list(&ListParams::default().labels(&selector))
                .await?
                .items
                .is_empty()
                .then_some(()))
        })
        .await?;
        admission_api(cx, version, "MutatingAdmissionPolicy")
            .patch(
                POLICY,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"sidecar-injector.io/config": "stale"}}}),
                ),
            )
            .await?;
        let stale = check_release(&cx.env, release_ns, &name, "default").await?;
        let report = format!("{:#}{}", stale.json, stale.stderr);
        ensure!(
            stale.code == 1,
            "check with a stale policy: exit {}: {report}",
            stale.code
        );
        ensure!(
            stale.fails_with("mutatingPolicy", "stale: exported from configuration stale"),
            "check with a stale policy does not name it: {report}"
        );
        ensure!(
            stale
                .in_state("warn")
                .iter()
                .any(|(c, _, m)| c == "keeper" && m.contains("will not reach them")),
            "check with the keeper stopped does not warn of it: {report}"
        );
        anyhow::Ok(())
    }
    .await;
    scale(1).await?;
    result?;
    eventually(
        "check passing, the keeper ready, once it is back",
        WAIT_LONG,
        || async {
            let run = check_release(&cx.env, release_ns, &name, "default").await?;
            let ready = run.in_state("pass").iter().any(|(c, _, _)| c == "keeper");
            Ok((run.code == 0 && ready).then_some(()))
        },
    )
    .await?;
    println!(
        "n11: check failed on a stale MutatingAdmissionPolicy with the keeper stopped, and passed once it was back"
    );
    Ok(())
}

/// The image the suite's own release runs (made by `make image`, never pulled).
async fn suite_image(cx: &Ctx) -> anyhow::Result<String> {
    Api::<Deployment>::namespaced(cx.client.clone(), &cx.env.injector_namespace)
        .get(&cx.env.webhook_config)
        .await?
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.image)
        .context("the suite's injector Deployment names no image")
}

/// Creates `deployment` (one replica, pods labelled `app=web`) in `ns` and waits for its pod
/// to run with every container ready.
async fn web_pod_running(cx: &Ctx, ns: &str, deployment: &Deployment) -> anyhow::Result<Pod> {
    Api::<Deployment>::namespaced(cx.client.clone(), ns)
        .create(&PostParams::default(), deployment)
        .await?;
    let pods = cx.pods_in(ns);
    eventually("the policy-injected pod running", RUNNING, || async {
        let list = pods.list(&ListParams::default().labels("app=web")).await?;
        let Some(pod) = list.items.into_iter().next() else {
            return Ok(None);
        };
        let status = pod.status.clone().unwrap_or_default();
        let all_ready = status.container_statuses.iter().flatten().all(|c| c.ready);
        Ok(
            (status.phase.as_deref() == Some("Running") && all_ready && is_ready(&pod))
                .then_some(pod),
        )
    })
    .await
}

/// After a scenario's own release: uninstalled if the scenario failed (it uninstalls it itself
/// when it passes), and its namespace deleted.
async fn release_cleanup(
    cx: &Ctx,
    release: &str,
    release_ns: &str,
    body: anyhow::Result<()>,
) -> anyhow::Result<()> {
    if body.is_err() {
        cx.helm(&["uninstall", release, "-n", release_ns, "--timeout", "60s"])
            .await
            .ok();
    }
    cx.delete_namespace(release_ns).await.ok();
    body
}

/// The pod template of a workload that runs to completion: it writes numbered lines into the
/// shared log directory, the last one just before it exits 0. The pod keeps the default grace
/// period (30 s), so a sidecar that ignored the kubelet's SIGTERM would show as a slow end.
fn finite_template(name: &str) -> serde_json::Value {
    let script = "for i in 1 2 3; do echo \"line $i from the job\" >> \"$APP_LOG_DIR/app.log\"; sleep 0.3; done; \
                  echo 'the last line from the job' >> \"$APP_LOG_DIR/app.log\"; echo 'job: done'";
    json!({
        "metadata": {"labels": {"app": name, INJECT_LABEL: "true"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "app", "image": BUSYBOX, "imagePullPolicy": "Never",
                "command": ["sh", "-c", script]
            }]
        }
    })
}

/// Waits for Job `name` to complete, then checks its one pod: `Succeeded`, injected, the log
/// shipper (a native sidecar) stopped by the kubelet after the app had ended and having shipped
/// the app's last line (tagged with the pod's `app` label, `app_label`). Returns seconds from the app's end to the pod's last container's end.
async fn completed_job(cx: &Ctx, name: &str, app_label: &str) -> anyhow::Result<i64> {
    use k8s_openapi::api::batch::v1::Job;
    let jobs: Api<Job> = Api::namespaced(cx.client.clone(), &cx.ns);
    eventually(&format!("Job {name} to complete"), RUNNING, || async {
        let job = jobs.get(name).await?;
        let status = job.status.unwrap_or_default();
        let complete = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Complete" && c.status == "True");
        if complete {
            return Ok(Some(()));
        }
        anyhow::bail!(
            "active {:?}, succeeded {:?}, failed {:?}, conditions {:?}",
            status.active,
            status.succeeded,
            status.failed,
            status.conditions
        )
    })
    .await?;
    let pods = cx.pods();
    let list = pods
        .list(&ListParams::default().labels(&format!("job-name={name}")))
        .await?;
    ensure!(
        list.items.len() == 1,
        "Job {name} has {} pods",
        list.items.len()
    );
    let pod = &list.items[0];
    check_injected(pod)?;
    let pod_name = pod.metadata.name.clone().context("pod without a name")?;
    let status = pod.status.clone().unwrap_or_default();
    ensure!(
        status.phase.as_deref() == Some("Succeeded"),
        "pod {pod_name}: phase {:?}",
        status.phase
    );
    let ended = |statuses: &Option<Vec<k8s_openapi::api::core::v1::ContainerStatus>>, c: &str| {
        statuses
            .iter()
            .flatten()
            .find(|s| s.name == c)
            .and_then(|s| s.state.as_ref()?.terminated.clone())
            .with_context(|| format!("pod {pod_name}: {c} has not terminated: {statuses:?}"))
    };
    let app = ended(&status.container_statuses, "app")?;
    ensure!(app.exit_code == 0, "the app exited {}", app.exit_code);
    let shipper = ended(&status.init_container_statuses, LOG_SHIPPER)?;
    ensure!(
        shipper.exit_code == 0,
        "the log shipper exited {} (137: killed at the end of the grace period, not stopped by SIGTERM)",
        shipper.exit_code
    );
    let at = |t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
        t.as_ref().map(|t| t.0.as_second())
    };
    let (app_end, shipper_end) = (at(&app.finished_at), at(&shipper.finished_at));
    ensure!(
        shipper_end >= app_end,
        "the log shipper ended ({shipper_end:?}) before the app ({app_end:?})"
    );
    let log = logs(&pods, &pod_name, LOG_SHIPPER).await?;
    let tag = format!("[{}.{app_label}]", cx.ns);
    line_with(
        &log,
        &format!("{tag} the last line from the job"),
        "log-shipper",
    )?;
    line_with(&log, "log-shipper: stopped", "log-shipper")?;
    let last = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .filter_map(|s| at(&s.state.as_ref()?.terminated.as_ref()?.finished_at))
        .max();
    Ok(last.zip(app_end).map_or(0, |(last, app)| last - app))
}

/// n12. Injection never keeps a workload from finishing: an opted-in Job, with the bundled
/// templates, runs to `Complete`, its pod `Succeeded`; both sidecars are native, so the kubelet
/// stops them once the app has ended, and the log shipper ships the app's last line before it
/// goes. A CronJob's Job does the same: one made from the CronJob's template as `kubectl create
/// job --from=cronjob/...` makes it (owned by the CronJob, which is suspended so that it never
/// fires by itself within the scenario).
#[tokio::test]
async fn n12_jobs_and_cronjobs_complete_with_their_sidecars() -> anyhow::Result<()> {
    use k8s_openapi::api::batch::v1::{CronJob, Job};
    scenario("n12-jobs-complete", &[Need::Node], |cx| async move {
        let jobs: Api<Job> = Api::namespaced(cx.client.clone(), &cx.ns);
        let cronjobs: Api<CronJob> = Api::namespaced(cx.client.clone(), &cx.ns);
        let job: Job = from_json(json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "batch"},
            "spec": {"backoffLimit": 0, "template": finite_template("batch")}
        }))?;
        jobs.create(&PostParams::default(), &job).await?;
        let cron: CronJob = from_json(json!({
            "apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "nightly"},
            "spec": {
                "schedule": "0 3 * * *", "suspend": true,
                "jobTemplate": {"spec": {"backoffLimit": 0, "template": finite_template("nightly")}}
            }
        }))?;
        let cron = cronjobs.create(&PostParams::default(), &cron).await?;
        let template = cron
            .spec
            .as_ref()
            .and_then(|s| s.job_template.spec.clone())
            .context("the CronJob has no job template")?;
        let uid = cron.metadata.uid.clone().context("the CronJob has no uid")?;
        let manual: Job = from_json(json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {
                "name": "nightly-manual",
                "annotations": {"cronjob.kubernetes.io/instantiate": "manual"},
                "ownerReferences": [{
                    "apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly",
                    "uid": uid, "controller": true
                }]
            },
            "spec": template
        }))?;
        jobs.create(&PostParams::default(), &manual).await?;
        for (name, app) in [("batch", "batch"), ("nightly-manual", "nightly")] {
            let tail = completed_job(&cx, name, app).await?;
            println!("Job {name}: Complete; its last container ended {tail} s after the app");
            ensure!(
                tail < 25,
                "Job {name}: the sidecars ended {tail} s after the app: they waited out the grace period"
            );
        }
        Ok(())
    })
    .await
}

/// n13's release: its name, revision and the lifetimes of its certificates. A CA of 90 s gets
/// its successor with 30 s left; serving certificates of 36 s renew every 24 s; an old CA leaves
/// the bundles 6 s after the switch; every replica looks every 2 s.
const C3: &str = "e2e-c3";
const C3_REVISION: &str = "c3";
const C3_CA_LIFETIME: u64 = 90;
const C3_SERVING_LIFETIME: u64 = 36;
const C3_GRACE: u64 = 6;
const C3_RECHECK: u64 = 2;

/// The chart's values for n13's release: the chart's default certificates (`selfManaged`) with
/// the lifetimes above, two replicas, the mutating failurePolicy Fail (the validating one is
/// Fail by default), revision c3 and its own template `agent`, the only default.
fn c3_values(image: &str) -> String {
    let extra = format!(
        r#"server:
  recheckInterval: {C3_RECHECK}s
webhook:
  mutating:
    failurePolicy: Fail
certificates:
  selfManaged:
    caLifetime: {C3_CA_LIFETIME}s
    servingLifetime: {C3_SERVING_LIFETIME}s
    reloadGrace: {C3_GRACE}s
"#
    );
    release_values(C3, C3_REVISION, 2, image, "agent", &extra)
}

/// The sum over the release's ready replicas of `sidecar_injector_certificate_steps_total`
/// with `labels`, read from each pod's admin port.
async fn certificate_steps(
    cx: &Ctx,
    release_ns: &str,
    labels: &[(&str, &str)],
) -> anyhow::Result<f64> {
    let mut sum = 0.0;
    for pod in injector_pods(&cx.client, release_ns, C3).await? {
        let ip = pod
            .status
            .and_then(|s| s.pod_ip)
            .context("an injector pod without an IP")?;
        let text = sidecar_injector_e2e::outdated::scrape(&format!("{ip}:8080")).await?;
        sum += sidecar_injector_e2e::metrics::sum(
            &text,
            "sidecar_injector_certificate_steps_total",
            labels,
        );
    }
    Ok(sum)
}

/// The names of every webhook of the configurations named `name`.
async fn webhook_names(cx: &Ctx, name: &str) -> anyhow::Result<Vec<String>> {
    use sidecar_injector_e2e::webhooks::{mutating, validating};
    let m = mutating(&cx.client).get(name).await?;
    let v = validating(&cx.client).get(name).await?;
    Ok(m.webhooks
        .iter()
        .flatten()
        .map(|w| w.name.clone())
        .chain(v.webhooks.iter().flatten().map(|w| w.name.clone()))
        .collect())
}

/// n13. The chart's default certificates in the cluster, with lifetimes of a minute and a half:
/// the release's two replicas issue a CA and serving certificate into the Secret the chart
/// rendered empty, and set both caBundles; a caBundle taken out by hand (as a
/// GitOps sync of the chart's render would) is set back and counted
/// (`sidecar_injector_certificate_steps_total{step="mend_bundles"}`); under opted-in creations
/// at 10 a second (as n04), serving certificates renew and the CA rolls over (successor added,
/// serving switched, old CA dropped) with not one creation refused, every pod stored injected
/// and no failed webhook call in the API server's own count; at the next roll-over, one replica
/// SIGKILLed the moment the successor CA is stored leaves a state that is finished (one CA, in
/// both bundles, served by both replicas); `helm uninstall` takes the Secret.
#[tokio::test]
async fn n13_self_managed_certificates_roll_over_in_the_cluster() -> anyhow::Result<()> {
    scenario(
        "n13-certificates-roll-over",
        &[Need::Node, Need::PodNetwork, Need::NodeProcesses],
        |cx| async move {
            let release_ns = cx.extra_namespace("c3", &[]).await?;
            let dir = tempfile::tempdir()?;
            let values = dir.path().join("c3.yaml");
            std::fs::write(&values, c3_values(&suite_image(&cx).await?))?;
            let body =
                certificates_roll_over(&cx, &release_ns, &values.display().to_string()).await;
            release_cleanup(&cx, C3, &release_ns, body).await
        },
    )
    .await
}

async fn certificates_roll_over(cx: &Ctx, release_ns: &str, values: &str) -> anyhow::Result<()> {
    use sidecar_injector_e2e::certs::{
        bundles_are, pem_blocks, self_managed, webhook_call_failures,
    };
    use sidecar_injector_e2e::cluster::dry_run;
    use sidecar_injector_e2e::node::sigkill_in_pod;
    use sidecar_injector_e2e::pods::{REVISION_LABEL, labelled, opted_in, status_annotation};
    use sidecar_injector_e2e::webhooks::mutating;
    let chart = cx.env.chart.display().to_string();
    let secret = format!("{C3}-certificates");
    let dns = format!("{C3}.{release_ns}.svc");
    let secrets: Api<Secret> = Api::namespaced(cx.client.clone(), release_ns);
    let pods = cx.pods();
    let c3_pod = |name: &str| labelled(opted_in(name), REVISION_LABEL, C3_REVISION);
    let stored = || async {
        let (ca, tls) = self_managed(&secrets, &secret)
            .await?
            .context("the Secret holds no certificates")?;
        anyhow::Ok((pem_blocks(&ca), ca, tls))
    };

    cx.helm(&[
        "install",
        C3,
        &chart,
        "-n",
        release_ns,
        "-f",
        values,
        "--wait",
        "--timeout",
        "120s",
    ])
    .await?;
    let installed = tokio::time::Instant::now();
    eventually(
        "the release's replicas to issue and inject",
        WAIT_LONG,
        || async {
            Ok(dry_run(&pods, &c3_pod("probe"))
                .await
                .ok()
                .filter(|p| status_annotation(p).is_some())
                .map(drop))
        },
    )
    .await?;
    // The chart renders the Secret empty (so `helm uninstall` deletes it); the server fills it.
    let labels = secrets
        .get(&secret)
        .await?
        .metadata
        .labels
        .unwrap_or_default();
    ensure!(
        labels
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str)
            == Some("Helm"),
        "Secret {secret} is not the chart's: labels {labels:?}"
    );
    let (first, _, _) = stored().await?;
    ensure!(first.len() == 1, "a new Secret holds {} CAs", first.len());
    let hooks = webhook_names(cx, C3).await?;

    // A caBundle taken out by hand, as a sync of the chart's render would: set back, counted.
    let mend = [("step", "mend_bundles"), ("result", "done")];
    let mended_before = certificate_steps(cx, release_ns, &mend).await?;
    let hook = hooks.first().context("no webhook")?;
    mutating(&cx.client)
        .patch(
            C3,
            &PatchParams::default(),
            &Patch::Strategic(
                &json!({"webhooks": [{"name": hook, "clientConfig": {"caBundle": null}}]}),
            ),
        )
        .await?;
    let reset = tokio::time::Instant::now();
    eventually(
        "the caBundle to be set back",
        Duration::from_secs(20),
        || async {
            let (_, ca, _) = stored().await?;
            Ok(bundles_are(&cx.client, C3, &ca).await?.then_some(()))
        },
    )
    .await?;
    let mended_in = reset.elapsed();
    let mended = eventually(
        "the mend to be counted",
        Duration::from_secs(10),
        || async {
            let now = certificate_steps(cx, release_ns, &mend).await?;
            Ok((now > mended_before).then_some(now - mended_before))
        },
    )
    .await?;

    // Opted-in creations at 10 a second while serving certificates renew and the CA rolls over.
    let metrics_before = sidecar_injector_e2e::metrics::scrape(&cx.client).await?;
    let stream = PodStream::start_labelled(
        &cx.client,
        &cx.ns,
        STREAM_EVERY,
        STREAM_LIMIT,
        &[(REVISION_LABEL, C3_REVISION)],
    );
    let streamed = tokio::time::Instant::now();
    let (mut servings, mut bundles) = (std::collections::BTreeSet::new(), Vec::<usize>::new());
    let roll_over = Duration::from_secs(C3_CA_LIFETIME + 4 * C3_GRACE);
    let watched = async {
        loop {
            let (cas, ca, tls) = stored().await?;
            servings.insert(tls);
            if bundles.last() != Some(&cas.len()) {
                bundles.push(cas.len());
            }
            let dropped = bundles.contains(&2) && cas.len() == 1 && cas[0] != first[0];
            if dropped && servings.len() >= 3 && bundles_are(&cx.client, C3, &ca).await? {
                return anyhow::Ok(cas);
            }
            ensure!(
                installed.elapsed() < roll_over,
                "no CA roll-over in {roll_over:?} (CAs in the Secret by turns: {bundles:?}; {} serving certificates)",
                servings.len()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    .await;
    if watched.is_ok() {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let report = stream.stop().await?;
    let second = watched?;
    let metrics_after = sidecar_injector_e2e::metrics::scrape(&cx.client).await?;
    let call_failures: f64 = hooks
        .iter()
        .map(|h| {
            webhook_call_failures(&metrics_after, h) - webhook_call_failures(&metrics_before, h)
        })
        .sum();
    println!(
        "n13: {} opted-in creations in {:.1} s across {} serving certificates and a CA roll-over (CAs in the Secret by turns {bundles:?}): {} refused, {} not injected, longest admission {} ms, {call_failures} failed webhook calls (API server); caBundle set back {} ms after it was taken out (mend_bundles +{mended})",
        report.created,
        streamed.elapsed().as_secs_f64(),
        servings.len(),
        report.failures.len(),
        report.not_injected.len(),
        report.longest.as_millis(),
        mended_in.as_millis(),
    );
    check_stream(&report, "renewals and a CA roll-over")?;
    ensure!(
        call_failures == 0.0,
        "the API server counts {call_failures} failed calls to the release's webhooks"
    );

    // The next roll-over: a replica SIGKILLed the moment the successor CA is stored.
    let (added, added_text) = eventually("the next successor CA", roll_over, || async {
        let (cas, ca, _) = stored().await?;
        Ok((cas.len() == 2).then_some((cas, ca)))
    })
    .await?;
    let successor = added
        .iter()
        .find(|c| **c != second[0])
        .cloned()
        .context("the two CAs stored do not include the one rolled over to")?;
    let mut replicas = injector_pods(&cx.client, release_ns, C3).await?;
    replicas.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let victim = replicas.first().context("no replica to kill")?;
    let (victim_name, victim_uid) = (
        victim.metadata.name.clone().unwrap_or_default(),
        victim.metadata.uid.clone().unwrap_or_default(),
    );
    let bundles_then = bundles_are(&cx.client, C3, &added_text).await?;
    let pid = sigkill_in_pod(&victim_uid, "sidecar-injector").await?;
    let killed = tokio::time::Instant::now();
    println!(
        "n13: SIGKILLed {victim_name} (pid {pid}) with 2 CAs in the Secret; both bundles holding both then: {bundles_then}"
    );
    let finished = eventually(
        "the roll-over finished after the kill",
        roll_over,
        || async {
            let (cas, ca, _) = stored().await?;
            if cas != [successor.clone()] || !bundles_are(&cx.client, C3, &ca).await? {
                return Ok(None);
            }
            let ready = injector_pods(&cx.client, release_ns, C3).await?;
            if ready.len() != 2 {
                return Ok(None);
            }
            for pod in &ready {
                let ip = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.pod_ip.clone())
                    .context("no pod IP")?;
                served_certificate(&ip, 8443, &dns, ca.as_bytes()).await?;
            }
            Ok(Some(ready))
        },
    )
    .await?;
    let restarts: i32 = finished
        .iter()
        .filter(|p| p.metadata.uid.as_deref() == Some(&victim_uid))
        .flat_map(|p| {
            p.status
                .iter()
                .flat_map(|s| s.container_statuses.iter().flatten())
        })
        .map(|c| c.restart_count)
        .sum();
    ensure!(
        restarts >= 1,
        "the killed replica {victim_name} shows no restart"
    );
    println!(
        "n13: after the kill, the roll-over finished: one CA in the Secret and both bundles, served by both replicas {} ms after the kill; {victim_name} restarted {restarts} time(s)",
        killed.elapsed().as_millis(),
    );

    cx.helm(&[
        "uninstall",
        C3,
        "-n",
        release_ns,
        "--wait",
        "--timeout",
        "120s",
    ])
    .await?;
    eventually("the Secret to go with the release", WAIT_LONG, || async {
        Ok(secrets.get_opt(&secret).await?.is_none().then_some(()))
    })
    .await
}
