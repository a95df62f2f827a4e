//! The injector's configuration: what opts a pod in, which templates exist, what is skipped.
//!
//! Parsing and checking happen here, once, when the configuration loads. Reading files is the
//! caller's job ([`crate::load`]); this module only turns text into a checked [`Injector`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::engine::fit;
use crate::engine::template::{TemplateError, TemplateSet};

/// The default configuration, compiled into the binary.
pub const DEFAULT_CONFIG: &str = include_str!("../../templates/config.yaml");

/// The bundled templates, compiled into the binary (name, source).
pub const BUNDLED_TEMPLATES: &[(&str, &str)] = &[
    (
        "log-shipper",
        include_str!("../../templates/log-shipper.yaml.j2"),
    ),
    ("proxy", include_str!("../../templates/proxy.yaml.j2")),
];

/// The bundled templates as owned (name, source) pairs, the form a configuration loads.
pub fn bundled_templates() -> Vec<(String, String)> {
    BUNDLED_TEMPLATES
        .iter()
        .map(|(n, s)| ((*n).to_owned(), (*s).to_owned()))
        .collect()
}

/// The configuration file as written by a person.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(default = "defaults::inject_label")]
    pub inject_label: String,
    #[serde(default = "defaults::templates_annotation")]
    pub templates_annotation: String,
    /// Comma-separated names of the pod's containers and init containers that receive the
    /// templates' mounts and env vars; absent: every application container, no init container.
    #[serde(default = "defaults::containers_annotation")]
    pub containers_annotation: String,
    #[serde(default = "defaults::status_annotation")]
    pub status_annotation: String,
    /// This installation's revision. Empty: the default revision, which injects pods and
    /// namespaces that name no revision. Otherwise only those naming this one with
    /// `revisionLabel`.
    #[serde(default)]
    pub revision: String,
    /// The label (on the pod or the namespace that opted in) naming the revision to inject.
    #[serde(default = "defaults::revision_label")]
    pub revision_label: String,
    #[serde(default)]
    pub default_templates: Vec<String>,
    #[serde(default = "defaults::excluded_namespaces")]
    pub excluded_namespaces: Vec<String>,
    #[serde(default)]
    pub skip: SkipRules,
    #[serde(default)]
    pub validation: Validation,
    /// Namespaces labelled `<injectLabel>: required`: who may run there without sidecars.
    /// Left out of the digest when empty, so that a configuration without it keeps the digest
    /// (and the status annotations) it had; written into it otherwise, so that a backstop
    /// exported before an exemption changed is seen to be behind.
    #[serde(default, skip_serializing_if = "Required::is_empty")]
    pub required: Required,
    /// Directory of `NAME.yaml.j2` templates, relative to the configuration file. Absent: the
    /// bundled templates.
    #[serde(default)]
    pub templates_dir: Option<String>,
    #[serde(default)]
    pub values: BTreeMap<String, serde_json::Value>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SkipRules {
    /// Skip pods with `hostNetwork: true`: a sidecar sharing the node's network namespace
    /// would collide with the node's ports and every other such pod.
    #[serde(default = "defaults::yes")]
    pub host_network: bool,
    /// Skip Windows pods unless a template sets `supportsWindows: true`.
    #[serde(default = "defaults::yes")]
    pub windows: bool,
}

impl Default for SkipRules {
    fn default() -> Self {
        Self {
            host_network: true,
            windows: true,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Validation {
    #[serde(default)]
    pub mode: ValidationMode,
}

/// What a namespace labelled `<injectLabel>: required` lets through without sidecars.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Required {
    /// `namespace/serviceaccount` entries (`*/serviceaccount`: in every namespace): a pod
    /// running as such a service account (`spec.serviceAccountName`, `default` when unset, as
    /// the ServiceAccount admission plugin sets it before any webhook) may opt out with
    /// `<injectLabel>: "false"` in a required namespace. Nobody else may.
    #[serde(default)]
    pub exempt: Vec<String>,
}

impl Required {
    pub fn is_empty(&self) -> bool {
        self.exempt.is_empty()
    }

    /// The entry of [`Self::exempt`] that exempts service account `service_account` of
    /// `namespace`, if one does.
    pub fn exemption(&self, namespace: &str, service_account: &str) -> Option<&str> {
        self.exempt.iter().map(String::as_str).find(|e| {
            e.split_once('/')
                .is_some_and(|(ns, sa)| (ns == "*" || ns == namespace) && sa == service_account)
        })
    }

    /// The service accounts exempt in `namespace`, in the order the configuration lists them,
    /// each once.
    pub fn exempt_in(&self, namespace: &str) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for (ns, sa) in self.exempt.iter().filter_map(|e| e.split_once('/')) {
            if (ns == "*" || ns == namespace) && !out.contains(&sa) {
                out.push(sa);
            }
        }
        out
    }

    /// Why an entry of [`Self::exempt`] is not one, if one is not: each must be
    /// `namespace/serviceaccount`, the namespace a DNS label or `*`, the service account a
    /// DNS subdomain (never `*`: a namespace whose every pod may opt out is one labelled
    /// `enabled`, not `required`).
    fn problem(&self) -> Option<String> {
        self.exempt.iter().find_map(|e| {
            let ok = e.split_once('/').is_some_and(|(ns, sa)| {
                (ns == "*" || is_dns_label(ns))
                    && !sa.is_empty()
                    && sa.len() <= 253
                    && sa.split('.').all(is_dns_label)
            });
            (!ok).then(|| {
                format!(
                    "required.exempt entry {e:?} is not NAMESPACE/SERVICEACCOUNT (NAMESPACE may be * for every namespace; SERVICEACCOUNT is a name, never *: label a namespace {NAMESPACE_ENABLED}, not {NAMESPACE_REQUIRED}, to let every pod opt out)"
                )
            })
        })
    }
}

/// What the validating webhook does with its findings.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ValidationMode {
    /// Deny the request.
    #[default]
    Enforce,
    /// Admit the request and return the findings as warnings.
    Warn,
}

