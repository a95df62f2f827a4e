//! Command-line interface: `serve`, `inject`, `uninject`, `review`, `explain`, `outdated`,
//! `export`, `check`.
//!
//! A shell around the engine. It owns the flags, reading the files and standard input a
//! command names (`stdio`), standard output and exit statuses; every answer comes from
//! [`crate::engine`], or for `check` and `outdated` from [`crate::diagnose`]. `serve` runs
//! [`crate::server`]; [`outdated`] and [`check`] hold the API-server calls. Nothing in the
//! library imports `cli`: `main.rs` runs it.

pub mod check;
pub mod outdated;
mod stdio;

use std::io::IsTerminal as _;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};

use crate::engine::inject::Entry;
use crate::engine::review::Webhook;
use crate::engine::{explain, manifest, review, uninject};
use crate::export;
use crate::load::{ConfigArg, SelectionArgs};
use stdio::{read_input, read_text, write_errors, write_notes, write_stdout, write_warnings};

#[derive(Debug, Parser)]
#[command(
    name = "sidecar-injector",
    version,
    about = "Kubernetes sidecar injection: admission webhooks and an offline injector"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the mutating (/mutate) and validating (/validate) webhooks over TLS.
    Serve(Box<crate::server::ServeArgs>),
    /// Inject sidecars into manifests and print the result (YAML).
    ///
    /// Reads multi-document YAML or JSON, including the `kind: List` that `kubectl get -o
    /// yaml|json` prints (its items are injected in place). Pods and pod templates are injected:
    /// those of the workload kinds, and of any kind with a pod template (a `spec.containers`
    /// list) at `spec.template` or `spec.jobTemplate.spec.template`. Other documents, and
    /// documents with nothing to add, are written back byte for byte. Every opted-in pod or pod
    /// template it leaves as it is gets a `note:` line on standard error with the reason. YAML
    /// is read as kubectl reads it (`0644` is octal). A document that cannot be read or
    /// injected is written back as it came and named in an `error:` line; the others are
    /// still injected, and the exit status is 1.
    Inject(ManifestArgs),
    /// Remove what `inject` (or the webhook) added to manifests and print the result (YAML).
    ///
    /// Reads what `inject` reads. A pod or pod template carrying the status annotation
    /// (`sidecar-injector.io/status`) loses what its recorded templates add, rendered again
    /// under this configuration for what the status says the pod had: the sidecars (not a
    /// container of the pod's own the status records as kept), volumes, image pull secrets,
    /// mounts and env vars, labels and annotations, and the status annotation; a pod-level
    /// budget shrinks back. An item the pod's author wrote differently from the template's, or
    /// before items of their own, is left alone; one written exactly as the template's, last
    /// in its list, cannot be told from an injected one and is removed. Other documents are written back byte for byte. Each object gets a `note:`
    /// line on standard error: the templates removed, or why it was left as it is. A document
    /// that cannot be read or uninjected (another configuration rendered it) is written back as
    /// it came and named in an `error:` line; the others are still uninjected, and the exit
    /// status is 1.
    Uninject(UninjectArgs),
    /// Answer a captured AdmissionReview exactly as the server would.
    Review {
        /// AdmissionReview file (JSON), or - for standard input.
        #[arg(long, value_name = "FILE|-")]
        request: PathBuf,
        /// Answer as the validating webhook instead of the mutating one.
        #[arg(long)]
        validate: bool,
        /// Answer as the server answers a POST to this path: /mutate or /validate (the entry
        /// for pods opted in by their own label), /mutate/namespace or /validate/namespace
        /// (the entry for pods in a namespace labelled `sidecar-injector.io/inject: enabled`),
        /// or /mutate/required or /validate/required (a namespace labelled `required`).
        #[arg(long = "path", value_name = "PATH", conflicts_with = "validate")]
        webhook_path: Option<String>,
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Explain, for each pod or pod template, whether it is injected (by which rule) or why not,
    /// and what is added.
    ///
    /// Reads what `inject` reads, and judges the same objects: the items of a `kind: List`
    /// one by one.
    Explain(ManifestArgs),
    /// Report the cluster's pods whose sidecars differ from what the configuration injects
    /// now, by workload; with --restart, roll those workloads. Exit status 3: something is
    /// outdated (and was not restarted).
    ///
    /// Pods are judged by the webhooks' own engine, with their namespace's labels choosing the
    /// rule that opts them in (pod label or namespace); pods another revision injected are
    /// listed as such and never restarted.
    ///
    /// The cluster is the one KUBECONFIG (or ~/.kube/config) names, or the pod's own service
    /// account when run in a cluster.
    Outdated(outdated::OutdatedArgs),
    /// Export the configuration as admission policies the API server runs by itself (CEL, no
    /// webhook call): a ValidatingAdmissionPolicy that refuses opted-in pods the injector did
    /// not reach (`backstop`), or one MutatingAdmissionPolicy, for every template, that
    /// injects without the injector (`mutating`). Each with a binding per opt-in rule, selecting
    /// the pods the chart's webhook entries select (the injector's own namespace, from
    /// SIDECAR_INJECTOR_NAMESPACE, is never matched). YAML on standard output, for
    /// `kubectl apply -f -`.
    ///
    /// Every object is annotated with the digest of the configuration it was exported from
    /// (`sidecar-injector.io/config`, also in each injected pod's status): the backstop holds a
    /// pod to its contract only when the pod was injected under that configuration or not at
    /// all, so a backstop that is behind or ahead of the injector never refuses what the
    /// injector injects. `serve --backstop` (the chart's default) applies and keeps the
    /// backstop in step by itself, and in the chart's policy mode `serve --policies-only
    /// --mutating-policy auto` keeps the MutatingAdmissionPolicy too; export by hand only where
    /// no pod of the chart runs in the cluster.
    ///
    /// Loops over the pod's containers, init containers, volumes and their ports (and lists a
    /// template collects from them), and per-pod overrides, are written as CEL: the bundled
    /// templates export. A pod whose override the template does not allow is left alone by
    /// the mutating policy and refused by the backstop with the webhook's message. What CEL
    /// cannot write (a condition on the pod outside a loop, a loop inside such a loop, other
    /// fields of the pod's spec, the owner, a value of the pod kept in a variable) is refused
    /// with its line and the reason; nothing is written and the exit status is 1.
    Export(ExportArgs),
    /// Check an installation in the cluster: both webhook configurations and their entries,
    /// the Service's ready endpoints, that each caBundle verifies the certificate the server
    /// serves (and when it expires), that the backstop is the export of the running
    /// configuration, that an opted-in pod comes back injected and admitted (a server-side dry
    /// run), and which other mutating webhooks see the same pods, in the order they are called.
    ///
    /// One line per check: ✓ passed, ✗ failed (with what to do), ! warning, - skipped (the
    /// right to read it is missing, or the installation cannot have it). Exit status 1 when a
    /// check failed.
    ///
    /// The cluster is the one KUBECONFIG (or ~/.kube/config) names, or the pod's own service
    /// account when run in a cluster (the chart's `helm test`).
    Check(check::CheckArgs),
}

