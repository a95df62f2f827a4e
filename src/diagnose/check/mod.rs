//! `check`, the judging half: whether a live installation works, from the objects the CLI read.
//!
//! - [`webhooks`]: the two webhook configurations and their entries, and whether they pair up.
//! - [`endpoints`](mod@endpoints): the Services the entries call, and their ready EndpointSlices.
//! - [`others`]: the other mutating webhooks that see the same pods (and their order).
//! - [`tls`]: whether each `caBundle` verifies the certificate the server serves, and when that
//!   certificate expires.
//! - [`backstop`]: whether the backstop is the export of the running configuration.
//! - [`policy_mode`]: an installation with no webhook, where the API server injects through the
//!   MutatingAdmissionPolicy: whether it is in step, and its keeper.
//! - [`probe`]: the opted-in pod a dry run creates, and what its answer says.
//! - [`version`]: whether the cluster's Kubernetes is one the injector supports.
//!
//! Pure: fetched objects (or why they could not be fetched) and the time in, one [`Finding`]
//! per line out. The API calls, the TLS handshake and the clock are in `crate::cli::check`.

pub mod backstop;
pub mod endpoints;
pub mod others;
pub mod policy_mode;
pub mod probe;
pub mod tls;
pub mod version;
pub mod webhooks;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use serde::Serialize;

use crate::engine::config::Injector;
use crate::engine::inject::revision_name;

/// What a check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum State {
    Pass,
    /// Works now, but needs attention (a certificate close to its expiry).
    Warn,
    Fail,
    /// Not checked: the caller lacks a right, or the installation cannot have it (url mode).
    Skip,
}

impl State {
    pub fn symbol(self) -> &'static str {
        match self {
            Self::Pass => "✓",
            Self::Warn => "!",
            Self::Fail => "✗",
            Self::Skip => "-",
        }
    }
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// Which check (`kubernetes`, `config`, `webhooks`, `endpoints`, `certificate`, `expiry`,
    /// `backstop`, `dryRun`, `otherWebhooks`, ...).
    pub check: &'static str,
    pub state: State,
    /// What was looked at: `MutatingWebhookConfiguration sidecar-injector`.
    pub subject: String,
    pub message: String,
    /// What to do (on a failure or a warning).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Finding {
    pub fn new(
        check: &'static str,
        state: State,
        subject: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            check,
            state,
            subject: subject.into(),
            message: message.into(),
            fix: None,
        }
    }

    pub fn pass(
        check: &'static str,
        subject: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self::new(check, State::Pass, subject, message)
    }

    pub fn fail(
        check: &'static str,
        subject: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self::new(check, State::Fail, subject, message)
    }

    pub fn skip(
        check: &'static str,
        subject: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self::new(
            check,
            State::Skip,
            subject,
            format!("skipped: {}", message.into()),
        )
    }

    pub fn fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }

    /// The text line: `✗ Service sidecar-injector: no ready endpoints — kubectl ...`.
    pub fn line(&self) -> String {
        let mut line = format!("{} {}: {}", self.state.symbol(), self.subject, self.message);
        if let Some(fix) = &self.fix {
            line.push_str(" — ");
            line.push_str(fix);
        }
        line
    }
}

/// What could be read of an object.
#[derive(Clone, Debug)]
pub enum Got<T> {
    Found(T),
    Missing,
    /// HTTP 403: the right the caller lacks, in words (`get mutatingwebhookconfigurations`).
    Forbidden(String),
    /// Any other error, as text.
    Failed(String),
}

impl<T> Got<T> {
    pub fn as_ref(&self) -> Got<&T> {
        match self {
            Self::Found(t) => Got::Found(t),
            Self::Missing => Got::Missing,
            Self::Forbidden(r) => Got::Forbidden(r.clone()),
            Self::Failed(e) => Got::Failed(e.clone()),
        }
    }

    /// The same absence, for another type; `Found` becomes `Missing` (the caller has handled it).
    pub fn absent<U>(self) -> Got<U> {
        match self {
            Self::Found(_) | Self::Missing => Got::Missing,
            Self::Forbidden(r) => Got::Forbidden(r),
            Self::Failed(e) => Got::Failed(e),
        }
    }

    pub fn found(&self) -> Option<&T> {
        match self {
            Self::Found(t) => Some(t),
            _ => None,
        }
    }
}

/// The finding for an object that could not be read, or `None` when it was.
pub fn unread<T>(got: &Got<T>, check: &'static str, subject: &str) -> Option<Finding> {
    match got {
        Got::Found(_) => None,
        Got::Missing => Some(Finding::fail(check, subject, "not found")),
        Got::Forbidden(right) => Some(Finding::skip(
            check,
            subject,
            format!("you lack the right to {right}"),
        )),
        Got::Failed(error) => Some(Finding::fail(
            check,
            subject,
            format!("cannot be read: {error}"),
        )),
    }
}

