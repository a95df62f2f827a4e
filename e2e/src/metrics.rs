//! The apiserver's own Prometheus metrics, read with the suite's (admin) credentials.

use anyhow::Context as _;
use kube::Client;

/// The text of the apiserver's `/metrics`.
pub async fn scrape(client: &Client) -> anyhow::Result<String> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .context("cannot build the /metrics request")?;
    client
        .request_text(request)
        .await
        .context("cannot read the apiserver's /metrics")
}

/// Sum of the samples of `metric` whose labels include every `name="value"` pair in `labels`.
pub fn sum(text: &str, metric: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(metric)?;
            let (label_text, value) = match rest.strip_prefix('{') {
                Some(rest) => rest.split_once('}')?,
                None if rest.starts_with(' ') => ("", rest),
                None => return None,
            };
            labels
                .iter()
                .all(|(k, v)| label_text.contains(&format!("{k}=\"{v}\"")))
                .then(|| value.split_whitespace().next()?.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// How many requests the apiserver says validating webhook `webhook` has refused.
pub fn validating_rejections(text: &str, webhook: &str) -> f64 {
    sum(
        text,
        "apiserver_admission_webhook_rejection_count",
        &[("name", webhook), ("type", "validating")],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_matching_series_only() {
        let text = "\
# HELP apiserver_admission_webhook_rejection_count [ALPHA] ...
apiserver_admission_webhook_rejection_count{error_type=\"no_error\",name=\"validate.sidecar-injector.io\",operation=\"CREATE\",rejection_code=\"403\",type=\"validating\"} 2
apiserver_admission_webhook_rejection_count{error_type=\"calling_webhook_error\",name=\"validate.sidecar-injector.io\",operation=\"UPDATE\",rejection_code=\"0\",type=\"validating\"} 1
apiserver_admission_webhook_rejection_count{error_type=\"no_error\",name=\"other\",operation=\"CREATE\",rejection_code=\"403\",type=\"validating\"} 7
apiserver_admission_webhook_rejection_count_other{name=\"validate.sidecar-injector.io\",type=\"validating\"} 100
";
        assert_eq!(
            validating_rejections(text, "validate.sidecar-injector.io"),
            3.0
        );
    }
}
