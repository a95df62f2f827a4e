//! `outdated`, the command: which pods run sidecars other than what the current configuration
//! injects, and a safe rolling restart of their workloads.
//!
//! - [`cluster`]: the API calls.
//! - The judging ([`check`](crate::diagnose::outdated::check),
//!   [`workload`](crate::diagnose::outdated::workload),
//!   [`report`](crate::diagnose::outdated::report)) is pure and lives in
//!   [`crate::diagnose::outdated`].

pub mod cluster;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};

use crate::diagnose::outdated::report::{Report, RestartRecord};
use crate::diagnose::outdated::workload::Rollout;
use crate::load::ConfigArg;
use crate::server::parse_duration;

/// Exit status when some pod needs a restart that this run did not do (0: none; 1: error).
pub const EXIT_OUTDATED: u8 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// Flags of `outdated`; each is also read from an environment variable.
#[derive(Debug, Args)]
pub struct OutdatedArgs {
    /// Only this namespace. Default: all namespaces.
    #[arg(short = 'n', long, env = "SIDECAR_INJECTOR_OUTDATED_NAMESPACE")]
    pub namespace: Option<String>,
    #[command(flatten)]
    pub config: ConfigArg,
    /// Read the configuration from the installed chart's ConfigMap (NAMESPACE/NAME, e.g.
    /// sidecar-injector/sidecar-injector) instead of --config.
    #[arg(
        long,
        env = "SIDECAR_INJECTOR_FROM_CONFIGMAP",
        value_name = "NAMESPACE/NAME"
    )]
    pub from_configmap: Option<String>,
    /// Output format.
    #[arg(
        short = 'o',
        long,
        env = "SIDECAR_INJECTOR_OUTPUT",
        value_enum,
        default_value = "table"
    )]
    pub output: Output,
    /// Restart the workloads (Deployments, StatefulSets, DaemonSets) with outdated or
    /// uninjected pods, one at a time, as `kubectl rollout restart` does. Bare pods and Jobs
    /// are reported, never deleted.
    #[arg(long, env = "SIDECAR_INJECTOR_RESTART")]
    pub restart: bool,
    /// With --restart: send each restart as a server-side dry run (checks permissions,
    /// changes nothing).
    #[arg(long, env = "SIDECAR_INJECTOR_DRY_RUN", requires = "restart")]
    pub dry_run: bool,
    /// With --restart: restart at most this many workloads.
    #[arg(long, env = "SIDECAR_INJECTOR_MAX", requires = "restart")]
    pub max: Option<usize>,
    /// With --restart: how long to wait for each rollout to finish before the next one. A
    /// rollout not finished in time stops the restarts (exit status 1).
    #[arg(long, env = "SIDECAR_INJECTOR_WAIT_TIMEOUT", value_parser = parse_duration, default_value = "5m")]
    pub wait_timeout: Duration,
    /// With --restart: do not wait for rollouts (every restart is sent at once, one after the
    /// other).
    #[arg(long, env = "SIDECAR_INJECTOR_NO_WAIT", requires = "restart")]
    pub no_wait: bool,
}

