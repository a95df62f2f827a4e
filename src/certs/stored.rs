//! What the TLS Secret holds, read into what [`plan`](super::plan) decides on: the CAs of
//! `ca.crt`, which of them `ca.key` belongs to, and the serving certificate of `tls.crt` —
//! who signed it, whether `tls.key` is its key and whether it names every address the API
//! server dials.

use core::net::IpAddr;

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;
use sha2::{Digest as _, Sha256};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;

use super::plan::{Ca, Serving, Stored};

/// The Secret's data keys.
pub const CA_CRT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const TLS_CRT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";

/// The Secret's four PEM values, as bytes; a missing key is empty.
#[derive(Clone, Copy, Debug, Default)]
pub struct Pems<'a> {
    pub ca_crt: &'a [u8],
    pub ca_key: &'a [u8],
    pub tls_crt: &'a [u8],
    pub tls_key: &'a [u8],
}

/// The certificates of a PEM text, in order; an unreadable block is an error.
pub fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())
}

/// What a webhook's `caBundle` is compared by: the SHA-256 of each certificate's DER. An
/// unreadable bundle trusts nothing.
pub fn ids(pem: &[u8]) -> Vec<[u8; 32]> {
    certificates(pem)
        .unwrap_or_default()
        .iter()
        .map(|der| id(der))
        .collect()
}

pub fn id(der: &[u8]) -> [u8; 32] {
    Sha256::digest(der).into()
}

/// The public key (SubjectPublicKeyInfo, DER) of a PEM private key.
fn public_key(key_pem: &[u8]) -> Option<Vec<u8>> {
    use rcgen::PublicKeyData as _;
    let pem = std::str::from_utf8(key_pem).ok()?;
    rcgen::KeyPair::from_pem(pem)
        .ok()
        .map(|k| k.subject_public_key_info())
}

/// Reads the Secret. `Err` says why nothing usable is stored (no CA at all); a missing or
/// unfit serving certificate or CA key is read as such, for the plan to renew.
pub fn read(pems: Pems<'_>, names: &[String]) -> Result<Stored, String> {
    if pems.ca_crt.is_empty() {
        return Err(format!("the Secret has no {CA_CRT}"));
    }
    let ders = certificates(pems.ca_crt).map_err(|e| format!("{CA_CRT}: {e}"))?;
    let mut cas = Vec::with_capacity(ders.len());
    for der in &ders {
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| format!("{CA_CRT}: not a certificate: {e}"))?;
        cas.push((id(der), cert));
    }
    if cas.is_empty() {
        return Err(format!("{CA_CRT} holds no certificate"));
    }
    let bundle = cas
        .iter()
        .map(|(id, cert)| Ca {
            id: *id,
            not_before: cert.validity().not_before.timestamp(),
            not_after: cert.validity().not_after.timestamp(),
        })
        .collect();
    let ca_key = public_key(pems.ca_key);
    let signer = cas
        .iter()
        .find(|(_, cert)| ca_key.as_deref() == Some(cert.public_key().raw))
        .map(|(id, _)| *id);
    Ok(Stored {
        bundle,
        signer,
        serving: serving(pems, &cas, names),
    })
}

fn serving(
    pems: Pems<'_>,
    cas: &[([u8; 32], X509Certificate<'_>)],
    names: &[String],
) -> Option<Serving> {
    let ders = certificates(pems.tls_crt).ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(ders.first()?).ok()?;
    let issuer = cas
        .iter()
        .find(|(_, ca)| cert.verify_signature(Some(ca.public_key())).is_ok())
        .map(|(id, _)| *id);
    Some(Serving {
        issuer,
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        names_ok: names.iter().all(|name| names_one(&cert, name)),
        key_ok: public_key(pems.tls_key).as_deref() == Some(cert.public_key().raw),
    })
}

/// Whether the certificate's subject alternative names hold `name` (a DNS name, or an IP
/// address when it reads as one).
fn names_one(cert: &X509Certificate<'_>, name: &str) -> bool {
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return false;
    };
    let ip: Option<IpAddr> = name.parse().ok();
    san.value.general_names.iter().any(|general| match general {
        GeneralName::DNSName(dns) => ip.is_none() && dns.eq_ignore_ascii_case(name),
        GeneralName::IPAddress(bytes) => ip.is_some_and(|ip| match ip {
            IpAddr::V4(v4) => *bytes == v4.octets(),
            IpAddr::V6(v6) => *bytes == v6.octets(),
        }),
        _ => false,
    })
}
