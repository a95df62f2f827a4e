//! Whether a webhook's `caBundle` verifies the certificate its server serves, as the API server
//! verifies it (chain to the bundle, valid for the name it dials), and when that certificate
//! expires. The chain comes from the TLS Secret the Deployment mounts, or from a handshake with
//! the url; the time comes from the caller.

use std::sync::Arc;
use std::time::Duration;

use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier as _;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use super::{Finding, Got, State};

/// Below this many days left, an expiry is a warning (`check --expiry-warning-days`).
pub const WARN_DAYS: u32 = 14;

/// A certificate chain a server serves, and where it was read.
#[derive(Clone, Debug)]
pub struct Served {
    /// `Secret sidecar-injector/sidecar-injector-tls` or `the server at 127.0.0.1:8443`.
    pub source: String,
    /// Read from a Secret the chart's Deployment mounts (not from a handshake).
    pub from_secret: bool,
    /// DER, the server's own certificate first.
    pub chain: Got<Vec<Vec<u8>>>,
    /// Issued by the server itself (`certificates.mode=selfManaged`): by which CA, and from
    /// when the server renews it.
    pub managed: Option<Managed>,
}

/// What `check` says of a certificate the server looks after itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Managed {
    /// The subject of the CA that signed it.
    pub issuer: String,
    /// Seconds since the epoch from which the server renews it.
    pub renews_at: i64,
}

/// The Secret the server keeps its own certificate in: the Deployment's first container's
/// `SIDECAR_INJECTOR_CERTIFICATES_SECRET` (`certificates.mode=selfManaged`).
pub fn managed_secret_name(deployment: &k8s_openapi::api::apps::v1::Deployment) -> Option<String> {
    deployment
        .spec
        .iter()
        .flat_map(|s| s.template.spec.iter())
        .flat_map(|s| s.containers.first())
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name == "SIDECAR_INJECTOR_CERTIFICATES_SECRET")
        .and_then(|e| e.value.clone())
}

/// The TLS Secret a Deployment mounts: the `secret` volume named `tls` (the chart's), else the
/// only `secret` volume.
pub fn secret_name(deployment: &k8s_openapi::api::apps::v1::Deployment) -> Option<String> {
    let volumes: Vec<(&str, &str)> = deployment
        .spec
        .iter()
        .flat_map(|s| s.template.spec.iter())
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| {
            let secret = v.secret.as_ref()?.secret_name.as_deref()?;
            Some((v.name.as_str(), secret))
        })
        .collect();
    match volumes.iter().find(|(name, _)| *name == "tls") {
        Some((_, secret)) => Some((*secret).to_owned()),
        None => match volumes.as_slice() {
            [(_, secret)] => Some((*secret).to_owned()),
            _ => None,
        },
    }
}

/// The certificates of a PEM text, as DER.
pub fn pem_chain(pem: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    for cert in CertificateDer::pem_slice_iter(pem) {
        out.push(cert.map_err(|e| format!("not PEM: {e}"))?.to_vec());
    }
    if out.is_empty() {
        return Err("holds no PEM certificate".into());
    }
    Ok(out)
}

/// The host and port of an https url (`https://[::1]:8443/mutate` → `("::1", 8443)`).
pub fn url_host_port(url: &str) -> Option<(String, u16)> {
    let rest = url.strip_prefix("https://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None => 443,
        };
        return Some((host.to_owned(), port));
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => Some((host.to_owned(), port.parse().ok()?)),
        None => Some((authority.to_owned(), 443)),
    }
}

