//! The admission policies `sidecar-injector export` writes, on a real API server: the
//! MutatingAdmissionPolicy injects what the webhook injects, and the ValidatingAdmissionPolicy
//! (the backstop) refuses an opted-in pod the injector did not reach, with its own message.
//! Run with the other scenarios, one at a time.

use std::collections::BTreeMap;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use sidecar_injector_e2e::cluster::{WAIT, accepts, dry_run, refusal, rejects, scenario};
use sidecar_injector_e2e::env::Need;
use sidecar_injector_e2e::eventually;
use sidecar_injector_e2e::pods::*;
use sidecar_injector_e2e::policies::{
    CHART_OFF, ROAD_LABEL, Server, export, injector_config, install, mutating_version,
    policy_config,
};
use sidecar_injector_e2e::webhooks::with_mutating_changed;

/// A small deterministic generator (the same pods on every run; a failure names its case).
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next() as usize) % items.len()]
    }

    fn chance(&mut self, one_in: u64) -> bool {
        self.next().is_multiple_of(one_in)
    }
}

/// Pod `i` of the generated set: labels, annotations, containers, init containers, volumes,
/// env and mounts that meet the templates' own names and paths, a sidecar the pod brings
/// itself, skipped pods (hostNetwork, Windows) and pods that opt out.
fn generated(i: u64) -> Value {
    let mut g = Gen(i.wrapping_mul(7919) + 17);
    let mut labels = BTreeMap::new();
    labels.insert(
        "sidecar-injector.io/inject",
        *g.pick(&["true", "true", "true", "true", "false"]),
    );
    if g.chance(2) {
        labels.insert("app", *g.pick(&["web", "1.5", "true", "x-y.z", "null"]));
    }
    let mut annotations = BTreeMap::new();
    if g.chance(2) {
        annotations.insert(
            "example.com/team",
            *g.pick(&["payments", "a: b", "#x", "'\"", "[1]", "0"]),
        );
    }
    if !g.chance(4) {
        annotations.insert(
            "sidecar-injector.io/templates",
            *g.pick(&[
                "log-shipper",
                "mesh-agent",
                "mesh-agent, log-shipper",
                "log-shipper,,mesh-agent,log-shipper",
                " mesh-agent ",
                "proxy",
                "proxy",
                "proxy",
                "proxy",
                "proxy",
                "proxy,log-shipper",
                "log-shipper,proxy",
                "proxy, mesh-agent, proxy",
                "mesh-agent,log-shipper,proxy",
            ]),
        );
    }
    // The proxy's per-pod overrides: allowed values, and values the webhook refuses (the
    // policy road leaves such a pod to the backstop, which refuses it with the same message).
    for (key, values) in [
        (
            "sidecar-injector.io/proxy-cpu",
            &["100m", "10m", "500m", "0.5", "1", "2000m"][..],
        ),
        (
            "sidecar-injector.io/proxy-memory",
            &["128Mi", "32Mi", "256Mi", "1Gi", "64M"][..],
        ),
        (
            "sidecar-injector.io/proxy-log-level",
            &["debug", "off", "critical", "loud"][..],
        ),
    ] {
        if g.chance(5) {
            annotations.insert(key, *g.pick(values));
        }
    }
    if g.chance(5) {
        // The containers that get the mounts and env: application and init containers by
        // name, a name of none, blanks.
        annotations.insert(
            "sidecar-injector.io/containers",
            *g.pick(&["c0", "c1, init0", "init1,c0,nope", "", " , c2", "init0"]),
        );
    }
    let mut containers = Vec::new();
    // Ports the proxy routes to: duplicates within and across containers, named and not, UDP
    // (left out) and TCP written or left to the API server's default.
    let mut named = 0;
    let mut ports = |g: &mut Gen| -> Vec<Value> {
        (0..g.next() % 4)
            .map(|_| {
                let mut port = json!({"containerPort": *g.pick(&[8080, 9090, 53, 8080, 7000])});
                if g.chance(16) {
                    // The proxy's own port: over TCP the webhook refuses the pod (the backstop
                    // refuses it on the policy road with the same words); over UDP it does not.
                    port["containerPort"] = json!(15001);
                }
                match g.next() % 3 {
                    0 => port["protocol"] = json!("UDP"),
                    1 => port["protocol"] = json!("TCP"),
                    _ => {}
                }
                if g.chance(3) {
                    named += 1;
                    port["name"] = json!(format!("p{named}"));
                }
                port
            })
            .collect()
    };
    for c in 0..1 + g.next() % 4 {
        let mut container = json!({"name": format!("c{c}"), "image": app_image()});
        let declared = ports(&mut g);
        if !declared.is_empty() {
            container["ports"] = json!(declared);
        }
        if g.chance(3) {
            container["env"] = json!([{"name": "APP_LOG_DIR", "value": "/elsewhere"}, {"name": "OTHER", "value": "1"}]);
        }
        if g.chance(4) {
            container["volumeMounts"] = json!([{"name": "data", "mountPath": *g.pick(&["/var/log/app", "/data", "/var/run/mesh"])}]);
        }
        containers.push(container);
    }
    if g.chance(6) {
        // A container of the pod's own under a sidecar's name: left alone, listed as kept.
        containers.push(json!({"name": "log-shipper", "image": app_image()}));
    }
    if g.chance(15) {
        // Another mesh's proxy: the proxy template is not injected beside it.
        containers.push(json!({"name": "istio-proxy", "image": app_image()}));
    }
    let mut spec = json!({"containers": containers});
    let inits = g.next() % 3;
    if inits > 0 {
        spec["initContainers"] = json!(
            (0..inits)
                .map(|k| {
                    // An init container's ports are not the application's: the proxy leaves them.
                    let mut init = json!({"name": format!("init{k}"), "image": app_image()});
                    let declared = ports(&mut g);
                    if !declared.is_empty() {
                        init["ports"] = json!(declared);
                    }
                    init
                })
                .collect::<Vec<_>>()
        );
    }
    // The QoS class: Guaranteed (every own container's limits, requests left to the API
    // server's default or written equal in another form), Burstable (one request below its
    // limit) or none. A Guaranteed pod's sidecars get their requests as limits.
    let class = g.next() % 4;
    if class < 2 {
        let mut first = true;
        for list in ["containers", "initContainers"] {
            for c in spec[list].as_array_mut().into_iter().flatten() {
                let (cpu, memory) = (*g.pick(&["100m", "1", "250m"]), *g.pick(&["64Mi", "128Mi"]));
                let mut resources = json!({"limits": {"cpu": cpu, "memory": memory}});
                if g.chance(2) {
                    let request = if cpu == "1" { "1000m" } else { cpu };
                    resources["requests"] = json!({"cpu": request, "memory": memory});
                }
                if class == 1 && first {
                    resources["requests"] = json!({"cpu": "10m", "memory": memory});
                }
                first = false;
                c["resources"] = resources;
            }
        }
    }
    let mut volumes = Vec::new();
    if containers_mount_data(&spec) || g.chance(3) {
        volumes.push(json!({"name": "data", "emptyDir": {}}));
    }
    if g.chance(6) {
        volumes.push(json!({"name": "sidecar-logs", "emptyDir": {"medium": "Memory"}}));
    }
    if !volumes.is_empty() {
        spec["volumes"] = json!(volumes);
    }
    if g.chance(10) {
        spec["hostNetwork"] = json!(true);
        // Host ports equal container ports there, and the API server refuses duplicates.
        for list in ["containers", "initContainers"] {
            for c in spec[list].as_array_mut().into_iter().flatten() {
                if let Some(c) = c.as_object_mut() {
                    c.remove("ports");
                }
            }
        }
    }
    if g.chance(10) {
        spec["nodeSelector"] = json!({"kubernetes.io/os": "windows"});
    }
    let mut metadata = json!({"labels": labels, "annotations": annotations});
    if g.chance(2) {
        metadata["generateName"] = json!(format!("gen{i}-"));
    } else {
        metadata["name"] = json!(format!("pod{i}"));
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
}

fn containers_mount_data(spec: &Value) -> bool {
    spec["containers"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["volumeMounts"].as_array().is_some_and(|m| !m.is_empty()))
    })
}

