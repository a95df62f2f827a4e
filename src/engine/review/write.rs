//! Writing an answer's bytes: the common answers (allowed, with a patch, warnings, audit
//! annotations) written directly, every other answer encoded by serde.

use base64::Engine as _;
use kube::core::Status;
use kube::core::admission::AdmissionResponse;

use crate::engine::inject::Patch;

/// The response to a request before anything is decided: allowed, nothing to say.
pub(super) fn base(api_version: &str, uid: &str) -> AdmissionResponse {
    let mut response = AdmissionResponse::invalid("");
    response.types.api_version = api_version.to_owned();
    response.uid = uid.to_owned();
    response.allowed = true;
    response.result = Status::default();
    response
}

pub(super) fn deny(
    response: AdmissionResponse,
    code: u16,
    reason: &str,
    message: String,
) -> AdmissionResponse {
    let mut response = response.deny(message);
    response.result = Status::failure(&response.result.message, reason).with_code(code);
    response
}

pub(super) fn warn(mut response: AdmissionResponse, warnings: Vec<String>) -> AdmissionResponse {
    if !warnings.is_empty() {
        response
            .warnings
            .get_or_insert_with(Vec::new)
            .extend(warnings);
    }
    response
}

/// The response review's bytes, with the patch (its JSON) written in base64. An allowed
/// response (every answer with a patch) is written straight into one buffer
/// ([`write_allowed`]); any other goes through [`encode`]. Both write the same bytes for the
/// same response (a test holds them equal).
pub fn finish(response: AdmissionResponse, patch: Option<&Patch<'_>>) -> Vec<u8> {
    if !response.allowed || response.result != Status::default() {
        return encode(response);
    }
    let audit: Vec<(&str, &str)> = response
        .audit_annotations
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    write_allowed(
        &Allowed {
            api_version: &response.types.api_version,
            uid: &response.uid,
            audit: &audit,
            warnings: response.warnings.as_deref().unwrap_or_default(),
        },
        patch,
    )
}

/// An allowed response, borrowed: what [`write_allowed`] writes. An injection's answer is
/// written from this directly, without building kube's `AdmissionResponse` (its strings, its
/// failure `Status` to be replaced, its audit map: about seven allocations a review).
pub(super) struct Allowed<'a> {
    pub(super) api_version: &'a str,
    pub(super) uid: &'a str,
    pub(super) audit: &'a [(&'a str, &'a str)],
    /// None are written when empty.
    pub(super) warnings: &'a [String],
}

/// An allowed response review, the patch encoded into the same buffer in one SIMD pass.
pub(super) fn write_allowed(a: &Allowed<'_>, patch: Option<&Patch<'_>>) -> Vec<u8> {
    let patch_len = patch.map_or(0, |p| p.len().div_ceil(3) * 4);
    let mut out = Vec::with_capacity(256 + patch_len + a.uid.len());
    out.extend_from_slice(br#"{"apiVersion":"#);
    json_str(&mut out, a.api_version);
    out.extend_from_slice(br#","kind":"AdmissionReview","response":{"uid":"#);
    json_str(&mut out, a.uid);
    out.extend_from_slice(br#","allowed":true,"status":{}"#);
    if patch.is_some() {
        out.extend_from_slice(br#","patchType":"JSONPatch""#);
    }
    if !a.audit.is_empty() {
        out.extend_from_slice(br#","auditAnnotations":{"#);
        for (i, (k, v)) in a.audit.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            json_str(&mut out, k);
            out.push(b':');
            json_str(&mut out, v);
        }
        out.push(b'}');
    }
    if !a.warnings.is_empty() {
        out.extend_from_slice(br#","warnings":["#);
        for (i, w) in a.warnings.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            json_str(&mut out, w);
        }
        out.push(b']');
    }
    if let Some(patch) = patch {
        out.extend_from_slice(br#","patch":""#);
        patch.base64_into(&mut out);
        out.push(b'"');
    }
    out.extend_from_slice(b"}}");
    out
}

fn json_str(out: &mut Vec<u8>, s: &str) {
    crate::engine::json::write_str(out, s);
}

/// Serializes a response review. The patch goes out base64-encoded, as the API documents
/// `[]byte` fields; key order is fixed, so the same review always gives the same bytes.
pub fn encode(mut response: AdmissionResponse) -> Vec<u8> {
    let patch = response.patch.take();
    let mut review = response.into_review();
    // Echoed from the request, which a damaged review may have left empty.
    review.types.kind = "AdmissionReview".to_owned();
    let mut value = serde_json::to_value(&review).unwrap_or_default();
    if let (Some(patch), Some(r)) = (
        patch,
        value.get_mut("response").and_then(|r| r.as_object_mut()),
    ) {
        r.insert(
            "patch".into(),
            base64::engine::general_purpose::STANDARD
                .encode(patch)
                .into(),
        );
        r.insert("patchType".into(), "JSONPatch".into());
    }
    serde_json::to_vec(&value).unwrap_or_default()
}
