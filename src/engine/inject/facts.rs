//! What a request says of a pod: the pod, its namespace, which webhook entry sent it, and what
//! is known of it offline.

use std::collections::BTreeMap;

use crate::engine::config::{Injector, NAMESPACE_ENABLED, NAMESPACE_REQUIRED};
use crate::engine::context::{self, Owner, Shown, Source};
use crate::engine::inject::status::Status;
use crate::engine::view::{PodView, StrMap};

/// Which of the chart's webhook entries sent a request, that is, which selectors the API server
/// matched. A review carries no namespace labels, so the engine cannot check a namespace's
/// opt-in itself: the chart registers one entry per rule with selectors that cannot overlap,
/// each calling its own path, and the path tells the engine which rule the API server applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Entry {
    /// The pod's own label opted it in (`/mutate`, `/validate`): the pod carries
    /// `inject: "true"`, its namespace is not opted in, and its revision label names this
    /// installation's revision (absent for the default revision).
    #[default]
    Pod,
    /// Its namespace is labelled `inject: enabled` and names this installation's revision
    /// (`/mutate/namespace`, `/validate/namespace`); the pod does not say `inject: "false"`.
    Namespace,
    /// Its namespace is labelled `inject: required` and names this installation's revision
    /// (`/mutate/required`, `/validate/required`). Every pod is sent, those that say
    /// `inject: "false"` too: the mutator injects the others as [`Self::Namespace`] does and
    /// leaves those alone; the validator refuses them unless their service account is exempt
    /// (`required.exempt`).
    Required,
}

impl Entry {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pod => "pod",
            Self::Namespace => "namespace",
            Self::Required => "required",
        }
    }

    /// The rule, in words, for `explain` and logs.
    pub fn describe(self, inj: &Injector) -> String {
        let cfg = &inj.config;
        let revision = match cfg.revision.as_str() {
            "" => String::new(),
            r => format!(" with {}={r}", cfg.revision_label),
        };
        match self {
            Self::Pod => format!("the pod's label {}=\"true\"{revision}", cfg.inject_label),
            Self::Namespace => format!(
                "its namespace's label {}={NAMESPACE_ENABLED}{revision}",
                cfg.inject_label
            ),
            Self::Required => format!(
                "its namespace's label {}={NAMESPACE_REQUIRED}{revision}",
                cfg.inject_label
            ),
        }
    }
}

/// The pod fields the decision reads, with the request's namespace filled in.
pub struct PodFacts<'a> {
    pub pod: &'a PodView<'a>,
    pub namespace: &'a str,
    /// The webhook entry that sent the pod (from the path the API server called).
    pub entry: Entry,
    /// The namespace's labels, when they are known (offline, from a Namespace document or the
    /// command line). Then they decide the entry, as the chart's selectors would; a webhook
    /// never knows them and goes by [`Self::entry`].
    pub namespace_labels: Option<&'a BTreeMap<String, String>>,
    /// The controlling workload, when known better than the pod says (offline: the workload
    /// document a pod template comes from).
    pub workload: Option<Owner>,
}

impl<'a> PodFacts<'a> {
    /// `request_namespace` is used when the object carries none (pods created in a namespace
    /// through the API often have `metadata.namespace` unset at admission).
    pub fn new(pod: &'a PodView<'a>, request_namespace: Option<&'a str>) -> Self {
        let namespace = pod
            .meta()
            .namespace
            .as_ref()
            .map(|ns| ns.as_str())
            .filter(|ns| !ns.is_empty())
            .or(request_namespace)
            .unwrap_or("default");
        Self {
            pod,
            namespace,
            entry: Entry::Pod,
            namespace_labels: None,
            workload: None,
        }
    }

    /// The same pod, sent by `entry`.
    pub fn with_entry(mut self, entry: Entry) -> Self {
        self.entry = entry;
        self
    }

    /// The service account the pod runs as: `spec.serviceAccountName`, or `default` (what the
    /// ServiceAccount admission plugin sets before any webhook sees the pod).
    pub fn service_account(&self) -> &'a str {
        self.pod
            .spec
            .as_ref()
            .map(|s| s.service_account_name())
            .filter(|sa| !sa.is_empty())
            .unwrap_or("default")
    }

    pub(crate) fn annotations(&self) -> &'a StrMap<'a> {
        self.pod.annotations()
    }

    /// The status annotation, when it parses.
    pub(crate) fn status(&self, inj: &Injector) -> Option<Status> {
        self.pod
            .annotation(&inj.config.status_annotation)
            .and_then(|v| serde_json::from_str::<Status>(v).ok())
    }

    pub(crate) fn is_windows(&self) -> Result<bool, serde_json::Error> {
        let Some(spec) = self.pod.spec.as_ref() else {
            return Ok(false);
        };
        Ok(spec.os_name()?.is_some_and(|os| os == "windows")
            || spec
                .node_selector
                .as_ref()
                .and_then(|s| s.get("kubernetes.io/os"))
                .is_some_and(|os| os.as_str() == "windows"))
    }

    /// The controlling workload (see [`context::owner`]).
    pub fn owner(&self) -> Owner {
        context::owner(self.pod, self.workload.as_ref())
    }

    /// What the template context of this pod is made from, showing `shown` of it.
    pub fn source<'s>(&'s self, inj: &'s Injector, shown: &'s Shown<'s>) -> Source<'s> {
        Source {
            pod: self.pod,
            namespace: self.namespace,
            owned: inj.templates.owned(),
            status_annotation: &inj.config.status_annotation,
            workload: self.workload.as_ref(),
            shown,
        }
    }
}
