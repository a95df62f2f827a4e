//! The injector's own webhook configurations: their entries as the chart writes them, and
//! whether the mutating and validating entries pair up. The Services they call are in
//! [`super::endpoints`](mod@super::endpoints); the other mutating webhooks, in [`super::others`].

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhook,
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::{Finding, Got, unread};
use crate::engine::config::NAMESPACE_REQUIRED;

/// Above this the API server makes every opted-in pod create wait too long on the webhook.
pub const MAX_TIMEOUT_SECONDS: i32 = 10;
/// The label every namespace carries with its own name.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The fields of a webhook entry the checks read, the same for both kinds.
#[derive(Clone, Debug)]
pub struct WebhookEntry {
    pub name: String,
    pub client_config: WebhookClientConfig,
    pub object_selector: Option<LabelSelector>,
    pub namespace_selector: Option<LabelSelector>,
    pub failure_policy: String,
    /// `None` for a validating entry.
    pub reinvocation_policy: Option<String>,
    pub side_effects: String,
    pub timeout_seconds: i32,
    pub rules: Vec<RuleWithOperations>,
}

impl From<&MutatingWebhook> for WebhookEntry {
    fn from(w: &MutatingWebhook) -> Self {
        Self {
            name: w.name.clone(),
            client_config: w.client_config.clone(),
            object_selector: w.object_selector.clone(),
            namespace_selector: w.namespace_selector.clone(),
            // The API server's defaults for admissionregistration.k8s.io/v1.
            failure_policy: w.failure_policy.clone().unwrap_or_else(|| "Fail".into()),
            reinvocation_policy: Some(
                w.reinvocation_policy
                    .clone()
                    .unwrap_or_else(|| "Never".into()),
            ),
            side_effects: w.side_effects.clone(),
            timeout_seconds: w.timeout_seconds.unwrap_or(10),
            rules: w.rules.clone().unwrap_or_default(),
        }
    }
}

impl From<&ValidatingWebhook> for WebhookEntry {
    fn from(w: &ValidatingWebhook) -> Self {
        Self {
            name: w.name.clone(),
            client_config: w.client_config.clone(),
            object_selector: w.object_selector.clone(),
            namespace_selector: w.namespace_selector.clone(),
            failure_policy: w.failure_policy.clone().unwrap_or_else(|| "Fail".into()),
            reinvocation_policy: None,
            side_effects: w.side_effects.clone(),
            timeout_seconds: w.timeout_seconds.unwrap_or(10),
            rules: w.rules.clone().unwrap_or_default(),
        }
    }
}

pub fn mutating_entries(c: &MutatingWebhookConfiguration) -> Vec<WebhookEntry> {
    c.webhooks
        .iter()
        .flatten()
        .map(WebhookEntry::from)
        .collect()
}

pub fn validating_entries(c: &ValidatingWebhookConfiguration) -> Vec<WebhookEntry> {
    c.webhooks
        .iter()
        .flatten()
        .map(WebhookEntry::from)
        .collect()
}

/// Which opt-in rule an entry serves, from its objectSelector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rule {
    /// `<injectLabel>: "true"` on the pod.
    Pod,
    /// `<injectLabel> NotIn [false]` on the pod (its namespace opts in).
    Namespace,
    /// `<injectLabel> In [required]` on the namespace, whatever the pod says (its namespace
    /// requires sidecars, and an opt-out is the validator's to judge).
    Required,
}

impl Rule {
    fn describe(self) -> &'static str {
        match self {
            Self::Pod => "pods opted in by their own label",
            Self::Namespace => "pods of namespaces that opt in",
            Self::Required => "pods of namespaces that require sidecars",
        }
    }
}

/// What the checks need to know of the installation's configuration.
#[derive(Clone, Debug)]
pub struct Expect<'a> {
    pub inject_label: &'a str,
    pub release_namespace: &'a str,
}