impl OutdatedArgs {
    pub fn run(self) -> anyhow::Result<ExitCode> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?
            .block_on(self.run_async())
    }

    async fn run_async(self) -> anyhow::Result<ExitCode> {
        let Self {
            namespace,
            config,
            from_configmap,
            output,
            restart,
            dry_run,
            max,
            wait_timeout,
            no_wait,
        } = self;
        // Bad flags and a broken configuration file fail before any API call.
        let configmap = from_configmap.as_deref().map(configmap_ref).transpose()?;
        let from_file = match configmap {
            None => Some(config.load()?),
            Some(_) => None,
        };
        let client = kube::Client::try_default().await.context(
            "cannot reach a cluster: set KUBECONFIG (or ~/.kube/config), or run in a pod with a service account",
        )?;
        let inj = match (from_file, configmap) {
            (Some(inj), _) => inj,
            (None, reference) => {
                let reference = reference.context("no configuration source")?;
                cluster::configmap_injector(&client, reference).await?
            }
        };
        let (pods, owners) = cluster::pods_and_owners(&client, namespace.as_deref()).await?;
        let namespaces = cluster::namespace_labels(&client, namespace.as_deref()).await?;
        let mut report = Report::build(&inj, &pods, &owners, &namespaces);
        let mut failed = false;
        let mut left_outdated = report.anything_outdated();
        if restart {
            let plan = Plan {
                dry_run,
                max,
                wait: (!no_wait).then_some(wait_timeout),
            };
            let (records, ok, remaining) = plan.run(&client, &report).await;
            report.restarts = records;
            failed = !ok;
            left_outdated = remaining;
        }
        let text = match output {
            Output::Table => report.table(),
            Output::Json => report.json(),
        };
        super::stdio::write_stdout(text.as_bytes())?;
        Ok(if failed {
            ExitCode::FAILURE
        } else if left_outdated {
            ExitCode::from(EXIT_OUTDATED)
        } else {
            ExitCode::SUCCESS
        })
    }
}

/// `NAMESPACE/NAME` of `--from-configmap`.
fn configmap_ref(reference: &str) -> anyhow::Result<(&str, &str)> {
    reference
        .split_once('/')
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'))
        .with_context(|| format!("--from-configmap wants NAMESPACE/NAME, got {reference:?}"))
}

/// How `--restart` goes about it.
struct Plan {
    dry_run: bool,
    max: Option<usize>,
    /// `None`: do not wait.
    wait: Option<Duration>,
}

impl Plan {
    /// Restarts, one at a time, each workload whose pods need it. Returns what was done,
    /// whether everything went well, and whether something outdated was left as it is.
    async fn run(
        &self,
        client: &kube::Client,
        report: &Report,
    ) -> (Vec<RestartRecord>, bool, bool) {
        let now = k8s_openapi::jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let mut records = Vec::new();
        let mut restarted = 0usize;
        let mut ok = true;
        let mut left = false;
        for w in report.workloads.iter().filter(|w| w.needs_restart()) {
            let workload = w.workload.clone();
            let record = |action, detail: String| RestartRecord {
                workload: workload.clone(),
                action,
                detail,
            };
            if let Some(why) = workload.why_not_restartable() {
                left = true;
                records.push(record("notRestartable", why.into()));
                continue;
            }
            if !ok {
                left = true;
                records.push(record(
                    "notReached",
                    "an earlier restart did not finish".into(),
                ));
                continue;
            }
            if self.max.is_some_and(|max| restarted >= max) {
                left = true;
                records.push(record(
                    "overLimit",
                    format!("--max {} reached", self.max.unwrap_or_default()),
                ));
                continue;
            }
            restarted += 1;
            if let Err(error) = cluster::restart(client, &workload, &now, self.dry_run).await {
                ok = false;
                left = true;
                records.push(record("failed", format!("{error:#}")));
                continue;
            }
            if self.dry_run {
                left = true;
                records.push(record(
                    "wouldRestart",
                    "dry run: the API server accepted the patch".into(),
                ));
                continue;
            }
            let Some(timeout) = self.wait else {
                records.push(record("restarted", "rollout not waited for".into()));
                continue;
            };
            let detail = match cluster::wait_for_rollout(client, &workload, timeout).await {
                Ok(Rollout::Done) => "rollout finished".to_owned(),
                Ok(Rollout::Waiting(why)) => {
                    ok = false;
                    format!("rollout not finished after {timeout:?}: {why}")
                }
                Ok(Rollout::Failed(why)) => {
                    ok = false;
                    format!("rollout failed: {why}")
                }
                Err(error) => {
                    ok = false;
                    format!("{error:#}")
                }
            };
            records.push(record("restarted", detail));
        }
        (records, ok, left)
    }
}