/// Which installation is checked.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Installation {
    pub namespace: String,
    pub release: String,
}

/// The whole report, as `-o json` writes it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub installation: Installation,
    /// No check failed (warnings and skipped checks allowed).
    pub ok: bool,
    pub checks: Vec<Finding>,
}

impl Report {
    pub fn new(installation: Installation, checks: Vec<Finding>) -> Self {
        let ok = !checks.iter().any(|f| f.state == State::Fail);
        Self {
            installation,
            ok,
            checks,
        }
    }

    /// One line per finding, then a summary line.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for finding in &self.checks {
            out.push_str(&finding.line());
            out.push('\n');
        }
        let count = |s: State| self.checks.iter().filter(|f| f.state == s).count();
        out.push_str(&format!(
            "{} passed, {} failed, {} warnings, {} skipped\n",
            count(State::Pass),
            count(State::Fail),
            count(State::Warn),
            count(State::Skip)
        ));
        out
    }
}

/// Everything read of the cluster for one run (see `crate::cli::check`).
#[derive(Debug)]
pub struct Observed {
    pub installation: Installation,
    /// Where the dry-run pod is created.
    pub pod_namespace: String,
    /// Seconds since the epoch, for certificate validity.
    pub now: u64,
    /// A certificate with fewer days left is a warning.
    pub warn_days: u32,
    /// The API server's `gitVersion` (`/version`).
    pub kubernetes: Got<String>,
    /// The configuration in the release's ConfigMap.
    pub config: Got<Injector>,
    pub mutating: Got<MutatingWebhookConfiguration>,
    pub validating: Got<ValidatingWebhookConfiguration>,
    pub endpoints: Vec<endpoints::ServiceEndpoints>,
    /// The chain served behind each webhook target, by [`target_key`].
    pub served: BTreeMap<String, tls::Served>,
    /// `None` when the configuration could not be read (nothing to compare with).
    pub backstop: Option<backstop::BackstopRead>,
    /// `None` when the configuration could not be read (no probe to make).
    pub dry_run: Option<probe::Answer>,
    /// `Some` when the installation is in policy mode ([`policy_mode::detect`]).
    pub policy_mode: Option<policy_mode::PolicyModeRead>,
    pub all_mutating: Got<Vec<MutatingWebhookConfiguration>>,
    /// The namespaces labelled `<injectLabel>: required` for this installation's revision
    /// (their names); not found when the configuration could not be read.
    pub required_namespaces: Got<Vec<String>>,
}

/// Where a webhook entry's server is, as a key of [`Observed::served`], and the name the API
/// server verifies its certificate as: `<service>.<namespace>.svc`, or the url's host.
pub fn target_key(cc: &WebhookClientConfig) -> Option<(String, String)> {
    match (&cc.service, &cc.url) {
        (Some(s), _) => Some((
            format!("service {}/{}", s.namespace, s.name),
            format!("{}.{}.svc", s.name, s.namespace),
        )),
        (None, Some(url)) => {
            let (host, port) = tls::url_host_port(url)?;
            Some((format!("url {host}:{port}"), host))
        }
        (None, None) => None,
    }
}

/// The report of a run, every check in order.
pub fn judge(o: &Observed) -> Report {
    let entries = Entries::of(o);
    let road = match o.policy_mode {
        Some(_) => probe::Road::Policy,
        None => probe::Road::Webhooks,
    };
    let mut out = vec![version::judge(&o.kubernetes)];
    out.extend(config(o));
    out.extend(configurations(o, &entries));
    out.extend(endpoints(o, &entries));
    out.extend(certificates(o, &entries, injected(o, road)));
    out.extend(backstop_in_step(o));
    out.extend(dry_run(o, road));
    out.extend(other_webhooks(o, &entries));
    Report::new(o.installation.clone(), out)
}

// === the steps of judge, in the order of the report ===

/// The two webhook configurations' entries, or why they could not be read.
struct Entries {
    mutating: Got<Vec<webhooks::WebhookEntry>>,
    validating: Got<Vec<webhooks::WebhookEntry>>,
}

impl Entries {
    fn of(o: &Observed) -> Self {
        Self {
            mutating: match &o.mutating {
                Got::Found(c) => Got::Found(webhooks::mutating_entries(c)),
                other => other.as_ref().absent(),
            },
            validating: match &o.validating {
                Got::Found(c) => Got::Found(webhooks::validating_entries(c)),
                other => other.as_ref().absent(),
            },
        }
    }