fn rule_of(entry: &WebhookEntry, label: &str) -> Option<Rule> {
    let required = entry
        .namespace_selector
        .iter()
        .flat_map(|s| s.match_expressions.iter().flatten())
        .any(|e| {
            e.key == label
                && e.operator == "In"
                && e.values.as_deref() == Some(&[NAMESPACE_REQUIRED.to_owned()][..])
        });
    if required {
        return Some(Rule::Required);
    }
    let selector = entry.object_selector.as_ref()?;
    if selector
        .match_labels
        .as_ref()
        .and_then(|m| m.get(label))
        .is_some_and(|v| v == "true")
    {
        return Some(Rule::Pod);
    }
    for e in selector.match_expressions.iter().flatten() {
        if e.key != label {
            continue;
        }
        let values = e.values.clone().unwrap_or_default();
        match e.operator.as_str() {
            "In" if values == ["true"] => return Some(Rule::Pod),
            "NotIn" if values.iter().any(|v| v == "false") => return Some(Rule::Namespace),
            _ => {}
        }
    }
    None
}

/// Whether the rules send pod CREATE requests.
pub fn matches_pod_create(rules: &[RuleWithOperations]) -> bool {
    rules.iter().any(|r| {
        let has = |list: &Option<Vec<String>>, want: &[&str]| {
            list.iter().flatten().any(|v| want.contains(&v.as_str()))
        };
        has(&r.api_groups, &["", "*"])
            && has(&r.resources, &["pods", "*", "*/*"])
            && has(&r.operations, &["CREATE", "*"])
    })
}

/// The namespaces an entry's namespaceSelector leaves out by name.
fn excluded_namespaces(entry: &WebhookEntry) -> BTreeSet<String> {
    entry
        .namespace_selector
        .iter()
        .flat_map(|s| s.match_expressions.iter().flatten())
        .filter(|e| e.key == NAMESPACE_NAME_LABEL && e.operator == "NotIn")
        .flat_map(|e| e.values.iter().flatten().cloned())
        .collect()
}

/// Where an entry sends its requests, in words.
pub fn target(cc: &WebhookClientConfig) -> String {
    match (&cc.service, &cc.url) {
        (Some(s), _) => format!(
            "Service {}/{}{} port {}",
            s.namespace,
            s.name,
            s.path.as_deref().unwrap_or(""),
            s.port.unwrap_or(443)
        ),
        (None, Some(url)) => url.clone(),
        (None, None) => "nowhere (no service, no url)".into(),
    }
}

/// The problems of one entry, each in words with what to do.
fn entry_problems(entry: &WebhookEntry, expect: &Expect<'_>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if rule_of(entry, expect.inject_label).is_none() {
        out.push((
            format!(
                "objectSelector does not select on {}: every pod's creation waits on the injector",
                expect.inject_label
            ),
            "reinstall the chart's webhook configurations (helm upgrade)".to_owned(),
        ));
    }
    let excluded = excluded_namespaces(entry);
    let missing: Vec<&str> = ["kube-system", expect.release_namespace]
        .into_iter()
        .filter(|ns| !excluded.contains(*ns))
        .collect();
    if !missing.is_empty() {
        out.push((
            format!(
                "namespaceSelector does not leave out {}: the control plane or the injector's own pods would wait on the injector",
                missing.join(" and ")
            ),
            "reinstall the chart's webhook configurations (helm upgrade)".to_owned(),
        ));
    }
    if let Some(policy) = &entry.reinvocation_policy
        && policy != "IfNeeded"
    {
        out.push((
            format!("reinvocationPolicy {policy}: containers a later webhook adds get no sidecar treatment"),
            "set reinvocationPolicy: IfNeeded (the chart does)".to_owned(),
        ));
    }
    if entry.timeout_seconds > MAX_TIMEOUT_SECONDS {
        out.push((
            format!(
                "timeoutSeconds {} is above {MAX_TIMEOUT_SECONDS}: the API server waits that long for each opted-in pod when the injector hangs",
                entry.timeout_seconds
            ),
            "helm upgrade --set webhook.timeoutSeconds=5".to_owned(),
        ));
    }
    if entry.side_effects != "None" {
        out.push((
            format!(
                "sideEffects {}: dry-run requests (kubectl apply --dry-run=server) are refused",
                entry.side_effects
            ),
            "set sideEffects: None (the server writes nothing)".to_owned(),
        ));
    }
    if !matches_pod_create(&entry.rules) {
        out.push((
            "its rules do not match pod CREATE: it is never called for a new pod".to_owned(),
            "reinstall the chart's webhook configurations (helm upgrade)".to_owned(),
        ));
    }
    out
}

