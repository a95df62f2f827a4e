//! The end-to-end scenarios. Run through `e2e/run.sh` (local control plane) or
//! `e2e/kind/run.sh` (kind), one at a time (`--test-threads=1`): some change the shared webhook
//! configurations and put them back. Every check reads what the apiserver stored; no kubelet
//! runs locally, so pods stay Pending.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, ServiceAccount};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use sidecar_injector_e2e::adder::{ADDED_PORT, Adder};
use sidecar_injector_e2e::certs::{bundles_are, pem_blocks, self_managed, webhook_call_failures};
use sidecar_injector_e2e::check::check;
use sidecar_injector_e2e::cluster::{WAIT, accepts, dry_run, rejects, scenario};
use sidecar_injector_e2e::env::{Env, Mode, Need};
use sidecar_injector_e2e::outdated::{
    EXIT_OUTDATED, ProxyImage, RESTARTED_AT, injection_hashes, injector_metrics, outdated,
};
use sidecar_injector_e2e::pods::*;
use sidecar_injector_e2e::webhooks::{
    MUTATING_WEBHOOK, VALIDATING_WEBHOOK, closed_port, delete_mutating, mutating, point_at_port,
    validating, wait_for_injection, wait_for_refusal, with_mutating_changed,
    with_mutating_webhooks_changed,
};

/// The annotation carrying the digest of the configuration an exported policy comes from.
const CONFIG_ANNOTATION: &str = "sidecar-injector.io/config";
use sidecar_injector_e2e::{audit, eventually, metrics};

/// The webhook configurations carry the fields the chart's README promises.
#[tokio::test]
async fn s00_webhooks_are_registered_as_documented() -> anyhow::Result<()> {
    scenario("s00-registration", &[], |cx| async move {
        let name = &cx.env.webhook_config;
        let m = mutating(&cx.client).get(name).await?;
        let v = validating(&cx.client).get(name).await?;
        let m = serde_json::to_value(&m)?;
        let v = serde_json::to_value(&v)?;
        for (kind, cfg, webhook, path, ops) in [
            (
                "mutating",
                &m,
                MUTATING_WEBHOOK,
                "/mutate",
                json!(["CREATE"]),
            ),
            (
                "validating",
                &v,
                VALIDATING_WEBHOOK,
                "/validate",
                json!(["CREATE", "UPDATE"]),
            ),
        ] {
            // Three entries: the pod's own label, namespaces labelled `inject: enabled`, and
            // namespaces labelled `inject: required` (every pod, opted out or not).
            let hooks = cfg["webhooks"].as_array().context("no webhooks")?;
            let names: Vec<&str> = hooks.iter().filter_map(|h| h["name"].as_str()).collect();
            ensure!(
                names
                    == [
                        webhook.to_owned(),
                        format!("namespace.{webhook}"),
                        format!("required.{webhook}")
                    ],
                "{kind}: expected the pod, namespace and required entries, got {names:?}"
            );
            let required = &hooks[2];
            ensure!(
                required
                    .get("objectSelector")
                    .is_none_or(|o| o == &json!({})),
                "{kind}: the required entry selects pods by label: {}",
                required["objectSelector"]
            );
            ensure!(
                required["namespaceSelector"]["matchExpressions"]
                    .as_array()
                    .is_some_and(|e| e.contains(
                        &json!({"key": INJECT_LABEL, "operator": "In", "values": ["required"]})
                    )),
                "{kind}: the required entry's namespaceSelector is {}",
                required["namespaceSelector"]
            );
            if cx.env.mode == Mode::Local {
                let url = required["clientConfig"]["url"].as_str().unwrap_or("");
                ensure!(
                    url.ends_with(&format!("{path}/required")),
                    "{kind}: required entry url {url}"
                );
            }
            let ns_entry = &hooks[1];
            ensure!(
                ns_entry["objectSelector"]["matchExpressions"][0]
                    == json!({"key": INJECT_LABEL, "operator": "NotIn", "values": ["false"]}),
                "{kind}: namespace entry objectSelector is {}",
                ns_entry["objectSelector"]
            );
            if cx.env.mode == Mode::Local {
                let url = ns_entry["clientConfig"]["url"].as_str().unwrap_or("");
                ensure!(
                    url.ends_with(&format!("{path}/namespace")),
                    "{kind}: namespace entry url {url}"
                );
            }
            let h = &hooks[0];
            ensure!(
                h["name"] == webhook,
                "{kind}: webhook is named {}",
                h["name"]
            );
            ensure!(
                h["objectSelector"]["matchLabels"][INJECT_LABEL] == "true",
                "{kind}: objectSelector is {}",
                h["objectSelector"]
            );
            let excluded = h["namespaceSelector"]["matchExpressions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|e| e["key"] == "kubernetes.io/metadata.name" && e["operator"] == "NotIn")
                .context("namespaceSelector has no NotIn on kubernetes.io/metadata.name")?;
            for ns in [
                "kube-system",
                "kube-public",
                "kube-node-lease",
                cx.env.injector_namespace.as_str(),
            ] {
                ensure!(
                    excluded["values"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|v| v == ns),
                    "{kind}: namespaceSelector does not exclude {ns}: {excluded}"
                );
            }
            ensure!(
                h["sideEffects"] == "None",
                "{kind}: sideEffects {}",
                h["sideEffects"]
            );
            ensure!(
                h["matchPolicy"] == "Equivalent",
                "{kind}: matchPolicy {}",
                h["matchPolicy"]
            );
            ensure!(
                h["admissionReviewVersions"] == json!(["v1", "v1beta1"]),
                "{kind}: admissionReviewVersions {}",
                h["admissionReviewVersions"]
            );
            let timeout = h["timeoutSeconds"].as_i64().unwrap_or(10);
            ensure!(
                (1..=5).contains(&timeout),
                "{kind}: timeoutSeconds {timeout}"
            );
            ensure!(
                h["rules"][0]["operations"] == ops && h["rules"][0]["resources"] == json!(["pods"]),
                "{kind}: rules {}",
                h["rules"]
            );
            ensure!(
                !h["clientConfig"]["caBundle"].is_null() || cx.env.mode == Mode::Kind,
                "{kind}: no caBundle"
            );
            if cx.env.mode != Mode::Local {
                ensure!(
                    h["clientConfig"]["service"]["name"] == json!(cx.env.webhook_config)
                        && h["clientConfig"]["service"]["namespace"]
                            == json!(cx.env.injector_namespace),
                    "{kind}: clientConfig {} does not name the chart's Service",
                    h["clientConfig"]
                );
            }
            if cx.env.mode == Mode::Local {
                let url = h["clientConfig"]["url"]
                    .as_str()
                    .context("no clientConfig.url")?;
                let expected = format!("{}{path}", cx.env.webhook_url.clone().unwrap_or_default());
                ensure!(url == expected, "{kind}: url {url}, expected {expected}");
                ensure!(
                    url.starts_with("https://127.0.0.1:"),
                    "{kind}: url {url} is not on 127.0.0.1"
                );
            }
        }
        ensure!(
            m["webhooks"][0]["reinvocationPolicy"] == "IfNeeded",
            "mutating: reinvocationPolicy {}",
            m["webhooks"][0]["reinvocationPolicy"]
        );
        Ok(())
    })
    .await
}

/// 1. An opted-in pod is stored with its sidecars and the status annotation.
#[tokio::test]
async fn s01_opted_in_pod_is_stored_with_its_sidecars() -> anyhow::Result<()> {
    scenario("s01-opted-in", &[], |cx| async move {
        let stored = accepts(&cx.pods(), &opted_in("web")).await?;
        check_injected(&stored)?;
        check_own_init_after_sidecars(&stored, &["app-init"])?;
        ensure!(
            containers(&stored).first().map(|c| c.name.as_str()) == Some("app"),
            "the pod's own container is no longer first: {:?}",
            containers(&stored).iter().map(|c| &c.name).collect::<Vec<_>>()
        );
        // The apiserver's own admission ran too (ServiceAccount; AlwaysPullImages locally).
        let spec = stored.spec.as_ref().context("no spec")?;
        ensure!(spec.service_account_name.as_deref() == Some("default"), "no ServiceAccount defaulting");
        if cx.env.always_pull_images {
            for c in containers(&stored).iter().chain(init_containers(&stored)) {
                ensure!(
                    c.image_pull_policy.as_deref() == Some("Always"),
                    "container {} has imagePullPolicy {:?}: AlwaysPullImages did not run after injection",
                    c.name,
                    c.image_pull_policy
                );
            }
        }
        Ok(())
    })
    .await
}

/// 2. A pod without the label, or with a value other than "true", is stored untouched, and the
/// injector is not even called for it (objectSelector).
#[tokio::test]
async fn s02_pods_that_did_not_opt_in_are_untouched() -> anyhow::Result<()> {
    scenario("s02-not-opted-in", &[], |cx| async move {
        let pods = cx.pods();
        let cases = [
            ("no-label", app_pod("no-label")),
            (
                "label-false",
                labelled(app_pod("label-false"), INJECT_LABEL, "false"),
            ),
            (
                "label-yes",
                labelled(app_pod("label-yes"), INJECT_LABEL, "yes"),
            ),
        ];
        for (name, pod) in &cases {
            let stored = accepts(&pods, pod).await?;
            check_untouched(&stored).with_context(|| format!("pod {name}"))?;
            ensure!(
                init_containers(&stored)
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    == ["app-init"],
                "pod {name}: init containers changed"
            );
        }
        let names: Vec<&str> = cases.iter().map(|(name, _)| *name).collect();
        never_reached_injector(&cx, &names).await?;
        Ok(())
    })
    .await
}

/// 3. Labelled pods in kube-system and in the injector's own namespace are untouched.
#[tokio::test]
async fn s03_system_and_injector_namespaces_are_untouched() -> anyhow::Result<()> {
    scenario("s03-excluded-namespaces", &[], |cx| async move {
        let own = cx.env.injector_namespace.clone();
        let namespaces: Api<Namespace> = Api::all(cx.client.clone());
        ensure!(
            namespaces.get_opt(&own).await?.is_some(),
            "the injector's namespace {own} does not exist (the chart's release namespace)"
        );
        let pod_name = format!("{}-labelled", cx.ns);
        let mut result = Ok(());
        for ns in ["kube-system", own.as_str()] {
            let pods = cx.pods_in(ns);
            let outcome = async {
                eventually(&format!("ServiceAccount {ns}/default"), WAIT, || async {
                    let sa: Api<k8s_openapi::api::core::v1::ServiceAccount> =
                        Api::namespaced(cx.client.clone(), ns);
                    Ok(sa.get_opt("default").await?.map(|_| ()))
                })
                .await?;
                // Compliant with Pod Security's restricted profile, which the node suite's
                // release namespace enforces (for the injector's own pods).
                let stored = accepts(&pods, &restricted(opted_in(&pod_name))?).await?;
                check_untouched(&stored).with_context(|| format!("labelled pod in {ns}"))
            }
            .await;
            let _ = pods.delete(&pod_name, &DeleteParams::default()).await;
            result = result.and(outcome);
        }
        result
    })
    .await
}

/// 4. A Deployment's pod (ReplicaSet, generateName, created by the controller-manager) is injected.
#[tokio::test]
async fn s04_deployment_pods_are_injected() -> anyhow::Result<()> {
    scenario("s04-deployment", &[], |cx| async move {
        let template = opted_in("ignored");
        let deployment: Deployment = from_json(json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web", INJECT_LABEL: "true"}},
                    "spec": template.spec
                }
            }
        }))?;
        let deployments: Api<Deployment> = Api::namespaced(cx.client.clone(), &cx.ns);
        deployments
            .create(&PostParams::default(), &deployment)
            .await?;
        let pods = cx.pods();
        let pod = eventually(
            "the controller-manager to create the Deployment's pod",
            Duration::from_secs(60),
            || async {
                let list = pods.list(&ListParams::default().labels("app=web")).await?;
                Ok(list.items.into_iter().next())
            },
        )
        .await?;
        let generate_name = pod.metadata.generate_name.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        ensure!(
            generate_name.starts_with("web-")
                && name.starts_with(&generate_name)
                && name != generate_name,
            "expected a generateName pod, got name {name:?} generateName {generate_name:?}"
        );
        let owner = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| o.kind.clone());
        ensure!(
            owner.as_deref() == Some("ReplicaSet"),
            "pod is owned by {owner:?}"
        );
        check_injected(&pod)?;
        check_own_init_after_sidecars(&pod, &["app-init"])?;
        check_memory_of_answers(&cx).await
    })
    .await
}

/// What the API server sends is of the shape the servers' memory of answers keeps (it writes
/// `request.uid` first): no review was left out of it, and the same pod sent again a few times
/// in a row (server-side dry runs, alike but for the uid within one second) is answered from
/// it: a pod that mounts no service account token, and one that does, whose token volume the
/// API server's ServiceAccount admission names `kube-api-access-` and five random characters
/// for each pod (the memory leaves that suffix out where the pod names its token volume). A
/// server keeps a body the second time it comes and answers it from the third: five in a row,
/// several times (with two servers, three of five reach the same one; a try that spans a
/// second boundary, `managedFields`' time, tries again).
async fn check_memory_of_answers(cx: &sidecar_injector_e2e::cluster::Ctx) -> anyhow::Result<()> {
    // In kind the injector pods are not reachable: their metrics cannot be read.
    if cx.env.mode == Mode::Kind {
        return Ok(());
    }
    let count = |text: &str, result: &str| {
        metrics::sum(
            text,
            "sidecar_injector_review_memo_total",
            &[("result", result)],
        )
    };
    let before = injector_metrics(&cx.env, &cx.client).await?;
    ensure!(
        count(&before, "miss") > 0.0 && count(&before, "unkept") == 0.0,
        "the API server's reviews are not all of the shape the memory keeps: miss {}, unkept {}",
        count(&before, "miss"),
        count(&before, "unkept")
    );
    let pods = cx.pods();
    let tokenless = {
        let mut pod = opted_in("replica");
        pod.spec
            .as_mut()
            .context("opted_in has a spec")?
            .automount_service_account_token = Some(false);
        pod
    };
    for (what, replica) in [
        ("without a token volume", tokenless),
        ("with a token volume", opted_in("replica-token")),
    ] {
        let mut before = injector_metrics(&cx.env, &cx.client).await?;
        let mut hit = false;
        for _ in 0..10 {
            for _ in 0..5 {
                let pod = dry_run(&pods, &replica).await?;
                check_injected(&pod)?;
            }
            let now = injector_metrics(&cx.env, &cx.client).await?;
            if count(&now, "hit") > count(&before, "hit") {
                hit = true;
                break;
            }
            before = now;
        }
        ensure!(
            hit,
            "50 dry runs of one pod {what}, none answered from the memory of answers"
        );
    }
    Ok(())
}

