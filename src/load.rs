//! Reading a configuration and its templates from disk (the only file I/O of the core's inputs),
//! and the `--config` flag every command that loads one shares.

use std::path::{Path, PathBuf};

use clap::Args;

use crate::engine::config::{ConfigError, Injector, parse_config};
use crate::engine::template::TEMPLATE_SUFFIX;

/// Environment variable naming the injector's own namespace (never injected).
pub const NAMESPACE_ENV: &str = "SIDECAR_INJECTOR_NAMESPACE";

/// The injector's own namespace, from the environment.
pub fn own_namespace() -> Option<String> {
    std::env::var(NAMESPACE_ENV).ok()
}

/// The configuration flag every subcommand shares.
#[derive(Clone, Debug, Args)]
pub struct ConfigArg {
    /// Configuration file (YAML). Default: the embedded configuration and bundled templates.
    #[arg(long = "config", env = "SIDECAR_INJECTOR_CONFIG", value_name = "PATH")]
    pub path: Option<PathBuf>,
}

impl ConfigArg {
    /// The configuration, with its advisories on standard error (once, for a person at the
    /// command line: nothing is refused for them).
    pub fn load(&self) -> anyhow::Result<Injector> {
        let inj = injector(self.path.as_deref())?;
        warn_advisories(&inj);
        Ok(inj)
    }
}

/// Writes a loaded configuration's advisories to standard error, one `warning:` line each.
pub fn warn_advisories(inj: &Injector) {
    use std::io::Write as _;
    let mut err = std::io::stderr().lock();
    for advice in &inj.advisories {
        let _ = writeln!(err, "warning: {advice}");
    }
}

/// How the chart's webhook entries select pods, for the admission policies written alongside
/// them (`export`, `serve --backstop`): the chart's `webhook.*` values.
#[derive(Clone, Debug, Args)]
pub struct SelectionArgs {
    /// Also select the pods of namespaces labelled `<injectLabel>: enabled` (a second binding),
    /// as the chart's `webhook.namespaceOptIn.enabled` does.
    #[arg(long, env = "SIDECAR_INJECTOR_NAMESPACE_OPT_IN", default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub namespace_opt_in: bool,
    /// Also select the pods of namespaces labelled `<injectLabel>: required` (a third binding),
    /// as the chart's `webhook.namespaceOptIn.required` does: the mutating policy injects them
    /// as in `enabled` namespaces, and the backstop also refuses those that opt out with
    /// `<injectLabel>: "false"` unless their service account is exempt (`required.exempt`).
    #[arg(long, env = "SIDECAR_INJECTOR_NAMESPACE_REQUIRED", default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub namespace_required: bool,
    /// Leave namespaces labelled `<this>: "true"` alone, as the chart's `webhook.disabledLabel`.
    #[arg(
        long,
        env = "SIDECAR_INJECTOR_DISABLED_LABEL",
        default_value = "sidecar-injector.io/disabled"
    )]
    pub disabled_label: String,
}

impl SelectionArgs {
    pub fn selection(&self) -> crate::export::Selection {
        crate::export::Selection {
            namespace_opt_in: self.namespace_opt_in,
            namespace_required: self.namespace_required,
            disabled_label: self.disabled_label.clone(),
        }
    }
}

/// The texts a configuration is built from, read from disk.
#[derive(Debug)]
pub struct Sources {
    pub origin: String,
    pub config: String,
    pub templates: Vec<(String, String)>,
    /// Directories whose changes may change these sources.
    pub dirs: Vec<PathBuf>,
}

impl Sources {
    /// Reads the configuration at `path` and the templates it points to.
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let origin = path.display().to_string();
        let config = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: origin.clone(),
            source,
        })?;
        let parsed = parse_config(&origin, &config)?;
        let base = path.parent().unwrap_or(Path::new("."));
        let mut dirs = vec![base.to_path_buf()];
        let templates = match &parsed.templates_dir {
            None => crate::engine::config::bundled_templates(),
            Some(dir) => {
                let dir = base.join(dir);
                let templates = read_templates(&dir)?;
                dirs.push(dir);
                templates
            }
        };
        Ok(Self {
            origin,
            config,
            templates,
            dirs,
        })
    }

    /// A hash of every text: equal fingerprints mean nothing changed.
    pub fn fingerprint(&self) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(self.config.as_bytes());
        for (name, source) in &self.templates {
            h.update([0]);
            h.update(name.as_bytes());
            h.update([0]);
            h.update(source.as_bytes());
        }
        h.finalize().into()
    }

    pub fn build(self, own_namespace: Option<String>) -> Result<Injector, ConfigError> {
        Injector::from_sources(&self.origin, &self.config, self.templates, own_namespace)
    }
}

