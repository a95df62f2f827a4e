//! Policy mode (the chart's `mode: policy`): the API server injects by itself, through the
//! MutatingAdmissionPolicy exported from the release's configuration. There is no webhook,
//! Service or certificate to look at; what matters is whether the policy and its binding are the
//! export of the running configuration, and whether the keeper that keeps them so is running.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;

use super::backstop::{BackstopRead, env_is_true, in_step};
use super::{Finding, Got, Installation, State, unread};
use crate::engine::config::NAMESPACE_REQUIRED;

/// The environment variable that makes the chart's pod a keeper (`serve --policies-only`).
pub const POLICIES_ONLY_ENV: &str = "SIDECAR_INJECTOR_POLICIES_ONLY";

/// Whether the Deployment runs the policy keeper rather than a webhook server.
pub fn is_keeper(deployment: &Deployment) -> bool {
    env_is_true(deployment, POLICIES_ONLY_ENV)
}

/// How many of the keeper's replicas are ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replicas {
    pub desired: i32,
    pub ready: i32,
}

impl Replicas {
    pub fn of(deployment: &Deployment) -> Self {
        Self {
            desired: deployment
                .spec
                .as_ref()
                .and_then(|s| s.replicas)
                .unwrap_or(1),
            ready: deployment
                .status
                .as_ref()
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0),
        }
    }
}

/// What was read of an installation in policy mode.
#[derive(Clone, Debug)]
pub struct PolicyModeRead {
    /// The policy's (and its binding's) name, `sidecar-injector[-<revision>]`.
    pub name: String,
    /// The keeper's Deployment; `Missing` when the policies came from
    /// `policies.mutating.manifest` (no pod keeps them).
    pub keeper: Got<Replicas>,
    /// The MutatingAdmissionPolicy's API version where it was found (`v1`, `v1beta1`).
    pub api_version: Option<String>,
    /// The policy's and its binding's annotations.
    pub policy: Got<BTreeMap<String, String>>,
    pub binding: Got<BTreeMap<String, String>>,
    /// The binding of required namespaces (`<name>-required`, `webhook.namespaceOptIn.required`).
    pub required_binding: Got<BTreeMap<String, String>>,
}

/// Whether an installation is in policy mode: its Deployment is a keeper, or it has no webhook
/// configuration but the MutatingAdmissionPolicy is there (applied from a manifest).
pub fn detect<A, B>(
    deployment: &Got<Deployment>,
    mutating: &Got<A>,
    validating: &Got<B>,
    policy: &Got<BTreeMap<String, String>>,
) -> bool {
    deployment.found().is_some_and(is_keeper)
        || (matches!(mutating, Got::Missing)
            && matches!(validating, Got::Missing)
            && matches!(policy, Got::Found(_)))
}

/// The webhook configuration line of an installation in policy mode, which has none.
pub fn no_webhooks(kind: &str, release: &str, policy: &str) -> Finding {
    Finding::skip(
        "webhooks",
        format!("{kind} {release}"),
        format!(
            "policy mode: the API server injects through the MutatingAdmissionPolicy {policy}, with no webhook"
        ),
    )
}