fn summary(kind: &str, entries: &[WebhookEntry]) -> String {
    let distinct = |f: &dyn Fn(&WebhookEntry) -> String| {
        let set: BTreeSet<String> = entries.iter().map(f).collect();
        set.into_iter().collect::<Vec<_>>().join("/")
    };
    let mut parts = vec![format!(
        "{} {}",
        entries.len(),
        if entries.len() == 1 {
            "entry"
        } else {
            "entries"
        }
    )];
    if kind == "MutatingWebhookConfiguration" {
        parts.push(format!(
            "reinvocationPolicy {}",
            distinct(&|e| e.reinvocation_policy.clone().unwrap_or_default())
        ));
    }
    parts.push(format!(
        "timeout {}s",
        distinct(&|e| e.timeout_seconds.to_string())
    ));
    parts.push(format!(
        "failurePolicy {}",
        distinct(&|e| e.failure_policy.clone())
    ));
    parts.join(", ")
}

/// Check 1 for one configuration: it exists, and every entry is as the chart writes it.
pub fn configuration(
    kind: &str,
    name: &str,
    got: &Got<Vec<WebhookEntry>>,
    expect: &Expect<'_>,
) -> Vec<Finding> {
    let subject = format!("{kind} {name}");
    if let Some(f) = unread(got, "webhooks", &subject) {
        return vec![match got {
            Got::Missing => f.fix(format!(
                "the webhooks are not registered: helm upgrade --install {name} ... (or check --release)"
            )),
            _ => f,
        }];
    }
    let Some(entries) = got.found() else {
        return Vec::new();
    };
    if entries.is_empty() {
        return vec![
            Finding::fail(
                "webhooks",
                subject,
                "has no entries: no pod is ever sent to the injector",
            )
            .fix("helm upgrade the release to restore its webhooks"),
        ];
    }
    let problems: Vec<Finding> = entries
        .iter()
        .flat_map(|e| {
            entry_problems(e, expect).into_iter().map(|(message, fix)| {
                Finding::fail("webhooks", format!("{subject}, entry {}", e.name), message).fix(fix)
            })
        })
        .collect();
    if !problems.is_empty() {
        return problems;
    }
    vec![Finding::pass("webhooks", subject, summary(kind, entries))]
}

/// Check 1, across both: each opt-in rule has an entry in both configurations. A rule only the
/// validator has refuses the pods it was meant to inject; one only the injector has lets them
/// through unchecked.
pub fn pairing(
    name: &str,
    mutating: &[WebhookEntry],
    validating: &[WebhookEntry],
    expect: &Expect<'_>,
) -> Vec<Finding> {
    let rules = |entries: &[WebhookEntry]| -> BTreeMap<Rule, String> {
        entries
            .iter()
            .filter_map(|e| rule_of(e, expect.inject_label).map(|r| (r, e.name.clone())))
            .collect()
    };
    let (m, v) = (rules(mutating), rules(validating));
    let mut out = Vec::new();
    for (rule, entry) in &v {
        if !m.contains_key(rule) {
            out.push(
                Finding::fail(
                    "webhooks",
                    format!("MutatingWebhookConfiguration {name}"),
                    format!(
                        "has no entry for {} ({entry} validates them): they are refused without ever being injected",
                        rule.describe()
                    ),
                )
                .fix("helm upgrade the release to restore its webhooks"),
            );
        }
    }
    for (rule, entry) in &m {
        if !v.contains_key(rule) {
            out.push(
                Finding::fail(
                    "webhooks",
                    format!("ValidatingWebhookConfiguration {name}"),
                    format!(
                        "has no entry for {} ({entry} injects them): nothing refuses one the injector missed",
                        rule.describe()
                    ),
                )
                .fix("helm upgrade the release to restore its webhooks"),
            );
        }
    }
    if !m.contains_key(&Rule::Pod) && !v.contains_key(&Rule::Pod) && !mutating.is_empty() {
        out.push(
            Finding::fail(
                "webhooks",
                format!("MutatingWebhookConfiguration {name}"),
                format!(
                    "has no pod-label entry: a pod labelled {}=true is not injected",
                    expect.inject_label
                ),
            )
            .fix("helm upgrade the release to restore its webhooks"),
        );
    }
    out
}

