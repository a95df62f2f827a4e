//! The webhook server: TLS for the API server, a plain admin port, reloads, limits, shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::cli::ConfigArg;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Json,
    Text,
}

/// Flags of `serve`; each is also read from an environment variable.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address of the TLS listener for the API server (POST /mutate, POST /validate).
    #[arg(long, env = "SIDECAR_INJECTOR_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// Address of the plain-HTTP admin listener (GET /livez, /readyz, /metrics).
    #[arg(
        long,
        env = "SIDECAR_INJECTOR_ADMIN_LISTEN",
        default_value = "0.0.0.0:8080"
    )]
    pub admin_listen: SocketAddr,
    /// Serving certificate chain (PEM). Without it, a self-signed development certificate is made.
    #[arg(
        long,
        env = "SIDECAR_INJECTOR_TLS_CERT_FILE",
        value_name = "PATH",
        requires = "tls_key_file"
    )]
    pub tls_cert_file: Option<PathBuf>,
    /// Private key of the serving certificate (PEM).
    #[arg(
        long,
        env = "SIDECAR_INJECTOR_TLS_KEY_FILE",
        value_name = "PATH",
        requires = "tls_cert_file"
    )]
    pub tls_key_file: Option<PathBuf>,
    /// Where the development certificate's CA is written when no certificate is given.
    #[arg(long, env = "SIDECAR_INJECTOR_DEV_CA_FILE", value_name = "PATH")]
    pub dev_ca_file: Option<PathBuf>,
    /// Log format. Default: json when standard error is not a terminal, else text.
    #[arg(long, env = "SIDECAR_INJECTOR_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Largest accepted request body, in bytes (the API server's own request limit is 3 MiB).
    #[arg(long, env = "SIDECAR_INJECTOR_MAX_BODY_BYTES", default_value_t = 6 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Time allowed for a client to send its request headers.
    #[arg(long, env = "SIDECAR_INJECTOR_HEADER_READ_TIMEOUT", value_parser = parse_duration, default_value = "5s")]
    pub header_read_timeout: Duration,
    /// Time allowed for one request, body included (the API server gives up after 30s at most).
    #[arg(long, env = "SIDECAR_INJECTOR_REQUEST_TIMEOUT", value_parser = parse_duration, default_value = "10s")]
    pub request_timeout: Duration,
    /// On SIGTERM, how long in-flight requests may take to finish.
    #[arg(long, env = "SIDECAR_INJECTOR_SHUTDOWN_TIMEOUT", value_parser = parse_duration, default_value = "20s")]
    pub shutdown_timeout: Duration,
    /// How often files are re-checked in case a change notification was missed.
    #[arg(long, env = "SIDECAR_INJECTOR_RELOAD_INTERVAL", value_parser = parse_duration, default_value = "30s")]
    pub reload_interval: Duration,
    #[command(flatten)]
    pub config: ConfigArg,
}

/// Parses `250ms`, `5s`, `2m` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((s, "s"), |i| s.split_at(i));
    let n: f64 = number
        .parse()
        .map_err(|_| format!("invalid duration {s:?} (examples: 250ms, 5s, 2m)"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => return Err(format!("invalid duration unit in {s:?} (use ms, s or m)")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

impl ServeArgs {
    pub fn run(self) -> anyhow::Result<()> {
        anyhow::bail!("serve is not built yet")
    }
}
