//! The webhook configurations: their entries as the chart writes them, the Service they call,
//! and the other mutating webhooks that see the same pods.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhook,
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::{Finding, Got, State, unread};

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
}

impl Rule {
    fn describe(self) -> &'static str {
        match self {
            Self::Pod => "pods opted in by their own label",
            Self::Namespace => "pods of namespaces that opt in",
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

/// A Service the webhooks call, and what was read of its EndpointSlices.
#[derive(Debug)]
pub struct ServiceEndpoints {
    pub namespace: String,
    pub name: String,
    pub slices: Got<Vec<EndpointSlice>>,
}

/// Every distinct Service the entries call, and every url.
pub fn services(entries: &[&WebhookEntry]) -> (Vec<(String, String)>, Vec<String>) {
    let mut services = BTreeSet::new();
    let mut urls = BTreeSet::new();
    for e in entries {
        match (&e.client_config.service, &e.client_config.url) {
            (Some(s), _) => {
                services.insert((s.namespace.clone(), s.name.clone()));
            }
            (None, Some(url)) => {
                urls.insert(url.clone());
            }
            (None, None) => {}
        }
    }
    (services.into_iter().collect(), urls.into_iter().collect())
}

/// Check 2: each Service has ready endpoints; a url is reported (nothing to look at).
pub fn endpoints(seen: &[ServiceEndpoints], urls: &[String], release: &str) -> Vec<Finding> {
    let mut out = Vec::new();
    for s in seen {
        let subject = format!("Service {}", s.name);
        if let Some(f) = unread(&s.slices, "endpoints", &subject) {
            out.push(f);
            continue;
        }
        let slices = s.slices.found().map(Vec::as_slice).unwrap_or_default();
        let ready = slices
            .iter()
            .flat_map(|slice| &slice.endpoints)
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
            .count();
        out.push(if ready == 0 {
            Finding::fail(
                "endpoints",
                subject,
                "no ready endpoints: the API server has no server to call",
            )
            .fix(format!(
                "kubectl -n {} get pods -l app.kubernetes.io/instance={release}",
                s.namespace
            ))
        } else {
            Finding::pass(
                "endpoints",
                subject,
                format!(
                    "{ready} ready endpoint{}",
                    if ready == 1 { "" } else { "s" }
                ),
            )
        });
    }
    // One line per server: the chart's entries differ only in their paths.
    let mut servers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for url in urls {
        let (server, path) = match url.find("://").map(|i| i + 3) {
            Some(start) => match url[start..].find('/') {
                Some(slash) => url.split_at(start + slash),
                None => (url.as_str(), ""),
            },
            None => (url.as_str(), ""),
        };
        servers
            .entry(server.to_owned())
            .or_default()
            .push(path.to_owned());
    }
    for (server, paths) in servers {
        out.push(Finding::skip(
            "endpoints",
            "Service",
            format!(
                "the webhooks call {server} (url mode: {}): there is no Service to look at; the certificate check below dials it",
                paths.join(", ")
            ),
        ));
    }
    out
}

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
    use serde_json::json;

    fn chart_mutating(timeout: i32) -> MutatingWebhookConfiguration {
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

    fn slice(ready: &[Option<bool>]) -> EndpointSlice {
        serde_json::from_value(json!({
            "addressType": "IPv4",
            "endpoints": ready.iter().map(|r| json!({"addresses": ["10.0.0.1"], "conditions": {"ready": r}})).collect::<Vec<_>>(),
        }))
        .expect("an EndpointSlice")
    }

    #[test]
    fn endpoints_count_ready_ones_and_urls_are_skipped() {
        let seen = |slices| ServiceEndpoints {
            namespace: "si".into(),
            name: "sidecar-injector".into(),
            slices,
        };
        let none = endpoints(
            &[seen(Got::Found(vec![slice(&[Some(false)])]))],
            &[],
            "sidecar-injector",
        );
        assert_eq!(
            none[0].line(),
            "✗ Service sidecar-injector: no ready endpoints: the API server has no server to call — kubectl -n si get pods -l app.kubernetes.io/instance=sidecar-injector"
        );
        let two = endpoints(
            &[seen(Got::Found(vec![slice(&[
                Some(true),
                None,
                Some(false),
            ])]))],
            &[],
            "r",
        );
        assert_eq!(
            two[0].line(),
            "✓ Service sidecar-injector: 2 ready endpoints"
        );
        let url = endpoints(
            &[],
            &[
                "https://127.0.0.1:8443/mutate".into(),
                "https://127.0.0.1:8443/validate".into(),
            ],
            "r",
        );
        assert_eq!(url.len(), 1);
        assert_eq!(url[0].state, State::Skip);
        assert!(
            url[0]
                .message
                .contains("https://127.0.0.1:8443 (url mode: /mutate, /validate)"),
            "{}",
            url[0].message
        );
    }

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