/// 5. A pod that already carries a sidecar is created once, without a duplicate, and admitted;
/// so is a pod whose own container merely has a sidecar's name.
#[tokio::test]
async fn s05_existing_sidecars_are_not_duplicated() -> anyhow::Result<()> {
    scenario("s05-no-duplicates", &[], |cx| async move {
        let pods = cx.pods();
        // What the injector makes of a pod, and of a pod asking for the proxy only.
        let full = dry_run(&pods, &opted_in("full")).await?;
        let proxy_only = dry_run(
            &pods,
            &annotated(opted_in("proxy-only"), TEMPLATES_ANNOTATION, PROXY),
        )
        .await?;
        check_injected(&full)?;

        // Everything already there: created as it is.
        let again = accepts(&pods, &recreate_from(&full, "already-injected")).await?;
        check_injected(&again)?;
        // Compared without the ServiceAccount token volume, which gets a new random name.
        ensure!(
            recreate_from(&again, "x").spec == recreate_from(&full, "x").spec,
            "a pod that already had its sidecars was changed"
        );

        // The proxy already there (as the injector renders it), the log shipper missing.
        let mut pod = opted_in("has-proxy");
        let proxy = init_containers(&proxy_only)
            .iter()
            .find(|c| c.name == PROXY)
            .cloned()
            .map(without_token_mount)
            .context("no proxy in the proxy-only dry run")?;
        if let Some(spec) = pod.spec.as_mut() {
            spec.init_containers
                .get_or_insert_with(Vec::new)
                .insert(0, proxy);
        }
        let stored = accepts(&pods, &pod).await?;
        check_injected(&stored)?;
        check_own_init_after_sidecars(&stored, &["app-init"])?;

        ensure!(
            kept(&stored)? == [PROXY],
            "the status should record the pod's own proxy as kept"
        );

        // The pod's own container called log-shipper (not the injector's): kept as it is, with
        // no second one (the apiserver would refuse a duplicate name), recorded under "kept",
        // and admitted by the validator (docs/ARCHITECTURE.md: How a pod is injected, 5).
        let mut pod = opted_in("own-log-shipper");
        if let Some(spec) = pod.spec.as_mut() {
            spec.containers.push(k8s_openapi::api::core::v1::Container {
                name: LOG_SHIPPER.into(),
                image: Some(app_image()),
                ..Default::default()
            });
        }
        let stored = accepts(&pods, &pod).await?;
        ensure!(
            count_named(&stored, LOG_SHIPPER) == 1,
            "duplicate log-shipper"
        );
        let own = containers(&stored)
            .iter()
            .find(|c| c.name == LOG_SHIPPER)
            .context("log-shipper is gone")?;
        ensure!(
            own.image.as_deref() == Some(app_image().as_str()),
            "the pod's own log-shipper was replaced: image {:?}",
            own.image
        );
        ensure!(
            kept(&stored)? == [LOG_SHIPPER],
            "the status should record log-shipper as kept"
        );
        check_own_init_after_sidecars(&stored, &["app-init"])?;
        check_app_container_injected(&stored, "app")?;
        ensure!(volume_count(&stored, LOGS_VOLUME) == 1, "no logs volume");
        Ok(())
    })
    .await
}

