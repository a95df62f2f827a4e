//! The other mutating webhooks that could see the same pods as the injector: whether their
//! selectors could match our pods, and the order the API server calls them in against ours.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::webhooks::matches_pod_create;
use super::{Finding, Got, State, unread};

/// Whether a selector can match some object whose labels include `labels` (requirements on
/// other keys can always be met by some object).
fn could_match(selector: Option<&LabelSelector>, labels: &BTreeMap<String, String>) -> bool {
    let Some(selector) = selector else {
        return true;
    };
    for (k, v) in selector.match_labels.iter().flatten() {
        if labels.get(k).is_some_and(|have| have != v) {
            return false;
        }
    }
    for e in selector.match_expressions.iter().flatten() {
        let Some(have) = labels.get(&e.key) else {
            continue;
        };
        let values = e.values.clone().unwrap_or_default();
        let ok = match e.operator.as_str() {
            "In" => values.contains(have),
            "NotIn" => !values.contains(have),
            "Exists" => true,
            "DoesNotExist" => false,
            _ => true,
        };
        if !ok {
            return false;
        }
    }
    true
}

/// What injects, for [`others`]: the webhook configuration of that name, which the API server
/// calls among the others by name; or the MutatingAdmissionPolicy of that name, which it runs
/// before every mutating webhook (its admission plugin comes first).
#[derive(Clone, Copy, Debug)]
pub enum Ours<'a> {
    Webhook(&'a str),
    Policy(&'a str),
}

/// Check 6: the other mutating webhooks that are called for the same pod creates, in the
/// order the API server calls them (by configuration name, then entry order).
pub fn others(
    all: &Got<Vec<MutatingWebhookConfiguration>>,
    ours: Ours<'_>,
    pod_labels: &BTreeMap<String, String>,
    our_reinvocation: Option<&str>,
) -> Vec<Finding> {
    let subject = "other mutating webhooks";
    if let Some(f) = unread(all, "otherWebhooks", subject) {
        return vec![f];
    }
    let mut configs: Vec<&MutatingWebhookConfiguration> =
        all.found().iter().flat_map(|v| v.iter()).collect();
    configs.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut before = Vec::new();
    let mut after = Vec::new();
    let mut seen_ours = matches!(ours, Ours::Policy(_));
    for c in configs {
        let name = c.metadata.name.clone().unwrap_or_default();
        if matches!(ours, Ours::Webhook(n) if n == name) {
            seen_ours = true;
            continue;
        }
        for w in c.webhooks.iter().flatten() {
            if !matches_pod_create(w.rules.as_deref().unwrap_or_default())
                || !could_match(w.object_selector.as_ref(), pod_labels)
            {
                continue;
            }
            let theirs = w.reinvocation_policy.as_deref().unwrap_or("Never");
            let line = format!("{name}/{} (reinvocationPolicy {theirs})", w.name);
            if seen_ours {
                after.push(line);
            } else {
                before.push(line);
            }
        }
    }
    if before.is_empty() && after.is_empty() {
        return vec![Finding::pass(
            "otherWebhooks",
            subject,
            "none is called for the pods it injects",
        )];
    }
    let mut message =
        String::from("the API server calls them by configuration name, then entry order: ");
    let mut order: Vec<String> = before.iter().map(|b| format!("{b} before ours")).collect();
    order.push(match ours {
        Ours::Webhook(name) => format!("ours ({name})"),
        Ours::Policy(name) => {
            format!("ours (MutatingAdmissionPolicy {name}: policies run before every webhook)")
        }
    });
    order.extend(after.iter().map(|a| format!("{a} after ours")));
    message.push_str(&order.join(", "));
    if our_reinvocation == Some("IfNeeded") {
        if !after.is_empty() {
            message.push_str("; with reinvocationPolicy IfNeeded ours is called again after them, so it sees the containers they add");
        }
        vec![Finding::pass("otherWebhooks", subject, message)]
    } else {
        if after.is_empty() {
            return vec![Finding::pass("otherWebhooks", subject, message)];
        }
        vec![Finding::new("otherWebhooks", State::Warn, subject, format!(
            "{message}; ours does not have reinvocationPolicy IfNeeded, so it never sees the containers they add"
        ))
        .fix("set reinvocationPolicy: IfNeeded on our entries (the chart does)")]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::check::webhooks::tests::chart_mutating;
    use serde_json::json;

    fn other(
        name: &str,
        selector: serde_json::Value,
        reinvocation: &str,
    ) -> MutatingWebhookConfiguration {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "webhooks": [{
                "name": format!("{name}.example.com"),
                "admissionReviewVersions": ["v1"],
                "clientConfig": {"url": "https://x"},
                "sideEffects": "None",
                "objectSelector": selector,
                "reinvocationPolicy": reinvocation,
                "rules": [{"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"], "operations": ["*"]}],
            }]
        }))
        .expect("a MutatingWebhookConfiguration")
    }

    #[test]
    fn other_webhooks_are_listed_in_call_order() {
        let labels: BTreeMap<String, String> =
            [("sidecar-injector.io/inject".to_owned(), "true".to_owned())].into();
        let all = Got::Found(vec![
            other("zz-adder", json!({}), "Never"),
            chart_mutating(5),
            other("aa-mesh", json!({"matchLabels": {"app": "x"}}), "IfNeeded"),
            // Never sees our pods: it wants the label absent.
            other(
                "bb-other",
                json!({"matchExpressions": [{"key": "sidecar-injector.io/inject", "operator": "DoesNotExist"}]}),
                "Never",
            ),
        ]);
        let found = others(
            &all,
            Ours::Webhook("sidecar-injector"),
            &labels,
            Some("IfNeeded"),
        );
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].state, State::Pass);
        assert_eq!(
            found[0].message,
            "the API server calls them by configuration name, then entry order: aa-mesh/aa-mesh.example.com (reinvocationPolicy IfNeeded) before ours, ours (sidecar-injector), zz-adder/zz-adder.example.com (reinvocationPolicy Never) after ours; with reinvocationPolicy IfNeeded ours is called again after them, so it sees the containers they add"
        );
        let never = others(
            &all,
            Ours::Webhook("sidecar-injector"),
            &labels,
            Some("Never"),
        );
        assert_eq!(never[0].state, State::Warn);
        let alone = others(
            &Got::Found(vec![chart_mutating(5)]),
            Ours::Webhook("sidecar-injector"),
            &labels,
            Some("IfNeeded"),
        );
        assert_eq!(
            alone[0].line(),
            "✓ other mutating webhooks: none is called for the pods it injects"
        );
        // In policy mode every webhook comes after the policy, which is called again after them.
        let policy = others(
            &all,
            Ours::Policy("sidecar-injector"),
            &labels,
            Some("IfNeeded"),
        );
        assert_eq!(policy[0].state, State::Pass);
        assert!(
            policy[0].message.contains("ours (MutatingAdmissionPolicy sidecar-injector: policies run before every webhook), aa-mesh/aa-mesh.example.com (reinvocationPolicy IfNeeded) after ours, sidecar-injector/inject.sidecar-injector.io"),
            "{}",
            policy[0].message
        );
    }
}
