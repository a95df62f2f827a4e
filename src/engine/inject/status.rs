//! The status annotation: which templates a pod got, a hash of what they rendered, and what
//! of the pod the rendering saw; serialized once per distinct status.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::engine::config::Injector;
use crate::engine::context::{Seen, SeenNames};
use crate::engine::template::{Fragment, Quoted};

/// One rendered template.
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    pub name: String,
    pub fragment: Arc<Fragment>,
}

/// The status annotation's value.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct Status {
    pub templates: Vec<String>,
    pub hash: String,
    /// The digest of the configuration that injected the pod ([`Injector::digest`]): the
    /// backstop holds the pod to the contract of its own export only under the same one.
    /// Absent in a status written before it existed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub config: String,
    /// Sidecar names the pod already had when it was first injected: the injector left those
    /// containers alone, so the validator does not hold them to the template.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<String>,
    /// The revision of the installation that injected the pod; absent for the default one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub revision: String,
    /// What of the pod the rendering saw, so that the validator and a reinvocation render from
    /// the same containers and volumes, whatever was added to the pod after us. Always written
    /// (`{}` when it saw nothing); absent only in a status written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Seen>,
}

/// The status annotation's value, serialized once per distinct status: the pods of one shape
/// given the same renderings carry the same bytes. The key writes every part with its length,
/// so that two statuses share a key only when they are equal.
pub(crate) fn status_json(
    inj: &Injector,
    templates: &[Rendered],
    hash: String,
    kept: Vec<String>,
    revision: &str,
    seen: &impl SeenNames,
) -> Arc<Quoted> {
    fn put(key: &mut Vec<u8>, text: &str) {
        key.extend_from_slice(&(text.len() as u64).to_le_bytes());
        key.extend_from_slice(text.as_bytes());
    }
    fn list<'s>(key: &mut Vec<u8>, texts: impl ExactSizeIterator<Item = &'s str>) {
        key.extend_from_slice(&(texts.len() as u64).to_le_bytes());
        texts.for_each(|text| put(key, text));
    }
    let mut key = Vec::with_capacity(256);
    list(&mut key, templates.iter().map(|t| t.name.as_str()));
    put(&mut key, &hash);
    list(&mut key, kept.iter().map(String::as_str));
    put(&mut key, revision);
    // Every list of the `Seen` a status records, so that none can be left out of the key.
    for l in 0..3 {
        list(&mut key, (0..seen.len(l)).map(|i| seen.name(l, i)));
    }
    inj.templates.quoted_with(key, || {
        serde_json::to_string(&Status {
            templates: templates.iter().map(|t| t.name.clone()).collect(),
            hash,
            config: inj.digest.clone(),
            kept,
            revision: revision.to_owned(),
            context: Some(seen.to_seen()),
        })
        .unwrap_or_default()
    })
}

/// A short hash of what the templates rendered, for the status annotation.
pub(crate) fn fragment_hash(inj: &Injector, templates: &[Rendered]) -> String {
    let mut input = Vec::with_capacity(templates.len() * 48);
    for t in templates {
        input.extend_from_slice(t.name.as_bytes());
        input.push(0);
        input.extend_from_slice(&t.fragment.digest);
    }
    // The same templates rendering the same fragments: the digest is remembered.
    let digest = inj.templates.digest_with(input, |input| {
        let sum = Sha256::digest(input);
        sum[..8].iter().map(|b| format!("{b:02x}")).collect()
    });
    // Copied as it is (`to_string` went through the formatter, growing a string from empty).
    String::from(&*digest)
}