/// The documents `inject`, `uninject` or `explain` could not read or process, each on standard
/// error, and an error (exit status 1) when there is one; the others were written all the same.
fn left_as_they_came(
    errors: &[impl std::fmt::Display],
    what: &str,
    verb: &str,
) -> anyhow::Result<()> {
    if errors.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = errors.iter().map(|e| format!("{e} ({what})")).collect();
    write_errors(&lines);
    anyhow::bail!(
        "{} document(s) could not be read or {verb} (named above); the others were written",
        errors.len()
    )
}

/// An injector from a ConfigMap manifest: the first document of kind ConfigMap.
fn configmap_injector(file: &std::path::Path) -> anyhow::Result<crate::engine::config::Injector> {
    let text = read_text(file)?;
    let origin = file.display().to_string();
    for doc in manifest::split_documents(&text) {
        let value: serde_json::Value = manifest::read_document(doc.text)
            .with_context(|| format!("{origin}: a document is not YAML"))?;
        if value["kind"] != "ConfigMap" {
            continue;
        }
        let data: std::collections::BTreeMap<String, String> =
            serde_json::from_value(value["data"].clone()).with_context(|| {
                format!("{origin}: the ConfigMap's data is not a map of strings")
            })?;
        let name = value["metadata"]["name"].as_str().unwrap_or("");
        let inj = crate::load::from_configmap_data(
            &format!("ConfigMap {name} in {origin}"),
            &data,
            crate::load::own_namespace(),
        )?;
        crate::load::warn_advisories(&inj);
        return Ok(inj);
    }
    anyhow::bail!("{origin} holds no ConfigMap")
}