/// The sidecar names the status annotation records as the pod's own (`kept`).
fn kept(pod: &Pod) -> anyhow::Result<Vec<String>> {
    let status: serde_json::Value =
        serde_json::from_str(status_annotation(pod).context("no status annotation")?)?;
    Ok(status["kept"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect())
}

/// Creates `pod` with the adder webhook configured as `configuration` and returns the stored pod
/// and the audit record of its create.
async fn create_with_adder(
    cx: &sidecar_injector_e2e::cluster::Ctx,
    adder: &Adder,
    configuration: &str,
    pod_name: &str,
) -> anyhow::Result<(Pod, audit::Record)> {
    let api = mutating(&cx.client);
    api.create(
        &PostParams::default(),
        &adder.configuration(configuration, &cx.ns)?,
    )
    .await
    .with_context(|| format!("cannot create {configuration}"))?;
    let outcome = async {
        let pods = cx.pods();
        eventually(&format!("{configuration} to take effect"), WAIT, || async {
            let pod = dry_run(&pods, &opted_in("probe")).await?;
            Ok((count_named(&pod, &adder.container) == 1).then_some(()))
        })
        .await?;
        let stored = accepts(&pods, &opted_in(pod_name)).await?;
        let log = cx.env.audit_log.as_deref().context("no audit log")?;
        let record = audit::pod_create(log, &cx.ns, pod_name).await?;
        Ok((stored, record))
    }
    .await;
    delete_mutating(&cx.client, configuration).await?;
    outcome
}

/// The adder's configuration was called once, in round 0, and mutated: its call's index.
fn adders_one_call(record: &audit::Record, configuration: &str) -> anyhow::Result<u32> {
    let calls: Vec<_> = record.calls_of(configuration).collect();
    ensure!(
        calls.len() == 1 && calls[0].round == 0 && calls[0].mutated,
        "the adder should run once, in round 0, and mutate: {}",
        record.describe()
    );
    Ok(calls[0].index)
}

/// 6. Reinvocation: with a second webhook that adds a container, our webhook runs again in
/// round 1, each sidecar is stored once, and the added container gets our env and mounts, with
/// the other webhook called before ours and after ours. What the apiserver did is read from the
/// audit log.
#[tokio::test]
async fn s06_reinvocation_converges() -> anyhow::Result<()> {
    scenario(
        "s06-reinvocation",
        &[Need::AuditLog, Need::LoopbackWebhooks],
        |cx| async move {
            let ours = cx.env.webhook_config.clone();
            let adder = Adder::start(&cx.env.host, "added-by-other").await?;

            // Configurations are called in name order: "a-..." runs before "sidecar-injector".
            // Round 0: it adds its container, we inject into both application containers. Our
            // change makes the apiserver run its in-tree mutating plugins again (round 1): the
            // ServiceAccount plugin mounts its token into our new sidecars (and AlwaysPullImages,
            // locally, sets their pull policy), so we are called again and change nothing. Seen
            // with and without AlwaysPullImages (e2e/node/run.sh has none).
            let before = format!("a-e2e-adder-{}", cx.ns);
            let (pod, record) = create_with_adder(&cx, &adder, &before, "adder-first").await?;
            println!("adder before us: {}", record.describe());
            let adder_index = adders_one_call(&record, &before)?;
            let our_calls: Vec<_> = record.calls_of(&ours).collect();
            ensure!(
                our_calls
                    .iter()
                    .any(|c| c.round == 0 && c.mutated && c.index > adder_index),
                "we should inject in round 0, after the adder: {}",
                record.describe()
            );
            ensure!(
                our_calls.iter().any(|c| c.round == 1 && !c.mutated),
                "we should be called again in round 1 and change nothing: {}",
                record.describe()
            );
            check_injected(&pod)?;
            check_app_container_injected(&pod, &adder.container)?;

            // "z-..." runs after us. Round 0: we inject, it adds its container. Round 1: we are
            // reinvoked and give its container our env and mounts.
            let after = format!("z-e2e-adder-{}", cx.ns);
            let (pod, record) = create_with_adder(&cx, &adder, &after, "adder-last").await?;
            println!("adder after us: {}", record.describe());
            let adder_index = adders_one_call(&record, &after)?;
            let our_calls: Vec<_> = record.calls_of(&ours).collect();
            ensure!(
                our_calls
                    .iter()
                    .any(|c| c.round == 0 && c.mutated && c.index < adder_index),
                "we should inject in round 0, before the adder: {}",
                record.describe()
            );
            ensure!(
                our_calls.iter().any(|c| c.round == 1 && c.mutated),
                "we should be reinvoked in round 1 and complete the added container: {}",
                record.describe()
            );
            ensure!(
                our_calls.len() == 2,
                "we should be called exactly twice: {}",
                record.describe()
            );
            check_injected(&pod)?;
            check_app_container_injected(&pod, &adder.container)?;
            Ok(())
        },
    )
    .await
}

/// 7. A server-side dry-run create returns the injected pod and stores nothing.
#[tokio::test]
async fn s07_dry_run_is_injected_and_stores_nothing() -> anyhow::Result<()> {
    scenario("s07-dry-run", &[], |cx| async move {
        let pods = cx.pods();
        let answer = dry_run(&pods, &opted_in("dry")).await?;
        check_injected(&answer)?;
        ensure!(
            pods.get_opt("dry").await?.is_none(),
            "the dry-run pod was stored"
        );
        ensure!(
            pods.list(&ListParams::default()).await?.items.is_empty(),
            "a pod was stored"
        );
        Ok(())
    })
    .await
}

/// 8. The mutating webhook unreachable with failurePolicy Ignore: an opted-in pod is still
/// refused, by our validator with our message, and the apiserver counts the rejection.
#[tokio::test]
async fn s08_validator_refuses_what_the_mutator_missed() -> anyhow::Result<()> {
    scenario("s08-mutator-down", &[], |cx| async move {
        let port = closed_port("127.0.0.1").await?;
        let client = cx.client.clone();
        let config = cx.env.webhook_config.clone();
        let ns = cx.ns.clone();
        with_mutating_changed(
            &client,
            &config,
            &ns,
            |hook| {
                hook.failure_policy = Some("Ignore".into());
                point_at_port(&mut hook.client_config, port)
            },
            || async {
                // The chart installs the backstop where the API server has
                // ValidatingAdmissionPolicy: it runs before the validating webhooks and refuses
                // first, with its own message (p02 tests it further).
                if backstop_installed(&cx).await? {
                    wait_for_refusal(&cx.client, &cx.ns, "lacks its sidecar(s)").await?;
                    let message = rejects(&cx.pods(), &opted_in("no-sidecars")).await?;
                    ensure!(
                        message.contains("ValidatingAdmissionPolicy 'sidecar-injector-backstop'")
                            && message.contains("pod no-sidecars lacks its sidecar(s) \"log-shipper\" (template \"log-shipper\"), \"proxy\" (template \"proxy\")"),
                        "expected the backstop's refusal, got: {message}"
                    );
                    return Ok(());
                }
                wait_for_refusal(&cx.client, &cx.ns, "sidecar-injector: pod").await?;
                let before = metrics::validating_rejections(&metrics::scrape(&cx.client).await?, VALIDATING_WEBHOOK);
                let message = rejects(&cx.pods(), &opted_in("no-sidecars")).await?;
                ensure!(
                    message.contains(VALIDATING_WEBHOOK) && message.contains("sidecar-injector: pod \"no-sidecars\""),
                    "expected our validator's refusal, got: {message}"
                );
                ensure!(
                    message.contains("sidecar \"log-shipper\" (template \"log-shipper\") is missing from spec.initContainers")
                        && message.contains("sidecar \"proxy\" (template \"proxy\") is missing from spec.initContainers"),
                    "the refusal should say what is missing: {message}"
                );
                let after = eventually("the rejection to be counted", WAIT, || async {
                    let after = metrics::validating_rejections(&metrics::scrape(&cx.client).await?, VALIDATING_WEBHOOK);
                    Ok((after > before).then_some(after))
                })
                .await?;
                println!("apiserver_admission_webhook_rejection_count{{name={VALIDATING_WEBHOOK}}}: {before} -> {after}");
                if let Some(log) = &cx.env.audit_log {
                    let record = audit::pod_create(log, &cx.ns, "no-sidecars").await?;
                    ensure!(record.code == Some(403) || record.code == Some(400), "audit code {:?}", record.code);
                    ensure!(
                        record.failed_open.iter().any(|(_, _, w)| w == MUTATING_WEBHOOK),
                        "the audit log should record the mutating webhook failing open: {:?}",
                        record.failed_open
                    );
                }
                Ok(())
            },
        )
        .await
    })
    .await
}

/// Whether the chart installed its backstop (a ValidatingAdmissionPolicy named after it).
async fn backstop_installed(cx: &sidecar_injector_e2e::cluster::Ctx) -> anyhow::Result<bool> {
    let request = http::Request::get(
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/sidecar-injector-backstop",
    )
    .body(Vec::new())?;
    match cx.client.request::<serde_json::Value>(request).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// 9. Changing a sidecar's image on an injected pod is refused by the validator; an unrelated
/// update is not.
#[tokio::test]
async fn s09_sidecar_changes_are_refused_on_update() -> anyhow::Result<()> {
    scenario("s09-update", &[], |cx| async move {
        let pods = cx.pods();
        let stored = accepts(&pods, &opted_in("web")).await?;
        check_injected(&stored)?;

        // replace: the log shipper's image. On a node the scheduler and the kubelet update the
        // pod meanwhile, so a replace of a stale copy can meet a conflict: read it again.
        let mut attempts = 0;
        let message = loop {
            let mut changed = pods.get("web").await?;
            if let Some(spec) = changed.spec.as_mut() {
                for c in spec.init_containers.iter_mut().flatten().filter(|c| c.name == LOG_SHIPPER) {
                    c.image = Some("cr.fluentbit.io/fluent/fluent-bit:9.9.9".into());
                }
            }
            match pods.replace("web", &PostParams::default(), &changed).await {
                Ok(_) => anyhow::bail!("changing the log shipper's image was admitted"),
                Err(kube::Error::Api(status)) if status.code == 409 && attempts < 5 => {
                    attempts += 1;
                }
                Err(e) => break sidecar_injector_e2e::cluster::refusal(&e),
            }
        };
        ensure!(
            message.contains("sidecar-injector") && message.contains("\"log-shipper\"") && message.contains("image"),
            "expected the validator's refusal naming the log shipper's image, got: {message}"
        );

        // patch: the proxy's image.
        let patch = json!({"spec": {"initContainers": [{"name": PROXY, "image": "docker.io/envoyproxy/envoy:v0.0.1"}]}});
        let message = match pods.patch("web", &PatchParams::default(), &Patch::Strategic(&patch)).await {
            Ok(_) => anyhow::bail!("changing the proxy's image was admitted"),
            Err(e) => sidecar_injector_e2e::cluster::refusal(&e),
        };
        ensure!(
            message.contains("sidecar-injector") && message.contains("\"proxy\""),
            "expected the validator's refusal naming the proxy, got: {message}"
        );

        // Compared without spec.nodeName, which the scheduler sets on a node meanwhile.
        let unbound = |pod: &Pod| {
            let mut spec = pod.spec.clone();
            if let Some(spec) = spec.as_mut() {
                spec.node_name = None;
            }
            spec
        };
        let now = pods.get("web").await?;
        ensure!(
            unbound(&now) == unbound(&stored),
            "the refused updates changed the stored pod"
        );
        // An update that leaves the sidecars alone goes through.
        let label = json!({"metadata": {"labels": {"touched": "yes"}}});
        pods.patch("web", &PatchParams::default(), &Patch::Merge(&label))
            .await
            .context("an unrelated update of an injected pod was refused")?;
        Ok(())
    })
    .await
}

/// 10. The server stopped and the mutating failurePolicy Fail: opted-in pods fail with a webhook
/// call error; other pods are still created. Restores the policy and the server afterwards.
#[tokio::test]
async fn s10_server_down_blocks_only_opted_in_pods() -> anyhow::Result<()> {
    scenario(
        "s10-server-down",
        &[Need::ProcessControl],
        |cx| async move {
            let client = cx.client.clone();
            let config = cx.env.webhook_config.clone();
            let ns = cx.ns.clone();
            let outcome = with_mutating_changed(
                &client,
                &config,
                &ns,
                |hook| {
                    hook.failure_policy = Some("Fail".into());
                    Ok(())
                },
                || async {
                    cx.env.injector("stop").await?;
                    let body = async {
                        let needle = format!("failed calling webhook \"{MUTATING_WEBHOOK}\"");
                        wait_for_refusal(&cx.client, &cx.ns, &needle).await?;
                        let pods = cx.pods();
                        let message = rejects(&pods, &opted_in("blocked")).await?;
                        // A process on 127.0.0.1 that is gone refuses the connection; a Service
                        // whose Deployment has no pod has no endpoint to call.
                        // In kind the apiserver dials the Service's cluster IP through
                        // kube-proxy, which rejects or drops what goes to a Service with no
                        // endpoint: the call is refused, unreachable or times out (all three
                        // seen in runs here).
                        let causes: &[&str] = match cx.env.mode {
                            Mode::Node => &["no endpoints available for service"],
                            Mode::Kind => &[
                                "context deadline exceeded",
                                "connection refused",
                                "network is unreachable",
                            ],
                            Mode::Local => &["connection refused"],
                        };
                        let cause = causes.join(" or ");
                        ensure!(
                            message.contains(&needle) && causes.iter().any(|c| message.contains(c)),
                            "expected a webhook call error ({cause}), got: {message}"
                        );
                        let stored = accepts(&pods, &app_pod("plain")).await?;
                        check_untouched(&stored)?;
                        let stored = accepts(
                            &pods,
                            &labelled(app_pod("opted-out"), INJECT_LABEL, "false"),
                        )
                        .await?;
                        check_untouched(&stored)?;
                        Ok(())
                    }
                    .await;
                    // Restore the server before the configuration (which waits for injection).
                    body.and(cx.env.injector("start").await)
                },
            )
            .await;
            if outcome.is_err() {
                // Whatever failed, leave a server running for the scenarios after this one.
                let _ = cx.env.injector("start").await;
            }
            outcome?;
            wait_for_injection(&cx.client, &cx.ns).await?;
            Ok(())
        },
    )
    .await
}

/// `helm install` of the chart in url mode and without its Deployment: its webhooks call `url`
/// (a server outside the cluster) and trust `ca`; each of `sets` is one more `--set`.
async fn helm_install_url_mode(
    cx: &sidecar_injector_e2e::cluster::Ctx,
    release: &str,
    release_ns: &str,
    url: &str,
    ca: &std::path::Path,
    sets: &[&str],
) -> anyhow::Result<String> {
    let chart = cx.env.chart.display().to_string();
    let url = format!("webhook.url={url}");
    let ca_file = format!("certificates.existingSecret.caBundle={}", ca.display());
    let mut args = vec![
        "install",
        release,
        &chart,
        "--namespace",
        release_ns,
        "--set",
        &url,
        "--set",
        "deployment.enabled=false",
        "--set",
        "certificates.mode=existingSecret",
        "--set-file",
        &ca_file,
        "--timeout",
        "60s",
    ];
    for set in sets {
        args.extend(["--set", set]);
    }
    cx.helm(&args).await
}

async fn helm_uninstall(
    cx: &sidecar_injector_e2e::cluster::Ctx,
    release: &str,
    release_ns: &str,
) -> anyhow::Result<String> {
    cx.helm(&[
        "uninstall",
        release,
        "--namespace",
        release_ns,
        "--timeout",
        "60s",
    ])
    .await
}

/// 11. The chart installs into this apiserver in url mode, its webhooks inject, and
/// `helm uninstall` removes its webhook configurations.
#[tokio::test]
async fn s11_helm_chart_in_url_mode() -> anyhow::Result<()> {
    scenario("s11-helm", &[Need::ServerUrl], |cx| async move {
        let url = cx.env.webhook_url.clone().context("no E2E_WEBHOOK_URL")?;
        let ca = cx.env.ca_cert.clone().context("no CA_CERT")?;
        // The suite's own registration leaves alone namespaces labelled with its disabledLabel;
        // this release uses another label, so in the scenario's namespace only it injects.
        let main_disabled = "sidecar-injector.io/disabled";
        let namespaces: Api<Namespace> = Api::all(cx.client.clone());
        let label = json!({"metadata": {"labels": {main_disabled: "true"}}});
        namespaces
            .patch(&cx.ns, &PatchParams::default(), &Patch::Merge(&label))
            .await?;
        let release_ns = cx.extra_namespace("release", &[]).await?;
        let release = "e2e-helm";
        let fullname = "e2e-helm-sidecar-injector";
        let outcome = async {
            let probe = opted_in("probe");
            eventually(
                "the main webhooks to leave the namespace alone",
                WAIT,
                || async {
                    Ok(status_annotation(&dry_run(&cx.pods(), &probe).await?)
                        .is_none()
                        .then_some(()))
                },
            )
            .await?;
            let installed = helm_install_url_mode(
                &cx,
                release,
                &release_ns,
                &url,
                &ca,
                &["webhook.disabledLabel=e2e.sidecar-injector.io/helm-disabled"],
            )
            .await?;
            println!(
                "{}",
                installed.lines().take(6).collect::<Vec<_>>().join("\n")
            );
            let m = mutating(&cx.client).get(fullname).await?;
            let hook_url = m
                .webhooks
                .iter()
                .flatten()
                .next()
                .and_then(|w| w.client_config.url.clone());
            ensure!(
                hook_url == Some(format!("{url}/mutate")),
                "chart's clientConfig.url is {hook_url:?}"
            );
            validating(&cx.client).get(fullname).await?;

            wait_for_injection(&cx.client, &cx.ns).await?;
            let stored = accepts(&cx.pods(), &opted_in("through-chart")).await?;
            check_injected(&stored)?;
            if let Some(log) = &cx.env.audit_log {
                let record = audit::pod_create(log, &cx.ns, "through-chart").await?;
                ensure!(
                    record.calls_of(fullname).any(|c| c.mutated)
                        && record.calls_of(&cx.env.webhook_config).next().is_none(),
                    "the chart's webhook should be the one that injected: {}",
                    record.describe()
                );
            }

            helm_uninstall(&cx, release, &release_ns).await?;
            ensure!(
                mutating(&cx.client).get_opt(fullname).await?.is_none(),
                "MutatingWebhookConfiguration {fullname} is left"
            );
            ensure!(
                validating(&cx.client).get_opt(fullname).await?.is_none(),
                "ValidatingWebhookConfiguration {fullname} is left"
            );
            let plain = eventually(
                "pods to be left alone after helm uninstall",
                WAIT,
                || async {
                    let pod = dry_run(&cx.pods(), &probe).await?;
                    Ok(status_annotation(&pod).is_none().then_some(pod))
                },
            )
            .await?;
            check_untouched(&plain)?;
            Ok(())
        }
        .await;
        if outcome.is_err() {
            let _ = helm_uninstall(&cx, release, &release_ns).await;
        }
        let _ = cx.delete_namespace(&release_ns).await;
        outcome
    })
    .await
}

/// Opted-in pods the injector skips (hostNetwork, Windows) are stored untouched; locally the
/// audit log shows they never reached it (the chart's matchConditions hold them back).
#[tokio::test]
async fn s12_skipped_pods_are_untouched() -> anyhow::Result<()> {
    scenario("s12-skipped", &[], |cx| async move {
        let pods = cx.pods();
        let mut host_network = opted_in("host-network");
        let mut windows = opted_in("windows");
        if let Some(spec) = host_network.spec.as_mut() {
            spec.host_network = Some(true);
        }
        if let Some(spec) = windows.spec.as_mut() {
            spec.node_selector =
                Some([("kubernetes.io/os".to_owned(), "windows".to_owned())].into());
        }
        for pod in [&host_network, &windows] {
            let stored = accepts(&pods, pod).await?;
            check_untouched(&stored)?;
        }
        never_reached_injector(&cx, &["host-network", "windows"]).await?;
        Ok(())
    })
    .await
}

/// An opted-in pod asking for a template that does not exist is refused by the injector itself,
/// with a message naming the known templates.
#[tokio::test]
async fn s13_unknown_template_is_refused_with_the_known_ones() -> anyhow::Result<()> {
    scenario("s13-unknown-template", &[], |cx| async move {
        let pod = annotated(opted_in("typo"), TEMPLATES_ANNOTATION, "proxy,log-shiper");
        let message = rejects(&cx.pods(), &pod).await?;
        ensure!(
            message.contains(&format!("admission webhook \"{MUTATING_WEBHOOK}\" denied the request"))
                && message.contains("\"log-shiper\"")
                && message.contains("log-shipper")
                && message.contains("proxy"),
            "expected the injector's refusal naming the unknown and the known templates, got: {message}"
        );
        Ok(())
    })
    .await
}

/// Where the audit log is available: the injector's webhook was never called for these pods.
async fn never_reached_injector(
    cx: &sidecar_injector_e2e::cluster::Ctx,
    names: &[&str],
) -> anyhow::Result<()> {
    let Some(log) = &cx.env.audit_log else {
        return Ok(());
    };
    for name in names {
        let record = audit::pod_create(log, &cx.ns, name).await?;
        ensure!(
            record.calls_of(&cx.env.webhook_config).next().is_none(),
            "pod {name}: the injector was called: {}",
            record.describe()
        );
    }
    Ok(())
}

/// 14. A namespace labelled `sidecar-injector.io/inject: enabled` gets every pod injected,
/// through the namespace entry, except a pod that says "false", which never reaches the
/// injector; a pod saying "true" there is injected once (the entries cannot overlap).
#[tokio::test]
async fn s14_namespace_opt_in_with_a_pod_opting_out() -> anyhow::Result<()> {
    scenario("s14-namespace-opt-in", &[], |cx| async move {
        let ns = cx
            .extra_namespace("enabled", &[(INJECT_LABEL, NAMESPACE_ENABLED)])
            .await?;
        let outcome = async {
            let pods = cx.pods_in(&ns);
            let unlabelled = eventually("the namespace entry to inject", WAIT, || async {
                let pod = dry_run(&pods, &app_pod("probe")).await?;
                Ok(status_annotation(&pod).is_some().then_some(()))
            });
            unlabelled.await?;
            let stored = accepts(&pods, &app_pod("plain")).await?;
            check_injected(&stored).context("a pod without the label")?;
            let stored = accepts(&pods, &opted_in("also-true")).await?;
            check_injected(&stored).context("a pod labelled \"true\"")?;
            let stored = accepts(
                &pods,
                &labelled(app_pod("opted-out"), INJECT_LABEL, "false"),
            )
            .await?;
            check_untouched(&stored).context("a pod labelled \"false\"")?;
            if let Some(log) = &cx.env.audit_log {
                let namespace_entry = format!("namespace.{MUTATING_WEBHOOK}");
                for name in ["plain", "also-true"] {
                    let record = audit::pod_create(log, &ns, name).await?;
                    let ours: Vec<_> = record.calls_of(&cx.env.webhook_config).collect();
                    ensure!(
                        !ours.is_empty() && ours.iter().all(|c| c.webhook == namespace_entry),
                        "pod {name}: expected calls of {namespace_entry} only: {}",
                        record.describe()
                    );
                }
                let record = audit::pod_create(log, &ns, "opted-out").await?;
                ensure!(
                    record.calls_of(&cx.env.webhook_config).next().is_none(),
                    "the opted-out pod reached the injector: {}",
                    record.describe()
                );
            }
            // The same pod in a namespace that did not opt in is left alone.
            let stored = accepts(&cx.pods(), &app_pod("elsewhere")).await?;
            check_untouched(&stored)
        }
        .await;
        let _ = cx.delete_namespace(&ns).await;
        outcome
    })
    .await
}

/// A server of the suite's own (`sidecar-injector serve` as a revision of its own) on the
/// suite's host address; it stops, and its directory goes, when this is dropped (its chart
/// release is uninstalled by the scenario).
struct OwnServer {
    process: tokio::process::Child,
    dir: std::path::PathBuf,
    /// Its admin port on 127.0.0.1 (metrics).
    admin: u16,
}

/// The end of a scenario with a release and a server of its own (s15, s30): the release
/// (name, namespace) uninstalled, the server stopped, the scenario's namespaces deleted, then
/// the release's; the scenario's own outcome first, then the uninstall's.
async fn end_with_own_release(
    cx: &sidecar_injector_e2e::cluster::Ctx,
    (release, release_ns): (&str, &str),
    server: OwnServer,
    namespaces: &[String],
    outcome: anyhow::Result<()>,
) -> anyhow::Result<()> {
    let uninstalled = helm_uninstall(cx, release, release_ns).await;
    drop(server);
    for ns in namespaces.iter().map(String::as_str).chain([release_ns]) {
        let _ = cx.delete_namespace(ns).await;
    }
    outcome?;
    uninstalled.map(|_| ())
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = self.process.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl OwnServer {
    /// Starts `sidecar-injector serve` with the default configuration as `revision`, on
    /// `port` of the suite's host address, with `args` (the certificate's flags) after.
    async fn start(
        env: &Env,
        release_ns: &str,
        revision: &str,
        port: u16,
        args: &[std::ffi::OsString],
    ) -> anyhow::Result<Self> {
        Self::start_with(env, release_ns, revision, port, args, "").await
    }

    /// [`Self::start`], with `extra` (top-level keys) appended to its configuration.
    async fn start_with(
        env: &Env,
        release_ns: &str,
        revision: &str,
        port: u16,
        args: &[std::ffi::OsString],
        extra: &str,
    ) -> anyhow::Result<Self> {
        let bin = env.injector_bin.as_ref().context("no E2E_INJECTOR_BIN")?;
        let host = env.host.as_str();
        let dir = std::env::temp_dir().join(format!("sidecar-injector-e2e-{release_ns}"));
        std::fs::create_dir_all(&dir)?;
        // The main server's configuration when the runner gives one (on a node: the stand-in
        // images), else the embedded default; only the revision differs.
        let base = match std::env::var("SIDECAR_INJECTOR_CONFIG") {
            Ok(path) if !path.is_empty() => std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read SIDECAR_INJECTOR_CONFIG {path}"))?,
            _ => include_str!("../../templates/config.yaml").to_owned(),
        };
        ensure!(
            base.contains("revision: \"\""),
            "the configuration has no `revision: \"\"` line"
        );
        let config = dir.join("config.yaml");
        let mut text = base.replace("revision: \"\"", &format!("revision: {revision}"));
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(extra);
        std::fs::write(&config, text)?;
        let admin = closed_port("127.0.0.1").await?;
        let log = std::fs::File::create(dir.join("server.log"))?;
        let process = tokio::process::Command::new(bin)
            .args(["serve", "--listen", &format!("{host}:{port}")])
            .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
            .arg("--config")
            .arg(&config)
            .args(args)
            .env("SIDECAR_INJECTOR_NAMESPACE", release_ns)
            .env("SIDECAR_INJECTOR_LOG_FORMAT", "json")
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start the {revision} server"))?;
        Ok(Self {
            process,
            dir,
            admin,
        })
    }

    /// Stops the server (its directory stays until it is dropped).
    async fn stop(&mut self) {
        let _ = self.process.kill().await;
    }

    /// Its log so far.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

/// 15. Two revisions side by side: the default installation and a `canary` one (a second
/// server, a second chart release with `revision=canary`). A namespace labelled for each
/// revision gets only that revision's sidecars, once; a pod naming the canary revision itself
/// goes to it; then the canary upgrade: a namespace relabelled to canary gets canary pods from
/// then on, and its old pods stay updatable (checked by the revision that injected them).
#[tokio::test]
async fn s15_two_revisions_side_by_side() -> anyhow::Result<()> {
    scenario(
        "s15-revisions",
        &[
            Need::ServerUrl,
            Need::ProcessControl,
            Need::LoopbackWebhooks,
        ],
        |cx| async move {
            let ca = cx.env.ca_cert.clone().context("no CA_CERT")?;
            let release_ns = cx.extra_namespace("canary-release", &[]).await?;
            let stable_ns = cx
                .extra_namespace("stable", &[(INJECT_LABEL, NAMESPACE_ENABLED)])
                .await?;
            let canary_ns = cx
                .extra_namespace(
                    "canary",
                    &[
                        (INJECT_LABEL, NAMESPACE_ENABLED),
                        (REVISION_LABEL, "canary"),
                    ],
                )
                .await?;
            let release = "e2e-canary";
            let fullname = "e2e-canary-sidecar-injector-canary";
            let cert = cx
                .env
                .injector_cert
                .clone()
                .context("no E2E_INJECTOR_CERT")?;
            let key = cx.env.injector_key.clone().context("no E2E_INJECTOR_KEY")?;
            let port = closed_port(&cx.env.host).await?;
            let tls = [
                "--tls-cert-file".into(),
                cert.into(),
                "--tls-key-file".into(),
                key.into(),
            ];
            let server = OwnServer::start(&cx.env, &release_ns, "canary", port, &tls).await?;
            let outcome = async {
                helm_install_url_mode(
                    &cx,
                    release,
                    &release_ns,
                    &format!("https://{}:{port}", cx.env.host),
                    &ca,
                    &["revision=canary"],
                )
                .await?;
                let m = mutating(&cx.client).get(fullname).await?;
                let names: Vec<&str> = m
                    .webhooks
                    .iter()
                    .flatten()
                    .map(|w| w.name.as_str())
                    .collect();
                ensure!(
                    names
                        == [
                            "canary.inject.sidecar-injector.io",
                            "canary.namespace.inject.sidecar-injector.io",
                            "canary.required.inject.sidecar-injector.io"
                        ],
                    "canary webhooks are {names:?}"
                );
                let revision_of = |pod: &Pod| -> anyhow::Result<String> {
                    Ok(status(pod)?["revision"].as_str().unwrap_or("").to_owned())
                };
                let canary_pods = cx.pods_in(&canary_ns);
                sidecar_injector_e2e::cluster::wait_injecting(
                    &canary_pods,
                    &app_pod("probe"),
                    "the canary server and webhooks to inject",
                )
                .await?;

                let stable = accepts(&cx.pods_in(&stable_ns), &app_pod("web")).await?;
                check_injected(&stable)?;
                ensure!(
                    revision_of(&stable)?.is_empty(),
                    "the stable namespace's pod: {:?}",
                    status(&stable)?
                );
                let canary = accepts(&canary_pods, &app_pod("web")).await?;
                check_injected(&canary)?;
                ensure!(
                    revision_of(&canary)? == "canary",
                    "the canary namespace's pod: {:?}",
                    status(&canary)?
                );
                let own = accepts(
                    &cx.pods(),
                    &labelled(opted_in("asks-canary"), REVISION_LABEL, "canary"),
                )
                .await?;
                check_injected(&own)?;
                ensure!(
                    revision_of(&own)? == "canary",
                    "the pod naming canary: {:?}",
                    status(&own)?
                );
                let plain = accepts(&cx.pods(), &opted_in("asks-default")).await?;
                check_injected(&plain)?;
                ensure!(
                    revision_of(&plain)?.is_empty(),
                    "the pod naming no revision: {:?}",
                    status(&plain)?
                );
                if let Some(log) = &cx.env.audit_log {
                    for (ns, name, injector, other) in [
                        (&stable_ns, "web", cx.env.webhook_config.as_str(), fullname),
                        (&canary_ns, "web", fullname, cx.env.webhook_config.as_str()),
                        (
                            &cx.ns,
                            "asks-canary",
                            fullname,
                            cx.env.webhook_config.as_str(),
                        ),
                    ] {
                        let record = audit::pod_create(log, ns, name).await?;
                        ensure!(
                            record.calls_of(injector).any(|c| c.mutated)
                                && record.calls_of(other).next().is_none(),
                            "{ns}/{name}: expected {injector} only: {}",
                            record.describe()
                        );
                    }
                }

                // The canary upgrade: move the stable namespace to the canary revision.
                let namespaces: Api<Namespace> = Api::all(cx.client.clone());
                let relabel = json!({"metadata": {"labels": {REVISION_LABEL: "canary"}}});
                namespaces
                    .patch(&stable_ns, &PatchParams::default(), &Patch::Merge(&relabel))
                    .await?;
                let stable_pods = cx.pods_in(&stable_ns);
                let moved = eventually(
                    "the relabelled namespace to be injected by canary",
                    WAIT,
                    || async {
                        let pod = dry_run(&stable_pods, &app_pod("probe")).await?;
                        Ok((status(&pod)
                            .ok()
                            .and_then(|s| s["revision"].as_str().map(str::to_owned))
                            .as_deref()
                            == Some("canary"))
                        .then_some(pod))
                    },
                )
                .await?;
                check_injected(&moved)?;
                // The pod the default revision injected is now seen by canary's validator: an
                // update that leaves its sidecars alone is admitted.
                let touch = json!({"metadata": {"labels": {"touched": "yes"}}});
                stable_pods
                    .patch("web", &PatchParams::default(), &Patch::Merge(&touch))
                    .await
                    .context("updating the default revision's pod after the move was refused")?;
                Ok(())
            }
            .await;
            end_with_own_release(
                &cx,
                (release, &release_ns),
                server,
                &[stable_ns, canary_ns],
                outcome,
            )
            .await
        },
    )
    .await
}

/// 16. The proxy learned the application's ports from the pod: a listener per declared TCP
/// port, routing to it; a pod declaring none gets a proxy that routes nowhere.
#[tokio::test]
async fn s16_the_proxy_routes_to_the_apps_ports() -> anyhow::Result<()> {
    scenario("s16-app-ports", &[], |cx| async move {
        let pods = cx.pods();
        let stored = accepts(&pods, &with_ports(opted_in("two-ports"), &[8080, 9090])).await?;
        check_injected(&stored)?;
        let (clusters, listeners) = proxy_routes(&stored)?;
        ensure!(clusters == [8080, 9090], "the proxy routes to {clusters:?}");
        ensure!(
            listeners == [15001, 15002],
            "the proxy listens on {listeners:?}"
        );
        let stored = accepts(&pods, &opted_in("no-ports")).await?;
        check_injected(&stored)?;
        let (clusters, listeners) = proxy_routes(&stored)?;
        ensure!(
            clusters.is_empty() && listeners == [15001],
            "no ports: {clusters:?} {listeners:?}"
        );
        Ok(())
    })
    .await
}

/// 17. A per-pod override the proxy template declares is accepted and rendered.
#[tokio::test]
async fn s17_an_override_is_accepted() -> anyhow::Result<()> {
    scenario("s17-override-accepted", &[], |cx| async move {
        let pod = annotated(
            annotated(opted_in("tuned"), "sidecar-injector.io/proxy-cpu", "250m"),
            "sidecar-injector.io/proxy-log-level",
            "debug",
        );
        let stored = accepts(&cx.pods(), &pod).await?;
        check_injected(&stored)?;
        let proxy = init_containers(&stored)
            .iter()
            .find(|c| c.name == PROXY)
            .context("no proxy")?;
        let cpu = proxy
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("cpu"))
            .map(|q| q.0.clone());
        ensure!(cpu.as_deref() == Some("250m"), "proxy cpu request {cpu:?}");
        let args = proxy.args.clone().unwrap_or_default();
        ensure!(
            args.windows(2).any(|w| w == ["--log-level", "debug"]),
            "proxy args {args:?}"
        );
        Ok(())
    })
    .await
}

/// 18. A bad override is refused by the injector, naming the annotation and what is allowed;
/// nothing is stored.
#[tokio::test]
async fn s18_a_bad_override_is_refused() -> anyhow::Result<()> {
    scenario("s18-override-refused", &[], |cx| async move {
        let pod = annotated(opted_in("loud"), "sidecar-injector.io/proxy-log-level", "loud");
        let message = rejects(&cx.pods(), &pod).await?;
        ensure!(
            message.contains(&format!("admission webhook \"{MUTATING_WEBHOOK}\" denied the request"))
                && message.contains("annotation sidecar-injector.io/proxy-log-level: \"loud\" is not allowed")
                && message.contains("one of trace, debug, info, warn, error, critical, off"),
            "expected the injector's refusal naming the annotation and the allowed values, got: {message}"
        );
        Ok(())
    })
    .await
}

/// 19. The rendering is fixed at the first call: another webhook, called after ours, adds a
/// container with a port of its own; on reinvocation the injector completes that container
/// (env, mount) but the proxy still routes only to the port the pod declared, and the
/// validator, which sees the added container too, admits the pod.
#[tokio::test]
async fn s19_what_is_added_after_us_does_not_change_the_rendering() -> anyhow::Result<()> {
    scenario("s19-stable-rendering", &[Need::LoopbackWebhooks], |cx| async move {
        let adder = Adder::start(&cx.env.host, "added-by-other").await?;
        let configuration = format!("z-e2e-adder-{}", cx.ns);
        mutating(&cx.client)
            .create(&PostParams::default(), &adder.configuration(&configuration, &cx.ns)?)
            .await?;
        let outcome = async {
            let pods = cx.pods();
            eventually("the adder to take effect", WAIT, || async {
                let pod = dry_run(&pods, &opted_in("probe")).await?;
                Ok((count_named(&pod, &adder.container) == 1).then_some(()))
            })
            .await?;
            let stored = accepts(&pods, &with_ports(opted_in("web"), &[8080])).await?;
            check_injected(&stored)?;
            check_app_container_injected(&stored, &adder.container)?;
            let (clusters, _) = proxy_routes(&stored)?;
            ensure!(
                clusters == [8080],
                "the proxy routes to {clusters:?}; the added container's {ADDED_PORT} must not change it"
            );
            let seen = status(&stored)?["context"]["containers"].clone();
            ensure!(seen == json!(["app"]), "the status records the context {seen}");
            Ok(())
        }
        .await;
        delete_mutating(&cx.client, &configuration).await?;
        outcome
    })
    .await
}

// === outdated (s20..s22) ===
//
// Locally no kubelet runs: pods stay Pending and a rollout that waits for ready replicas never
// finishes. The Deployments here use `strategy: Recreate` and the StatefulSet `Parallel`, so
// their controllers replace pods without waiting for them to be ready (unscheduled pods are
// deleted at once); the restarts are sent with `--no-wait`. On a node the pods run, and s22
// also waits for a rollout to finish.

type Cx = sidecar_injector_e2e::cluster::Ctx;

/// A Deployment of opted-in pods; `never_ready` adds a readiness probe that cannot succeed, so
/// its rollout never finishes, node or not.
fn deployment(
    name: &str,
    replicas: i32,
    strategy: &str,
    templates: Option<&str>,
    never_ready: bool,
) -> serde_json::Value {
    let mut annotations = serde_json::Map::new();
    if let Some(t) = templates {
        annotations.insert(TEMPLATES_ANNOTATION.into(), t.into());
    }
    let mut app = json!({"name": "app", "image": app_image()});
    if never_ready {
        app["readinessProbe"] = json!({"exec": {"command": ["/never-ready"]}, "periodSeconds": 1});
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "strategy": {"type": strategy},
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, INJECT_LABEL: "true"}, "annotations": annotations},
                "spec": {"terminationGracePeriodSeconds": 0, "containers": [app]}
            }
        }
    })
}

