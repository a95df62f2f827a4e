//! Command-line interface: `serve`, `inject`, `review`, `explain`.

use std::io::{IsTerminal as _, Read as _, Write as _};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};

use crate::review::Webhook;

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
    Serve(crate::server::ServeArgs),
    /// Inject sidecars into manifests (multi-document YAML) and print the result.
    Inject(ManifestArgs),
    /// Answer a captured AdmissionReview exactly as the server would.
    Review {
        /// AdmissionReview file (JSON), or - for standard input.
        #[arg(long, value_name = "FILE|-")]
        request: PathBuf,
        /// Answer as the validating webhook instead of the mutating one.
        #[arg(long)]
        validate: bool,
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Explain, for each pod or pod template, whether it is injected, why, and what is added.
    Explain(ManifestArgs),
}

/// What `inject` and `explain` read.
#[derive(Debug, Args)]
pub struct ManifestArgs {
    /// Manifest file (multi-document YAML), or - for standard input.
    #[arg(short = 'f', long = "filename", value_name = "FILE|-")]
    pub file: PathBuf,
    /// Namespace for documents that name none: where they will be applied. Templates render
    /// per namespace, so `inject` refuses such a document without it (`explain` assumes
    /// "default" and says so).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    #[command(flatten)]
    pub config: ConfigArg,
}

/// The configuration flag every subcommand shares.
#[derive(Clone, Debug, Args)]
pub struct ConfigArg {
    /// Configuration file (YAML). Default: the embedded configuration and bundled templates.
    #[arg(long = "config", env = "SIDECAR_INJECTOR_CONFIG", value_name = "PATH")]
    pub path: Option<PathBuf>,
}

impl ConfigArg {
    pub fn load(&self) -> anyhow::Result<crate::config::Injector> {
        Ok(crate::load::injector(self.path.as_deref())?)
    }
}

fn read_input(path: &Path) -> anyhow::Result<Vec<u8>> {
    if path == Path::new("-") {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .context("cannot read standard input")?;
        Ok(buf)
    } else {
        std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
    }
}

fn read_text(path: &Path) -> anyhow::Result<String> {
    String::from_utf8(read_input(path)?)
        .with_context(|| format!("{} is not UTF-8 text", path.display()))
}

fn write_stdout(bytes: &[u8]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)?;
    out.flush()?;
    Ok(())
}

impl Cli {
    pub fn run(self) -> anyhow::Result<()> {
        match self.command {
            Command::Serve(args) => args.run(),
            Command::Inject(ManifestArgs {
                file,
                namespace,
                config,
            }) => {
                let inj = config.load()?;
                let output =
                    crate::manifest::inject(&inj, &read_text(&file)?, namespace.as_deref())?;
                write_stdout(output.as_bytes())
            }
            Command::Review {
                request,
                validate,
                config,
            } => {
                let inj = config.load()?;
                let webhook = if validate {
                    Webhook::Validate
                } else {
                    Webhook::Mutate
                };
                let answer = crate::review::answer(&inj, webhook, &read_input(&request)?)?;
                write_stdout(&answer.body)?;
                // The bytes are the server's answer exactly; a newline only for a person.
                if std::io::stdout().is_terminal() {
                    write_stdout(b"\n")?;
                }
                Ok(())
            }
            Command::Explain(ManifestArgs {
                file,
                namespace,
                config,
            }) => {
                let inj = config.load()?;
                write_stdout(
                    crate::explain::explain(&inj, &read_text(&file)?, namespace.as_deref())?
                        .as_bytes(),
                )
            }
        }
    }
}