mod defaults {
    pub fn inject_label() -> String {
        "sidecar-injector.io/inject".into()
    }
    pub fn templates_annotation() -> String {
        "sidecar-injector.io/templates".into()
    }
    pub fn containers_annotation() -> String {
        "sidecar-injector.io/containers".into()
    }
    pub fn status_annotation() -> String {
        "sidecar-injector.io/status".into()
    }
    pub fn revision_label() -> String {
        "sidecar-injector.io/rev".into()
    }
    pub fn excluded_namespaces() -> Vec<String> {
        ["kube-system", "kube-public", "kube-node-lease"]
            .map(String::from)
            .to_vec()
    }
    pub fn yes() -> bool {
        true
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: invalid configuration: {message}")]
    Parse { path: String, message: String },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    #[error(transparent)]
    Template(#[from] TemplateError),
}

/// A loaded, checked configuration with its compiled templates: everything the core needs.
#[derive(Debug)]
pub struct Injector {
    pub config: ConfigFile,
    pub templates: TemplateSet,
    /// The injector's own namespace: never injected, whatever the configuration says.
    pub own_namespace: Option<String>,
    /// A short digest of what the configuration decides (its settings as read, every
    /// template's source): the same for every replica serving the same files, and for the
    /// same configuration written as a file or as the chart's ConfigMap. The
    /// status annotation records it, and the backstop holds a pod to its own export's
    /// contract only when the pod was injected under the same digest (or not at all).
    pub digest: String,
    /// What its author is told once, when the configuration is loaded, about templates that
    /// would change a pod's fate ([`crate::engine::fit::advisories`]): the shells print or log
    /// them; nothing is refused for them.
    pub advisories: Vec<String>,
}

impl Injector {
    /// The default configuration with `required.exempt` set to the YAML list items `exempt`
    /// (for the tests of required namespaces).
    #[cfg(test)]
    pub(crate) fn exempting(exempt: &str) -> Self {
        let config = format!("{DEFAULT_CONFIG}required:\n  exempt: [{exempt}]\n");
        Self::from_sources("required.yaml", &config, bundled_templates(), None)
            .expect("the default configuration with required.exempt loads")
    }

    /// Builds an injector from configuration text and template sources. `origin` names the
    /// configuration in error messages. Every template is compiled and test-rendered here, so a
    /// broken template fails now, with its file and line, and never at request time.
    pub fn from_sources(
        origin: &str,
        config_yaml: &str,
        templates: Vec<(String, String)>,
        own_namespace: Option<String>,
    ) -> Result<Self, ConfigError> {
        let config = parse_config(origin, config_yaml)?;
        let templates = TemplateSet::compile(templates, &config.values)?;
        for name in &config.default_templates {
            if !templates.contains(name) {
                return Err(ConfigError::Invalid {
                    path: origin.to_owned(),
                    message: format!(
                        "defaultTemplates names {name:?}, but no such template exists (known: {})",
                        templates.names().collect::<Vec<_>>().join(", ")
                    ),
                });
            }
        }
        if config.inject_label.is_empty()
            || config.status_annotation.is_empty()
            || config.revision_label.is_empty()
        {
            return Err(ConfigError::Invalid {
                path: origin.to_owned(),
                message: "injectLabel, statusAnnotation and revisionLabel must not be empty".into(),
            });
        }
        if !is_dns_label(&config.revision) && !config.revision.is_empty() {
            return Err(ConfigError::Invalid {
                path: origin.to_owned(),
                message: format!(
                    "revision {:?} is not a DNS label (lowercase letters, digits and '-', at most 63, starting and ending with a letter or digit); it is used in label values and object names",
                    config.revision
                ),
            });
        }
        if let Some(message) = config.required.problem() {
            return Err(ConfigError::Invalid {
                path: origin.to_owned(),
                message,
            });
        }
        let own_namespace = own_namespace.filter(|ns| !ns.is_empty());
        let digest = config_digest(&config, &templates);
        let mut advisories = Vec::new();
        for name in templates.names() {
            // Every template rendered for the bare sample when it was compiled.
            if let Ok(fragment) = templates.sample(name) {
                advisories.extend(fit::advisories(name, &fragment));
            }
        }
        Ok(Self {
            config,
            templates,
            own_namespace,
            digest,
            advisories,
        })
    }

    /// The embedded default: bundled configuration and templates.
    pub fn embedded(own_namespace: Option<String>) -> Result<Self, ConfigError> {
        Self::from_sources(
            "<embedded config.yaml>",
            DEFAULT_CONFIG,
            bundled_templates(),
            own_namespace,
        )
    }

    /// Whether `namespace` is never injected.
    pub fn is_excluded_namespace(&self, namespace: &str) -> bool {
        self.own_namespace.as_deref() == Some(namespace)
            || self
                .config
                .excluded_namespaces
                .iter()
                .any(|ns| ns == namespace)
    }
}

/// The digest of [`Injector::digest`]: 16 hex digits of a SHA-256 over what the configuration
/// decides, read (every default filled in, map keys sorted, where the templates were read from
/// left out) so that the same configuration written two ways (a file, the chart's ConfigMap)
/// has one digest, and over every template's name and source, each with its length.
fn config_digest(config: &ConfigFile, templates: &TemplateSet) -> String {
    use sha2::{Digest as _, Sha256};
    fn sorted(v: serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::Object(map) => {
                let mut entries: Vec<_> = map.into_iter().collect();
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                serde_json::Value::Object(
                    entries.into_iter().map(|(k, v)| (k, sorted(v))).collect(),
                )
            }
            serde_json::Value::Array(items) => {
                serde_json::Value::Array(items.into_iter().map(sorted).collect())
            }
            other => other,
        }
    }
    let mut read = config.clone();
    read.templates_dir = None;
    let read = sorted(serde_json::to_value(&read).unwrap_or_default());
    let mut h = Sha256::new();
    let mut put = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    put(&serde_json::to_vec(&read).unwrap_or_default());
    let mut names: Vec<&str> = templates.names().collect();
    names.sort_unstable();
    for name in names {
        put(name.as_bytes());
        put(templates.source(name).unwrap_or("").as_bytes());
    }
    h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The value of the inject label on a namespace that opts all its pods in.
pub const NAMESPACE_ENABLED: &str = "enabled";

/// The value of the inject label on a namespace that opts all its pods in and refuses those
/// that arrive without their sidecars, unless exempt ([`Required::exempt`]).
pub const NAMESPACE_REQUIRED: &str = "required";

/// A DNS-1123 label: what a revision must be, since it goes into label values and object names.
pub fn is_dns_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first() != Some(&b'-')
        && bytes.last() != Some(&b'-')
}

/// Parses the configuration file text.
pub fn parse_config(origin: &str, yaml: &str) -> Result<ConfigFile, ConfigError> {
    // An empty file means "all defaults".
    let yaml = if yaml.trim().is_empty() { "{}" } else { yaml };
    serde_saphyr::from_str(yaml).map_err(|e| ConfigError::Parse {
        path: origin.to_owned(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::template::TEMPLATE_SUFFIX;

    /// The digest follows what the configuration decides, not how it is written: key order,
    /// defaults written out, the templates' directory and the own namespace do not change it; a
    /// value or a template's source does.
    #[test]
    fn the_digest_follows_what_the_configuration_decides() {
        let load = |yaml: &str, templates: Vec<(String, String)>, ns: &str| {
            Injector::from_sources("test", yaml, templates, Some(ns.into()))
                .expect("loads")
                .digest
        };
        let base = load(DEFAULT_CONFIG, bundled_templates(), "a");
        assert_eq!(base.len(), 16);
        let reordered = "values:\n  proxy: {adminPort: 15000, port: 15001, image: docker.io/envoyproxy/envoy:v1.32.3}\n  logShipper: {logDir: /var/log/app, image: cr.fluentbit.io/fluent/fluent-bit:3.2.4}\ndefaultTemplates: [log-shipper, proxy]\ntemplatesDir: elsewhere\nskip: {windows: true}\n";
        assert_eq!(load(reordered, bundled_templates(), "b"), base);
        let other_value = reordered.replace("port: 15001", "port: 15002");
        assert_ne!(load(&other_value, bundled_templates(), "a"), base);
        let mut edited = bundled_templates();
        edited[0]
            .1
            .push_str("\n# a comment changes the template's source\n");
        assert_ne!(load(DEFAULT_CONFIG, edited, "a"), base);
    }

    #[test]
    fn embedded_default_loads() {
        let inj = Injector::embedded(Some("sidecar-injector".into())).expect("embedded loads");
        assert_eq!(inj.config.inject_label, "sidecar-injector.io/inject");
        assert!(inj.is_excluded_namespace("kube-system"));
        assert!(inj.is_excluded_namespace("sidecar-injector"));
        assert!(!inj.is_excluded_namespace("default"));
        assert_eq!(inj.config.validation.mode, ValidationMode::Enforce);
    }

    #[test]
    fn every_bundled_file_is_compiled_in() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/templates");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .expect("templates dir")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|n| n.strip_suffix(TEMPLATE_SUFFIX).map(str::to_owned))
            .collect();
        on_disk.sort();
        let mut bundled: Vec<_> = BUNDLED_TEMPLATES
            .iter()
            .map(|(n, _)| n.to_string())
            .collect();
        bundled.sort();
        assert_eq!(on_disk, bundled);
    }

    #[test]
    fn unknown_keys_are_rejected_with_the_origin() {
        let err = parse_config("my.yaml", "injectLable: x\n").expect_err("typo must fail");
        let msg = err.to_string();
        assert!(msg.starts_with("my.yaml: invalid configuration"), "{msg}");
        assert!(msg.contains("injectLable"), "{msg}");
    }

    #[test]
    fn unknown_default_template_is_an_error() {
        let err = Injector::from_sources("c.yaml", "defaultTemplates: [nope]\n", vec![], None)
            .expect_err("must fail");
        assert!(err.to_string().contains("\"nope\""), "{err}");
    }

    #[test]
    fn revision_must_be_a_dns_label() {
        let load = |revision: &str| {
            let yaml = DEFAULT_CONFIG.replace("revision: \"\"", &format!("revision: {revision}"));
            Injector::from_sources("c.yaml", &yaml, bundled_templates(), None)
        };
        assert_eq!(load("\"\"").expect("no revision").config.revision, "");
        assert_eq!(load("canary-2").expect("loads").config.revision, "canary-2");
        for bad in ["Canary", "-x", "a_b", "x-"] {
            let err = load(bad).expect_err(bad);
            assert!(err.to_string().contains("not a DNS label"), "{err}");
        }
    }

    /// Exemptions are `namespace/serviceaccount`, `*` for every namespace; a malformed one, or
    /// `*` for the service account, fails the load. An empty list leaves the digest alone; a
    /// list is part of it.
    #[test]
    fn required_exemptions_are_checked_and_matched() {
        let load = |extra: &str| {
            Injector::from_sources(
                "c.yaml",
                &format!("{DEFAULT_CONFIG}{extra}"),
                bundled_templates(),
                None,
            )
        };
        let base = load("").expect("loads").digest;
        assert_eq!(
            load("required: {exempt: []}\n").expect("loads").digest,
            base
        );
        let inj =
            load("required:\n  exempt: [ci/runner, \"*/backup\", ci/runner]\n").expect("loads");
        assert_ne!(inj.digest, base);
        let r = &inj.config.required;
        assert_eq!(r.exemption("ci", "runner"), Some("ci/runner"));
        assert_eq!(r.exemption("shop", "backup"), Some("*/backup"));
        assert_eq!(r.exemption("shop", "runner"), None);
        assert_eq!(r.exemption("ci", "default"), None);
        assert_eq!(r.exempt_in("ci"), ["runner", "backup"]);
        assert_eq!(r.exempt_in("shop"), ["backup"]);
        for bad in [
            "runner",
            "ci/*",
            "ci/",
            "/runner",
            "Ci/runner",
            "a/b/c",
            "*/",
        ] {
            let err = load(&format!("required: {{exempt: [\"{bad}\"]}}\n")).expect_err(bad);
            assert!(err.to_string().contains("required.exempt entry"), "{err}");
        }
    }

    #[test]
    fn bad_validation_mode_is_an_error() {
        assert!(parse_config("c", "validation: {mode: maybe}\n").is_err());
        let c = parse_config("c", "validation: {mode: warn}\n").expect("warn parses");
        assert_eq!(c.validation.mode, ValidationMode::Warn);
    }
}