/// A StatefulSet of one opted-in pod; `Parallel`, so that its controller replaces a pod that is
/// not ready (none is, without a kubelet).
fn statefulset(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "serviceName": name,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, INJECT_LABEL: "true"}},
                "spec": {"terminationGracePeriodSeconds": 0, "containers": [{"name": "app", "image": app_image()}]}
            }
        }
    })
}

async fn create_workloads(
    cx: &Cx,
    deployments: &[serde_json::Value],
    statefulsets: &[serde_json::Value],
) -> anyhow::Result<()> {
    let d: Api<Deployment> = Api::namespaced(cx.client.clone(), &cx.ns);
    for value in deployments {
        d.create(&PostParams::default(), &from_json(value.clone())?)
            .await
            .with_context(|| format!("creating {}", value["metadata"]["name"]))?;
    }
    let s: Api<StatefulSet> = Api::namespaced(cx.client.clone(), &cx.ns);
    for value in statefulsets {
        s.create(&PostParams::default(), &from_json(value.clone())?)
            .await
            .with_context(|| format!("creating {}", value["metadata"]["name"]))?;
    }
    Ok(())
}

/// Waits until each `(app, count)` has exactly `count` live pods (label `app`), all injected.
async fn wait_for_pods(cx: &Cx, apps: &[(&str, usize)]) -> anyhow::Result<()> {
    for (app, count) in apps {
        eventually(
            &format!("{count} injected pod(s) of {app}"),
            Duration::from_secs(60),
            || async {
                let list = cx
                    .pods()
                    .list(&ListParams::default().labels(&format!("app={app}")))
                    .await?;
                let live: Vec<&Pod> = list
                    .items
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .collect();
                Ok(
                    (live.len() == *count && live.iter().all(|p| status_annotation(p).is_some()))
                        .then_some(()),
                )
            },
        )
        .await?;
    }
    Ok(())
}

