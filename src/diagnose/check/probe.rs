//! The opted-in pod `check` creates as a server-side dry run, what it should come back with (the
//! engine's own injection of it, offline), and what the answer says.

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::{Finding, State};
use crate::engine::config::Injector;
use crate::engine::manifest::{Target, inject_for};

/// The probe pod's name; a dry run stores nothing, so it never clashes.
pub const NAME: &str = "sidecar-injector-check";

/// The pod: opted in by its label (and naming the configuration's revision, if it has one).
pub fn pod(inj: &Injector) -> Value {
    let cfg = &inj.config;
    let mut labels = json!({
        cfg.inject_label.clone(): "true",
        "app.kubernetes.io/name": NAME,
    });
    if !cfg.revision.is_empty() {
        labels[cfg.revision_label.clone()] = cfg.revision.clone().into();
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": NAME, "labels": labels},
        "spec": {
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
            "terminationGracePeriodSeconds": 0,
        },
    })
}

fn names(pod: &Value) -> Vec<String> {
    ["initContainers", "containers"]
        .iter()
        .flat_map(|list| pod["spec"][list].as_array().into_iter().flatten())
        .filter_map(|c| c["name"].as_str().map(str::to_owned))
        .collect()
}

/// The sidecars the configuration adds to the probe in `namespace`: the engine's own offline
/// injection of it.
pub fn expected_sidecars(inj: &Injector, namespace: &str) -> Result<Vec<String>, String> {
    let probe = pod(inj);
    let target = Target {
        namespace: Some(namespace),
        namespace_labels: None,
    };
    let injected = inject_for(inj, &probe.to_string(), &target).map_err(|e| e.to_string())?;
    let value: Value = serde_saphyr::from_str(&injected.yaml).map_err(|e| e.to_string())?;
    let before = names(&probe);
    Ok(names(&value)
        .into_iter()
        .filter(|n| !before.contains(n))
        .collect())
}

/// What the API server answered the dry run.
#[derive(Clone, Debug)]
pub enum Answer {
    /// Admitted: the pod as it would be stored.
    Admitted(Box<Pod>),
    /// Refused by admission (or invalid): the API server's message.
    Refused(String),
    Forbidden(String),
    Failed(String),
}

/// What injects opted-in pods in the checked installation, for what a failed probe tells to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Road {
    /// The server, through the mutating webhook (the chart's default).
    Webhooks,
    /// The API server, through the MutatingAdmissionPolicy (`mode: policy`).
    Policy,
}

impl Road {
    fn refused_fix(self) -> &'static str {
        match self {
            Self::Webhooks => {
                "the webhooks or the backstop refuse an opted-in pod: see the lines above, and the server's logs"
            }
            Self::Policy => {
                "the backstop refuses an opted-in pod the MutatingAdmissionPolicy did not inject: see the lines above"
            }
        }
    }

    fn uninjected_fix(self) -> &'static str {
        match self {
            Self::Webhooks => {
                "the mutating webhook was not called or failed open (failurePolicy Ignore): see the lines above, and the server's logs"
            }
            Self::Policy => {
                "the MutatingAdmissionPolicy did not inject it (missing, stale, not loaded yet, or its match conditions left the pod alone): see the lines above"
            }
        }
    }
}