    /// Each configuration with its kind, mutating first.
    fn by_kind(&self) -> [(&'static str, &Got<Vec<webhooks::WebhookEntry>>); 2] {
        [
            ("MutatingWebhookConfiguration", &self.mutating),
            ("ValidatingWebhookConfiguration", &self.validating),
        ]
    }

    /// Every entry read, of both configurations.
    fn every(&self) -> Vec<&webhooks::WebhookEntry> {
        self.mutating
            .found()
            .into_iter()
            .chain(self.validating.found())
            .flatten()
            .collect()
    }
}

/// The configuration line: the release's ConfigMap, read and parsed, or why not.
fn config(o: &Observed) -> Option<Finding> {
    let inst = &o.installation;
    let subject = format!("ConfigMap {}", inst.release);
    match &o.config {
        Got::Found(inj) => Some(Finding::pass(
            "config",
            subject,
            format!(
                "configuration {} ({}, default templates {})",
                inj.digest,
                revision_name(&inj.config.revision),
                inj.config.default_templates.join(", ")
            ),
        )),
        got => unread(got, "config", &subject).map(|f| match got {
            Got::Missing => f.fix(format!(
                "is the release {} installed in namespace {}? (--release, --namespace)",
                inst.release, inst.namespace
            )),
            _ => f,
        }),
    }
}

/// What the webhook entries are held to: the configuration's inject label (the default one when
/// the configuration could not be read) and the release's namespace.
fn expect(o: &Observed) -> webhooks::Expect<'_> {
    webhooks::Expect {
        inject_label: o.config.found().map_or("sidecar-injector.io/inject", |i| {
            i.config.inject_label.as_str()
        }),
        release_namespace: &o.installation.namespace,
    }
}

/// Each webhook configuration (or, in policy mode, why there is none and the policy in its
/// place), then whether the two configurations' entries pair up.
fn configurations(o: &Observed, entries: &Entries) -> Vec<Finding> {
    let inst = &o.installation;
    let expect = expect(o);
    let mut out = Vec::new();
    for (kind, got) in entries.by_kind() {
        match (&o.policy_mode, got) {
            (Some(read), Got::Missing) => {
                out.push(policy_mode::no_webhooks(kind, &inst.release, &read.name));
            }
            _ => out.extend(webhooks::configuration(kind, &inst.release, got, &expect)),
        }
    }
    if let (Got::Found(inj), Some(read)) = (&o.config, &o.policy_mode) {
        out.extend(policy_mode::judge(inst, &inj.digest, read));
        let backstop = format!("{}-backstop", crate::export::base_name(inj));
        out.extend(required_namespaces(o, "mutatingPolicy", |names| {
            policy_mode::required_namespaces(
                names,
                expect.inject_label,
                read,
                o.backstop.as_ref(),
                &backstop,
            )
        }));
    }
    if let (Some(m), Some(v)) = (entries.mutating.found(), entries.validating.found()) {
        out.extend(webhooks::pairing(&inst.release, m, v, &expect));
        out.extend(required_namespaces(o, "webhooks", |names| {
            webhooks::required_namespaces(&inst.release, names, m, v, &expect)
        }));
    }
    out
}

/// What `judge` finds of the namespaces labelled `<injectLabel>: required`, when they could be
/// listed; else, without the right to list them, a skip under `check`.
fn required_namespaces(
    o: &Observed,
    check: &'static str,
    judge: impl FnOnce(&[String]) -> Vec<Finding>,
) -> Vec<Finding> {
    match &o.required_namespaces {
        Got::Found(names) => judge(names),
        Got::Forbidden(right) => vec![Finding::skip(
            check,
            "namespaces labelled required",
            format!("you lack the right to {right}"),
        )],
        Got::Missing | Got::Failed(_) => Vec::new(),
    }
}

/// The ready endpoints of every Service the entries call.
fn endpoints(o: &Observed, entries: &Entries) -> Vec<Finding> {
    let (_, urls) = endpoints::services(&entries.every());
    endpoints::endpoints(&o.endpoints, &urls, &o.installation.release)
}

/// Whether the dry-run pod came back injected as it should (a `caBundle` that does not verify
/// the served chain is then reported with that in mind).
fn injected(o: &Observed, road: probe::Road) -> bool {
    matches!(
        (&o.dry_run, &o.config),
        (Some(answer @ probe::Answer::Admitted(_)), Got::Found(inj))
            if probe::judge(road, inj, &o.pod_namespace, &probe::expected_sidecars(inj, &o.pod_namespace), answer).state == State::Pass
    )
}