/// What the two roads must agree on, without what differs by construction: the namespace,
/// generated names, the ServiceAccount token volume's random suffix, the status hash (the
/// policy records its export's digest: CEL has no hash function) and server-side fields.
fn comparable(pod: &Pod, ns: &str) -> anyhow::Result<Value> {
    let mut v = serde_json::to_value(pod)?;
    let meta = v["metadata"].as_object_mut().context("no metadata")?;
    for k in [
        "uid",
        "creationTimestamp",
        "resourceVersion",
        "managedFields",
        "namespace",
        "name",
    ] {
        meta.remove(k);
    }
    v.as_object_mut().context("not an object")?.remove("status");
    let mut text = serde_json::to_string(&v)?.replace(ns, "NS");
    for (start, end) in [("kube-api-access-", 5), ("\\\"hash\\\":\\\"", 0)] {
        let mut out = String::with_capacity(text.len());
        let mut rest = text.as_str();
        while let Some(at) = rest.find(start) {
            out.push_str(&rest[..at + start.len()]);
            rest = &rest[at + start.len()..];
            let skip = if end > 0 {
                end.min(rest.len())
            } else {
                rest.find("\\\"").unwrap_or(0)
            };
            out.push('X');
            rest = &rest[skip..];
        }
        out.push_str(rest);
        text = out;
    }
    Ok(serde_json::from_str(&text)?)
}