/// The restart annotation on a Deployment's or StatefulSet's pod template, if set.
async fn restarted_at(cx: &Cx, workload: &str) -> anyhow::Result<Option<String>> {
    let (kind, name) = workload.split_once('/').context("Kind/name")?;
    let template = match kind {
        "Deployment" => {
            let d: Api<Deployment> = Api::namespaced(cx.client.clone(), &cx.ns);
            d.get(name).await?.spec.map(|s| s.template)
        }
        "StatefulSet" => {
            let s: Api<StatefulSet> = Api::namespaced(cx.client.clone(), &cx.ns);
            s.get(name).await?.spec.map(|s| s.template)
        }
        other => anyhow::bail!("no pod template on {other}"),
    };
    Ok(template
        .and_then(|t| t.metadata)
        .and_then(|m| m.annotations)
        .and_then(|a| a.get(RESTARTED_AT).cloned()))
}

/// Runs `body` with the proxy template's image changed, and puts it back whatever happens.
async fn with_proxy_changed<F, Fut>(cx: &Cx, body: F) -> anyhow::Result<()>
where
    F: FnOnce(String, String) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let change = ProxyImage::set(&cx.env, &cx.client, &cx.pods()).await?;
    let result = body(change.old.clone(), change.new.clone()).await;
    let restored = change.restore(&cx.pods()).await;
    result.and(restored)
}

/// The running local server's configuration directory as a ConfigMap named `name`.
fn running_config(cx: &Cx, name: &str) -> anyhow::Result<ConfigMap> {
    let config = cx
        .env
        .injector_config
        .clone()
        .context("no injector config")?;
    let dir = config.parent().context("config dir")?;
    let mut data = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let file = entry.file_name().to_string_lossy().into_owned();
        data.insert(file, std::fs::read_to_string(entry.path())?);
    }
    Ok(ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    })
}

/// Locally: the local server's configuration as a ConfigMap in the injector's namespace gives
/// the report `expected` gave; the chart's own ConfigMap (the bundled template) says all
/// `current`. (On a node every run already reads the chart's ConfigMap.)
async fn same_from_configmaps(
    cx: &Cx,
    expected: &sidecar_injector_e2e::outdated::Report,
    current: usize,
) -> anyhow::Result<()> {
    if cx.env.mode != Mode::Local {
        return Ok(());
    }
    let cms: Api<ConfigMap> = Api::namespaced(cx.client.clone(), &cx.env.injector_namespace);
    let name = format!("changed-{}", cx.ns);
    cms.create(&PostParams::default(), &running_config(cx, &name)?)
        .await?;
    let reference = format!("{}/{name}", cx.env.injector_namespace);
    let from_cm = outdated(&cx.env, &cx.ns, &["--from-configmap", &reference]).await;
    cms.delete(&name, &DeleteParams::default()).await?;
    let from_cm = from_cm?;
    ensure!(
        from_cm.code == expected.code && from_cm.json["workloads"] == expected.json["workloads"],
        "from {reference}: exit {}: {}{}",
        from_cm.code,
        from_cm.json,
        from_cm.stderr
    );
    let chart = format!("{}/{}", cx.env.injector_namespace, cx.env.webhook_config);
    let from_chart = outdated(&cx.env, &cx.ns, &["--from-configmap", &chart]).await?;
    ensure!(
        from_chart.code == 0 && from_chart.workloads("current").len() == current,
        "from the chart's ConfigMap {chart}: exit {}: {}{}",
        from_chart.code,
        from_chart.json,
        from_chart.stderr
    );
    Ok(())
}

/// After a template change, `outdated` names exactly the workloads whose pods carry the old
/// template, with the old and new image; workloads that do not use the template stay current;
/// the server counts injections under the new template hash; putting the template back makes
/// everything current again.
#[tokio::test]
async fn s20_outdated_names_exactly_the_workloads_a_template_change_affects() -> anyhow::Result<()>
{
    scenario(
        "s20-outdated-report",
        &[Need::TemplateChange],
        |cx| async move {
            create_workloads(
                &cx,
                &[
                    deployment("web", 1, "Recreate", None, false),
                    deployment("logs", 1, "Recreate", Some(LOG_SHIPPER), false),
                ],
                &[statefulset("db")],
            )
            .await?;
            accepts(&cx.pods(), &opted_in("debug")).await?;
            accepts(&cx.pods(), &app_pod("plain")).await?;
            wait_for_pods(&cx, &[("web", 1), ("logs", 1), ("db", 1), ("debug", 1)]).await?;

            let before = outdated(&cx.env, &cx.ns, &[]).await?;
            ensure!(
                before.code == 0,
                "before the change: exit {}: {}{}",
                before.code,
                before.json,
                before.stderr
            );
            ensure!(
                before.all_workloads()
                    == [
                        "Deployment/logs",
                        "Deployment/web",
                        "Pod/debug",
                        "StatefulSet/db"
                    ]
                    && before.workloads("current").len() == 4,
                "before the change: {}",
                before.json
            );

            let cx = &cx;

            with_proxy_changed(cx, |old, new| async move {
                let after = outdated(&cx.env, &cx.ns, &[]).await?;
                ensure!(
                    after.code == EXIT_OUTDATED,
                    "after the change: exit {}: {}",
                    after.code,
                    after.stderr
                );
                ensure!(
                    after.workloads("outdated")
                        == ["Deployment/web", "Pod/debug", "StatefulSet/db"]
                        && after.workloads("current") == ["Deployment/logs"],
                    "after the change: {}",
                    after.json
                );
                after.check_proxy_changed(&old, &new)?;
                // The servers count injections under the new proxy hash; the log shipper's is
                // unchanged.
                let metrics = injector_metrics(&cx.env, &cx.client).await?;
                let proxy = injection_hashes(&metrics, PROXY);
                let shipper = injection_hashes(&metrics, LOG_SHIPPER);
                ensure!(
                    proxy.len() == 2 && shipper.len() == 1,
                    "injections by template hash: proxy {proxy:?}, log-shipper {shipper:?}"
                );
                same_from_configmaps(cx, &after, 4).await
            })
            .await?;

            let restored = outdated(&cx.env, &cx.ns, &[]).await?;
            ensure!(
                restored.code == 0 && restored.workloads("current").len() == 4,
                "after putting the template back: exit {}: {}",
                restored.code,
                restored.json
            );
            Ok(())
        },
    )
    .await
}

/// `--restart --dry-run` changes nothing; `--restart` patches the pod templates the way
/// `kubectl rollout restart` does, the controllers replace the pods with injected current ones,
/// the bare pod is reported and left alone, and once a person recreates it the report is clean.
#[tokio::test]
async fn s21_restart_brings_the_report_back_clean() -> anyhow::Result<()> {
    scenario(
        "s21-outdated-restart",
        &[Need::TemplateChange],
        |cx| async move {
            create_workloads(
                &cx,
                &[deployment("web", 2, "Recreate", None, false)],
                &[statefulset("db")],
            )
            .await?;
            accepts(&cx.pods(), &opted_in("debug")).await?;
            wait_for_pods(&cx, &[("web", 2), ("db", 1), ("debug", 1)]).await?;
            let old_pods: Vec<String> = cx
                .pods()
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter_map(|p| p.metadata.uid)
                .collect();

            let cx = &cx;

            with_proxy_changed(cx, |_old, new| async move {
                let dry = outdated(&cx.env, &cx.ns, &["--restart", "--dry-run"]).await?;
                ensure!(
                    dry.code == EXIT_OUTDATED,
                    "dry run: exit {}: {}",
                    dry.code,
                    dry.stderr
                );
                let mut actions = dry.restarts();
                actions.sort();
                ensure!(
                    actions
                        == [
                            ("Deployment/web".to_owned(), "wouldRestart".to_owned()),
                            ("Pod/debug".to_owned(), "notRestartable".to_owned()),
                            ("StatefulSet/db".to_owned(), "wouldRestart".to_owned()),
                        ],
                    "dry run: {}",
                    dry.json
                );
                for w in ["Deployment/web", "StatefulSet/db"] {
                    ensure!(restarted_at(cx, w).await?.is_none(), "dry run patched {w}");
                }

                let run = outdated(&cx.env, &cx.ns, &["--restart", "--no-wait"]).await?;
                // The bare pod is still outdated: it is never deleted.
                ensure!(
                    run.code == EXIT_OUTDATED,
                    "restart: exit {}: {}",
                    run.code,
                    run.stderr
                );
                for w in ["Deployment/web", "StatefulSet/db"] {
                    ensure!(
                        restarted_at(cx, w).await?.is_some(),
                        "{w}: no {RESTARTED_AT} on the pod template: {}",
                        run.json
                    );
                }
                let debug = cx.pods().get("debug").await?;
                ensure!(
                    debug
                        .metadata
                        .uid
                        .as_ref()
                        .is_some_and(|u| old_pods.contains(u))
                        && debug.metadata.deletion_timestamp.is_none(),
                    "the bare pod was touched"
                );

                // The controllers replace the pods; the new ones are injected with the new template.
                let report = eventually(
                    "the restarted workloads' new pods to be current",
                    // On a node the old pods really stop and the new ones really start (the
                    // StatefulSet one after the other): minutes on a busy machine.
                    Duration::from_secs(180),
                    || async {
                        let r = outdated(&cx.env, &cx.ns, &[]).await?;
                        if r.workloads("outdated") == ["Pod/debug"]
                            && r.workloads("current") == ["Deployment/web", "StatefulSet/db"]
                        {
                            return Ok(Some(r));
                        }
                        anyhow::bail!(
                            "outdated {:?}, current {:?}",
                            r.workloads("outdated"),
                            r.workloads("current")
                        )
                    },
                )
                .await?;
                for w in report.json["workloads"].as_array().into_iter().flatten() {
                    if w["kind"] == "Pod" {
                        continue;
                    }
                    for p in w["pods"].as_array().into_iter().flatten() {
                        let pod = cx
                            .pods()
                            .get(p["name"].as_str().unwrap_or_default())
                            .await?;
                        ensure!(
                            !pod.metadata
                                .uid
                                .as_ref()
                                .is_some_and(|u| old_pods.contains(u)),
                            "pod {} is an old one",
                            p["name"]
                        );
                        let proxy = init_containers(&pod).iter().find(|c| c.name == PROXY);
                        ensure!(
                            proxy.and_then(|c| c.image.as_deref()) == Some(new.as_str()),
                            "pod {} has proxy {:?}",
                            p["name"],
                            proxy.and_then(|c| c.image.clone())
                        );
                    }
                }

                // A person recreates the bare pod; then nothing is outdated.
                cx.pods().delete("debug", &DeleteParams::default()).await?;
                eventually(
                    "the bare pod to be gone",
                    Duration::from_secs(60),
                    || async { Ok(cx.pods().get_opt("debug").await?.is_none().then_some(())) },
                )
                .await?;
                accepts(&cx.pods(), &opted_in("debug")).await?;
                let clean = outdated(&cx.env, &cx.ns, &["--restart"]).await?;
                ensure!(
                    clean.code == 0
                        && clean.workloads("current").len() == 3
                        && clean.restarts().is_empty(),
                    "after the restart: exit {}: {}",
                    clean.code,
                    clean.json
                );
                Ok(())
            })
            .await
        },
    )
    .await
}

/// `--max` bounds how many workloads are restarted (on a node the one restarted is waited for
/// until its rollout finishes); a rollout that does not finish within `--wait-timeout` stops the
/// restarts (exit 1) before the next workload is touched.
#[tokio::test]
async fn s22_restart_is_limited_and_stops_at_an_unfinished_rollout() -> anyhow::Result<()> {
    scenario(
        "s22-outdated-limits",
        &[Need::TemplateChange],
        |cx| async move {
            create_workloads(
                &cx,
                &[
                    deployment("api", 1, "Recreate", None, false),
                    // RollingUpdate, never ready: its new pod never becomes available.
                    deployment("web", 1, "RollingUpdate", None, true),
                    deployment("zeta", 1, "Recreate", None, false),
                ],
                &[],
            )
            .await?;
            wait_for_pods(&cx, &[("api", 1), ("web", 1), ("zeta", 1)]).await?;

            let cx = &cx;

            with_proxy_changed(cx, |_old, _new| async move {
                // Pods run (a node or kind): the restarted ones can be waited for.
                let node = cx.env.mode != Mode::Local;
                let args: &[&str] = if node {
                    &["--restart", "--max", "1", "--wait-timeout", "90s"]
                } else {
                    &["--restart", "--max", "1", "--no-wait"]
                };
                let first = outdated(&cx.env, &cx.ns, args).await?;
                ensure!(
                    first.code == EXIT_OUTDATED,
                    "--max 1: exit {}: {}",
                    first.code,
                    first.stderr
                );
                ensure!(
                    first.restarts()
                        == [
                            ("Deployment/api".to_owned(), "restarted".to_owned()),
                            ("Deployment/web".to_owned(), "overLimit".to_owned()),
                            ("Deployment/zeta".to_owned(), "overLimit".to_owned()),
                        ],
                    "--max 1: {}",
                    first.json
                );
                let api = first
                    .restart_of("Deployment/api")
                    .context("no record for api")?;
                let expected = if node {
                    "rollout finished"
                } else {
                    "rollout not waited for"
                };
                ensure!(api["detail"] == expected, "api: {api}");
                ensure!(
                    restarted_at(cx, "Deployment/api").await?.is_some(),
                    "api not patched"
                );
                for w in ["Deployment/web", "Deployment/zeta"] {
                    ensure!(
                        restarted_at(cx, w).await?.is_none(),
                        "{w} patched beyond --max"
                    );
                }
                eventually(
                    "api's new pod to be current",
                    Duration::from_secs(60),
                    || async {
                        let r = outdated(&cx.env, &cx.ns, &[]).await?;
                        Ok(r.workloads("current")
                            .contains(&"Deployment/api".to_owned())
                            .then_some(()))
                    },
                )
                .await?;

                let second =
                    outdated(&cx.env, &cx.ns, &["--restart", "--wait-timeout", "3s"]).await?;
                ensure!(
                    second.code == 1,
                    "unfinished rollout: exit {}: {}",
                    second.code,
                    second.json
                );
                let web = second
                    .restart_of("Deployment/web")
                    .context("no record for web")?;
                ensure!(
                    web["action"] == "restarted"
                        && web["detail"]
                            .as_str()
                            .is_some_and(|d| d.starts_with("rollout not finished after 3s")),
                    "web: {web}"
                );
                ensure!(
                    second.restart_of("Deployment/zeta").map(|r| &r["action"])
                        == Some(&json!("notReached")),
                    "zeta: {}",
                    second.json
                );
                ensure!(
                    restarted_at(cx, "Deployment/web").await?.is_some(),
                    "web not patched"
                );
                ensure!(
                    restarted_at(cx, "Deployment/zeta").await?.is_none(),
                    "zeta was restarted after an unfinished rollout"
                );
                Ok(())
            })
            .await
        },
    )
    .await
}

