//! Prometheus metrics. Labels are small fixed sets: never a pod, namespace or uid. Template
//! names and hashes come from the configuration: a handful per configuration loaded.
//!
//! A review's series are found once and their handles kept (a handle shares its series), so
//! that answering a review does not hash its labels again: `prometheus-client` finds a series
//! by hashing its label set with SipHash under a lock, a few hundred instructions a series.
//! A series still appears in `/metrics` only once it is first counted.
//!
//! Nothing a review counts takes a lock that another serving thread can hold: counters are
//! atomic, the latency histogram is [`Latency`] (prometheus-client's `Histogram` takes a write
//! lock for every observation), and the injection handles sit behind a read-write lock that is
//! written only when a new template hash is first counted. A thread preempted while it held a
//! shared lock made the other serving threads sleep until it ran again (docs/benchmarks-history.md,
//! "Locks on the serving path").

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

use crate::engine::memo::Recall;
use crate::engine::review::{Outcome, Webhook};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReviewLabels {
    webhook: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WebhookLabel {
    webhook: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    kind: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RecallLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectLabel {
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SyncLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertStepLabel {
    step: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabel {
    policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TemplateLabels {
    template: Arc<str>,
    template_hash: Arc<str>,
}

/// Webhooks × outcomes: the handles of the review counters.
const WEBHOOKS: usize = 2;
const OUTCOMES: usize = 5;

fn webhook_index(webhook: Webhook) -> usize {
    match webhook {
        Webhook::Mutate => 0,
        Webhook::Validate => 1,
    }
}

const RECALLS: usize = 3;

fn recall_index(recall: Recall) -> usize {
    match recall {
        Recall::Hit => 0,
        Recall::Miss => 1,
        Recall::Unkept => 2,
    }
}

fn outcome_index(outcome: Outcome) -> usize {
    match outcome {
        Outcome::Injected => 0,
        Outcome::Skipped => 1,
        Outcome::Allowed => 2,
        Outcome::Denied => 3,
        Outcome::Error => 4,
    }
}

/// Handles of series already counted.
#[derive(Default)]
struct Handles {
    reviews: [[OnceLock<Counter>; OUTCOMES]; WEBHOOKS],
    latency: [OnceLock<Latency>; WEBHOOKS],
    recalls: [OnceLock<Counter>; RECALLS],
    /// By template name and hash, newest last; a new configuration adds its own. Found by
    /// pointer first (the configuration's own strings) and read without cloning them: a clone
    /// is a write to a count the other serving threads write too.
    injections: RwLock<Vec<(TemplateLabels, Counter)>>,
}

/// Bound on the kept injection handles: after many reloads the table starts over (the series
/// stay in the registry either way).
const INJECTION_HANDLES: usize = 256;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

/// What a reload was of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReloadKind {
    Config,
    Certificate,
}

impl ReloadKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Config => "config",
            Self::Certificate => "certificate",
        }
    }
}

pub struct Metrics {
    registry: Registry,
    reviews: Family<ReviewLabels, Counter>,
    latency: Family<WebhookLabel, Latency>,
    reloads: Family<ReloadLabels, Counter>,
    rejected: Family<RejectLabel, Counter>,
    recalls: Family<RecallLabel, Counter>,
    injections: Family<TemplateLabels, Counter>,
    cert_expiry: Gauge,
    last_reload: Family<KindLabel, Gauge>,
    backstop_syncs: Family<SyncLabel, Counter>,
    backstop_in_step: Family<PolicyLabel, Gauge>,
    cert_steps: Family<CertStepLabel, Counter>,
    ca_expiry: Gauge,
    handles: Handles,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

/// Latency buckets, in seconds: fine below a millisecond, where a healthy review lands, and
/// coarse up to 30 s, the longest webhook `timeoutSeconds`, so that a p99 approaching the
/// timeout is seen as such (with 1 s the last bound, any p99 above it read as 1 s).
const BUCKETS: [f64; 18] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0,
];

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("sidecar_injector");
        let reviews = Family::<ReviewLabels, Counter>::default();
        registry.register(
            "reviews",
            "AdmissionReviews answered, by webhook and outcome",
            reviews.clone(),
        );
        let latency = Family::<WebhookLabel, Latency>::default();
        registry.register(
            "review_duration_seconds",
            "Time from a complete request body to the encoded answer",
            latency.clone(),
        );
        let reloads = Family::<ReloadLabels, Counter>::default();
        // At 0 from the start, so that a dashboard's increase() has series before a reload.
        for kind in [ReloadKind::Config, ReloadKind::Certificate] {
            for result in ["success", "error"] {
                let _ = reloads.get_or_create(&ReloadLabels {
                    kind: kind.as_str(),
                    result,
                });
            }
        }
        registry.register(
            "reloads",
            "Reloads of configuration and certificate, by result",
            reloads.clone(),
        );
        let rejected = Family::<RejectLabel, Counter>::default();
        registry.register(
            "http_rejections",
            "HTTP requests refused before review (404, 405, 400, 408, 413)",
            rejected.clone(),
        );
        let recalls = Family::<RecallLabel, Counter>::default();
        registry.register(
            "review_memo",
            "Reviews by whether the answer came from the memory of recent answers (hit), was reviewed and remembered (miss), or was reviewed in a shape the memory does not keep, or with it off (unkept)",
            recalls.clone(),
        );
        let injections = Family::<TemplateLabels, Counter>::default();
        registry.register(
            "injections",
            "Templates injected, by template and template hash (of its source and values): after a change, new injections move to the new hash",
            injections.clone(),
        );
        let cert_expiry = Gauge::default();
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "When the serving certificate expires (Unix time)",
            cert_expiry.clone(),
        );
        // Both kinds from the start, at 1: the server starts only once both have loaded, and an
        // alert on `== 0` needs the series before the first failure.
        let last_reload = Family::<KindLabel, Gauge>::default();
        for kind in [ReloadKind::Config, ReloadKind::Certificate] {
            last_reload
                .get_or_create(&KindLabel {
                    kind: kind.as_str(),
                })
                .set(1);
        }
        registry.register(
            "last_reload_successful",
            "Whether the last change to the configuration or certificate files was loaded (1) or refused, the previous one still served (0)",
            last_reload.clone(),
        );
        let backstop_syncs = Family::<SyncLabel, Counter>::default();
        registry.register(
            "backstop_syncs",
            "Checks of a kept policy (the backstop; in policy mode also the MutatingAdmissionPolicy) against the configuration served, by result: applied (it was missing or another configuration's), unchanged, error",
            backstop_syncs.clone(),
        );
        // Only when the server keeps policies (`serve --backstop`, `--mutating-policy`): no series otherwise.
        let backstop_in_step = Family::<PolicyLabel, Gauge>::default();
        registry.register(
            "backstop_in_step",
            "Whether a kept policy in the cluster (the backstop, or in policy mode the MutatingAdmissionPolicy) is the export of the configuration served (1) or could not be made so (0)",
            backstop_in_step.clone(),
        );
        // Only with self-managed certificates (`serve --certificates-secret`).
        let cert_steps = Family::<CertStepLabel, Counter>::default();
        registry.register(
            "certificate_steps",
            "Steps taken on the self-managed certificates, by step (issue, add_ca, renew_serving, drop_ca, mend_bundles, check) and result (done, error); a check is one look at the Secret and the webhook configurations",
            cert_steps.clone(),
        );
        let ca_expiry = Gauge::default();
        registry.register(
            "ca_expiry_timestamp_seconds",
            "When the CA that signs the serving certificate expires (Unix time); 0 when the server does not manage its certificates",
            ca_expiry.clone(),
        );
        let build = Family::<BuildLabels, Gauge>::default();
        build
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        registry.register("build_info", "Build information; always 1", build);
        Self {
            registry,
            reviews,
            latency,
            reloads,
            rejected,
            recalls,
            injections,
            cert_expiry,
            last_reload,
            backstop_syncs,
            backstop_in_step,
            cert_steps,
            ca_expiry,
            handles: Handles::default(),
        }
    }
}