/// The first place two JSON values differ.
fn first_difference(a: &Value, b: &Value, at: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys()) {
                let (l, r) = (
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                );
                if let Some(d) = first_difference(l, r, &format!("{at}/{k}")) {
                    return Some(d);
                }
            }
            None
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (l, r))| first_difference(l, r, &format!("{at}/{i}"))),
        _ if a == b => None,
        _ => Some(format!("{at}: policy {a}, webhook {b}")),
    }
}

const GENERATED: u64 = 150;

/// Policy mode: the API server injects by itself. Generated pods created (dry run) through the
/// exported MutatingAdmissionPolicies in one namespace and through a webhook serving the same
/// configuration in another come back the same (containers, init containers, volumes, env,
/// mounts, annotations, the status but for its hash), both pass the exported backstop, and a
/// policy-injected pod created again through the policies is unchanged. Pods that ask for the
/// bundled proxy with an override it does not allow are refused on both roads with the same
/// message: by the webhook, and on the policy road by the backstop.
#[tokio::test]
async fn p01_policies_inject_what_the_webhook_injects() -> anyhow::Result<()> {
    scenario("p01-policy-mode", &[Need::TemplateChange, Need::LoopbackWebhooks], |cx| async move {
        let Some(version) = mutating_version(&cx.client).await? else {
            anyhow::bail!("this API server serves no MutatingAdmissionPolicy (1.36+, or 1.34-1.35 with the MutatingAdmissionPolicy feature gate and runtime-config)");
        };
        println!("p01: MutatingAdmissionPolicy {version}");
        let config = policy_config();
        let mutating = export(&cx.env, "mutating", Some(&config), &["--api-version", version]).await?;
        let backstop = export(&cx.env, "backstop", Some(&config), &[]).await?;
        // The mutations on the policy road only; the backstop on both roads.
        let mutations = install(&cx.client, mutating, &["policy"]).await?;
        let backstop = match install(&cx.client, backstop, &["policy", "webhook"]).await {
            Ok(b) => b,
            Err(e) => {
                mutations.remove().await.ok();
                return Err(e);
            }
        };
        let mut server = match Server::start(&cx.env, &cx.client, &config, "webhook").await {
            Ok(s) => s,
            Err(e) => {
                mutations.remove().await.ok();
                backstop.remove().await.ok();
                return Err(e);
            }
        };
        let result = async {
            let p = cx.extra_namespace("policy", &[(ROAD_LABEL, "policy"), (CHART_OFF, "true")]).await?;
            let w = cx.extra_namespace("webhook", &[(ROAD_LABEL, "webhook"), (CHART_OFF, "true")]).await?;
            let body = async {
                let (pp, wp) = (cx.pods_in(&p), cx.pods_in(&w));
                // Both roads are in effect once a probe is injected on each.
                for (pods, road) in [(&pp, "policy"), (&wp, "webhook")] {
                    eventually(&format!("injection through the {road} road"), WAIT, || async {
                        let pod = dry_run(pods, &opted_in("probe")).await.map_err(|e| anyhow::anyhow!(refusal(&e)))?;
                        Ok(status_annotation(&pod).map(|_| ()))
                    })
                    .await?;
                }
                // The mutating policy being in effect says nothing of the backstop: the API server
                // loads each policy on its own, and a pod the backstop should refuse is admitted
                // until it has. Wait until it refuses an override the proxy does not allow.
                let bad = annotated(
                    annotated(opted_in("probe-refused"), "sidecar-injector.io/templates", "proxy"),
                    "sidecar-injector.io/proxy-log-level",
                    "loud",
                );
                eventually("the backstop on the policy road", WAIT, || async {
                    match dry_run(&pp, &bad).await {
                        Ok(_) => Ok(None),
                        Err(e) if refusal(&e).contains("ValidatingAdmissionPolicy 'sidecar-injector-backstop") => Ok(Some(())),
                        Err(e) => anyhow::bail!("refused by another than the backstop: {}", refusal(&e)),
                    }
                })
                .await?;
                let (mut injected, mut refused, mut proxied) = (0, 0, 0);
                let (mut clashed, mut guaranteed) = (0, 0);
                for i in 0..GENERATED {
                    let pod: Pod = from_json(generated(i))?;
                    let a = dry_run(&pp, &pod).await;
                    let b = dry_run(&wp, &pod).await;
                    let case = serde_json::to_string(&generated(i))?;
                    let (a, b) = match (a, b) {
                        (Ok(a), Ok(b)) => (a, b),
                        // An override the proxy does not allow, or a port of the pod's that the
                        // proxy declares too: the webhook refuses the pod, and on the policy road
                        // the backstop does, with the webhook's own message.
                        (Err(a), Err(b)) if refusal(&b).contains("sidecar-injector: template") => {
                            let (a, b) = (refusal(&a), refusal(&b));
                            let tail = |m: &str| m.find("sidecar-injector: template").map(|at| m[at..].to_owned());
                            ensure!(
                                a.contains("ValidatingAdmissionPolicy 'sidecar-injector-backstop") && tail(&a) == tail(&b),
                                "pod {i} ({case}): the policy road refused it with {a:?}, the webhook with {b:?}"
                            );
                            refused += 1;
                            clashed += usize::from(b.contains("declares too"));
                            continue;
                        }
                        (a, b) => anyhow::bail!(
                            "pod {i} ({case}): policy road {}, webhook road {}",
                            a.map(|_| "admitted".to_owned()).unwrap_or_else(|e| refusal(&e)),
                            b.map(|_| "admitted".to_owned()).unwrap_or_else(|e| refusal(&e)),
                        ),
                    };
                    if let Some(status) = status_annotation(&a) {
                        injected += 1;
                        let class = a.status.as_ref().and_then(|s| s.qos_class.as_deref());
                        guaranteed += usize::from(class == Some("Guaranteed"));
                        if status.contains("\"proxy\"") {
                            proxied += 1;
                        }
                    }
                    let (ca, cb) = (comparable(&a, &p)?, comparable(&b, &w)?);
                    if let Some(d) = first_difference(&ca, &cb, "") {
                        anyhow::bail!("pod {i} ({case}) differs at {d}");
                    }
                    // Idempotent: the policy road's output, created again, is unchanged.
                    let mut again = a.clone();
                    again.metadata.uid = None;
                    again.metadata.resource_version = None;
                    again.metadata.creation_timestamp = None;
                    let again = dry_run(&pp, &again).await.map_err(|e| anyhow::anyhow!("pod {i} again: {}", refusal(&e)))?;
                    if let Some(d) = first_difference(&comparable(&again, &p)?, &ca, "") {
                        anyhow::bail!("pod {i} ({case}) changed when created again through the policies, at {d}");
                    }
                }
                println!("p01: {GENERATED} generated pods, {injected} injected ({proxied} with the proxy, {guaranteed} Guaranteed) and {refused} refused ({clashed} for a port clash, the others for an override not allowed), the same on both roads");
                ensure!(proxied >= GENERATED / 8, "only {proxied} of {GENERATED} pods got the proxy: the generator no longer tests its loops much");
                ensure!(injected >= GENERATED / 2, "only {injected} of {GENERATED} pods were injected: the generator no longer tests much");
                ensure!(refused > clashed, "no generated pod had an override the proxy refuses: the generator no longer tests it");
                ensure!(clashed > 0, "no generated pod declared the proxy's port: the generator no longer tests it");
                ensure!(guaranteed > 0, "no generated pod was injected and stayed Guaranteed: the generator no longer tests it");
                // An opted-out pod is untouched.
                let plain = dry_run(&pp, &labelled(app_pod("out"), INJECT_LABEL, "false")).await.map_err(|e| anyhow::anyhow!(refusal(&e)))?;
                ensure!(status_annotation(&plain).is_none() && containers(&plain).len() == 1, "an opted-out pod was changed");
                anyhow::Ok(())
            }
            .await;
            cx.delete_namespace(&p).await.ok();
            cx.delete_namespace(&w).await.ok();
            body
        }
        .await;
        let stopped = server.stop().await;
        let removed = mutations.remove().await.and(backstop.remove().await);
        result.and(stopped).and(removed)
    })
    .await
}