/// What `export` writes.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ExportKind {
    /// ValidatingAdmissionPolicy and its bindings (admissionregistration.k8s.io/v1, Kubernetes 1.30+).
    Backstop,
    /// MutatingAdmissionPolicy and its bindings (v1: Kubernetes 1.36+; v1beta1: 1.34-1.35).
    Mutating,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// What to export.
    #[arg(value_enum)]
    pub kind: ExportKind,
    /// API version of the MutatingAdmissionPolicy: v1 (Kubernetes 1.36+) or v1beta1
    /// (1.34-1.35 with the MutatingAdmissionPolicy feature gate and
    /// --runtime-config=admissionregistration.k8s.io/v1beta1=true).
    #[arg(long, env = "SIDECAR_INJECTOR_MUTATING_API_VERSION", default_value = "v1", value_parser = ["v1", "v1beta1"])]
    pub api_version: String,
    /// The revision the policies are for; refused unless it is the configuration's (empty:
    /// the default revision). Without it, the configuration's.
    #[arg(long, env = "SIDECAR_INJECTOR_REVISION")]
    pub revision: Option<String>,
    #[command(flatten)]
    pub selection: SelectionArgs,
    /// Backstop: also refuse a sidecar whose image is not the one its template sets (only in a
    /// pod injected under this same configuration, or not injected at all: see the status
    /// annotation's `config`). `false`: names, lists and volumes only.
    #[arg(long, env = "SIDECAR_INJECTOR_CHECK_IMAGES", default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub check_images: bool,
    /// Read the configuration and templates from the chart's ConfigMap instead (a manifest,
    /// e.g. `helm template ... --show-only templates/configmap.yaml`), or - for standard input.
    #[arg(
        long,
        env = "SIDECAR_INJECTOR_CONFIGMAP",
        value_name = "FILE|-",
        conflicts_with = "path"
    )]
    pub configmap: Option<PathBuf>,
    #[command(flatten)]
    pub config: ConfigArg,
}

impl ExportArgs {
    fn run(self) -> anyhow::Result<()> {
        let Self {
            kind,
            api_version,
            revision,
            selection,
            check_images,
            configmap,
            config,
        } = self;
        let inj = match configmap {
            Some(file) => configmap_injector(&file)?,
            None => config.load()?,
        };
        export::check_revision(&inj, revision.as_deref())?;
        let selection = selection.selection();
        let docs = match kind {
            ExportKind::Backstop => export::backstop(&inj, &selection, check_images)?,
            ExportKind::Mutating => {
                let version = match api_version.as_str() {
                    "v1beta1" => export::MutatingVersion::V1beta1,
                    _ => export::MutatingVersion::V1,
                };
                export::mutating(&inj, &selection, version)?
            }
        };
        write_stdout(export::to_yaml(&docs)?.as_bytes())
    }
}

