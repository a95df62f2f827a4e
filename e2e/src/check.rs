//! Running `sidecar-injector check` against the suite's installation, and reading its report.

use std::process::Stdio;

use anyhow::Context as _;
use serde_json::Value;

use crate::env::Env;

/// One run of `check -o json`.
#[derive(Debug)]
pub struct CheckRun {
    pub code: i32,
    pub json: Value,
    pub stderr: String,
}

impl CheckRun {
    /// Every finding in `state` (`pass`, `warn`, `fail`, `skip`), as (check, subject, message).
    pub fn in_state(&self, state: &str) -> Vec<(String, String, String)> {
        self.json["checks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["state"] == state)
            .map(|c| {
                let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
                (s("check"), s("subject"), s("message"))
            })
            .collect()
    }

    /// Whether some failure of `check` has `needle` in its subject or message.
    pub fn fails_with(&self, check: &str, needle: &str) -> bool {
        self.in_state("fail").iter().any(|(c, subject, message)| {
            c == check && (subject.contains(needle) || message.contains(needle))
        })
    }
}

/// `sidecar-injector check` for the suite's release, the dry-run pod in `pod_namespace`. The
/// suite's serving certificates last two days: a warning only under one.
pub async fn check(env: &Env, pod_namespace: &str) -> anyhow::Result<CheckRun> {
    check_release(
        env,
        &env.injector_namespace,
        &env.webhook_config,
        pod_namespace,
    )
    .await
}

/// `sidecar-injector check` for the release whose objects are named `release` in `namespace`.
pub async fn check_release(
    env: &Env,
    namespace: &str,
    release: &str,
    pod_namespace: &str,
) -> anyhow::Result<CheckRun> {
    let bin = env.injector_bin.clone().context("no E2E_INJECTOR_BIN")?;
    let out = tokio::process::Command::new(&bin)
        .arg("check")
        .args(["--namespace", namespace])
        .args(["--release", release])
        .args(["--pod-namespace", pod_namespace])
        .args(["--expiry-warning-days", "1"])
        .args(["-o", "json"])
        .stdin(Stdio::null())
        .output()
        .await
        .context("running sidecar-injector check")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json: Value = serde_json::from_str(&stdout).with_context(|| {
        format!(
            "check wrote no JSON: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    Ok(CheckRun {
        code: out.status.code().unwrap_or(-1),
        json,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// A CA no server's certificate chains to, as PEM.
pub fn unrelated_ca() -> anyhow::Result<String> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "not the injector's CA");
    Ok(params.self_signed(&key)?.pem())
}