/// Loads the configuration at `path`, or the embedded default when `None`.
pub fn injector(path: Option<&Path>) -> Result<Injector, ConfigError> {
    match path {
        None => Injector::embedded(own_namespace()),
        Some(path) => Sources::read(path)?.build(own_namespace()),
    }
}

/// Builds an injector from the data of the chart's ConfigMap (`config.yaml` and the
/// `NAME.yaml.j2` files beside it), the way the server sees it once mounted. `origin` names the
/// ConfigMap in error messages.
pub fn from_configmap_data(
    origin: &str,
    data: &std::collections::BTreeMap<String, String>,
    own_namespace: Option<String>,
) -> Result<Injector, ConfigError> {
    let config = data
        .get("config.yaml")
        .ok_or_else(|| ConfigError::Invalid {
            path: origin.to_owned(),
            message: "has no key config.yaml".into(),
        })?;
    let parsed = parse_config(origin, config)?;
    let templates = match parsed.templates_dir.as_deref() {
        None => crate::engine::config::bundled_templates(),
        Some("." | "./") => data
            .iter()
            .filter(|(key, _)| !key.starts_with('.'))
            .filter_map(|(key, source)| {
                key.strip_suffix(TEMPLATE_SUFFIX)
                    .map(|name| (name.to_owned(), source.clone()))
            })
            .collect(),
        Some(other) => {
            return Err(ConfigError::Invalid {
                path: origin.to_owned(),
                message: format!(
                    "templatesDir {other:?} points outside the ConfigMap; only \".\" can be read from it"
                ),
            });
        }
    };
    Injector::from_sources(origin, config, templates, own_namespace)
}

/// Reads every `NAME.yaml.j2` in `dir`, sorted by name. Dot-files (a mounted ConfigMap's
/// `..data` and timestamped directories) are ignored.
pub fn read_templates(dir: &Path) -> Result<Vec<(String, String)>, ConfigError> {
    let origin = dir.display().to_string();
    let read_err = |source| ConfigError::Read {
        path: origin.clone(),
        source,
    };
    let mut files: Vec<(String, PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_err)? {
        let entry = entry.map_err(read_err)?;
        let file = entry.file_name().to_string_lossy().into_owned();
        if file.starts_with('.') {
            continue;
        }
        if let Some(name) = file.strip_suffix(TEMPLATE_SUFFIX) {
            files.push((name.to_owned(), entry.path()));
        }
    }
    files.sort();
    files
        .into_iter()
        .map(|(name, path)| {
            std::fs::read_to_string(&path)
                .map(|source| (name, source))
                .map_err(|source| ConfigError::Read {
                    path: path.display().to_string(),
                    source,
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_a_directory_and_reports_the_broken_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("config.yaml"),
            "templatesDir: .\ndefaultTemplates: [a]\n",
        )
        .expect("write");
        std::fs::write(
            dir.path().join("a.yaml.j2"),
            "containers:\n  - name: a\n    image: a:1\n",
        )
        .expect("write");
        let inj = injector(Some(&dir.path().join("config.yaml"))).expect("loads");
        assert_eq!(inj.templates.names().collect::<Vec<_>>(), ["a"]);

        std::fs::write(dir.path().join("b.yaml.j2"), "containers:\n{% if %}\n").expect("write");
        let err = injector(Some(&dir.path().join("config.yaml"))).expect_err("broken b");
        assert!(
            err.to_string().contains("b.yaml.j2") && err.to_string().contains("line 2"),
            "{err}"
        );
    }

    #[test]
    fn configmap_data_loads_like_the_mounted_directory() {
        let mut data = std::collections::BTreeMap::new();
        data.insert(
            "config.yaml".to_owned(),
            "templatesDir: .\ndefaultTemplates: [a]\n".to_owned(),
        );
        data.insert(
            "a.yaml.j2".to_owned(),
            "containers:\n  - name: a\n    image: a:1\n".to_owned(),
        );
        data.insert("notes.txt".to_owned(), "ignored".to_owned());
        let inj = from_configmap_data("ns/cm", &data, Some("ns".into())).expect("loads");
        assert_eq!(inj.templates.names().collect::<Vec<_>>(), ["a"]);
        assert!(inj.is_excluded_namespace("ns"));

        data.insert("config.yaml".to_owned(), "templatesDir: ../x\n".to_owned());
        let err = from_configmap_data("ns/cm", &data, None).expect_err("outside");
        assert!(err.to_string().starts_with("ns/cm: templatesDir"), "{err}");
        data.remove("config.yaml");
        let err = from_configmap_data("ns/cm", &data, None).expect_err("no config");
        assert!(err.to_string().contains("config.yaml"), "{err}");
    }

    #[test]
    fn missing_file_is_a_read_error_naming_it() {
        let err = injector(Some(Path::new("/nonexistent/config.yaml"))).expect_err("missing");
        assert!(
            err.to_string()
                .starts_with("/nonexistent/config.yaml: cannot read"),
            "{err}"
        );
    }
}
