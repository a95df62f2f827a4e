//! `check`, the command: whether an installation in the cluster works.
//!
//! - [`cluster`]: the reads, the dry run, the TLS handshake.
//! - The judging is pure and lives in [`crate::diagnose::check`].

pub mod cluster;

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};

use crate::diagnose::check::{
    self, Got, Installation, Observed, backstop, endpoints, policy_mode, probe, target_key, tls,
    webhooks,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// Flags of `check`; each is also read from an environment variable.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The namespace the chart was installed in.
    #[arg(
        short = 'n',
        long,
        env = "SIDECAR_INJECTOR_NAMESPACE",
        default_value = "sidecar-injector"
    )]
    pub namespace: String,
    /// The name of the chart's objects: the release name (with a revision,
    /// `<release>-<revision>`). It names both webhook configurations, the Service, the
    /// ConfigMap and the Deployment.
    #[arg(
        long,
        env = "SIDECAR_INJECTOR_RELEASE",
        default_value = "sidecar-injector"
    )]
    pub release: String,
    /// The namespace the opted-in probe pod is created in, as a server-side dry run (nothing
    /// is stored; it needs the right to create pods there).
    #[arg(
        long,
        env = "SIDECAR_INJECTOR_CHECK_POD_NAMESPACE",
        default_value = "default"
    )]
    pub pod_namespace: String,
    /// A served certificate with fewer days than this left is a warning.
    #[arg(
        long,
        env = "SIDECAR_INJECTOR_CHECK_EXPIRY_WARNING_DAYS",
        default_value_t = tls::WARN_DAYS,
        value_name = "DAYS"
    )]
    pub expiry_warning_days: u32,
    /// Output format: one line per check, or JSON for scripts.
    #[arg(
        short = 'o',
        long,
        env = "SIDECAR_INJECTOR_OUTPUT",
        value_enum,
        default_value = "text"
    )]
    pub output: Output,
}

impl CheckArgs {
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        runtime.block_on(self.run_async())
    }

    async fn run_async(self) -> anyhow::Result<ExitCode> {
        let Self {
            namespace,
            release,
            pod_namespace,
            expiry_warning_days,
            output,
        } = self;
        let client = kube::Client::try_default().await.context(
            "no Kubernetes client (KUBECONFIG, ~/.kube/config or in-cluster service account)",
        )?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();

        let kubernetes = match client.apiserver_version().await {
            Ok(info) => Got::Found(info.git_version),
            Err(e) => Got::Failed(e.to_string()),
        };
        let config = match cluster::get_namespaced::<ConfigMap>(&client, &namespace, &release).await
        {
            Got::Found(cm) => {
                match crate::load::from_configmap_data(
                    &format!("ConfigMap {namespace}/{release}"),
                    &cm.data.unwrap_or_default(),
                    Some(namespace.clone()),
                ) {
                    Ok(inj) => Got::Found(inj),
                    Err(e) => Got::Failed(e.to_string()),
                }
            }
            other => other.absent(),
        };
        let mutating =
            cluster::get_cluster::<MutatingWebhookConfiguration>(&client, &release).await;
        let validating =
            cluster::get_cluster::<ValidatingWebhookConfiguration>(&client, &release).await;
        let deployment = cluster::get_namespaced::<Deployment>(&client, &namespace, &release).await;
        let policy_mode =
            read_policy_mode(&client, &config, &deployment, &mutating, &validating).await;

        let mut entries: Vec<webhooks::WebhookEntry> = Vec::new();
        if let Got::Found(c) = &mutating {
            entries.extend(webhooks::mutating_entries(c));
        }
        if let Got::Found(c) = &validating {
            entries.extend(webhooks::validating_entries(c));
        }
        let refs: Vec<&webhooks::WebhookEntry> = entries.iter().collect();
        let (services, _) = endpoints::services(&refs);
        let mut endpoints = Vec::new();
        for (ns, name) in &services {
            endpoints.push(endpoints::ServiceEndpoints {
                namespace: ns.clone(),
                name: name.clone(),
                slices: cluster::endpoint_slices(&client, ns, name).await,
            });
        }

        let mut served = BTreeMap::new();
        for e in &entries {
            let Some((key, _)) = target_key(&e.client_config) else {
                continue;
            };
            if served.contains_key(&key) {
                continue;
            }
            let chain = match (&e.client_config.url, &deployment) {
                (Some(url), _) => cluster::handshake(url).await,
                (None, deployment) => secret_chain(&client, &namespace, deployment).await,
            };
            served.insert(key, chain);
        }

        let (backstop_seen, dry_run) = match &config {
            Got::Found(inj) => {
                let name = format!("{}-backstop", crate::export::base_name(inj));
                let [policy, binding, required_binding] = cluster::backstop(&client, &name).await;
                let seen = backstop::BackstopRead {
                    server_applies: deployment.found().map(backstop::server_applies),
                    policy,
                    binding,
                    required_binding,
                };
                let answer = cluster::dry_run(&client, &pod_namespace, &probe::pod(inj)).await;
                (Some(seen), Some(answer))
            }
            _ => (None, None),
        };
        let all_mutating = cluster::list_cluster::<MutatingWebhookConfiguration>(&client).await;
        let required_namespaces = match &config {
            Got::Found(inj) => {
                let cfg = &inj.config;
                let revision = match cfg.revision.as_str() {
                    "" => format!("!{}", cfg.revision_label),
                    r => format!("{}={r}", cfg.revision_label),
                };
                let selector = format!(
                    "{}={},{revision}",
                    cfg.inject_label,
                    crate::engine::config::NAMESPACE_REQUIRED
                );
                match cluster::list_selected::<Namespace>(&client, &selector).await {
                    Got::Found(list) => {
                        Got::Found(list.into_iter().filter_map(|n| n.metadata.name).collect())
                    }
                    Got::Missing => Got::Missing,
                    Got::Forbidden(r) => Got::Forbidden(r),
                    Got::Failed(e) => Got::Failed(e),
                }
            }
            _ => Got::Missing,
        };

        let report = check::judge(&Observed {
            installation: Installation { namespace, release },
            pod_namespace,
            now,
            warn_days: expiry_warning_days,
            kubernetes,
            config,
            mutating,
            validating,
            endpoints,
            served,
            backstop: backstop_seen,
            dry_run,
            policy_mode,
            all_mutating,
            required_namespaces,
        });
        let text = match output {
            Output::Text => report.text(),
            Output::Json => {
                let mut json = serde_json::to_string_pretty(&report)?;
                json.push('\n');
                json
            }
        };
        crate::cli::stdio::write_stdout(text.as_bytes())?;
        Ok(if report.ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        })
    }
}

