//! Self-managed certificates as the API server holds them: what the server's Secret stores, the
//! caBundle of both webhook configurations, and the API server's count of failed webhook calls.
//! Read by s29 (a server of the suite's own, lifetimes of seconds) and n13 (the chart's
//! replicas in the cluster, lifetimes of minutes).

use anyhow::ensure;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use crate::webhooks::{mutating, validating};

/// The certificates of a PEM text, each block as written.
pub fn pem_blocks(pem: &str) -> Vec<String> {
    pem.split_inclusive("-----END CERTIFICATE-----")
        .filter_map(|b| {
            b.find("-----BEGIN CERTIFICATE-----")
                .map(|i| b[i..].to_owned())
        })
        .collect()
}

/// What the self-managed Secret holds: `ca.crt` and `tls.crt` as text (`None` while the Secret
/// or either certificate is missing); an error when a key is missing beside them.
pub async fn self_managed(
    secrets: &Api<Secret>,
    name: &str,
) -> anyhow::Result<Option<(String, String)>> {
    let Some(secret) = secrets.get_opt(name).await? else {
        return Ok(None);
    };
    let data = secret.data.unwrap_or_default();
    let text = |key: &str| {
        data.get(key)
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
    };
    for key in ["ca.key", "tls.key"] {
        ensure!(
            text(key).is_some_and(|k| k.contains("PRIVATE KEY")),
            "Secret {name} has no {key}"
        );
    }
    Ok(text("ca.crt").zip(text("tls.crt")))
}

/// Whether every webhook of both configurations named `name` trusts exactly `ca_crt`.
pub async fn bundles_are(client: &Client, name: &str, ca_crt: &str) -> anyhow::Result<bool> {
    let m = mutating(client).get(name).await?;
    let v = validating(client).get(name).await?;
    let bundles = m
        .webhooks
        .iter()
        .flatten()
        .map(|w| w.client_config.ca_bundle.as_ref())
        .chain(
            v.webhooks
                .iter()
                .flatten()
                .map(|w| w.client_config.ca_bundle.as_ref()),
        );
    let mut all = true;
    for bundle in bundles {
        all &= bundle.is_some_and(|b| b.0 == ca_crt.as_bytes());
    }
    Ok(all)
}

/// The API server's count (from its `/metrics` text) of calls to the webhooks whose names
/// start with `prefix` that failed: refused, or let through by failurePolicy Ignore.
pub fn webhook_call_failures(text: &str, prefix: &str) -> f64 {
    [
        "apiserver_admission_webhook_rejection_count",
        "apiserver_admission_webhook_fail_open_count",
    ]
    .iter()
    .map(|metric| {
        text.lines()
            .filter(|l| l.starts_with(metric) && l.contains(&format!("name=\"{prefix}")))
            .filter(|l| !l.contains("error_type=\"no_error\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    })
    .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_blocks_split_a_bundle() {
        let one = "-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----";
        let two = "-----BEGIN CERTIFICATE-----\nBBB\n-----END CERTIFICATE-----";
        assert_eq!(pem_blocks(&format!("{one}\n{two}\n")), [one, two]);
        assert!(pem_blocks("no certificate").is_empty());
    }

    #[test]
    fn failed_calls_leave_out_answers_and_other_webhooks() {
        let text = "\
apiserver_admission_webhook_rejection_count{error_type=\"calling_webhook_error\",name=\"c3.mutate\",type=\"admit\"} 2
apiserver_admission_webhook_rejection_count{error_type=\"no_error\",name=\"c3.validate\",type=\"validating\"} 5
apiserver_admission_webhook_fail_open_count{name=\"c3.mutate\",type=\"admit\"} 1
apiserver_admission_webhook_rejection_count{error_type=\"calling_webhook_error\",name=\"other\",type=\"admit\"} 7
";
        assert_eq!(webhook_call_failures(text, "c3."), 3.0);
    }
}