/// 23. `outdated` judges a pod opted in through its namespace as the namespace entry does: it is
/// current while its namespace is labelled `sidecar-injector.io/inject: enabled` (a pod there
/// that opts out is not listed); once the label is gone, the pod "would not be injected now"
/// and needs a restart, and `-o json` says which rule dropped it.
#[tokio::test]
async fn s23_outdated_judges_namespace_opted_in_pods_by_the_namespace_entry() -> anyhow::Result<()>
{
    scenario(
        "s23-outdated-namespace",
        &[Need::TemplateChange],
        |cx| async move {
            let ns = cx
                .extra_namespace("enabled", &[(INJECT_LABEL, NAMESPACE_ENABLED)])
                .await?;
            let outcome = async {
                let pods = cx.pods_in(&ns);
                eventually("the namespace entry to inject", WAIT, || async {
                    let pod = dry_run(&pods, &app_pod("probe")).await?;
                    Ok(status_annotation(&pod).is_some().then_some(()))
                })
                .await?;
                let stored = accepts(&pods, &app_pod("web")).await?;
                check_injected(&stored).context("a pod without the label")?;
                let out = accepts(&pods, &labelled(app_pod("out"), INJECT_LABEL, "false")).await?;
                check_untouched(&out).context("a pod labelled \"false\"")?;

                let report = outdated(&cx.env, &ns, &[]).await?;
                ensure!(
                    report.code == 0
                        && report.all_workloads() == ["Pod/web"]
                        && report.workloads("current") == ["Pod/web"],
                    "while the namespace opts in: exit {}: {}{}",
                    report.code,
                    report.json,
                    report.stderr
                );

                let namespaces: Api<Namespace> = Api::all(cx.client.clone());
                namespaces
                    .patch(
                        &ns,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"labels": {INJECT_LABEL: null}}})),
                    )
                    .await?;
                let report = outdated(&cx.env, &ns, &[]).await?;
                ensure!(
                    report.code == EXIT_OUTDATED && report.workloads("outdated") == ["Pod/web"],
                    "after the namespace's label is removed: exit {}: {}{}",
                    report.code,
                    report.json,
                    report.stderr
                );
                let change = &report.json["workloads"][0]["pods"][0]["changes"][0];
                ensure!(
                    change["kind"] == "notInjectedNow"
                        && change["reason"].as_str().is_some_and(
                            |r| r.contains(&format!("{INJECT_LABEL}={NAMESPACE_ENABLED}"))
                        ),
                    "the change names the namespace rule: {change}"
                );
                Ok(())
            }
            .await;
            let _ = cx.delete_namespace(&ns).await;
            outcome
        },
    )
    .await
}

/// 24. `sidecar-injector check` passes on the suite's install (what url mode cannot have is
/// skipped, and says so), and names each fault the suite can make with a non-zero exit: the
/// server stopped, a wrong caBundle, a webhook entry deleted, and (locally, where no server
/// keeps it in step) a stale backstop.
#[tokio::test]
async fn s24_check_passes_and_names_each_fault() -> anyhow::Result<()> {
    scenario(
        "s24-check",
        &[Need::ProcessControl, Need::TemplateChange],
        |cx| async move {
            let healthy = check(&cx.env, &cx.ns).await?;
            let report = || format!("{:#}{}", healthy.json, healthy.stderr);
            ensure!(healthy.code == 0, "healthy: exit {}: {}", healthy.code, report());
            ensure!(
                healthy.in_state("fail").is_empty() && healthy.in_state("warn").is_empty(),
                "healthy: {}",
                report()
            );
            // What an install cannot have is skipped, and says why: the Service in url mode (the
            // local run), the backstop where the release keeps none (the node and kind runs'
            // releases: node/values.yaml, kind/run.sh).
            for (check, subject, message) in healthy.in_state("skip") {
                let url_mode = check == "endpoints" && message.contains("url mode");
                let no_backstop = check == "backstop"
                    && cx.env.mode != Mode::Local
                    && message.contains("does not keep one");
                ensure!(
                    url_mode || no_backstop,
                    "healthy: only the url mode's Service or a backstop the release keeps none of may be skipped, not {check} {subject}: {message}"
                );
            }
            for wanted in ["kubernetes", "config", "webhooks", "certificate", "expiry", "dryRun", "otherWebhooks"] {
                ensure!(
                    healthy.in_state("pass").iter().any(|(c, _, _)| c == wanted),
                    "healthy: no passing {wanted} check: {}",
                    report()
                );
            }

            // The server stopped.
            cx.env.injector("stop").await?;
            let stopped = check(&cx.env, &cx.ns).await;
            cx.env.injector("start").await?;
            wait_for_injection(&cx.client, &cx.ns).await?;
            let stopped = stopped?;
            ensure!(
                stopped.code != 0 && stopped.fails_with("dryRun", "refused"),
                "server stopped: exit {}: {:#}",
                stopped.code,
                stopped.json
            );
            if cx.env.mode == Mode::Local {
                ensure!(
                    stopped.fails_with("certificate", "Connection refused"),
                    "server stopped: the url should be unreachable: {:#}",
                    stopped.json
                );
            }

            // A caBundle that is not the CA of the served certificate.
            let client = cx.client.clone();
            let config = cx.env.webhook_config.clone();
            let ns = cx.ns.clone();
            let ca = sidecar_injector_e2e::check::unrelated_ca()?;
            with_mutating_changed(
                &client,
                &config,
                &ns,
                |hook| {
                    hook.client_config.ca_bundle = Some(k8s_openapi::ByteString(ca.into_bytes()));
                    Ok(())
                },
                || async {
                    let run = check(&cx.env, &cx.ns).await?;
                    ensure!(
                        run.code != 0
                            && run.fails_with("certificate", "does not verify the certificate served"),
                        "wrong caBundle: exit {}: {:#}",
                        run.code,
                        run.json
                    );
                    Ok(())
                },
            )
            .await?;

            // The pod-label entry deleted from the mutating configuration.
            with_mutating_webhooks_changed(
                &client,
                &config,
                &ns,
                |hooks| {
                    hooks.retain(|h| h.name != MUTATING_WEBHOOK);
                    Ok(())
                },
                || async {
                    let run = check(&cx.env, &cx.ns).await?;
                    ensure!(
                        run.code != 0
                            && run.fails_with("webhooks", "has no entry for pods opted in by their own label"),
                        "entry deleted: exit {}: {:#}",
                        run.code,
                        run.json
                    );
                    Ok(())
                },
            )
            .await?;

            // A stale backstop: locally nothing keeps it in step (the chart ships it in url mode).
            if cx.env.mode == Mode::Local && backstop_installed(&cx).await? {
                let policies: Api<ValidatingAdmissionPolicy> = Api::all(cx.client.clone());
                let name = "sidecar-injector-backstop";
                let digest = policies
                    .get(name)
                    .await?
                    .metadata
                    .annotations
                    .and_then(|a| a.get(CONFIG_ANNOTATION).cloned())
                    .context("the backstop has no config annotation")?;
                let annotate = |value: &str| {
                    Patch::Merge(json!({"metadata": {"annotations": {CONFIG_ANNOTATION: value}}}))
                };
                policies
                    .patch(name, &PatchParams::default(), &annotate("0000000000000000"))
                    .await?;
                let run = check(&cx.env, &cx.ns).await;
                policies
                    .patch(name, &PatchParams::default(), &annotate(&digest))
                    .await?;
                let run = run?;
                ensure!(
                    run.code != 0 && run.fails_with("backstop", "stale"),
                    "stale backstop: exit {}: {:#}",
                    run.code,
                    run.json
                );
            }
            Ok(())
        },
    )
    .await
}

/// `pod` made to comply with Pod Security's `restricted` profile by its own settings: non-root
/// and the runtime's seccomp profile for the pod, no privilege escalation and no capabilities
/// for each of its containers.
fn restricted(mut pod: Pod) -> anyhow::Result<Pod> {
    let spec = pod.spec.as_mut().context("pod without a spec")?;
    spec.security_context = Some(from_json(json!({
        "runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}
    }))?);
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        c.security_context = Some(from_json(json!({
            "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}
        }))?);
    }
    Ok(pod)
}

/// s25. Pod Security: a namespace that enforces `restricted` admits an opted-in pod whose own
/// containers comply, with both sidecars. PodSecurity is a validating admission plugin: it
/// judges the pod after the mutating webhooks, sidecars included. The same namespace refuses
/// an opted-in pod whose own containers do not comply, naming only those containers, so the
/// check is live and our sidecars are not among what it refuses.
#[tokio::test]
async fn s25_a_restricted_namespace_admits_injected_pods() -> anyhow::Result<()> {
    scenario("s25-restricted", &[], |cx| async move {
        let namespaces: Api<Namespace> = Api::all(cx.client.clone());
        let labels = json!({"metadata": {"labels": {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest"
        }}});
        namespaces
            .patch(&cx.ns, &PatchParams::default(), &Patch::Merge(labels))
            .await?;
        let pods = cx.pods();
        // PodSecurity reads namespaces from its informer: the label is seen a moment later.
        let message = eventually("PodSecurity to enforce restricted", WAIT, || async {
            Ok(match dry_run(&pods, &opted_in("plain")).await {
                Ok(_) => None,
                Err(e) => Some(sidecar_injector_e2e::cluster::refusal(&e)),
            })
        })
        .await?;
        ensure!(
            message.contains("violates PodSecurity \"restricted:latest\"")
                && message.contains("\"app\""),
            "expected PodSecurity's refusal of the pod's own containers, got: {message}"
        );
        for sidecar in SIDECARS {
            ensure!(
                !message.contains(&format!("\"{sidecar}\"")),
                "PodSecurity names our sidecar {sidecar}: {message}"
            );
        }
        let stored = accepts(&pods, &restricted(opted_in("compliant"))?).await?;
        check_injected(&stored)?;
        check_own_init_after_sidecars(&stored, &["app-init"])?;
        println!("restricted: refused the plain pod for its own containers only; admitted the compliant one with its sidecars");
        Ok(())
    })
    .await
}

/// s26. LimitRange and ResourceQuota: a namespace capping containers at 200m / 128Mi (with
/// defaults for the pod's own containers) refuses the default opted-in pod, the proxy's limits
/// being above its cap; the per-pod overrides of the sidecars' limits bring the pod inside it.
/// A ResourceQuota counting limits then refuses the pod until the log shipper's limit is
/// brought down too, and admits it at exactly its limit.
#[tokio::test]
async fn s26_limit_ranges_and_quotas_admit_pods_their_overrides_fit() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::{LimitRange, ResourceQuota};
    scenario("s26-limits", &[], |cx| async move {
        let ranges: Api<LimitRange> = Api::namespaced(cx.client.clone(), &cx.ns);
        let quotas: Api<ResourceQuota> = Api::namespaced(cx.client.clone(), &cx.ns);
        ranges
            .create(
                &PostParams::default(),
                &from_json(json!({
                    "metadata": {"name": "caps"},
                    "spec": {"limits": [{
                        "type": "Container",
                        "max": {"cpu": "200m", "memory": "128Mi"},
                        "default": {"cpu": "100m", "memory": "64Mi"},
                        "defaultRequest": {"cpu": "10m", "memory": "16Mi"}
                    }]}
                }))?,
            )
            .await?;
        let pods = cx.pods();
        let capped = |pod: Pod| {
            annotated(
                annotated(pod, "sidecar-injector.io/proxy-cpu-limit", "200m"),
                "sidecar-injector.io/proxy-memory-limit",
                "128Mi",
            )
        };
        // LimitRanger reads its objects from an informer: the cap is seen a moment later.
        let refusal = eventually("the LimitRange to cap the proxy", WAIT, || async {
            Ok(match dry_run(&pods, &opted_in("default")).await {
                Ok(_) => None,
                Err(e) => Some(sidecar_injector_e2e::cluster::refusal(&e)),
            })
        })
        .await?;
        println!("s26: the default pod under the LimitRange: {refusal}");
        ensure!(
            refusal.contains("maximum cpu usage per Container is 200m, but limit is 500m")
                && refusal
                    .contains("maximum memory usage per Container is 128Mi, but limit is 256Mi"),
            "expected the LimitRange's refusal of the proxy's default limits, got: {refusal}"
        );
        let stored = accepts(&pods, &capped(opted_in("capped"))).await?;
        check_injected(&stored)?;
        let proxy = init_containers(&stored)
            .iter()
            .find(|c| c.name == PROXY)
            .context("no proxy")?;
        let limits = proxy
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .unwrap_or_default();
        ensure!(
            limits.get("cpu").map(|q| q.0.as_str()) == Some("200m")
                && limits.get("memory").map(|q| q.0.as_str()) == Some("128Mi"),
            "the proxy's limits are {limits:?}"
        );

        // The pod's limits: app and app-init 100m each (the LimitRange's default), the proxy
        // 200m, the log shipper 100m: 400m, above a quota of 350m. The quota counts what is
        // stored, so the first pod goes first.
        pods.delete("capped", &DeleteParams::default().grace_period(0))
            .await?;
        eventually("pod capped to be gone", WAIT, || async {
            Ok(pods.get_opt("capped").await?.is_none().then_some(()))
        })
        .await?;
        quotas
            .create(
                &PostParams::default(),
                &from_json(json!({
                    "metadata": {"name": "budget"},
                    "spec": {"hard": {"limits.cpu": "350m", "limits.memory": "2Gi"}}
                }))?,
            )
            .await?;
        eventually("the quota's status", WAIT, || async {
            let status = quotas.get("budget").await?.status.unwrap_or_default();
            let used = status.used.unwrap_or_default();
            let counted = status.hard.is_some_and(|h| h.contains_key("limits.cpu"))
                && used.get("limits.cpu").is_some_and(|q| q.0 == "0");
            Ok(counted.then_some(()))
        })
        .await?;
        let refusal = rejects(&pods, &capped(opted_in("over-budget"))).await?;
        println!("s26: the capped pod under the quota: {refusal}");
        ensure!(
            refusal.contains("exceeded quota: budget") && refusal.contains("limits.cpu"),
            "expected the quota's refusal, got: {refusal}"
        );
        let fits = annotated(
            capped(opted_in("in-budget")),
            "sidecar-injector.io/log-shipper-cpu-limit",
            "50m",
        );
        let stored = accepts(&pods, &fits).await?;
        check_injected(&stored)?;
        Ok(())
    })
    .await
}

