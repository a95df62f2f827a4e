//! Whether the cluster runs a Kubernetes this injector supports: the floor, and why it is there.
//! The chart's `kubeVersion` says the same (a test holds the two equal).

use super::{Finding, Got, State, unread};

/// The oldest Kubernetes (major, minor) on which everything the injector adds works, and the
/// oldest the e2e suite runs on.
pub const OLDEST: (u32, u32) = (1, 30);

/// Why [`OLDEST`] is the floor, for a person.
pub const WHY: &str = "both bundled sidecars are native sidecars (on by default from 1.29; before, one is an init container that never exits and every injected pod hangs in Init), and matchConditions and the backstop's ValidatingAdmissionPolicy are GA from 1.30";

/// `major.minor` of a `gitVersion` such as `v1.35.8` or `v1.30.14-gke.1200`.
pub fn parse(git_version: &str) -> Option<(u32, u32)> {
    let mut parts = git_version.strip_prefix('v')?.splitn(3, '.');
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor.parse().ok()?))
}

/// The `kubernetes` line of `check`, from the API server's `/version` (`gitVersion`).
pub fn judge(git_version: &Got<String>) -> Finding {
    let (major, minor) = OLDEST;
    let Some(v) = git_version.found() else {
        return unread(git_version, "kubernetes", "the API server's /version")
            .unwrap_or_else(|| Finding::skip("kubernetes", "the API server", "no version"));
    };
    let subject = format!("Kubernetes {v}");
    match parse(v) {
        Some(found) if found >= OLDEST => Finding::pass(
            "kubernetes",
            subject,
            format!("supported (the oldest supported is {major}.{minor})"),
        ),
        Some(_) => Finding::fail(
            "kubernetes",
            subject,
            format!("older than {major}.{minor}, the oldest this injector supports: {WHY}"),
        )
        .fix(format!(
            "upgrade the cluster to Kubernetes {major}.{minor} or newer"
        )),
        None => Finding::new(
            "kubernetes",
            State::Warn,
            subject,
            format!("cannot tell the minor version; the oldest supported is {major}.{minor}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_judged_against_the_floor() {
        assert_eq!(parse("v1.30.14"), Some((1, 30)));
        assert_eq!(parse("v1.35.8-gke.1200"), Some((1, 35)));
        assert_eq!(parse("v1.29+"), Some((1, 29)));
        assert_eq!(parse("1.30.0"), None);
        let state = |v: &str| judge(&Got::Found(v.to_owned())).state;
        assert_eq!(state("v1.30.0"), State::Pass);
        assert_eq!(state("v1.37.2"), State::Pass);
        assert_eq!(state("v1.29.6"), State::Fail);
        assert_eq!(state("v2"), State::Warn);
        let old = judge(&Got::Found("v1.29.6".into()));
        assert!(old.line().contains("older than 1.30") && old.line().contains("native sidecars"));
        assert_eq!(
            judge(&Got::Forbidden("get /version".into())).state,
            State::Skip
        );
    }

    /// The chart refuses the clusters `check` fails.
    #[test]
    fn the_chart_states_the_same_floor() {
        let chart = include_str!("../../../charts/sidecar-injector/Chart.yaml");
        let (major, minor) = OLDEST;
        let expected = format!("kubeVersion: \">={major}.{minor}.0-0\"");
        assert!(
            chart.lines().any(|l| l == expected),
            "Chart.yaml has no line {expected}"
        );
    }
}
