//! The Services the webhook entries call and their ready EndpointSlices: which Services (and
//! urls) the entries name, and whether each Service has a ready endpoint for the API server.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::webhooks::WebhookEntry;
use super::{Finding, Got, unread};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::check::State;
    use serde_json::json;

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
}
