//! `check`, the judging half: whether a live installation works, from the objects the CLI read.
//!
//! - [`webhooks`]: the two webhook configurations and their entries, the Service's ready
//!   endpoints, and the other mutating webhooks that see the same pods (and their order).
//! - [`tls`]: whether each `caBundle` verifies the certificate the server serves, and when that
//!   certificate expires.
//! - [`backstop`]: whether the backstop is the export of the running configuration.
//! - [`probe`]: the opted-in pod a dry run creates, and what its answer says.
//!
//! Pure: fetched objects (or why they could not be fetched) and the time in, one [`Finding`]
//! per line out. The API calls, the TLS handshake and the clock are in `crate::cli::check`.

pub mod backstop;
pub mod probe;
pub mod tls;
pub mod webhooks;

use serde::Serialize;

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
    /// Which check (`webhooks`, `endpoints`, `certificate`, `expiry`, `backstop`, `dryRun`,
    /// `otherWebhooks`, `config`).
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