/// The policy and its binding against the running configuration's `digest`, and the keeper.
pub fn judge(inst: &Installation, digest: &str, seen: &PolicyModeRead) -> Vec<Finding> {
    let name = &seen.name;
    let version = seen
        .api_version
        .as_deref()
        .map(|v| format!(" ({v})"))
        .unwrap_or_default();
    let policy_subject = format!("MutatingAdmissionPolicy {name}{version}");
    let binding_subject = format!("MutatingAdmissionPolicyBinding {name}");
    let kept = matches!(seen.keeper, Got::Found(_));
    let fix = if kept {
        format!(
            "the keeper has not applied the running configuration's policy: see its logs / sidecar_injector_backstop_in_step{{policy=\"{name}\"}}"
        )
    } else {
        "export it again from the running configuration (sidecar-injector export mutating --configmap ...) and apply it, or let the chart keep it (mode: policy without policies.mutating.manifest)".to_owned()
    };
    let mut out = Vec::new();
    for (subject, got, missing) in [
        (
            &policy_subject,
            &seen.policy,
            "missing: in policy mode nothing injects opted-in pods without it",
        ),
        (
            &binding_subject,
            &seen.binding,
            "missing: without it the policy injects nothing",
        ),
    ] {
        out.push(match got {
            Got::Found(annotations) => {
                in_step("mutatingPolicy", subject, annotations, digest, &fix)
            }
            Got::Missing => {
                Finding::fail("mutatingPolicy", subject.as_str(), missing).fix(fix.clone())
            }
            other => unread(other, "mutatingPolicy", subject)
                .unwrap_or_else(|| Finding::fail("mutatingPolicy", subject.as_str(), "not read")),
        });
    }
    let subject = format!("Deployment {}", inst.release);
    out.push(match &seen.keeper {
        Got::Found(r) if r.ready > 0 => Finding::pass(
            "keeper",
            subject,
            format!(
                "{} of {} ready: keeps the policies in step with the ConfigMap",
                r.ready, r.desired
            ),
        ),
        Got::Found(r) => Finding::new(
            "keeper",
            State::Warn,
            subject,
            format!(
                "0 of {} ready: the policies applied last stay in force, but a change to the ConfigMap will not reach them",
                r.desired
            ),
        )
        .fix(format!(
            "kubectl -n {} get pods -l app.kubernetes.io/instance={}",
            inst.namespace, inst.release
        )),
        Got::Missing => Finding::skip(
            "keeper",
            subject,
            "no keeper: the policies were applied from a manifest (policies.mutating.manifest); export them again after every change to the configuration",
        ),
        other => unread(other, "keeper", &subject)
            .unwrap_or_else(|| Finding::fail("keeper", subject.as_str(), "not read")),
    });
    out
}