/// Check 5: the dry run came back injected (the status annotation, every expected sidecar) and
/// admitted (the validating webhook and the backstop let it through).
pub fn judge(
    road: Road,
    inj: &Injector,
    namespace: &str,
    expected: &Result<Vec<String>, String>,
    answer: &Answer,
) -> Finding {
    let subject = format!("dry-run pod in {namespace}");
    let expected = match expected {
        Ok(e) if e.is_empty() => {
            return Finding::fail(
                "dryRun",
                subject,
                format!("the configuration injects nothing into an opted-in pod in {namespace} (an excluded namespace?)"),
            )
            .fix("run check with --pod-namespace NAMESPACE, a namespace where pods are injected");
        }
        Ok(e) => e,
        Err(error) => {
            return Finding::fail(
                "dryRun",
                subject,
                format!("the configuration cannot inject the probe pod: {error}"),
            );
        }
    };
    let pod = match answer {
        Answer::Admitted(pod) => pod,
        Answer::Refused(message) => {
            return Finding::fail("dryRun", subject, format!("refused: {message}"))
                .fix(road.refused_fix());
        }
        Answer::Forbidden(right) => {
            return Finding::skip("dryRun", subject, format!("you lack the right to {right}"));
        }
        Answer::Failed(error) => {
            return Finding::fail("dryRun", subject, format!("cannot be created: {error}"));
        }
    };
    let value = serde_json::to_value(pod.as_ref()).unwrap_or(Value::Null);
    let have = names(&value);
    let status = inj.config.status_annotation.as_str();
    let annotated = value["metadata"]["annotations"][status].is_string();
    let missing: Vec<&str> = expected
        .iter()
        .filter(|n| !have.contains(n))
        .map(String::as_str)
        .collect();
    if !annotated || !missing.is_empty() {
        let mut why = Vec::new();
        if !annotated {
            why.push(format!("no {status} annotation"));
        }
        if !missing.is_empty() {
            why.push(format!("no {}", missing.join(", ")));
        }
        return Finding::new(
            "dryRun",
            State::Fail,
            subject,
            format!("admitted but not injected ({})", why.join("; ")),
        )
        .fix(road.uninjected_fix());
    }
    Finding::pass(
        "dryRun",
        subject,
        format!("injected ({}) and admitted", expected.join(", ")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn injector() -> Injector {
        Injector::from_sources(
            "test",
            crate::engine::config::DEFAULT_CONFIG,
            crate::engine::config::bundled_templates(),
            Some("sidecar-injector".into()),
        )
        .expect("the default configuration")
    }

    fn admitted(inj: &Injector, namespace: &str) -> Pod {
        let text = inject_for(
            inj,
            &pod(inj).to_string(),
            &Target {
                namespace: Some(namespace),
                namespace_labels: None,
            },
        )
        .expect("injected")
        .yaml;
        serde_saphyr::from_str(&text).expect("a pod")
    }

    #[test]
    fn the_engines_own_injection_passes() {
        let inj = injector();
        let expected = expected_sidecars(&inj, "default");
        let names = expected.clone().expect("sidecars");
        assert!(!names.is_empty());
        let found = judge(
            Road::Webhooks,
            &inj,
            "default",
            &expected,
            &Answer::Admitted(Box::new(admitted(&inj, "default"))),
        );
        assert_eq!(found.state, State::Pass, "{}", found.line());
        assert!(found.message.starts_with("injected ("));
    }

    #[test]
    fn an_uninjected_or_refused_pod_fails() {
        let inj = injector();
        let expected = expected_sidecars(&inj, "default");
        let plain: Pod = serde_json::from_value(pod(&inj)).expect("a pod");
        let found = judge(
            Road::Webhooks,
            &inj,
            "default",
            &expected,
            &Answer::Admitted(Box::new(plain)),
        );
        assert_eq!(found.state, State::Fail);
        assert!(
            found.message.contains(
                "admitted but not injected (no sidecar-injector.io/status annotation; no "
            ),
            "{}",
            found.message
        );
        let refused = judge(
            Road::Webhooks,
            &inj,
            "default",
            &expected,
            &Answer::Refused("denied".into()),
        );
        assert!(
            refused
                .line()
                .starts_with("✗ dry-run pod in default: refused: denied — ")
        );
        let on_policy = judge(
            Road::Policy,
            &inj,
            "default",
            &expected,
            &Answer::Admitted(Box::new(serde_json::from_value(pod(&inj)).expect("a pod"))),
        );
        assert!(
            on_policy
                .fix
                .as_deref()
                .is_some_and(|f| f.starts_with("the MutatingAdmissionPolicy did not inject it")),
            "{}",
            on_policy.line()
        );
        let forbidden = judge(
            Road::Webhooks,
            &inj,
            "default",
            &expected,
            &Answer::Forbidden("create pods in default".into()),
        );
        assert_eq!(forbidden.state, State::Skip);
    }

    #[test]
    fn an_excluded_namespace_is_named() {
        let inj = injector();
        let expected = expected_sidecars(&inj, "kube-system");
        assert_eq!(expected, Ok(Vec::new()));
        let found = judge(
            Road::Webhooks,
            &inj,
            "kube-system",
            &expected,
            &Answer::Refused("x".into()),
        );
        assert!(found.line().contains("--pod-namespace"));
    }

    #[test]
    fn a_revision_is_on_the_probe() {
        let inj = Injector::from_sources(
            "test",
            &crate::engine::config::DEFAULT_CONFIG.replace("revision: \"\"", "revision: canary"),
            crate::engine::config::bundled_templates(),
            None,
        )
        .expect("a revision's configuration");
        assert_eq!(
            pod(&inj)["metadata"]["labels"]["sidecar-injector.io/rev"],
            "canary"
        );
        assert!(
            !expected_sidecars(&inj, "default")
                .expect("sidecars")
                .is_empty()
        );
    }
}