/// What `inject` and `explain` read.
#[derive(Debug, Args)]
pub struct ManifestArgs {
    /// Manifest file (multi-document YAML or JSON; a `kind: List` as `kubectl get -o yaml|json`
    /// prints it), or - for standard input.
    #[arg(short = 'f', long = "filename", value_name = "FILE|-")]
    pub file: PathBuf,
    /// Namespace for documents that name none: where they will be applied. Templates render
    /// per namespace, so `inject` refuses such a document without it (`explain` assumes
    /// "default" and says so).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// A label of the namespace the documents go to (repeatable; for namespaces the input has
    /// no Namespace document for). With labels given, namespace opt-in and revisions are
    /// decided as the chart's webhooks decide them; without, only a pod's own label opts it in.
    #[arg(long = "namespace-label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub namespace_labels: Vec<(String, String)>,
    #[command(flatten)]
    pub config: ConfigArg,
}

/// What `uninject` reads.
#[derive(Debug, Args)]
pub struct UninjectArgs {
    /// Manifest file (multi-document YAML or JSON; a `kind: List` as `kubectl get -o yaml|json`
    /// prints it), or - for standard input.
    #[arg(short = 'f', long = "filename", value_name = "FILE|-")]
    pub file: PathBuf,
    /// Namespace of documents that name none, as given to `inject`: templates render per
    /// namespace, and what they rendered there is what is removed. Without it, "default".
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    #[command(flatten)]
    pub config: ConfigArg,
}

impl UninjectArgs {
    fn run(self) -> anyhow::Result<()> {
        let Self {
            file,
            namespace,
            config,
        } = self;
        let inj = config.load()?;
        let out = uninject::uninject(&inj, &read_text(&file)?, namespace.as_deref());
        // Every document, uninjected or as it came: nothing of the input is lost.
        write_stdout(out.yaml.as_bytes())?;
        write_notes(&out.notes);
        left_as_they_came(&out.errors, "written back as it came", "uninjected")
    }
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

impl ManifestArgs {
    fn target(&self) -> manifest::Target<'_> {
        manifest::Target {
            namespace: self.namespace.as_deref(),
            namespace_labels: (!self.namespace_labels.is_empty())
                .then(|| self.namespace_labels.iter().cloned().collect()),
        }
    }
}

impl Cli {
    /// Runs the command. Errors are returned; `outdated` also has an exit status of its own.
    pub fn run(self) -> anyhow::Result<std::process::ExitCode> {
        let done = match self.command {
            Command::Outdated(args) => return args.run(),
            Command::Check(args) => return args.run(),
            Command::Serve(args) => args.run(),
            Command::Inject(args) => {
                let inj = args.config.load()?;
                let injected = manifest::inject_each(&inj, &read_text(&args.file)?, &args.target());
                // Every document, injected or as it came: nothing of the input is lost.
                write_stdout(injected.yaml.as_bytes())?;
                // After the output, so that it is whole before anyone reads why.
                write_notes(&injected.left_alone);
                write_warnings(&injected.warnings);
                left_as_they_came(&injected.errors, "written back as it came", "injected")
            }
            Command::Review {
                request,
                validate,
                webhook_path,
                config,
            } => {
                let inj = config.load()?;
                let (webhook, entry) = match (webhook_path, validate) {
                    (Some(path), _) => review::route(&path).with_context(|| {
                        let paths: Vec<&str> = review::PATHS.iter().map(|(p, _, _)| *p).collect();
                        format!("no such path {path:?}; use {}", paths.join(", "))
                    })?,
                    (None, true) => (Webhook::Validate, Entry::Pod),
                    (None, false) => (Webhook::Mutate, Entry::Pod),
                };
                let answer = review::answer_for(&inj, webhook, entry, &read_input(&request)?)?;
                write_stdout(&answer.body)?;
                // The bytes are the server's answer exactly; a newline only for a person.
                if std::io::stdout().is_terminal() {
                    write_stdout(b"\n")?;
                }
                Ok(())
            }
            Command::Export(args) => args.run(),
            Command::Uninject(args) => args.run(),
            Command::Explain(args) => {
                let inj = args.config.load()?;
                let explained = explain::explain_for(&inj, &read_text(&args.file)?, &args.target());
                write_stdout(explained.text.as_bytes())?;
                left_as_they_came(&explained.errors, "not explained", "injected")
            }
        };
        done.map(|()| std::process::ExitCode::SUCCESS)
    }
}