/// The backstop, with the suite's own injector down and its mutating webhook set to `Ignore`:
/// an opted-in pod is refused by the ValidatingAdmissionPolicy with its own message (naming the
/// missing sidecars, saying the injector did not run) instead of a webhook call error; a pod
/// that did not opt in is created; once the injector is back, opted-in pods are admitted
/// injected, and the backstop accepts them.
#[tokio::test]
async fn p02_backstop_refuses_what_the_injector_did_not_reach() -> anyhow::Result<()> {
    scenario("p02-backstop", &[Need::ProcessControl, Need::TemplateChange], |cx| async move {
        // The configuration the suite's injector serves.
        let config = injector_config(&cx.env, &cx.client).await?;
        let docs = export(&cx.env, "backstop", Some(config.path()), &[]).await?;
        let policies = install(&cx.client, docs, &["backstop"]).await?;
        let ns = cx.extra_namespace("guarded", &[(ROAD_LABEL, "backstop")]).await;
        let ns = match ns {
            Ok(ns) => ns,
            Err(e) => {
                policies.remove().await.ok();
                return Err(e);
            }
        };
        let client = cx.client.clone();
        let result = with_mutating_changed(
            &client,
            &cx.env.webhook_config,
            &ns,
            |hook| {
                hook.failure_policy = Some("Ignore".into());
                Ok(())
            },
            || async {
                let pods = cx.pods_in(&ns);
                // The backstop is in effect once it refuses a pod the webhooks never see.
                let bare = opted_in("bare");
                let body = async {
                    cx.env.injector("stop").await?;
                    let message = eventually("the backstop's refusal", WAIT, || async {
                        match dry_run(&pods, &bare).await {
                            Err(e) if refusal(&e).contains("lacks its sidecar") => Ok(Some(refusal(&e))),
                            Err(e) => Err(anyhow::anyhow!("refused otherwise: {}", refusal(&e))),
                            Ok(_) => Ok(None),
                        }
                    })
                    .await?;
                    let message = rejects(&pods, &opted_in("refused")).await.unwrap_or(message);
                    for needle in [
                        "ValidatingAdmissionPolicy 'sidecar-injector-backstop",
                        "lacks its sidecar(s) \"log-shipper\" (template \"log-shipper\"), \"proxy\" (template \"proxy\")",
                        "the sidecar injector did not run for it",
                    ] {
                        ensure!(message.contains(needle), "expected {needle:?} in the refusal, got: {message}");
                    }
                    ensure!(!message.contains("failed calling webhook"), "the webhook's error, not the backstop's: {message}");
                    check_untouched(&accepts(&pods, &app_pod("plain")).await?)?;
                    check_untouched(&accepts(&pods, &labelled(app_pod("out"), INJECT_LABEL, "false")).await?)?;
                    anyhow::Ok(())
                }
                .await;
                let started = cx.env.injector("start").await;
                body.and(started)?;
                let stored = eventually("an opted-in pod admitted injected", WAIT, || async {
                    Ok(dry_run(&pods, &opted_in("back")).await.ok().filter(|p| status_annotation(p).is_some()))
                })
                .await?;
                check_injected(&stored)?;
                check_injected(&accepts(&pods, &opted_in("stored")).await?)?;
                Ok(())
            },
        )
        .await;
        cx.delete_namespace(&ns).await.ok();
        let removed = policies.remove().await;
        result.and(removed)
    })
    .await
}