/// Each configuration's `caBundle` against the chain its target serves, then each served
/// certificate's expiry.
fn certificates(o: &Observed, entries: &Entries, injected: bool) -> Vec<Finding> {
    let mut out = Vec::new();
    for (kind, got) in entries.by_kind() {
        let Some(of_kind) = got.found() else { continue };
        // One line per configuration and target: the chart's entries share both.
        let mut done = BTreeSet::new();
        for e in of_kind {
            let Some((key, server_name)) = target_key(&e.client_config) else {
                continue;
            };
            let bundle = e.client_config.ca_bundle.as_ref().map(|b| b.0.clone());
            if !done.insert((key.clone(), bundle.clone())) {
                continue;
            }
            let Some(served) = o.served.get(&key) else {
                continue;
            };
            out.push(tls::ca_bundle(
                &format!("{kind} {}", o.installation.release),
                bundle.as_deref(),
                served,
                &server_name,
                o.now,
                injected,
            ));
        }
    }
    for served in o.served.values() {
        out.extend(tls::expiry(served, o.now, o.warn_days));
    }
    out
}

/// Whether the backstop is the export of the running configuration.
fn backstop_in_step(o: &Observed) -> Vec<Finding> {
    match (&o.config, &o.backstop) {
        (Got::Found(inj), Some(read)) => backstop::judge(
            &format!("{}-backstop", crate::export::base_name(inj)),
            &inj.digest,
            read,
        ),
        _ => Vec::new(),
    }
}

/// What the dry-run pod came back with, against the engine's own injection of it.
fn dry_run(o: &Observed, road: probe::Road) -> Option<Finding> {
    let (Got::Found(inj), Some(answer)) = (&o.config, &o.dry_run) else {
        return None;
    };
    let expected = probe::expected_sidecars(inj, &o.pod_namespace);
    Some(probe::judge(road, inj, &o.pod_namespace, &expected, answer))
}

/// The other mutating webhooks that see the dry-run pod's labels, and their order against ours.
fn other_webhooks(o: &Observed, entries: &Entries) -> Vec<Finding> {
    let labels: BTreeMap<String, String> = o
        .config
        .found()
        .map(probe::pod)
        .and_then(|p| serde_json::from_value(p["metadata"]["labels"].clone()).ok())
        .unwrap_or_default();
    // The exported MutatingAdmissionPolicy is always reinvoked IfNeeded.
    let (ours, reinvocation) = match &o.policy_mode {
        Some(read) => (others::Ours::Policy(&read.name), Some("IfNeeded")),
        None => (
            others::Ours::Webhook(&o.installation.release),
            entries
                .mutating
                .found()
                .and_then(|m| m.first())
                .and_then(|e| e.reinvocation_policy.as_deref()),
        ),
    };
    others::others(&o.all_mutating, ours, &labels, reinvocation)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_carries_the_fix_after_a_dash() {
        let f = Finding::fail(
            "endpoints",
            "Service sidecar-injector",
            "no ready endpoints",
        )
        .fix("kubectl -n sidecar-injector get pods");
        assert_eq!(
            f.line(),
            "✗ Service sidecar-injector: no ready endpoints — kubectl -n sidecar-injector get pods"
        );
    }

    #[test]
    fn the_report_fails_on_a_failure_only() {
        let inst = Installation {
            namespace: "ns".into(),
            release: "r".into(),
        };
        let warn = Finding::new("expiry", State::Warn, "x", "soon");
        let skip = Finding::skip("backstop", "y", "you lack the right to get it");
        assert!(Report::new(inst.clone(), vec![warn.clone(), skip.clone()]).ok);
        let report = Report::new(
            inst,
            vec![warn, skip, Finding::fail("webhooks", "z", "bad")],
        );
        assert!(!report.ok);
        assert!(
            report
                .text()
                .ends_with("0 passed, 1 failed, 1 warnings, 1 skipped\n")
        );
        assert_eq!(
            report.checks[1].line(),
            "- y: skipped: you lack the right to get it"
        );
    }

    #[test]
    fn an_unread_object_is_skipped_only_when_forbidden() {
        let forbidden: Got<()> = Got::Forbidden("get secrets".into());
        assert_eq!(
            unread(&forbidden, "certificate", "Secret a").map(|f| f.state),
            Some(State::Skip)
        );
        assert_eq!(
            unread(&Got::<()>::Missing, "c", "s").map(|f| f.state),
            Some(State::Fail)
        );
        assert!(unread(&Got::Found(()), "c", "s").is_none());
    }
}