/// Check 1, for required namespaces: the namespaces labelled `<injectLabel>: required` that
/// name this installation's revision (`required`: their names) are selected by a required
/// entry in both configurations. Without one, their pods escape: none is injected but those
/// labelled `"true"`, and an opt-out is not refused. Nothing to say when there are none.
pub fn required_namespaces(
    name: &str,
    required: &[String],
    mutating: &[WebhookEntry],
    validating: &[WebhookEntry],
    expect: &Expect<'_>,
) -> Vec<Finding> {
    if required.is_empty() {
        return Vec::new();
    }
    let listed = required.join(", ");
    let subject = format!(
        "namespaces labelled {}={NAMESPACE_REQUIRED}",
        expect.inject_label
    );
    let lacking: Vec<&str> = [
        ("MutatingWebhookConfiguration", mutating),
        ("ValidatingWebhookConfiguration", validating),
    ]
    .into_iter()
    .filter(|(_, entries)| {
        !entries
            .iter()
            .any(|e| rule_of(e, expect.inject_label) == Some(Rule::Required))
    })
    .map(|(kind, _)| kind)
    .collect();
    if lacking.is_empty() {
        return vec![Finding::pass(
            "webhooks",
            subject,
            format!("{listed}: selected by the required entries"),
        )];
    }
    vec![
        Finding::fail(
            "webhooks",
            subject,
            format!(
                "{listed}: {} {name} has no entry for {}: their pods escape (only those labelled \"true\" are injected, and one that opts out is not refused)",
                lacking.join(" and "),
                Rule::Required.describe()
            ),
        )
        .fix("helm upgrade the release with --set webhook.namespaceOptIn.required=true"),
    ]
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::diagnose::check::State;
    use serde_json::json;

    /// The chart's MutatingWebhookConfiguration; the tests of `others` use it too.
    pub(in crate::diagnose::check) fn chart_mutating(timeout: i32) -> MutatingWebhookConfiguration {
        serde_json::from_value(json!({
            "metadata": {"name": "sidecar-injector"},
            "webhooks": [
                {
                    "name": "inject.sidecar-injector.io",
                    "admissionReviewVersions": ["v1"],
                    "clientConfig": {"service": {"name": "sidecar-injector", "namespace": "si", "path": "/mutate", "port": 443}},
                    "objectSelector": {"matchLabels": {"sidecar-injector.io/inject": "true"},
                        "matchExpressions": [{"key": "sidecar-injector.io/rev", "operator": "DoesNotExist"}]},
                    "namespaceSelector": {"matchExpressions": [
                        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "kube-public", "si"]}]},
                    "failurePolicy": "Ignore",
                    "reinvocationPolicy": "IfNeeded",
                    "sideEffects": "None",
                    "timeoutSeconds": timeout,
                    "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE"]}],
                },
                {
                    "name": "namespace.inject.sidecar-injector.io",
                    "admissionReviewVersions": ["v1"],
                    "clientConfig": {"service": {"name": "sidecar-injector", "namespace": "si", "path": "/mutate/namespace", "port": 443}},
                    "objectSelector": {"matchExpressions": [{"key": "sidecar-injector.io/inject", "operator": "NotIn", "values": ["false"]}]},
                    "namespaceSelector": {"matchExpressions": [
                        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "si"]}]},
                    "failurePolicy": "Ignore",
                    "reinvocationPolicy": "IfNeeded",
                    "sideEffects": "None",
                    "timeoutSeconds": timeout,
                    "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE"]}],
                }
            ]
        }))
        .expect("a MutatingWebhookConfiguration")
    }

    fn chart_validating() -> ValidatingWebhookConfiguration {
        let mut v = serde_json::to_value(chart_mutating(5)).expect("json");
        v["kind"] = "ValidatingWebhookConfiguration".into();
        for w in v["webhooks"].as_array_mut().expect("webhooks") {
            w.as_object_mut()
                .expect("entry")
                .remove("reinvocationPolicy");
            w["failurePolicy"] = "Fail".into();
            w["name"] = w["name"]
                .as_str()
                .expect("name")
                .replacen("inject", "validate", 1)
                .into();
        }
        serde_json::from_value(v).expect("a ValidatingWebhookConfiguration")
    }

    const EXPECT: Expect<'static> = Expect {
        inject_label: "sidecar-injector.io/inject",
        release_namespace: "si",
    };

    #[test]
    fn the_charts_configurations_pass_with_a_summary() {
        let m = configuration(
            "MutatingWebhookConfiguration",
            "sidecar-injector",
            &Got::Found(mutating_entries(&chart_mutating(5))),
            &EXPECT,
        );
        assert_eq!(m.len(), 1);
        assert_eq!(
            m[0].line(),
            "✓ MutatingWebhookConfiguration sidecar-injector: 2 entries, reinvocationPolicy IfNeeded, timeout 5s, failurePolicy Ignore"
        );
        let v = configuration(
            "ValidatingWebhookConfiguration",
            "sidecar-injector",
            &Got::Found(validating_entries(&chart_validating())),
            &EXPECT,
        );
        assert_eq!(v[0].state, State::Pass);
        assert!(
            pairing(
                "sidecar-injector",
                &mutating_entries(&chart_mutating(5)),
                &validating_entries(&chart_validating()),
                &EXPECT
            )
            .is_empty()
        );
    }

    #[test]
    fn a_long_timeout_a_missing_exclusion_and_never_reinvoked_fail() {
        let mut c = chart_mutating(30);
        let hook = &mut c.webhooks.as_mut().expect("webhooks")[0];
        hook.reinvocation_policy = Some("Never".into());
        hook.namespace_selector = None;
        hook.side_effects = "Some".into();
        let found = configuration(
            "MutatingWebhookConfiguration",
            "x",
            &Got::Found(mutating_entries(&c)),
            &EXPECT,
        );
        let text: Vec<String> = found.iter().map(Finding::line).collect();
        assert!(found.iter().all(|f| f.state == State::Fail), "{text:#?}");
        let all = text.join("\n");
        for needle in [
            "entry inject.sidecar-injector.io: namespaceSelector does not leave out kube-system and si",
            "reinvocationPolicy Never",
            "timeoutSeconds 30 is above 10",
            "sideEffects Some",
            "entry namespace.inject.sidecar-injector.io: timeoutSeconds 30",
        ] {
            assert!(all.contains(needle), "{needle} not in {all}");
        }
    }

    #[test]
    fn a_deleted_entry_is_named() {
        let mut m = chart_mutating(5);
        m.webhooks.as_mut().expect("webhooks").remove(0);
        let found = pairing(
            "r",
            &mutating_entries(&m),
            &validating_entries(&chart_validating()),
            &EXPECT,
        );
        let all: Vec<String> = found.iter().map(Finding::line).collect();
        assert_eq!(
            all,
            [
                "✗ MutatingWebhookConfiguration r: has no entry for pods opted in by their own label (validate.sidecar-injector.io validates them): they are refused without ever being injected — helm upgrade the release to restore its webhooks"
            ]
        );
        let found = pairing("r", &mutating_entries(&chart_mutating(5)), &[], &EXPECT);
        assert_eq!(found.len(), 2);
        assert!(found[0].line().starts_with("✗ ValidatingWebhookConfiguration r: has no entry for pods opted in by their own label (inject.sidecar-injector.io injects them)"));
    }

    #[test]
    fn a_missing_or_forbidden_configuration() {
        let missing = configuration("MutatingWebhookConfiguration", "r", &Got::Missing, &EXPECT);
        assert_eq!(missing[0].state, State::Fail);
        assert!(
            missing[0]
                .line()
                .contains("not found — the webhooks are not registered")
        );
        let forbidden = configuration(
            "MutatingWebhookConfiguration",
            "r",
            &Got::Forbidden("get mutatingwebhookconfigurations".into()),
            &EXPECT,
        );
        assert_eq!(
            forbidden[0].line(),
            "- MutatingWebhookConfiguration r: skipped: you lack the right to get mutatingwebhookconfigurations"
        );
    }

    /// The chart's required entry (no objectSelector: opted-out pods reach the validator) is
    /// one of the injector's, not an entry that sends every pod; it must pair up too.
    #[test]
    fn the_required_entry_is_known_and_must_pair_up() {
        let mut m = serde_json::to_value(chart_mutating(5)).expect("json");
        let mut required = m["webhooks"][1].clone();
        required["name"] = "required.inject.sidecar-injector.io".into();
        required["clientConfig"]["service"]["path"] = "/mutate/required".into();
        required
            .as_object_mut()
            .expect("entry")
            .remove("objectSelector");
        required["namespaceSelector"]["matchExpressions"]
            .as_array_mut()
            .expect("expressions")
            .push(json!({"key": "sidecar-injector.io/inject", "operator": "In", "values": ["required"]}));
        m["webhooks"]
            .as_array_mut()
            .expect("webhooks")
            .push(required);
        let m: MutatingWebhookConfiguration = serde_json::from_value(m).expect("mutating");
        let found = configuration(
            "MutatingWebhookConfiguration",
            "sidecar-injector",
            &Got::Found(mutating_entries(&m)),
            &EXPECT,
        );
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].line().starts_with("✓"), "{}", found[0].line());
        let unpaired = pairing(
            "r",
            &mutating_entries(&m),
            &validating_entries(&chart_validating()),
            &EXPECT,
        );
        assert_eq!(unpaired.len(), 1, "{unpaired:?}");
        assert!(
            unpaired[0]
                .line()
                .contains("has no entry for pods of namespaces that require sidecars"),
            "{}",
            unpaired[0].line()
        );
    }

    /// Namespaces labelled `required` with no required entry are named, with the fix; with
    /// the entries in both configurations they pass; with none, nothing is said.
    #[test]
    fn required_namespaces_without_their_entry_are_named() {
        let (m, v) = (
            mutating_entries(&chart_mutating(5)),
            validating_entries(&chart_validating()),
        );
        assert!(required_namespaces("r", &[], &m, &v, &EXPECT).is_empty());
        let names = ["payments".to_owned(), "shop".to_owned()];
        let found = required_namespaces("r", &names, &m, &v, &EXPECT);
        assert_eq!(
            found.iter().map(Finding::line).collect::<Vec<_>>(),
            [
                "✗ namespaces labelled sidecar-injector.io/inject=required: payments, shop: MutatingWebhookConfiguration and ValidatingWebhookConfiguration r has no entry for pods of namespaces that require sidecars: their pods escape (only those labelled \"true\" are injected, and one that opts out is not refused) — helm upgrade the release with --set webhook.namespaceOptIn.required=true"
            ]
        );
        let with_required = |entries: &[WebhookEntry]| {
            let mut all = entries.to_vec();
            let mut e = all[1].clone();
            e.object_selector = None;
            e.namespace_selector = serde_json::from_value(json!({"matchExpressions": [
                {"key": "sidecar-injector.io/inject", "operator": "In", "values": ["required"]}]}))
            .ok();
            all.push(e);
            all
        };
        let found =
            required_namespaces("r", &names, &with_required(&m), &with_required(&v), &EXPECT);
        assert!(found[0].line().starts_with("✓ namespaces labelled sidecar-injector.io/inject=required: payments, shop: selected"), "{}", found[0].line());
    }
}
