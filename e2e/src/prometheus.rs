//! The Prometheus the node suite runs (`e2e/node/run.sh`) scraping the injector's pods with the
//! chart's alert rules: its HTTP API, and the queries of the chart's dashboard and rules.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use serde::Deserialize;
use serde_json::Value;

/// The Prometheus HTTP API at `base` (`http://127.0.0.1:PORT`, on the namespace's loopback).
#[derive(Clone, Debug)]
pub struct Prometheus {
    address: String,
}

impl Prometheus {
    pub fn new(base: &str) -> anyhow::Result<Self> {
        let address = base
            .strip_prefix("http://")
            .with_context(|| format!("E2E_PROMETHEUS_URL {base:?} is not http://HOST:PORT"))?
            .trim_end_matches('/')
            .to_owned();
        Ok(Self { address })
    }

    /// `GET path` over plain HTTP/1.0; the `data` of the API's JSON answer.
    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let exchange = async {
            let mut stream = tokio::net::TcpStream::connect(&self.address).await?;
            stream
                .write_all(format!("GET {path} HTTP/1.0\r\nHost: prometheus\r\n\r\n").as_bytes())
                .await?;
            let mut response = String::new();
            stream.read_to_string(&mut response).await?;
            anyhow::Ok(response)
        };
        let response = tokio::time::timeout(Duration::from_secs(10), exchange)
            .await
            .with_context(|| format!("prometheus {path} did not answer within 10s"))??;
        let (_, body) = response
            .split_once("\r\n\r\n")
            .with_context(|| format!("prometheus {path}: no body in {response:?}"))?;
        let answer: Value = serde_json::from_str(body)
            .with_context(|| format!("prometheus {path}: not JSON: {body}"))?;
        ensure!(
            answer["status"] == "success",
            "prometheus {path}: {} {}",
            answer["errorType"],
            answer["error"]
        );
        Ok(answer["data"].clone())
    }

    /// The instant vector (or scalar) `promql` evaluates to now: its samples.
    pub async fn query(&self, promql: &str) -> anyhow::Result<Vec<Value>> {
        let data = self
            .get(&format!("/api/v1/query?query={}", percent_encode(promql)))
            .await
            .with_context(|| format!("query {promql}"))?;
        Ok(match data["resultType"].as_str() {
            Some("vector") => data["result"].as_array().cloned().unwrap_or_default(),
            Some("scalar") => vec![data["result"].clone()],
            other => anyhow::bail!("query {promql}: result type {other:?}"),
        })
    }

    /// The alerts now pending or firing: (alertname, state).
    pub async fn alerts(&self) -> anyhow::Result<Vec<(String, String)>> {
        let data = self.get("/api/v1/alerts").await?;
        Ok(data["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                (
                    a["labels"]["alertname"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    a["state"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect())
    }

    /// Every alerting rule loaded: (name, health, last error).
    pub async fn alerting_rules(&self) -> anyhow::Result<Vec<(String, String, String)>> {
        let data = self.get("/api/v1/rules?type=alert").await?;
        Ok(data["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .map(|r| {
                let field = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
                (field("name"), field("health"), field("lastError"))
            })
            .collect())
    }
}

fn percent_encode(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[derive(Deserialize)]
struct RuleFile {
    groups: Vec<RuleGroup>,
}

#[derive(Deserialize)]
struct RuleGroup {
    rules: Vec<Rule>,
}

/// An alerting rule of the chart's rule file.
#[derive(Clone, Debug, Deserialize)]
pub struct Rule {
    pub alert: String,
    pub expr: String,
}

/// The alerting rules of a rule file (`charts/prometheus-rules.py`'s output).
pub fn rules(yaml: &str) -> anyhow::Result<Vec<Rule>> {
    let file: RuleFile = serde_saphyr::from_str(yaml).context("not a Prometheus rule file")?;
    Ok(file.groups.into_iter().flat_map(|g| g.rules).collect())
}

/// Every query of a Grafana dashboard: (panel title, expression), with the dashboard's
/// variables replaced by `variables` (name without `$`, value).
pub fn dashboard_queries(
    json: &str,
    variables: &[(&str, &str)],
) -> anyhow::Result<Vec<(String, String)>> {
    let dashboard: Value = serde_json::from_str(json).context("the dashboard is not JSON")?;
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        let title = panel["title"].as_str().unwrap_or_default();
        for target in panel["targets"].as_array().into_iter().flatten() {
            let mut expr = target["expr"]
                .as_str()
                .with_context(|| format!("panel {title}: a target without expr"))?
                .to_owned();
            // Longest names first: `$__rate_interval` before any shorter one it contains.
            let mut variables = variables.to_vec();
            variables.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
            for (name, value) in variables {
                expr = expr.replace(&format!("${name}"), value);
            }
            ensure!(
                !expr.contains('$'),
                "panel {title}: a variable left unreplaced in {expr}"
            );
            out.push((title.to_owned(), expr));
        }
    }
    Ok(out)
}

/// The vector selectors of an expression, `name{matchers}` (the chart's expressions write every
/// selector with braces), each once.
pub fn selectors(expr: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let bytes = expr.as_bytes();
    let name_char = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    for (open, _) in expr.match_indices('{') {
        let start = (0..open)
            .rev()
            .take_while(|&i| name_char(bytes[i]))
            .last()
            .unwrap_or(open);
        let Some(close) = expr[open..].find('}') else {
            continue;
        };
        if start == open {
            continue;
        }
        let selector = expr[start..=open + close].to_owned();
        if !out.contains(&selector) {
            out.push(selector);
        }
    }
    out
}

/// A selector's metric name with only its `job` and `namespace` matchers: whether the metric
/// exists for the injector at all, whatever its other labels (a counter of errors has no series
/// until the first error).
pub fn metric_of(selector: &str) -> anyhow::Result<String> {
    let (name, matchers) = selector
        .split_once('{')
        .with_context(|| format!("{selector} is not name{{matchers}}"))?;
    let kept: Vec<&str> = matchers
        .trim_end_matches('}')
        .split(',')
        .map(str::trim)
        .filter(|m| m.starts_with("job=") || m.starts_with("namespace="))
        .collect();
    Ok(format!("{name}{{{}}}", kept.join(",")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_selector_once() {
        let expr = r#"sum by (webhook) (rate(a_total{job="j",namespace="n",outcome="error"}[5m]))
  / sum by (webhook) (rate(a_total{job="j",namespace="n"}[5m])) > 0.05 or absent(up{job="j"} == 1)
  or rate(a_total{job="j",namespace="n"}[1m])"#;
        assert_eq!(
            selectors(expr),
            vec![
                r#"a_total{job="j",namespace="n",outcome="error"}"#,
                r#"a_total{job="j",namespace="n"}"#,
                r#"up{job="j"}"#,
            ]
        );
        assert_eq!(
            metric_of(r#"a_total{job="j",namespace="n",outcome="error"}"#).unwrap(),
            r#"a_total{job="j",namespace="n"}"#
        );
    }

    #[test]
    fn reads_dashboard_queries_with_variables_replaced() {
        let json = r#"{"panels": [{"title": "T", "targets": [
            {"expr": "rate(x{job=\"$job\"}[$__rate_interval]) > $timeout"}]}]}"#;
        let got = dashboard_queries(
            json,
            &[("job", "j"), ("__rate_interval", "1m"), ("timeout", "5")],
        )
        .unwrap();
        assert_eq!(
            got,
            vec![("T".to_owned(), r#"rate(x{job="j"}[1m]) > 5"#.to_owned())]
        );
        assert!(dashboard_queries(json, &[("job", "j")]).is_err());
    }

    #[test]
    fn encodes_queries() {
        assert_eq!(
            percent_encode(r#"up{a="b"} == 1"#),
            "up%7Ba%3D%22b%22%7D%20%3D%3D%201"
        );
    }
}