/// A backstop exported from another configuration than the one the injector serves (a stale
/// one, as while a reload or a rollout is under way) never refuses what the running
/// configuration injects: the pod's status names the configuration that injected it, and the
/// backstop holds only pods of its own configuration (or with no status) to its contract. It
/// still refuses an opted-in pod the injector never reached, naming its own sidecars; and the
/// backstop exported from the running configuration (image check on, the default) admits the
/// same injected pods.
#[tokio::test]
async fn p03_a_stale_backstop_never_refuses_what_the_running_configuration_injects()
-> anyhow::Result<()> {
    scenario("p03-stale-backstop", &[Need::TemplateChange], |cx| async move {
        let running = injector_config(&cx.env, &cx.client).await?;
        // Another configuration: other templates (mesh-agent), other defaults, another digest.
        let stale = install(&cx.client, export(&cx.env, "backstop", Some(&policy_config()), &[]).await?, &["stale"]).await?;
        let fresh = match export(&cx.env, "backstop", Some(running.path()), &[]).await {
            Ok(docs) => install(&cx.client, docs, &["fresh"]).await,
            Err(e) => Err(e),
        };
        let fresh = match fresh {
            Ok(fresh) => fresh,
            Err(e) => {
                stale.remove().await.ok();
                return Err(e);
            }
        };
        let mut namespaces = Vec::new();
        let body = async {
            // Injected by the suite's injector, guarded by the stale backstop.
            let injected = cx.extra_namespace("injected", &[(ROAD_LABEL, "stale")]).await?;
            namespaces.push(injected.clone());
            // Never reached by the injector (the chart's opt-out), guarded by the stale backstop.
            let bare = cx.extra_namespace("bare", &[(ROAD_LABEL, "stale"), (CHART_OFF, "true")]).await?;
            namespaces.push(bare.clone());
            // Injected, guarded by the backstop of the running configuration.
            let current = cx.extra_namespace("current", &[(ROAD_LABEL, "fresh")]).await?;
            namespaces.push(current.clone());
            let message = eventually("the stale backstop's refusal of a pod the injector never reached", WAIT, || async {
                match dry_run(&cx.pods_in(&bare), &opted_in("bare")).await {
                    Err(e) if refusal(&e).contains("lacks its sidecar") => Ok(Some(refusal(&e))),
                    Err(e) => Err(anyhow::anyhow!("refused otherwise: {}", refusal(&e))),
                    Ok(_) => Ok(None),
                }
            })
            .await?;
            ensure!(message.contains("\"mesh-agent\" (template \"mesh-agent\")"), "the stale backstop names its own sidecars: {message}");
            for (ns, what) in [(&injected, "the stale backstop"), (&current, "the running configuration's backstop")] {
                let pods = cx.pods_in(ns);
                for (name, pod) in [
                    ("plain", opted_in("plain")),
                    ("ports", with_ports(opted_in("ports"), &[8080, 9090])),
                    ("one-template", annotated(opted_in("one-template"), TEMPLATES_ANNOTATION, PROXY)),
                ] {
                    let stored = accepts(&pods, &pod)
                        .await
                        .with_context(|| format!("{what} refused pod {name}, which the running configuration injected"))?;
                    let status = status_annotation(&stored).unwrap_or_default().to_owned();
                    ensure!(status.contains("\"config\":\""), "pod {name}: the status names no configuration: {status}");
                    if name != "one-template" {
                        check_injected(&stored)?;
                    }
                }
            }
            anyhow::Ok(())
        }
        .await;
        for ns in &namespaces {
            cx.delete_namespace(ns).await.ok();
        }
        let removed = stale.remove().await.and(fresh.remove().await);
        body.and(removed)
    })
    .await
}

