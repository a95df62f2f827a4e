//! Whether the backstop (the ValidatingAdmissionPolicy and its binding) is the export of the
//! configuration the release's ConfigMap holds: each exported object carries the digest of the
//! configuration it came from ([`crate::export::CONFIG_ANNOTATION`]).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;

use super::{Finding, Got, State};
use crate::export::CONFIG_ANNOTATION;

/// The environment variable that has the chart's server keep the backstop (`serve --backstop`).
pub const BACKSTOP_ENV: &str = "SIDECAR_INJECTOR_BACKSTOP";

/// Whether the Deployment's server keeps the backstop in step (`SIDECAR_INJECTOR_BACKSTOP=true`).
pub fn server_applies(deployment: &Deployment) -> bool {
    env_is_true(deployment, BACKSTOP_ENV)
}

/// Whether a container of the Deployment sets `name` to `true`.
pub(super) fn env_is_true(deployment: &Deployment, name: &str) -> bool {
    deployment
        .spec
        .iter()
        .flat_map(|s| s.template.spec.iter())
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.env.iter().flatten())
        .any(|e| e.name == name && e.value.as_deref() == Some("true"))
}

/// What was read of the backstop. Objects are given by their annotations.
#[derive(Clone, Debug)]
pub struct BackstopRead {
    /// `Some(true)`: the Deployment's server applies the backstop; `Some(false)`: it does not;
    /// `None`: no Deployment was read (a server outside the cluster, or no right to read it).
    pub server_applies: Option<bool>,
    pub policy: Got<BTreeMap<String, String>>,
    pub binding: Got<BTreeMap<String, String>>,
    /// The binding of required namespaces (`<name>-required`, `webhook.namespaceOptIn.required`):
    /// in policy mode the only thing that refuses their pods' opt-out.
    pub required_binding: Got<BTreeMap<String, String>>,
}

/// Check 4. `name`: the objects' name (`sidecar-injector-backstop`); `digest`: the running
/// configuration's.
pub fn judge(name: &str, digest: &str, seen: &BackstopRead) -> Vec<Finding> {
    let policy_subject = format!("ValidatingAdmissionPolicy {name}");
    let binding_subject = format!("ValidatingAdmissionPolicyBinding {name}");
    let keeper = match seen.server_applies {
        Some(true) => {
            "the server has not applied the running configuration's backstop: see its logs / sidecar_injector_backstop_in_step"
        }
        _ => {
            "export it again from the running configuration (sidecar-injector export backstop --configmap ...) and apply it"
        }
    };
    let mut out = Vec::new();
    match &seen.policy {
        Got::Missing if seen.server_applies == Some(true) => out.push(
            Finding::fail(
                "backstop",
                policy_subject,
                "missing, though the server is installed with the backstop (SIDECAR_INJECTOR_BACKSTOP=true)",
            )
            .fix("the server has not applied it: see its logs / sidecar_injector_backstop_in_step"),
        ),
        Got::Missing => {
            out.push(Finding::skip(
                "backstop",
                policy_subject,
                match seen.server_applies {
                    Some(false) => "not installed: the chart's server does not keep one (policies.backstop)",
                    _ => "not installed, and no in-cluster server keeps one (policies.backstop)",
                },
            ));
            return out;
        }
        Got::Forbidden(right) => out.push(Finding::skip(
            "backstop",
            policy_subject,
            format!("you lack the right to {right}"),
        )),
        Got::Failed(error) => out.push(Finding::fail(
            "backstop",
            policy_subject,
            format!("cannot be read: {error}"),
        )),
        Got::Found(annotations) => out.push(in_step("backstop", &policy_subject, annotations, digest, keeper)),
    }
    match &seen.binding {
        Got::Found(annotations) => out.push(in_step(
            "backstop",
            &binding_subject,
            annotations,
            digest,
            keeper,
        )),
        Got::Missing => out.push(
            Finding::fail(
                "backstop",
                binding_subject,
                "missing: without it the policy refuses nothing",
            )
            .fix(keeper),
        ),
        Got::Forbidden(right) => out.push(Finding::skip(
            "backstop",
            binding_subject,
            format!("you lack the right to {right}"),
        )),
        Got::Failed(error) => out.push(Finding::fail(
            "backstop",
            binding_subject,
            format!("cannot be read: {error}"),
        )),
    }
    out
}

/// Whether an exported object (given by its annotations) carries the running configuration's
/// digest; `keeper` is what to do when it does not.
pub(super) fn in_step(
    check: &'static str,
    subject: &str,
    annotations: &BTreeMap<String, String>,
    digest: &str,
    keeper: &str,
) -> Finding {
    match annotations.get(CONFIG_ANNOTATION) {
        Some(have) if have == digest => Finding::pass(
            check,
            subject,
            format!("the export of the running configuration ({CONFIG_ANNOTATION}: {digest})"),
        ),
        Some(have) => Finding::new(
            check,
            State::Fail,
            subject,
            format!("stale: exported from configuration {have}, the ConfigMap's is {digest}"),
        )
        .fix(keeper),
        None => Finding::fail(
            check,
            subject,
            format!("has no {CONFIG_ANNOTATION} annotation: not an export of this version's, or edited by hand"),
        )
        .fix(keeper),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotated(digest: &str) -> Got<BTreeMap<String, String>> {
        Got::Found([(CONFIG_ANNOTATION.to_owned(), digest.to_owned())].into())
    }

    fn seen(server: Option<bool>, policy: Got<BTreeMap<String, String>>) -> BackstopRead {
        BackstopRead {
            server_applies: server,
            binding: match &policy {
                Got::Missing => Got::Missing,
                _ => annotated("abc"),
            },
            required_binding: Got::Missing,
            policy,
        }
    }

    #[test]
    fn in_step_passes() {
        let found = judge(
            "sidecar-injector-backstop",
            "abc",
            &seen(Some(true), annotated("abc")),
        );
        assert_eq!(found.len(), 2);
        assert!(found.iter().all(|f| f.state == State::Pass));
        assert_eq!(
            found[0].line(),
            "✓ ValidatingAdmissionPolicy sidecar-injector-backstop: the export of the running configuration (sidecar-injector.io/config: abc)"
        );
    }

    #[test]
    fn a_stale_policy_names_the_server_when_it_keeps_it() {
        let found = judge("b", "abc", &seen(Some(true), annotated("old")));
        assert_eq!(found[0].state, State::Fail);
        assert_eq!(
            found[0].line(),
            "✗ ValidatingAdmissionPolicy b: stale: exported from configuration old, the ConfigMap's is abc — the server has not applied the running configuration's backstop: see its logs / sidecar_injector_backstop_in_step"
        );
        let by_hand = judge("b", "abc", &seen(None, annotated("old")));
        assert!(by_hand[0].line().contains("export it again"));
    }

    #[test]
    fn missing_fails_only_when_the_server_should_keep_it() {
        let found = judge("b", "abc", &seen(Some(true), Got::Missing));
        assert_eq!(found[0].state, State::Fail);
        let found = judge("b", "abc", &seen(None, Got::Missing));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].state, State::Skip);
    }

    #[test]
    fn the_env_says_whether_the_server_applies_it() {
        let deployment: Deployment = serde_json::from_value(serde_json::json!({
            "spec": {"selector": {}, "template": {"spec": {"containers": [{
                "name": "sidecar-injector",
                "env": [{"name": BACKSTOP_ENV, "value": "true"}],
            }]}}}
        }))
        .expect("a Deployment");
        assert!(server_applies(&deployment));
        assert!(!server_applies(&Deployment::default()));
    }
}