/// Check 1 in policy mode, for required namespaces: the namespaces labelled
/// `<injectLabel>: required` for this revision (`required`: their names) are selected by the
/// MutatingAdmissionPolicy's `-required` binding, which injects their pods, and by the
/// backstop's, which alone refuses an opt-out there (policy mode has no validating webhook).
/// Without either, their pods escape. Nothing to say when there are none. `backstop_name`:
/// the backstop's objects' name.
pub fn required_namespaces(
    required: &[String],
    inject_label: &str,
    seen: &PolicyModeRead,
    backstop: Option<&BackstopRead>,
    backstop_name: &str,
) -> Vec<Finding> {
    if required.is_empty() {
        return Vec::new();
    }
    let listed = required.join(", ");
    let subject = format!("namespaces labelled {inject_label}={NAMESPACE_REQUIRED}");
    let mutating = format!("MutatingAdmissionPolicyBinding {}-required", seen.name);
    let validating = format!("ValidatingAdmissionPolicyBinding {backstop_name}-required");
    let mut lacking = Vec::new();
    let mut unread = Vec::new();
    let mut judge = |what: &str, got: &Got<BTreeMap<String, String>>, escape: &str| match got {
        Got::Found(_) => {}
        Got::Missing => lacking.push(format!("no {what} ({escape})")),
        Got::Forbidden(right) => unread.push(format!("{what}: you lack the right to {right}")),
        Got::Failed(error) => unread.push(format!("{what} cannot be read: {error}")),
    };
    judge(
        &mutating,
        &seen.required_binding,
        "their pods are injected only when labelled \"true\"",
    );
    match backstop {
        Some(b) if matches!(b.policy, Got::Missing) => lacking.push(format!(
            "no ValidatingAdmissionPolicy {backstop_name} (policies.backstop), so nothing refuses a pod that opts out"
        )),
        Some(b) => judge(&validating, &b.required_binding, "a pod that opts out is not refused"),
        None => unread.push("the backstop was not read".to_owned()),
    }
    if !lacking.is_empty() {
        return vec![
            Finding::fail(
                "mutatingPolicy",
                subject,
                format!("{listed}: {}: their pods escape", lacking.join("; ")),
            )
            .fix("helm upgrade the release with --set webhook.namespaceOptIn.required=true (and policies.backstop=true); if it is set, the keeper has not applied them: see its logs"),
        ];
    }
    if !unread.is_empty() {
        return vec![Finding::skip("mutatingPolicy", subject, unread.join("; "))];
    }
    vec![Finding::pass(
        "mutatingPolicy",
        subject,
        format!("{listed}: selected by {mutating} and {validating}"),
    )]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::CONFIG_ANNOTATION;

    fn annotated(digest: &str) -> Got<BTreeMap<String, String>> {
        Got::Found([(CONFIG_ANNOTATION.to_owned(), digest.to_owned())].into())
    }

    fn inst() -> Installation {
        Installation {
            namespace: "ns".into(),
            release: "r".into(),
        }
    }

    fn seen(keeper: Got<Replicas>, policy: Got<BTreeMap<String, String>>) -> PolicyModeRead {
        PolicyModeRead {
            name: "p".into(),
            keeper,
            api_version: Some("v1".into()),
            binding: annotated("abc"),
            required_binding: Got::Missing,
            policy,
        }
    }

    const READY: Replicas = Replicas {
        desired: 1,
        ready: 1,
    };

    #[test]
    fn in_step_with_a_ready_keeper_passes() {
        let found = judge(&inst(), "abc", &seen(Got::Found(READY), annotated("abc")));
        assert_eq!(found.len(), 3);
        assert!(found.iter().all(|f| f.state == State::Pass), "{found:?}");
        assert_eq!(
            found[0].line(),
            "✓ MutatingAdmissionPolicy p (v1): the export of the running configuration (sidecar-injector.io/config: abc)"
        );
        assert_eq!(
            found[2].line(),
            "✓ Deployment r: 1 of 1 ready: keeps the policies in step with the ConfigMap"
        );
    }

    #[test]
    fn a_stale_or_missing_policy_fails_and_names_who_should_fix_it() {
        let stale = judge(&inst(), "abc", &seen(Got::Found(READY), annotated("old")));
        assert_eq!(stale[0].state, State::Fail);
        assert!(stale[0].line().contains("stale: exported from configuration old, the ConfigMap's is abc — the keeper has not applied"), "{}", stale[0].line());
        let by_hand = judge(&inst(), "abc", &seen(Got::Missing, annotated("old")));
        assert!(
            by_hand[0].line().contains("export it again"),
            "{}",
            by_hand[0].line()
        );
        assert_eq!(by_hand[2].state, State::Skip);
        let missing = judge(&inst(), "abc", &seen(Got::Found(READY), Got::Missing));
        assert_eq!(missing[0].state, State::Fail);
        assert!(missing[0].message.contains("nothing injects"));
        let forbidden = judge(
            &inst(),
            "abc",
            &seen(
                Got::Found(READY),
                Got::Forbidden("get mutatingadmissionpolicies p".into()),
            ),
        );
        assert_eq!(forbidden[0].state, State::Skip);
    }

    #[test]
    fn a_keeper_with_no_ready_replica_is_a_warning() {
        let found = judge(
            &inst(),
            "abc",
            &seen(
                Got::Found(Replicas {
                    desired: 1,
                    ready: 0,
                }),
                annotated("abc"),
            ),
        );
        assert_eq!(found[2].state, State::Warn);
        assert_eq!(
            found[2].fix.as_deref(),
            Some("kubectl -n ns get pods -l app.kubernetes.io/instance=r")
        );
    }

    #[test]
    fn policy_mode_is_the_keeper_or_a_policy_without_webhooks() {
        let keeper: Deployment = serde_json::from_value(serde_json::json!({
            "spec": {"selector": {}, "template": {"spec": {"containers": [{
                "name": "sidecar-injector",
                "env": [{"name": POLICIES_ONLY_ENV, "value": "true"}],
            }]}}}
        }))
        .expect("a Deployment");
        let none: Got<()> = Got::Missing;
        let some: Got<()> = Got::Found(());
        assert!(detect(&Got::Found(keeper), &some, &some, &Got::Missing));
        assert!(detect(&Got::Missing, &none, &none, &annotated("abc")));
        assert!(!detect(&Got::Missing, &some, &none, &annotated("abc")));
        assert!(!detect(
            &Got::Found(Deployment::default()),
            &none,
            &none,
            &Got::Missing
        ));
    }

    fn backstop(
        policy: Got<BTreeMap<String, String>>,
        required: Got<BTreeMap<String, String>>,
    ) -> BackstopRead {
        BackstopRead {
            server_applies: Some(true),
            binding: annotated("abc"),
            policy,
            required_binding: required,
        }
    }

    /// Required namespaces in policy mode need both `-required` bindings: without the mutating
    /// one their pods are not injected, without the backstop's (or the backstop) an opt-out is
    /// not refused. Each lack is named; none to say when no namespace is labelled required.
    #[test]
    fn required_namespaces_need_both_required_bindings() {
        let names = ["team-a".to_owned(), "team-b".to_owned()];
        let label = "sidecar-injector.io/inject";
        let mut read = seen(Got::Found(READY), annotated("abc"));
        let b = backstop(annotated("abc"), Got::Missing);
        assert!(required_namespaces(&[], label, &read, Some(&b), "p-backstop").is_empty());

        let found = required_namespaces(&names, label, &read, Some(&b), "p-backstop");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].state, State::Fail);
        assert_eq!(
            found[0].line(),
            "✗ namespaces labelled sidecar-injector.io/inject=required: team-a, team-b: no MutatingAdmissionPolicyBinding p-required (their pods are injected only when labelled \"true\"); no ValidatingAdmissionPolicyBinding p-backstop-required (a pod that opts out is not refused): their pods escape — helm upgrade the release with --set webhook.namespaceOptIn.required=true (and policies.backstop=true); if it is set, the keeper has not applied them: see its logs"
        );
        assert!(
            found[0]
                .fix
                .as_deref()
                .unwrap_or("")
                .contains("webhook.namespaceOptIn.required=true")
        );

        read.required_binding = annotated("abc");
        let found = required_namespaces(&names, label, &read, Some(&b), "p-backstop");
        assert_eq!(found[0].state, State::Fail);
        assert!(
            !found[0].message.contains("MutatingAdmissionPolicyBinding"),
            "{found:?}"
        );

        let no_backstop = backstop(Got::Missing, Got::Missing);
        let found = required_namespaces(&names, label, &read, Some(&no_backstop), "p-backstop");
        assert_eq!(found[0].state, State::Fail);
        assert!(found[0].message.contains("no ValidatingAdmissionPolicy p-backstop (policies.backstop), so nothing refuses a pod that opts out"), "{found:?}");

        let both = backstop(annotated("abc"), annotated("abc"));
        let found = required_namespaces(&names, label, &read, Some(&both), "p-backstop");
        assert_eq!(found[0].state, State::Pass);
        assert_eq!(
            found[0].line(),
            "✓ namespaces labelled sidecar-injector.io/inject=required: team-a, team-b: selected by MutatingAdmissionPolicyBinding p-required and ValidatingAdmissionPolicyBinding p-backstop-required"
        );

        let hidden = backstop(
            annotated("abc"),
            Got::Forbidden("get validatingadmissionpolicybindings".into()),
        );
        let found = required_namespaces(&names, label, &read, Some(&hidden), "p-backstop");
        assert_eq!(found[0].state, State::Skip, "{found:?}");
    }
}