/// Required namespaces in policy mode (issue 63), with no webhook at all: the
/// MutatingAdmissionPolicy's `-required` binding injects a pod of a namespace labelled
/// `<injectLabel>: required` that says nothing; the backstop's `-required` binding refuses one
/// that opts out, in the validator's words, unless its service account is exempt
/// (`required.exempt`), whose pod is admitted untouched; in a namespace labelled `enabled` the
/// opt-out is admitted untouched, as before. Both exported with `--namespace-required=true`.
#[tokio::test]
async fn p04_policy_mode_refuses_an_opt_out_in_a_required_namespace() -> anyhow::Result<()> {
    scenario("p04-policy-required", &[Need::InjectorBin, Need::LocalControlPlane], |cx| async move {
        let Some(version) = mutating_version(&cx.client).await? else {
            anyhow::bail!("this API server serves no MutatingAdmissionPolicy (1.36+, or 1.34-1.35 with the MutatingAdmissionPolicy feature gate and runtime-config)");
        };
        let required = cx
            .extra_namespace("required", &[(INJECT_LABEL, "required"), (ROAD_LABEL, "required"), (CHART_OFF, "true")])
            .await?;
        let enabled = cx
            .extra_namespace("enabled", &[(INJECT_LABEL, "enabled"), (ROAD_LABEL, "required"), (CHART_OFF, "true")])
            .await?;
        let body = async {
            // The policy configuration, with one exempt service account in the required namespace.
            let exempt = format!("{required}/backup");
            let dir = tempfile::tempdir()?;
            let base = std::fs::read_to_string(policy_config())?;
            let templates = policy_config().with_file_name("templates");
            let text = base.replace("templatesDir: templates", &format!("templatesDir: {}", templates.display()));
            ensure!(text != base, "e2e/policy/config.yaml no longer says templatesDir: templates");
            let config = dir.path().join("config.yaml");
            std::fs::write(&config, format!("{text}required:\n  exempt: [\"{exempt}\"]\n"))?;
            let selection = ["--namespace-required=true"];
            let mutating = export(&cx.env, "mutating", Some(&config), &[&selection[..], &["--api-version", version]].concat()).await?;
            let backstop = export(&cx.env, "backstop", Some(&config), &selection).await?;
            for (kind, docs) in [("mutating", &mutating), ("backstop", &backstop)] {
                let names: Vec<&str> = docs.iter().filter_map(|d| d["metadata"]["name"].as_str()).collect();
                ensure!(names.iter().any(|n| n.ends_with("-required")), "export {kind} --namespace-required wrote no -required binding: {names:?}");
            }
            let mutations = install(&cx.client, mutating, &["required"]).await?;
            let backstop = match install(&cx.client, backstop, &["required"]).await {
                Ok(b) => b,
                Err(e) => {
                    mutations.remove().await.ok();
                    return Err(e);
                }
            };
            let checked = async {
                let pods = cx.pods_in(&required);
                let injected = eventually("the -required binding to inject", WAIT, || async {
                    Ok(dry_run(&pods, &app_pod("probe")).await.ok().filter(|p| status_annotation(p).is_some()))
                })
                .await?;
                let names: Vec<&str> = containers(&injected).iter().chain(init_containers(&injected)).map(|c| c.name.as_str()).collect();
                ensure!(names.contains(&"log-shipper"), "a pod without the label came back with containers {names:?}");
                let opted_out = labelled(app_pod("opted-out"), INJECT_LABEL, "false");
                let refused = eventually("the backstop's -required binding to refuse the opt-out", WAIT, || async {
                    match dry_run(&pods, &opted_out).await {
                        Ok(_) => Ok(None),
                        Err(e) if refusal(&e).contains("ValidatingAdmissionPolicy") => Ok(Some(refusal(&e))),
                        Err(e) => anyhow::bail!("refused by another than the backstop: {}", refusal(&e)),
                    }
                })
                .await?;
                for expected in [
                    format!("its namespace \"{required}\" requires sidecars"),
                    format!("exempt in \"{required}\": \"backup\""),
                    "the pod runs as \"default\"".to_owned(),
                    "required.exempt".to_owned(),
                ] {
                    ensure!(refused.contains(&expected), "the backstop's refusal does not say {expected:?}: {refused}");
                }
                // Stored, not only dry-run: the refusal is the API server's, whatever the road.
                let stored_refusal = rejects(&pods, &opted_out).await?;
                ensure!(stored_refusal.contains("requires sidecars"), "a stored opt-out was refused otherwise: {stored_refusal}");
                let accounts: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> = kube::Api::namespaced(cx.client.clone(), &required);
                accounts
                    .create(&Default::default(), &serde_json::from_value(json!({"metadata": {"name": "backup"}}))?)
                    .await?;
                let mut exempt_pod = labelled(app_pod("backup"), INJECT_LABEL, "false");
                if let Some(spec) = exempt_pod.spec.as_mut() {
                    spec.service_account_name = Some("backup".into());
                }
                check_untouched(&accepts(&pods, &exempt_pod).await?).context("the exempt service account's pod")?;
                let stored = accepts(&pods, &app_pod("plain")).await?;
                ensure!(status_annotation(&stored).is_some(), "a pod without the label was stored uninjected");
                // An enabled namespace is as it was: its opt-out is admitted untouched, and a pod
                // that says nothing is injected by the -namespace binding.
                let enabled_pods = cx.pods_in(&enabled);
                check_untouched(&accepts(&enabled_pods, &opted_out).await?).context("an opt-out in an enabled namespace")?;
                eventually("the -namespace binding to inject", WAIT, || async {
                    Ok(dry_run(&enabled_pods, &app_pod("probe")).await.ok().filter(|p| status_annotation(p).is_some()).map(|_| ()))
                })
                .await?;
                println!("p04: MutatingAdmissionPolicy {version}; an opt-out in a required namespace refused by the backstop: {refused}");
                anyhow::Ok(())
            }
            .await;
            let removed = mutations.remove().await.and(backstop.remove().await);
            checked.and(removed)
        }
        .await;
        cx.delete_namespace(&required).await.ok();
        cx.delete_namespace(&enabled).await.ok();
        body
    })
    .await
}