/// The review latency histogram, without a lock: its counts are atomic, and the sum is kept in
/// nanoseconds. A scrape reads the buckets before the count and an observation counts the
/// count before its bucket, so a scrape never shows a bucket above `+Inf`.
#[derive(Clone, Debug, Default)]
pub struct Latency(Arc<LatencyCounts>);

#[derive(Debug, Default)]
struct LatencyCounts {
    count: AtomicU64,
    sum_ns: AtomicU64,
    /// Observations by the first bucket that holds them (not cumulative), as prometheus-client
    /// keeps them; above the last bound, in none (the count has them).
    buckets: [AtomicU64; BUCKETS.len()],
}

impl Latency {
    pub fn observe(&self, seconds: f64) {
        let counts = &self.0;
        counts.count.fetch_add(1, Ordering::SeqCst);
        // Saturating casts: NaN counts as 0, and no review takes 584 years.
        let ns = (seconds * 1e9) as u64;
        counts.sum_ns.fetch_add(ns, Ordering::Relaxed);
        if let Some(i) = BUCKETS.iter().position(|&bound| seconds <= bound) {
            counts.buckets[i].fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl TypedMetric for Latency {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Latency {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let counts = &self.0;
        let mut buckets: Vec<(f64, u64)> = BUCKETS
            .iter()
            .zip(&counts.buckets)
            .map(|(&bound, n)| (bound, n.load(Ordering::SeqCst)))
            .collect();
        let count = counts.count.load(Ordering::SeqCst);
        // `+Inf` (prometheus-client's `f64::MAX` bound): what no bound holds, so that it is
        // the count exactly.
        let bounded: u64 = buckets.iter().map(|(_, n)| n).sum();
        buckets.push((f64::MAX, count.saturating_sub(bounded)));
        let sum = counts.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

impl Metrics {
    pub fn review(&self, webhook: Webhook, outcome: Outcome, seconds: f64) {
        let (w, o) = (webhook_index(webhook), outcome_index(outcome));
        self.handles.reviews[w][o]
            .get_or_init(|| {
                self.reviews
                    .get_or_create(&ReviewLabels {
                        webhook: webhook.as_str(),
                        outcome: outcome.as_str(),
                    })
                    .clone()
            })
            .inc();
        self.handles.latency[w]
            .get_or_init(|| {
                self.latency
                    .get_or_create(&WebhookLabel {
                        webhook: webhook.as_str(),
                    })
                    .clone()
            })
            .observe(seconds);
    }

    pub fn reload(&self, kind: ReloadKind, ok: bool) {
        let result = if ok { "success" } else { "error" };
        self.reloads
            .get_or_create(&ReloadLabels {
                kind: kind.as_str(),
                result,
            })
            .inc();
        self.last_reload
            .get_or_create(&KindLabel {
                kind: kind.as_str(),
            })
            .set(i64::from(ok));
    }

    /// One pod injected with these templates (name, hash).
    pub fn injected(&self, templates: &[(Arc<str>, Arc<str>)]) {
        fn same(kept: &Arc<str>, given: &Arc<str>) -> bool {
            Arc::ptr_eq(kept, given) || kept == given
        }
        let mut missing = Vec::new();
        if let Ok(handles) = self.handles.injections.read() {
            for (template, template_hash) in templates {
                let kept = handles.iter().rev().find(|(labels, _)| {
                    same(&labels.template, template) && same(&labels.template_hash, template_hash)
                });
                match kept {
                    Some((_, counter)) => {
                        counter.inc();
                    }
                    None => missing.push(TemplateLabels {
                        template: template.clone(),
                        template_hash: template_hash.clone(),
                    }),
                }
            }
        }
        if missing.is_empty() {
            return;
        }
        let Ok(mut handles) = self.handles.injections.write() else {
            return;
        };
        for labels in missing {
            let counter = self.injections.get_or_create(&labels).clone();
            counter.inc();
            if handles.len() >= INJECTION_HANDLES {
                handles.clear();
            }
            handles.push((labels, counter));
        }
    }

    /// Whether a review's answer came from memory ([`crate::engine::memo`]).
    pub fn recall(&self, recall: Recall) {
        self.handles.recalls[recall_index(recall)]
            .get_or_init(|| {
                self.recalls
                    .get_or_create(&RecallLabel {
                        result: recall.as_str(),
                    })
                    .clone()
            })
            .inc();
    }

    pub fn rejected(&self, code: u16) {
        self.rejected.get_or_create(&RejectLabel { code }).inc();
    }

    /// One check of the backstop `policy`: `applied`, `unchanged` or `error`.
    pub fn backstop_sync(&self, policy: &str, result: &'static str) {
        for r in ["applied", "unchanged", "error"] {
            let _ = self.backstop_syncs.get_or_create(&SyncLabel { result: r });
        }
        self.backstop_syncs
            .get_or_create(&SyncLabel { result })
            .inc();
        self.backstop_in_step
            .get_or_create(&PolicyLabel {
                policy: policy.to_owned(),
            })
            .set(i64::from(result != "error"));
    }

    pub fn certificate_expiry(&self, not_after: i64) {
        self.cert_expiry.set(not_after);
    }

    /// A step taken on the self-managed certificates (`issue`, `add_ca`, `renew_serving`,
    /// `drop_ca`, `mend_bundles`, or `check` for a look that found nothing to do or failed).
    pub fn certificate_step(&self, step: &'static str, ok: bool) {
        let result = if ok { "done" } else { "error" };
        self.cert_steps
            .get_or_create(&CertStepLabel { step, result })
            .inc();
    }

    pub fn ca_expiry(&self, not_after: i64) {
        self.ca_expiry.set(not_after);
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts made through kept handles land in the registry's series: the same series each
    /// time, a new series for a new template hash, and still after the handle table starts over.
    #[test]
    fn kept_handles_count_in_the_registered_series() {
        let m = Metrics::default();
        for _ in 0..3 {
            m.review(Webhook::Mutate, Outcome::Injected, 0.0001);
        }
        m.review(Webhook::Validate, Outcome::Denied, 0.2);
        let proxy: (Arc<str>, Arc<str>) = ("proxy".into(), "aaaa".into());
        m.injected(std::slice::from_ref(&proxy));
        m.injected(&[proxy.clone(), ("proxy".into(), "bbbb".into())]);
        // Equal labels from other allocations (a reloaded configuration) find the same series.
        m.injected(&[("proxy".into(), "aaaa".into())]);
        for i in 0..INJECTION_HANDLES + 10 {
            m.injected(&[("other".into(), format!("{i}").into())]);
        }
        m.injected(&[proxy]);
        let text = m.encode();
        for line in [
            r#"sidecar_injector_reviews_total{webhook="mutate",outcome="injected"} 3"#,
            r#"sidecar_injector_reviews_total{webhook="validate",outcome="denied"} 1"#,
            r#"sidecar_injector_review_duration_seconds_count{webhook="mutate"} 3"#,
            r#"sidecar_injector_review_duration_seconds_count{webhook="validate"} 1"#,
            r#"sidecar_injector_injections_total{template="proxy",template_hash="aaaa"} 4"#,
            r#"sidecar_injector_injections_total{template="proxy",template_hash="bbbb"} 1"#,
            r#"sidecar_injector_injections_total{template="other",template_hash="0"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing from {text}");
        }
        assert!(!text.contains(r#"outcome="skipped""#), "{text}");
    }

    /// The lock-free histogram is exposed as prometheus-client's own was: cumulative buckets,
    /// `+Inf` equal to the count, the sum in seconds.
    #[test]
    fn latency_is_a_cumulative_histogram() {
        let m = Metrics::default();
        for seconds in [0.00004, 0.00004, 0.0003, 0.002, 7.0] {
            m.review(Webhook::Mutate, Outcome::Injected, seconds);
        }
        let text = m.encode();
        for line in [
            r#"sidecar_injector_review_duration_seconds_bucket{le="0.00005",webhook="mutate"} 2"#,
            r#"sidecar_injector_review_duration_seconds_bucket{le="0.00025",webhook="mutate"} 2"#,
            r#"sidecar_injector_review_duration_seconds_bucket{le="0.0005",webhook="mutate"} 3"#,
            r#"sidecar_injector_review_duration_seconds_bucket{le="0.0025",webhook="mutate"} 4"#,
            r#"sidecar_injector_review_duration_seconds_bucket{le="1.0",webhook="mutate"} 4"#,
            r#"sidecar_injector_review_duration_seconds_bucket{le="5.0",webhook="mutate"} 4"#,
            r#"sidecar_injector_review_duration_seconds_bucket{le="10.0",webhook="mutate"} 5"#,
            r#"sidecar_injector_review_duration_seconds_bucket{le="30.0",webhook="mutate"} 5"#,
            r#"sidecar_injector_review_duration_seconds_bucket{le="+Inf",webhook="mutate"} 5"#,
            r#"sidecar_injector_review_duration_seconds_count{webhook="mutate"} 5"#,
            "# TYPE sidecar_injector_review_duration_seconds histogram",
        ] {
            assert!(text.contains(line), "{line} missing from {text}");
        }
        let sum: f64 = text
            .lines()
            .find_map(|l| {
                l.strip_prefix(r#"sidecar_injector_review_duration_seconds_sum{webhook="mutate"} "#)
            })
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no sum in {text}"));
        assert!((sum - 7.00238).abs() < 1e-6, "{sum}");
    }

    /// The reload series exist from the start (alerts and dashboards need them before the first
    /// reload): the counters at 0, the success gauges at 1. A refused reload sets its kind's
    /// gauge to 0, the next loaded one back to 1.
    #[test]
    fn reload_series_exist_from_the_start_and_follow_each_reload() {
        let m = Metrics::default();
        let value = |m: &Metrics, kind: &str| -> Option<i64> {
            let prefix = format!(r#"sidecar_injector_last_reload_successful{{kind="{kind}"}} "#);
            m.encode()
                .lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()).and_then(|v| v.parse().ok()))
        };
        assert_eq!(value(&m, "config"), Some(1));
        assert_eq!(value(&m, "certificate"), Some(1));
        let text = m.encode();
        for kind in ["config", "certificate"] {
            for result in ["success", "error"] {
                let line = format!(
                    r#"sidecar_injector_reloads_total{{kind="{kind}",result="{result}"}} 0"#
                );
                assert!(text.contains(&line), "{line} missing from {text}");
            }
        }
        m.reload(ReloadKind::Config, false);
        assert_eq!(value(&m, "config"), Some(0));
        assert_eq!(value(&m, "certificate"), Some(1));
        m.reload(ReloadKind::Config, true);
        m.reload(ReloadKind::Certificate, false);
        assert_eq!(value(&m, "config"), Some(1));
        assert_eq!(value(&m, "certificate"), Some(0));
        assert!(
            m.encode()
                .contains("# TYPE sidecar_injector_last_reload_successful gauge"),
            "{}",
            m.encode()
        );
    }
}