/// Verifies `chain` for `server_name` against the roots in `ca_bundle` (PEM) at `now` (seconds
/// since the epoch), with the signature algorithms of rustls' ring provider.
pub fn verify(
    ca_bundle: &[u8],
    chain: &[Vec<u8>],
    server_name: &str,
    now: u64,
) -> Result<(), String> {
    let mut roots = RootCertStore::empty();
    for der in pem_chain(ca_bundle).map_err(|e| format!("the caBundle {e}"))? {
        roots
            .add(CertificateDer::from(der))
            .map_err(|e| format!("the caBundle holds a certificate that cannot be a root: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| format!("no verifier: {e}"))?;
    let (end, rest) = chain
        .split_first()
        .ok_or("the server serves no certificate")?;
    let intermediates: Vec<CertificateDer<'_>> = rest
        .iter()
        .map(|d| CertificateDer::from(d.as_slice()))
        .collect();
    let name = ServerName::try_from(server_name.to_owned())
        .map_err(|_| format!("{server_name:?} is not a name a certificate can be valid for"))?;
    verifier
        .verify_server_cert(
            &CertificateDer::from(end.as_slice()),
            &intermediates,
            &name,
            &[],
            UnixTime::since_unix_epoch(Duration::from_secs(now)),
        )
        .map(drop)
        .map_err(|e| e.to_string())
}

/// What a certificate says of itself: its subject and the end of its validity (seconds).
pub fn describe(der: &[u8]) -> Result<(String, i64), String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| format!("the served certificate cannot be read: {e}"))?;
    Ok((
        cert.subject().to_string(),
        cert.validity().not_after.timestamp(),
    ))
}

/// Check 3 for one configuration: its `caBundle` verifies the chain served at `server_name`.
/// `reached_by_apiserver`: a dry run was injected, so the API server reached a server even if
/// this machine cannot.
pub fn ca_bundle(
    subject: &str,
    ca_bundle: Option<&[u8]>,
    served: &Served,
    server_name: &str,
    now: u64,
    reached_by_apiserver: bool,
) -> Finding {
    let subject = format!("caBundle of {subject}");
    let chain = match &served.chain {
        Got::Found(chain) => chain,
        Got::Forbidden(right) => {
            return Finding::skip(
                "certificate",
                subject,
                format!("you lack the right to {right}"),
            );
        }
        Got::Missing => {
            return Finding::fail("certificate", subject, format!("{} not found", served.source))
                .fix("the server has no certificate to serve: see certificates.mode in the chart's values");
        }
        Got::Failed(error) if reached_by_apiserver => {
            return Finding::new(
                "certificate",
                State::Warn,
                subject,
                format!(
                    "not verified: {}: {error}; the API server reaches the server (the dry run was injected), this machine does not",
                    served.source
                ),
            );
        }
        Got::Failed(error) => {
            return Finding::fail(
                "certificate",
                subject,
                format!("{}: {error}", served.source),
            )
            .fix("is the server running? (its logs, its pods)");
        }
    };
    let Some(bundle) = ca_bundle.filter(|b| !b.is_empty()) else {
        return Finding::skip(
            "certificate",
            subject,
            "the entry has no caBundle: the API server verifies the server with its own system roots",
        );
    };
    match verify(bundle, chain, server_name, now) {
        Ok(()) => Finding::pass(
            "certificate",
            subject,
            format!(
                "verifies the certificate served for {server_name} (read from {})",
                served.source
            ),
        ),
        Err(error) => Finding::fail(
            "certificate",
            subject,
            format!(
                "does not verify the certificate served for {server_name} (read from {}): {error}",
                served.source
            ),
        )
        .fix("the API server refuses to call the server: set the caBundle to the CA that signed the serving certificate (helm upgrade; with cert-manager, see its cainjector)"),
    }
}

/// Check 3, expiry: when the served certificate ends; a warning under `warn_days` days left.
/// `None` when nothing was read (the caBundle finding says why).
pub fn expiry(served: &Served, now: u64, warn_days: u32) -> Option<Finding> {
    let chain = served.chain.found()?;
    let subject = format!("certificate of {}", served.source);
    let end = chain.first()?;
    let (name, not_after) = match describe(end) {
        Ok(d) => d,
        Err(error) => return Some(Finding::fail("expiry", subject, error)),
    };
    let left = not_after - i64::try_from(now).unwrap_or(i64::MAX);
    let days = left.div_euclid(86_400);
    let when_of = |at: i64| {
        k8s_openapi::jiff::Timestamp::from_second(at)
            .map(|t| t.strftime("%Y-%m-%d %H:%M UTC").to_string())
            .unwrap_or_else(|_| at.to_string())
    };
    let when = when_of(not_after);
    let renew = if served.managed.is_some() {
        "the server renews it itself (certificates.mode=selfManaged): its log and sidecar_injector_certificate_steps_total{result=\"error\"} say why it has not"
    } else if served.from_secret {
        "renew it (certificates.mode=selfSigned: delete the Secret and helm upgrade; cert-manager renews by itself: see its Certificate's status)"
    } else {
        "renew the server's certificate (the server reloads it in place)"
    };
    let mut in_days = format!(
        "{name} expires on {when}, in {days} day{}",
        if days == 1 { "" } else { "s" }
    );
    if let Some(m) = &served.managed {
        in_days.push_str(&format!(
            "; issued by the server's CA {}, which renews it from {}",
            m.issuer,
            when_of(m.renews_at)
        ));
    }
    Some(if left <= 0 {
        Finding::fail("expiry", subject, format!("{name} expired on {when}")).fix(renew)
    } else if days < i64::from(warn_days) {
        Finding::new("expiry", State::Warn, subject, in_days).fix(renew)
    } else {
        Finding::pass("expiry", subject, in_days)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Pki {
        ca_pem: String,
        chain: Vec<Vec<u8>>,
    }

    /// A CA, and a serving certificate it signs for `name`, valid from 2020 to 2030.
    fn pki(name: &str) -> Pki {
        let ca_key = rcgen::KeyPair::generate().expect("key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).expect("ca");
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(vec![name.to_owned()]).expect("params");
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2030, 1, 1);
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let cert = params.signed_by(&key, &issuer).expect("cert");
        Pki {
            ca_pem: ca.pem(),
            chain: vec![cert.der().to_vec()],
        }
    }

    /// 2030-01-01T00:00:00Z, the end of every test certificate.
    const END: u64 = 1_893_456_000;
    const DAY: u64 = 86_400;

    fn served(chain: Vec<Vec<u8>>) -> Served {
        Served {
            managed: None,
            source: "Secret si/sidecar-injector-tls".into(),
            from_secret: true,
            chain: Got::Found(chain),
        }
    }

    #[test]
    fn the_right_bundle_verifies_and_a_wrong_one_does_not() {
        let now = END - 365 * DAY;
        let good = pki("sidecar-injector.si.svc");
        let other = pki("sidecar-injector.si.svc");
        let s = served(good.chain.clone());
        let ok = ca_bundle(
            "M",
            Some(good.ca_pem.as_bytes()),
            &s,
            "sidecar-injector.si.svc",
            now,
            false,
        );
        assert_eq!(ok.state, State::Pass, "{}", ok.line());
        let wrong = ca_bundle(
            "M",
            Some(other.ca_pem.as_bytes()),
            &s,
            "sidecar-injector.si.svc",
            now,
            false,
        );
        assert_eq!(wrong.state, State::Fail);
        assert!(wrong.line().contains("does not verify"), "{}", wrong.line());
        let name = ca_bundle(
            "M",
            Some(good.ca_pem.as_bytes()),
            &s,
            "other.si.svc",
            now,
            false,
        );
        assert_eq!(name.state, State::Fail, "{}", name.line());
    }

    #[test]
    fn expiry_warns_under_two_weeks_and_fails_when_past() {
        let p = pki("a.b.svc");
        assert_eq!(describe(&p.chain[0]).map(|d| d.1), Ok(END as i64));
        let soon = expiry(&served(p.chain.clone()), END - 3 * DAY, WARN_DAYS).expect("a finding");
        assert_eq!(soon.state, State::Warn, "{}", soon.line());
        assert!(
            soon.message
                .ends_with("expires on 2030-01-01 00:00 UTC, in 3 days"),
            "{}",
            soon.message
        );
        let past = expiry(&served(p.chain.clone()), END + DAY, WARN_DAYS).expect("a finding");
        assert_eq!(past.state, State::Fail, "{}", past.line());
        let later =
            expiry(&served(p.chain.clone()), END - 100 * DAY, WARN_DAYS).expect("a finding");
        assert_eq!(later.state, State::Pass);
        // An expired certificate does not verify either.
        let v = ca_bundle(
            "M",
            Some(p.ca_pem.as_bytes()),
            &served(p.chain),
            "a.b.svc",
            END + DAY,
            false,
        );
        assert_eq!(v.state, State::Fail);
    }

    #[test]
    fn a_self_managed_certificate_says_who_issued_it_and_when_it_renews() {
        let p = pki("a.b.svc");
        let mut s = served(p.chain);
        s.managed = Some(Managed {
            issuer: "CN=sidecar-injector CA 1".into(),
            renews_at: END as i64 - 10 * DAY as i64,
        });
        let later = expiry(&s, END - 100 * DAY, WARN_DAYS).expect("a finding");
        assert_eq!(later.state, State::Pass);
        assert!(
            later.message.ends_with(
                "in 100 days; issued by the server's CA CN=sidecar-injector CA 1, which renews it from 2029-12-22 00:00 UTC"
            ),
            "{}",
            later.message
        );
        let soon = expiry(&s, END - 3 * DAY, WARN_DAYS).expect("a finding");
        assert!(soon.line().contains("selfManaged"), "{}", soon.line());
    }

    #[test]
    fn an_unreachable_url_fails_unless_the_api_server_reached_it() {
        let s = Served {
            managed: None,
            source: "the server at 127.0.0.1:8443".into(),
            from_secret: false,
            chain: Got::Failed("connection refused".into()),
        };
        assert_eq!(
            ca_bundle("M", Some(b"x"), &s, "127.0.0.1", END, false).state,
            State::Fail
        );
        assert_eq!(
            ca_bundle("M", Some(b"x"), &s, "127.0.0.1", END, true).state,
            State::Warn
        );
        assert!(expiry(&s, END, WARN_DAYS).is_none());
        // One day left is fine when asked to warn under one.
        let p = pki("a.b.svc");
        let one = expiry(&served(p.chain), END - DAY - 60, 1).expect("a finding");
        assert_eq!(
            one.line(),
            "✓ certificate of Secret si/sidecar-injector-tls: CN=rcgen self signed cert expires on 2030-01-01 00:00 UTC, in 1 day"
        );
    }

    #[test]
    fn urls_give_their_host_and_port() {
        assert_eq!(
            url_host_port("https://127.0.0.1:8443/mutate"),
            Some(("127.0.0.1".into(), 8443))
        );
        assert_eq!(url_host_port("https://[::1]:9/x"), Some(("::1".into(), 9)));
        assert_eq!(
            url_host_port("https://hooks.example.com/m"),
            Some(("hooks.example.com".into(), 443))
        );
        assert_eq!(url_host_port("http://x"), None);
    }
}