/// `pod` with `resources` on each of its own containers and init containers.
fn with_resources(mut pod: Pod, resources: serde_json::Value) -> anyhow::Result<Pod> {
    let resources: k8s_openapi::api::core::v1::ResourceRequirements = from_json(resources)?;
    if let Some(spec) = pod.spec.as_mut() {
        for c in spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten())
        {
            c.resources = Some(resources.clone());
        }
    }
    Ok(pod)
}

fn qos_class(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.qos_class.as_deref()
}

/// s27. The pod's class and ports are kept. A `Guaranteed` pod stays `Guaranteed` as the API
/// server stores it (`status.qosClass`): its sidecars' limits are their requests; a
/// `Burstable` one keeps the sidecars' own limits. A pod that already runs another mesh's
/// proxy (a container named `istio-proxy`) gets the log shipper but not our proxy. A pod
/// whose own container declares the proxy's port is refused, naming both and the fix. The
/// containers annotation sends the mounts and env to the init container it names only. A
/// pod-level budget grows by what the sidecars ask for (1.34+).
#[tokio::test]
async fn s27_the_pods_class_and_ports_are_kept() -> anyhow::Result<()> {
    scenario("s27-class-and-ports", &[], |cx| async move {
        let pods = cx.pods();
        let resources_of = |pod: &Pod, name: &str| {
            init_containers(pod)
                .iter()
                .find(|c| c.name == name)
                .and_then(|c| c.resources.clone())
                .map(|r| (r.requests.unwrap_or_default(), r.limits.unwrap_or_default()))
        };
        let exact = json!({"limits": {"cpu": "100m", "memory": "64Mi"}});
        let stored = accepts(&pods, &with_resources(opted_in("guaranteed"), exact)?).await?;
        check_injected(&stored)?;
        ensure!(
            qos_class(&stored) == Some("Guaranteed"),
            "the Guaranteed pod is stored as {:?}",
            qos_class(&stored)
        );
        for sidecar in SIDECARS {
            let (requests, limits) = resources_of(&stored, sidecar).context("no resources")?;
            ensure!(requests == limits, "{sidecar}: requests {requests:?}, limits {limits:?}");
        }
        let (requests, _) = resources_of(&stored, PROXY).context("no proxy")?;
        ensure!(
            requests.get("cpu").map(|q| q.0.as_str()) == Some("50m"),
            "the proxy's cpu request is {requests:?}"
        );
        let loose = json!({"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}});
        let stored = accepts(&pods, &with_resources(opted_in("burstable"), loose)?).await?;
        check_injected(&stored)?;
        let (_, limits) = resources_of(&stored, PROXY).context("no proxy")?;
        ensure!(
            qos_class(&stored) == Some("Burstable")
                && limits.get("cpu").map(|q| q.0.as_str()) == Some("500m"),
            "the Burstable pod: {:?}, proxy limits {limits:?}",
            qos_class(&stored)
        );

        let mut meshed = opted_in("meshed");
        if let Some(spec) = meshed.spec.as_mut() {
            spec.containers.push(k8s_openapi::api::core::v1::Container {
                name: "istio-proxy".into(),
                image: Some(app_image()),
                ..Default::default()
            });
        }
        let stored = accepts(&pods, &meshed).await?;
        let inits: Vec<&str> = init_containers(&stored).iter().map(|c| c.name.as_str()).collect();
        ensure!(
            inits.contains(&LOG_SHIPPER) && !inits.contains(&PROXY),
            "the pod with istio-proxy has init containers {inits:?}"
        );

        let mut clash = opted_in("clash");
        if let Some(c) = clash.spec.as_mut().and_then(|s| s.containers.first_mut()) {
            c.ports = Some(vec![from_json(json!({"containerPort": 15001}))?]);
        }
        let refusal = rejects(&pods, &clash).await?;
        println!("s27: the pod declaring 15001: {refusal}");
        ensure!(
            refusal.contains("sidecar \"proxy\" declares port 15001/TCP, which the pod's container \"app\" declares too")
                && refusal.contains("sidecar-injector.io/templates"),
            "expected the port clash's refusal, got: {refusal}"
        );
        // The containers annotation: the init container named gets the mounts and env, the
        // application container not named does not; the validator admits it so.
        let targeted = annotated(opted_in("targeted"), "sidecar-injector.io/containers", "app-init");
        let stored = accepts(&pods, &targeted).await?;
        let spec = stored.spec.as_ref().context("no spec")?;
        let has_dir = |c: &k8s_openapi::api::core::v1::Container| {
            c.env.iter().flatten().any(|e| e.name == "APP_LOG_DIR")
                && c.volume_mounts.iter().flatten().any(|m| m.name == LOGS_VOLUME)
        };
        let with: Vec<&str> = spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .filter(|c| has_dir(c))
            .map(|c| c.name.as_str())
            .collect();
        ensure!(with == ["app-init"], "the log directory reached {with:?}");

        // Pod-level resources (1.34+, on by default): a budget below what the sidecars ask for
        // would be refused by the API server; it grows by exactly their requests and limits.
        let info = cx.client.apiserver_version().await?;
        let minor: u32 = info.minor.trim_end_matches('+').parse().unwrap_or(0);
        if minor >= 34 {
            let mut budgeted = opted_in("budgeted");
            if let Some(spec) = budgeted.spec.as_mut() {
                spec.resources = Some(from_json(json!({
                    "requests": {"cpu": "50m", "memory": "64Mi"},
                    "limits": {"cpu": "100m", "memory": "128Mi"}
                }))?);
            }
            let stored = accepts(&pods, &budgeted).await?;
            check_injected(&stored)?;
            let budget = stored
                .spec
                .as_ref()
                .and_then(|s| s.resources.clone())
                .context("no pod-level resources")?;
            let amount = |l: &Option<std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>, r: &str| {
                l.as_ref().and_then(|m| m.get(r)).map(|q| q.0.clone()).unwrap_or_default()
            };
            // 50m + 10m + 50m; 64Mi + 32Mi + 64Mi; 100m + 100m + 500m; 128Mi + 64Mi + 256Mi.
            let got = [
                amount(&budget.requests, "cpu"),
                amount(&budget.requests, "memory"),
                amount(&budget.limits, "cpu"),
                amount(&budget.limits, "memory"),
            ];
            ensure!(
                got == ["110m", "160Mi", "700m", "448Mi"],
                "the pod-level budget as stored: {got:?}"
            );
            println!("s27: the pod-level budget grew to {got:?}");
        }
        println!("s27: Guaranteed kept (sidecars' limits = requests), Burstable untouched, istio-proxy's pod without our proxy, the port clash refused");
        Ok(())
    })
    .await
}

/// s28. What `inject` writes offline is what the API server takes: every manifest of
/// tests/inputs/manifests/shapes (octal modes, flow-style JSON, pod templates without metadata,
/// JSON in a YAML stream), injected by the CLI for this scenario's namespace with the server's
/// configuration, is created with a server-side dry run and strict field validation (an unknown
/// or duplicated field is refused), its pods through both webhooks (the validator admits what
/// the CLI injected). The one document the CLI cannot read is named on its standard error,
/// written back as it came, and left out here; the CLI exits 1 for that file only.
#[tokio::test]
async fn s28_what_inject_writes_the_api_server_takes() -> anyhow::Result<()> {
    scenario("s28-offline-shapes", &[Need::InjectorBin], |cx| async move {
        use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
        let bin = cx.env.injector_bin.clone().context("no E2E_INJECTOR_BIN")?;
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/inputs/manifests/shapes");
        let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
            .with_context(|| format!("cannot read {}", dir.display()))?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()?;
        files.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
        files.sort();
        ensure!(files.len() >= 5, "expected the shapes in {}", dir.display());
        let (mut created, mut injected, mut refused) = (0, 0, Vec::new());
        for file in &files {
            let name = file.file_name().unwrap_or_default().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(file)?
                .replace("namespace: shop", &format!("namespace: {}", cx.ns))
                .replace("\"namespace\": \"shop\"", &format!("\"namespace\": \"{}\"", cx.ns))
                .replace("batch-jobs", &cx.ns);
            let mut command = tokio::process::Command::new(&bin);
            command.args(["inject", "-f", "-"]);
            if let Some(config) = &cx.env.injector_config {
                command.arg("--config").arg(config);
            }
            let mut child = command
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .context("cannot run sidecar-injector inject")?;
            {
                use tokio::io::AsyncWriteExt as _;
                let mut stdin = child.stdin.take().context("no stdin")?;
                stdin.write_all(text.as_bytes()).await?;
            }
            let out = child.wait_with_output().await?;
            let (stdout, stderr) = (
                String::from_utf8(out.stdout)?,
                String::from_utf8_lossy(&out.stderr).into_owned(),
            );
            let unreadable = stderr.lines().filter(|l| l.starts_with("error: document ")).count();
            ensure!(
                out.status.success() == (unreadable == 0),
                "{name}: exit {:?} with {unreadable} unreadable documents: {stderr}",
                out.status.code()
            );
            if name == "one-bad-document.yaml" {
                ensure!(
                    unreadable == 1 && stderr.contains("(Deployment/broken)"),
                    "{name}: expected the broken document named: {stderr}"
                );
            }
            for doc in stdout.split("\n---") {
                let doc = doc.strip_prefix("---").unwrap_or(doc);
                // Read as kubectl reads it (YAML 1.1: `0755` is octal), as the documents the
                // CLI left as they came are written.
                let mut options = serde_saphyr::Options::default();
                options.legacy_octal_numbers = true;
                let value: serde_json::Value = match serde_saphyr::from_str_with_options::<
                    Option<serde_json::Value>,
                >(doc, options)
                {
                    Ok(Some(v)) if v.is_object() => v,
                    _ => continue,
                };
                let kind = value["kind"].as_str().unwrap_or("").to_owned();
                let id = format!("{kind}/{}", value["metadata"]["name"].as_str().unwrap_or(""));
                // The namespace exists already; the broken document was named above.
                if kind == "Namespace" || stderr.contains(&format!("({id})")) {
                    continue;
                }
                let api_version = value["apiVersion"].as_str().unwrap_or("");
                let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
                let gvk = GroupVersionKind::gvk(group, version, &kind);
                let plural = format!("{}s", kind.to_ascii_lowercase());
                let api: Api<DynamicObject> = Api::namespaced_with(
                    cx.client.clone(),
                    &cx.ns,
                    &ApiResource::from_gvk_with_plural(&gvk, &plural),
                );
                injected += usize::from(doc.contains("sidecar-injector.io/status"));
                let object: DynamicObject = serde_json::from_value(value)?;
                let params = PatchParams::apply("e2e-s28").dry_run().validation_strict();
                match api
                    .patch(object.metadata.name.as_deref().unwrap_or(""), &params, &Patch::Apply(&object))
                    .await
                {
                    Ok(_) => created += 1,
                    Err(e) => refused.push(format!("{name}: {id}: {}", sidecar_injector_e2e::cluster::refusal(&e))),
                }
            }
        }
        ensure!(refused.is_empty(), "the API server refused: {refused:#?}");
        // 11 objects in the five files besides the Namespace and the broken one; 8 opted in.
        ensure!(
            created == 11 && injected == 8,
            "{created} objects created (11 expected), {injected} injected (8 expected)"
        );
        println!("s28: {created} objects of {} files taken by the API server (dry run, strict fields), {injected} of them injected offline", files.len());
        Ok(())
    })
    .await
}

/// 29. Self-managed certificates (the chart's default `selfManaged` mode) on a server of the
/// suite's own, with lifetimes of seconds: the chart renders no caBundle; the server issues
/// its CA and serving certificate into its Secret and sets both configurations' caBundle; a
/// caBundle taken out by hand (as a sync would) is set back; under opted-in creations at 10 a
/// second, serving certificates renew and the CA rolls over (added, switched to, dropped) with
/// no call refused and every pod injected; `helm uninstall` takes the Secret with it (its
/// owner reference).
#[tokio::test]
async fn s29_self_managed_certificates_rotate_with_nothing_refused() -> anyhow::Result<()> {
    scenario(
        "s29-certificates",
        &[Need::LocalControlPlane, Need::LoopbackWebhooks],
        |cx| async move {
            let release_ns = cx.extra_namespace("certs-release", &[]).await?;
            let ns = cx
                .extra_namespace(
                    "certs",
                    &[(INJECT_LABEL, NAMESPACE_ENABLED), (REVISION_LABEL, "certs")],
                )
                .await?;
            let (release, fullname, secret) = (
                "e2e-certs",
                "e2e-certs-sidecar-injector-certs",
                "e2e-certs-tls",
            );
            let host = cx.env.host.clone();
            let port = closed_port(&host).await?;
            let chart = cx.env.chart.display().to_string();
            let url = format!("webhook.url=https://{host}:{port}");
            cx.helm(&[
                "install",
                release,
                &chart,
                "--namespace",
                &release_ns,
                "--set",
                &url,
                "--set",
                "deployment.enabled=false",
                "--set",
                "revision=certs",
                "--timeout",
                "60s",
            ])
            .await?;
            let outcome = async {
                for hook in mutating(&cx.client)
                    .get(fullname)
                    .await?
                    .webhooks
                    .iter()
                    .flatten()
                {
                    ensure!(
                        hook.client_config.ca_bundle.is_none(),
                        "the chart set a caBundle on {}",
                        hook.name
                    );
                }
                let bundle_of = format!("mutating/{fullname},validating/{fullname}");
                let args: Vec<std::ffi::OsString> = [
                    "--certificates-secret",
                    secret,
                    "--certificate-names",
                    &host,
                    "--ca-bundle-of",
                    &bundle_of,
                    "--reload-interval",
                    "1s",
                    "--certificate-reload-grace",
                    "3s",
                    "--serving-certificate-lifetime",
                    "12s",
                    "--ca-lifetime",
                    "27s",
                ]
                .iter()
                .map(Into::into)
                .collect();
                let server = OwnServer::start(&cx.env, &release_ns, "certs", port, &args).await?;
                let body =
                    certificates_rotate(&cx, &ns, &release_ns, fullname, secret, &server).await;
                if body.is_err() {
                    eprintln!("s29: the server's log:\n{}", server.log());
                }
                drop(server);
                body?;
                helm_uninstall(&cx, release, &release_ns).await?;
                let secrets: Api<Secret> = Api::namespaced(cx.client.clone(), &release_ns);
                eventually("the Secret to go with the release", WAIT, || async {
                    Ok(secrets.get_opt(secret).await?.is_none().then_some(()))
                })
                .await
            }
            .await;
            if outcome.is_err() {
                let _ = helm_uninstall(&cx, release, &release_ns).await;
            }
            let _ = cx.delete_namespace(&ns).await;
            let _ = cx.delete_namespace(&release_ns).await;
            outcome
        },
    )
    .await
}

async fn certificates_rotate(
    cx: &Cx,
    ns: &str,
    release_ns: &str,
    fullname: &str,
    secret: &str,
    server: &OwnServer,
) -> anyhow::Result<()> {
    let pods = cx.pods_in(ns);
    eventually(
        "the server to issue its certificate and inject",
        Duration::from_secs(60),
        || async {
            Ok(dry_run(&pods, &app_pod("probe"))
                .await
                .ok()
                .filter(|p| status_annotation(p).is_some())
                .map(drop))
        },
    )
    .await?;
    let secrets: Api<Secret> = Api::namespaced(cx.client.clone(), release_ns);
    let stored = secrets.get(secret).await?;
    let owner = stored.metadata.owner_references.unwrap_or_default();
    ensure!(
        owner
            .iter()
            .any(|o| o.kind == "MutatingWebhookConfiguration" && o.name == fullname),
        "Secret {secret} is not owned by the MutatingWebhookConfiguration: {owner:?}"
    );
    let (first_ca, _) = self_managed(&secrets, secret).await?.context("no Secret")?;
    let first_ca = pem_blocks(&first_ca);
    ensure!(
        first_ca.len() == 1,
        "a new Secret holds {} CAs",
        first_ca.len()
    );

    // A caBundle taken out, as a sync of the chart's rendering would: set back.
    let first = mutating(&cx.client).get(fullname).await?;
    let hook = first
        .webhooks
        .iter()
        .flatten()
        .next()
        .context("no webhook")?
        .name
        .clone();
    let remove = json!({"webhooks": [{"name": hook, "clientConfig": {"caBundle": null}}]});
    mutating(&cx.client)
        .patch(
            fullname,
            &PatchParams::default(),
            &Patch::Strategic(&remove),
        )
        .await?;

    let reset = std::time::Instant::now();
    eventually(
        "the caBundle to be set back",
        Duration::from_secs(15),
        || async {
            let (ca, _) = self_managed(&secrets, secret).await?.context("no Secret")?;
            Ok(bundles_are(&cx.client, fullname, &ca).await?.then_some(()))
        },
    )
    .await?;
    let mended_in = reset.elapsed();

    // Opted-in creations at 10 a second while certificates renew and the CA rolls over.
    let before = sidecar_injector_e2e::metrics::scrape(&cx.client).await?;
    let start = tokio::time::Instant::now();
    let (mut created, mut failed, mut longest) = (0, Vec::new(), Duration::ZERO);
    let (mut servings, mut bundles) =
        (std::collections::BTreeSet::new(), Vec::<Vec<String>>::new());
    for i in 0..300u32 {
        tokio::time::sleep_until(start + Duration::from_millis(100) * i).await;
        let sent = std::time::Instant::now();
        let answer = dry_run(&pods, &app_pod(&format!("stream-{i}"))).await;
        longest = longest.max(sent.elapsed());
        match answer {
            Ok(pod) if status_annotation(&pod).is_some() => created += 1,
            Ok(_) => failed.push(format!("stream-{i}: not injected")),
            Err(e) => failed.push(format!(
                "stream-{i}: {}",
                sidecar_injector_e2e::cluster::refusal(&e)
            )),
        }
        if i % 5 == 0 {
            let (ca, tls) = self_managed(&secrets, secret).await?.context("no Secret")?;
            servings.insert(tls);
            let ca = pem_blocks(&ca);
            if bundles.last() != Some(&ca) {
                bundles.push(ca);
            }
        }
    }
    let after = sidecar_injector_e2e::metrics::scrape(&cx.client).await?;
    let call_failures =
        webhook_call_failures(&after, "certs.") - webhook_call_failures(&before, "certs.");
    let own =
        sidecar_injector_e2e::outdated::scrape(&format!("127.0.0.1:{}", server.admin)).await?;
    let steps = |step: &str, result: &str| {
        sidecar_injector_e2e::metrics::sum(
            &own,
            "sidecar_injector_certificate_steps_total",
            &[("step", step), ("result", result)],
        )
    };
    let errors = sidecar_injector_e2e::metrics::sum(
        &own,
        "sidecar_injector_certificate_steps_total",
        &[("result", "error")],
    );
    let rolled = bundles.iter().any(|b| b.len() == 2)
        && bundles.last().is_some_and(|b| !b.contains(&first_ca[0]));
    println!(
        "s29: {created} of 300 opted-in creations injected in {:.1} s, longest admission {} ms, {} refused or not injected, {call_failures} failed webhook calls (API server); \
         {} serving certificates seen, bundles seen {:?} (CAs each), steps: issue {}, renew_serving {}, add_ca {}, drop_ca {}, mend_bundles {}, errors {}; caBundle set back in {} ms",
        start.elapsed().as_secs_f64(),
        longest.as_millis(),
        failed.len(),
        servings.len(),
        bundles.iter().map(Vec::len).collect::<Vec<_>>(),
        steps("issue", "done"),
        steps("renew_serving", "done"),
        steps("add_ca", "done"),
        steps("drop_ca", "done"),
        steps("mend_bundles", "done"),
        errors.abs(),
        mended_in.as_millis(),
    );
    ensure!(
        failed.is_empty(),
        "refused or not injected during the rotation: {failed:#?}"
    );
    ensure!(
        call_failures == 0.0,
        "the API server counts {call_failures} failed calls to the webhooks"
    );
    ensure!(
        servings.len() >= 3,
        "only {} serving certificates in 30 s of 12 s lifetimes",
        servings.len()
    );
    ensure!(
        rolled,
        "no CA roll-over seen (bundles by CA count: {:?})",
        bundles.iter().map(Vec::len).collect::<Vec<_>>()
    );
    ensure!(
        steps("mend_bundles", "done") >= 3.0,
        "the caBundle was mended fewer than 3 times"
    );
    ensure!(errors == 0.0, "{errors} certificate steps failed");
    Ok(())
}

/// 30. Required namespaces (issue 63): a second server as revision `req` whose configuration
/// exempts the service account `backup` of the required namespace, and a chart release with
/// `webhook.namespaceOptIn.required=true`. In the namespace labelled
/// `sidecar-injector.io/inject: required`, a pod without the label is injected; one that says
/// "false" is refused by the validating webhook with the sentence that names the namespace
/// and required.exempt; the same pod run as `backup` is admitted without sidecars. In a
/// namespace labelled `enabled` for the same revision, a pod that says "false" is admitted
/// untouched, as before. The backstop exported from the same configuration with
/// `--namespace-required`, the server stopped, refuses the opt-out in the same words.
#[tokio::test]
async fn s30_a_required_namespace_refuses_an_opt_out_unless_exempt() -> anyhow::Result<()> {
    scenario(
        "s30-required",
        &[
            Need::ServerUrl,
            Need::ProcessControl,
            Need::LoopbackWebhooks,
        ],
        |cx| async move {
            let ca = cx.env.ca_cert.clone().context("no CA_CERT")?;
            let release_ns = cx.extra_namespace("required-release", &[]).await?;
            let required_ns = cx
                .extra_namespace(
                    "required",
                    &[
                        (INJECT_LABEL, "required"),
                        (REVISION_LABEL, "req"),
                        (sidecar_injector_e2e::policies::ROAD_LABEL, "s30"),
                    ],
                )
                .await?;
            let enabled_ns = cx
                .extra_namespace(
                    "req-enabled",
                    &[(INJECT_LABEL, NAMESPACE_ENABLED), (REVISION_LABEL, "req")],
                )
                .await?;
            let (release, fullname) = ("e2e-required", "e2e-required-sidecar-injector-req");
            let cert = cx
                .env
                .injector_cert
                .clone()
                .context("no E2E_INJECTOR_CERT")?;
            let key = cx.env.injector_key.clone().context("no E2E_INJECTOR_KEY")?;
            let port = closed_port(&cx.env.host).await?;
            let tls = [
                "--tls-cert-file".into(),
                cert.into(),
                "--tls-key-file".into(),
                key.into(),
            ];
            let exempt = format!("{required_ns}/backup");
            let mut server = OwnServer::start_with(
                &cx.env,
                &release_ns,
                "req",
                port,
                &tls,
                &format!("required:\n  exempt: [\"{exempt}\"]\n"),
            )
            .await?;
            let outcome = async {
                let accounts: Api<ServiceAccount> =
                    Api::namespaced(cx.client.clone(), &required_ns);
                let backup: ServiceAccount =
                    serde_json::from_value(json!({"metadata": {"name": "backup"}}))?;
                accounts.create(&PostParams::default(), &backup).await?;
                helm_install_url_mode(
                    &cx,
                    release,
                    &release_ns,
                    &format!("https://{}:{port}", cx.env.host),
                    &ca,
                    &[
                        "revision=req",
                        "webhook.namespaceOptIn.required=true",
                        &format!("config.required.exempt={{{exempt}}}"),
                    ],
                )
                .await?;
                let v = validating(&cx.client).get(fullname).await?;
                let names: Vec<&str> = v
                    .webhooks
                    .iter()
                    .flatten()
                    .map(|w| w.name.as_str())
                    .collect();
                ensure!(
                    names
                        == [
                            "req.validate.sidecar-injector.io",
                            "req.namespace.validate.sidecar-injector.io",
                            "req.required.validate.sidecar-injector.io"
                        ],
                    "the release's validating webhooks are {names:?}"
                );
                let pods = cx.pods_in(&required_ns);
                sidecar_injector_e2e::cluster::wait_injecting(
                    &pods,
                    &app_pod("probe"),
                    "the req server and webhooks to inject",
                )
                .await?;
                let stored = accepts(&pods, &app_pod("plain")).await?;
                check_injected(&stored).context("a pod without the label")?;

                let opted_out = labelled(app_pod("opted-out"), INJECT_LABEL, "false");
                let refusal = rejects(&pods, &opted_out).await?;
                for expected in [
                    format!("its namespace \"{required_ns}\" requires sidecars"),
                    format!("exempt in \"{required_ns}\": \"backup\""),
                    "the pod runs as \"default\"".to_owned(),
                    "required.exempt".to_owned(),
                ] {
                    ensure!(
                        refusal.contains(&expected),
                        "the refusal does not say {expected:?}: {refusal}"
                    );
                }

                let mut exempt_pod = labelled(app_pod("backup"), INJECT_LABEL, "false");
                if let Some(spec) = exempt_pod.spec.as_mut() {
                    spec.service_account_name = Some("backup".into());
                }
                let stored = accepts(&pods, &exempt_pod).await?;
                check_untouched(&stored).context("the exempt service account's pod")?;

                // An enabled namespace is as it was: the pod that says "false" goes untouched.
                let stored = accepts(
                    &cx.pods_in(&enabled_ns),
                    &labelled(app_pod("opted-out"), INJECT_LABEL, "false"),
                )
                .await?;
                check_untouched(&stored).context("an opt-out in an enabled namespace")?;

                // The backstop of the req server's configuration (`export backstop
                // --namespace-required`), bound to the required namespace only: with the
                // server stopped, the API server itself refuses the opt-out, in the same words.
                let docs = sidecar_injector_e2e::policies::export(
                    &cx.env,
                    "backstop",
                    Some(&server.dir.join("config.yaml")),
                    &["--namespace-required=true"],
                )
                .await?;
                let installed =
                    sidecar_injector_e2e::policies::install(&cx.client, docs, &["s30"]).await?;
                server.stop().await;
                let backstop = eventually(
                    "the backstop to refuse the opt-out",
                    Duration::from_secs(30),
                    || async {
                        match dry_run(
                            &pods,
                            &labelled(app_pod("unreached"), INJECT_LABEL, "false"),
                        )
                        .await
                        {
                            Err(e) => {
                                let message = sidecar_injector_e2e::cluster::refusal(&e);
                                Ok(message
                                    .contains("ValidatingAdmissionPolicy")
                                    .then_some(message))
                            }
                            Ok(_) => anyhow::bail!("admitted with the server stopped"),
                        }
                    },
                )
                .await;
                installed.remove().await?;
                let backstop = backstop?;
                for expected in [
                    format!("its namespace \"{required_ns}\" requires sidecars"),
                    format!("exempt in \"{required_ns}\": \"backup\""),
                    "required.exempt".to_owned(),
                ] {
                    ensure!(
                        backstop.contains(&expected),
                        "the backstop's refusal does not say {expected:?}: {backstop}"
                    );
                }
                println!("s30: with the server stopped: {backstop}");
                Ok(())
            }
            .await;
            end_with_own_release(
                &cx,
                (release, &release_ns),
                server,
                &[required_ns, enabled_ns],
                outcome,
            )
            .await
        },
    )
    .await
}
