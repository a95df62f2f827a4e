//! The Secret's next contents for a step of the [`plan`](super::plan): a new CA and serving
//! certificate, a successor CA added, a serving certificate renewed, an old CA dropped. Keys
//! are ECDSA P-256 (rcgen's default); certificates start [`BACKDATE`] before `now`.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use super::plan::{self, BACKDATE, Ca, Policy, Step};
use super::stored::{self, CA_CRT, CA_KEY, Pems};

/// What the Secret is to hold, as PEM text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Contents {
    pub ca_crt: String,
    pub ca_key: String,
    pub tls_crt: String,
    pub tls_key: String,
}

/// The contents after `step`, from what the Secret holds now (`pems`); `None` for the steps
/// that do not write the Secret (mending bundles, waiting).
pub fn take(
    step: &Step,
    pems: Pems<'_>,
    names: &[String],
    policy: &Policy,
    now: i64,
) -> Result<Option<Contents>, String> {
    let text = |bytes: &[u8], what: &str| {
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("{what} is not PEM text"))
    };
    let contents = match step {
        Step::MendBundles | Step::Wait { .. } => return Ok(None),
        Step::Issue { .. } => {
            let (ca, ca_key) = new_ca(policy, now)?;
            let (tls_crt, tls_key) = new_serving(&ca, &ca_key, names, policy, now)?;
            Contents {
                ca_crt: ca.pem,
                ca_key: ca_key.serialize_pem(),
                tls_crt,
                tls_key,
            }
        }
        Step::AddCa => {
            let (ca, ca_key) = new_ca(policy, now)?;
            let mut ca_crt = text(pems.ca_crt, CA_CRT)?;
            if !ca_crt.ends_with('\n') {
                ca_crt.push('\n');
            }
            ca_crt.push_str(&ca.pem);
            Contents {
                ca_crt,
                ca_key: ca_key.serialize_pem(),
                tls_crt: text(pems.tls_crt, stored::TLS_CRT)?,
                tls_key: text(pems.tls_key, stored::TLS_KEY)?,
            }
        }
        Step::RenewServing { .. } => {
            let ca_key = text(pems.ca_key, CA_KEY)?;
            let key = KeyPair::from_pem(&ca_key).map_err(|e| format!("{CA_KEY}: {e}"))?;
            let ca = signer(pems.ca_crt, &key)?;
            let (tls_crt, tls_key) = new_serving(&ca, &key, names, policy, now)?;
            Contents {
                ca_crt: text(pems.ca_crt, CA_CRT)?,
                ca_key,
                tls_crt,
                tls_key,
            }
        }
        Step::DropCa { id } => {
            let ca_crt = text(pems.ca_crt, CA_CRT)?;
            let kept: String = blocks(&ca_crt)
                .filter(|block| stored::ids(block.as_bytes()).first() != Some(id))
                .collect();
            Contents {
                ca_crt: kept,
                ca_key: text(pems.ca_key, CA_KEY)?,
                tls_crt: text(pems.tls_crt, stored::TLS_CRT)?,
                tls_key: text(pems.tls_key, stored::TLS_KEY)?,
            }
        }
    };
    Ok(Some(contents))
}

/// A CA of the bundle with its PEM text.
struct CaPem {
    ca: Ca,
    pem: String,
}

fn time(at: i64) -> Result<time::OffsetDateTime, String> {
    time::OffsetDateTime::from_unix_timestamp(at).map_err(|e| e.to_string())
}

fn new_ca(policy: &Policy, now: i64) -> Result<(CaPem, KeyPair), String> {
    let err = |e: rcgen::Error| format!("cannot make a CA: {e}");
    let key = KeyPair::generate().map_err(err)?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    // Each CA its own name: with two in the bundle, a verifier finds the right one by it.
    params
        .distinguished_name
        .push(DnType::CommonName, format!("sidecar-injector CA {now}"));
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = time(now - BACKDATE)?;
    params.not_after = time(now + policy.ca_lifetime)?;
    let cert = params.self_signed(&key).map_err(err)?;
    let ca = Ca {
        id: stored::id(cert.der()),
        not_before: now - BACKDATE,
        not_after: now + policy.ca_lifetime,
    };
    Ok((
        CaPem {
            ca,
            pem: cert.pem(),
        },
        key,
    ))
}