/// What policy mode has, when the installation is in it: its Deployment is a keeper, or it has no
/// mutating webhook configuration and the MutatingAdmissionPolicy is there. An installation with
/// its webhook configuration and no keeper is in webhook mode: nothing more is read.
async fn read_policy_mode(
    client: &kube::Client,
    config: &Got<crate::engine::config::Injector>,
    deployment: &Got<Deployment>,
    mutating: &Got<MutatingWebhookConfiguration>,
    validating: &Got<ValidatingWebhookConfiguration>,
) -> Option<policy_mode::PolicyModeRead> {
    let keeper = deployment.found().filter(|d| policy_mode::is_keeper(d));
    if keeper.is_none() && !matches!(mutating, Got::Missing) {
        return None;
    }
    let name = config
        .found()
        .map_or_else(|| "sidecar-injector".to_owned(), crate::export::base_name);
    let read = cluster::mutating_policy(client, &name).await;
    if !policy_mode::detect(deployment, mutating, validating, &read.policy) {
        return None;
    }
    let keeper = match (keeper, deployment) {
        (Some(d), _) => Got::Found(policy_mode::Replicas::of(d)),
        (None, Got::Found(_)) => Got::Missing,
        (None, other) => other.as_ref().absent(),
    };
    Some(policy_mode::PolicyModeRead {
        name,
        keeper,
        api_version: read.api_version,
        policy: read.policy,
        binding: read.binding,
        required_binding: read.required_binding,
    })
}

/// The chain in the TLS Secret the Deployment mounts.
async fn secret_chain(
    client: &kube::Client,
    namespace: &str,
    deployment: &Got<Deployment>,
) -> tls::Served {
    let (name, managed) = match deployment {
        Got::Found(d) => match tls::managed_secret_name(d) {
            Some(name) => (Some(name), true),
            None => (tls::secret_name(d), false),
        },
        _ => (None, false),
    };
    let Some(name) = name else {
        let why = match deployment {
            Got::Forbidden(r) => Got::Forbidden(r.clone()),
            Got::Failed(e) => Got::Failed(e.clone()),
            Got::Missing => Got::Failed(format!(
                "no Deployment to find the TLS Secret by in namespace {namespace}"
            )),
            Got::Found(_) => Got::Failed("the Deployment mounts no TLS Secret".into()),
        };
        return tls::Served {
            source: "the TLS Secret".into(),
            from_secret: true,
            chain: why,
            managed: None,
        };
    };
    let source = format!("Secret {namespace}/{name}");
    let chain = match cluster::get_namespaced::<Secret>(client, namespace, &name).await {
        Got::Found(secret) => match secret.data.as_ref().and_then(|d| d.get("tls.crt")) {
            Some(pem) => match tls::pem_chain(&pem.0) {
                Ok(chain) => Got::Found(chain),
                Err(e) => Got::Failed(format!("its tls.crt {e}")),
            },
            None => Got::Failed("it has no tls.crt".into()),
        },
        other => other.absent(),
    };
    let managed = match (&chain, managed) {
        (Got::Found(chain), true) => chain.first().and_then(|leaf| managed_of(leaf)),
        _ => None,
    };
    tls::Served {
        source,
        from_secret: true,
        chain,
        managed,
    }
}

/// Who issued a self-managed serving certificate, and from when the server renews it (the
/// rule of [`plan`](crate::certs::plan)).
fn managed_of(leaf: &[u8]) -> Option<tls::Managed> {
    let (_, cert) = x509_parser::parse_x509_certificate(leaf).ok()?;
    let validity = cert.validity();
    Some(tls::Managed {
        issuer: cert.issuer().to_string(),
        renews_at: crate::certs::plan::renew_at(
            validity.not_before.timestamp(),
            validity.not_after.timestamp(),
            crate::certs::plan::Policy::default().renew_divisor,
        ),
    })
}
