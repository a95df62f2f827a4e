//! What a review's answer is: its bytes, its outcome, what the log line says of it, and the
//! errors that leave no AdmissionReview to answer with.

use std::ops::Range;

/// Which webhook a review is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Webhook {
    Mutate,
    Validate,
}

impl Webhook {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mutate => "mutate",
            Self::Validate => "validate",
        }
    }
}

/// What happened to a review, for metrics and logs (a small, fixed set of labels).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A patch was returned.
    Injected,
    /// An opted-in pod was skipped by a rule.
    Skipped,
    /// Admitted with nothing to do.
    Allowed,
    /// Refused: a validation finding or a request the injector cannot honour.
    Denied,
    /// The injector failed (a template failed to render, a request could not be read).
    Error,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Injected => "injected",
            Self::Skipped => "skipped",
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::Error => "error",
        }
    }
}

/// The request's identity, for the events a review logs: its uid, namespace, pod name (for a
/// pod still to be named, its `generateName` and `*`) and operation, kept in one string (one
/// allocation a review, where four strings were four).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    text: String,
    /// Where the uid, the namespace and the name end in `text`; the operation is the rest.
    ends: [usize; 3],
}

impl Summary {
    pub(super) fn new(uid: &str, namespace: &str, name: [&str; 2], operation: &str) -> Self {
        let mut text = String::with_capacity(
            uid.len() + namespace.len() + name[0].len() + name[1].len() + operation.len(),
        );
        text.push_str(uid);
        let uid_end = text.len();
        text.push_str(namespace);
        let namespace_end = text.len();
        text.push_str(name[0]);
        text.push_str(name[1]);
        let name_end = text.len();
        text.push_str(operation);
        Self {
            text,
            ends: [uid_end, namespace_end, name_end],
        }
    }

    pub fn uid(&self) -> &str {
        &self.text[..self.ends[0]]
    }

    /// The same summary for a request with another uid.
    pub fn with_uid(&self, uid: &str) -> Self {
        let old = self.ends[0];
        let mut text = String::with_capacity(self.text.len() - old + uid.len());
        text.push_str(uid);
        text.push_str(&self.text[old..]);
        Self {
            text,
            ends: self.ends.map(|end| end - old + uid.len()),
        }
    }

    pub fn namespace(&self) -> &str {
        &self.text[self.ends[0]..self.ends[1]]
    }

    pub fn name(&self) -> &str {
        &self.text[self.ends[1]..self.ends[2]]
    }

    pub fn operation(&self) -> &str {
        &self.text[self.ends[2]..]
    }
}

/// An answer ready to send.
#[derive(Debug)]
pub struct Answer {
    /// The AdmissionReview response, JSON.
    pub body: Vec<u8>,
    pub outcome: Outcome,
    pub summary: Summary,
    /// For an injection: each template injected and its hash ([`super::template::TemplateSet::hash`]).
    pub injected: Injected,
}

/// Template names with their hashes.
pub type Injected = Vec<crate::engine::template::Injection>;

/// A body that is not an AdmissionReview at all, so there is no uid to answer to.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("request body is not a readable AdmissionReview: {0}")]
    Unreadable(String),
    #[error("AdmissionReview has no request")]
    NoRequest,
    #[error(
        "unsupported AdmissionReview apiVersion {0:?} (expected admission.k8s.io/v1 or admission.k8s.io/v1beta1)"
    )]
    Version(String),
}

/// Where in a body the view read what [`super::memo`] may find changed in a replica's body.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Located {
    /// The request's uid, when the view read it as it is written (no escapes): the answer
    /// depends on those bytes only by echoing them.
    pub uid: Option<Range<usize>>,
    /// The pod's ServiceAccount token volume's name (`kube-api-access-` and a suffix the API
    /// server draws for each pod), where the view read it as written: in the volume and in
    /// every mount of a container or init container that names it. Empty when the pod has no
    /// such volume, has more than one, or one of these names was unescaped into a copy. The
    /// engine compares these names only with other names, and keeps them out of the template
    /// context.
    pub token_name: Vec<Range<usize>>,
}