/// The CA of `ca_crt` whose key `key` is.
fn signer(ca_crt: &[u8], key: &KeyPair) -> Result<CaPem, String> {
    use rcgen::PublicKeyData as _;
    let spki = key.subject_public_key_info();
    let text = std::str::from_utf8(ca_crt).map_err(|_| format!("{CA_CRT} is not PEM text"))?;
    for block in blocks(text) {
        let ders = stored::certificates(block.as_bytes()).map_err(|e| format!("{CA_CRT}: {e}"))?;
        let Some(der) = ders.first() else { continue };
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
            continue;
        };
        if cert.public_key().raw == spki.as_slice() {
            return Ok(CaPem {
                ca: Ca {
                    id: stored::id(der),
                    not_before: cert.validity().not_before.timestamp(),
                    not_after: cert.validity().not_after.timestamp(),
                },
                pem: block.to_owned(),
            });
        }
    }
    Err(format!("no certificate of {CA_CRT} is {CA_KEY}'s"))
}

fn new_serving(
    ca: &CaPem,
    ca_key: &KeyPair,
    names: &[String],
    policy: &Policy,
    now: i64,
) -> Result<(String, String), String> {
    let err = |e: rcgen::Error| format!("cannot make the serving certificate: {e}");
    let issuer = Issuer::from_ca_cert_pem(&ca.pem, ca_key).map_err(err)?;
    let key = KeyPair::generate().map_err(err)?;
    let mut params = CertificateParams::new(names.to_vec()).map_err(err)?;
    params.distinguished_name.push(
        DnType::CommonName,
        names.first().map_or("sidecar-injector", String::as_str),
    );
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = time(now - BACKDATE)?;
    params.not_after = time(plan::serving_not_after(policy, &ca.ca, now))?;
    let cert = params.signed_by(&key, &issuer).map_err(err)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// The PEM blocks of a text, each with its own end line.
fn blocks(text: &str) -> impl Iterator<Item = &str> {
    const END: &str = "-----END CERTIFICATE-----";
    let mut rest = text;
    std::iter::from_fn(move || {
        let start = rest.find("-----BEGIN CERTIFICATE-----")?;
        let end = rest[start..].find(END)? + start + END.len();
        let end = if rest[end..].starts_with('\n') {
            end + 1
        } else {
            end
        };
        let block = &rest[start..end];
        rest = &rest[end..];
        Some(block)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs::stored::read;

    const NOW: i64 = 1_800_000_000;

    fn names() -> Vec<String> {
        vec!["injector.ns.svc".to_owned(), "127.0.0.1".to_owned()]
    }

    fn pems(c: &Contents) -> Pems<'_> {
        Pems {
            ca_crt: c.ca_crt.as_bytes(),
            ca_key: c.ca_key.as_bytes(),
            tls_crt: c.tls_crt.as_bytes(),
            tls_key: c.tls_key.as_bytes(),
        }
    }

    fn step(step: &Step, from: &Contents, now: i64) -> Contents {
        take(step, pems(from), &names(), &Policy::default(), now)
            .unwrap()
            .unwrap()
    }

    fn issued() -> Contents {
        let why = "test".to_owned();
        take(
            &Step::Issue { why },
            Pems::default(),
            &names(),
            &Policy::default(),
            NOW,
        )
        .unwrap()
        .unwrap()
    }

    #[test]
    fn an_issued_secret_reads_back_as_a_signer_and_its_serving_certificate() {
        let c = issued();
        let s = read(pems(&c), &names()).unwrap();
        assert_eq!(s.bundle.len(), 1);
        assert_eq!(s.signer, Some(s.bundle[0].id));
        let serving = s.serving.unwrap();
        assert_eq!(serving.issuer, Some(s.bundle[0].id));
        assert!(serving.names_ok && serving.key_ok);
        assert_eq!(serving.not_before, NOW - BACKDATE);
        assert_eq!(serving.not_after, NOW + Policy::default().serving_lifetime);
        assert_eq!(
            plan::next(
                &Policy::default(),
                &plan::Observed {
                    stored: Ok(&read(pems(&c), &names()).unwrap()),
                    trusted: &[stored::ids(c.ca_crt.as_bytes())],
                    now: NOW,
                }
            ),
            Step::Wait { until: NOW + 30 }
        );
    }

    #[test]
    fn a_name_missing_or_a_key_swapped_is_seen() {
        let c = issued();
        let more = [names(), vec!["other.svc".to_owned()]].concat();
        let s = read(pems(&c), &more).unwrap();
        assert!(!s.serving.unwrap().names_ok);
        let other = issued();
        let swapped = Pems {
            tls_key: other.tls_key.as_bytes(),
            ..pems(&c)
        };
        let s = read(swapped, &names()).unwrap();
        assert!(!s.serving.as_ref().unwrap().key_ok);
        // A CA key of another CA: no signer.
        let foreign = Pems {
            ca_key: other.ca_key.as_bytes(),
            ..pems(&c)
        };
        assert_eq!(read(foreign, &names()).unwrap().signer, None);
        assert!(
            read(Pems::default(), &names())
                .unwrap_err()
                .contains("no ca.crt")
        );
        let garbage = Pems {
            ca_crt: b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            ..pems(&c)
        };
        assert!(read(garbage, &names()).is_err());
    }

    #[test]
    fn a_roll_over_adds_switches_and_drops_with_the_serving_certificate_always_verified() {
        let first = issued();
        let old = read(pems(&first), &names()).unwrap().bundle[0].id;
        let later = NOW + 300 * 86_400;
        let added = step(&Step::AddCa, &first, later);
        let s = read(pems(&added), &names()).unwrap();
        assert_eq!(s.bundle.len(), 2);
        assert_eq!(s.bundle[0].id, old, "the old CA stays first");
        let new = s.bundle[1].id;
        assert_eq!(s.signer, Some(new));
        assert_eq!(
            s.serving.as_ref().unwrap().issuer,
            Some(old),
            "served as before"
        );
        assert_eq!(added.tls_crt, first.tls_crt);
        let why = "switch";
        let switched = step(&Step::RenewServing { why }, &added, later + 10);
        let s = read(pems(&switched), &names()).unwrap();
        assert_eq!(s.serving.as_ref().unwrap().issuer, Some(new));
        assert!(s.serving.as_ref().unwrap().key_ok);
        assert_eq!(switched.ca_crt, added.ca_crt);
        let dropped = step(&Step::DropCa { id: old }, &switched, later + 400);
        let s = read(pems(&dropped), &names()).unwrap();
        assert_eq!(s.bundle.iter().map(|c| c.id).collect::<Vec<_>>(), [new]);
        assert_eq!(s.serving.unwrap().issuer, Some(new));
        assert_eq!(dropped.tls_crt, switched.tls_crt);
    }

    #[test]
    fn a_serving_certificate_never_outlives_its_signer() {
        let first = issued();
        let near_end = NOW + 360 * 86_400;
        let renewed = step(&Step::RenewServing { why: "end" }, &first, near_end);
        let s = read(pems(&renewed), &names()).unwrap();
        assert_eq!(s.serving.unwrap().not_after, s.bundle[0].not_after);
    }

    #[test]
    fn steps_that_write_nothing_make_no_contents() {
        let c = issued();
        for s in [Step::MendBundles, Step::Wait { until: NOW }] {
            assert_eq!(
                take(&s, pems(&c), &names(), &Policy::default(), NOW),
                Ok(None)
            );
        }
    }
}
