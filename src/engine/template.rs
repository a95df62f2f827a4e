//! Sidecar templates: minijinja sources rendered with a pod's context into a [`Fragment`].

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};

use sha2::{Digest as _, Sha256};

use k8s_openapi::api::core::v1::{Container, EnvVar, LocalObjectReference, Volume, VolumeMount};
use minijinja::{Environment, UndefinedBehavior, Value};
use serde::{Deserialize, Serialize};

use crate::engine::context::{Owned, PodContext, Reads, Sample};
use crate::engine::overrides::{self, BadValue, Declared};

/// The file name suffix of a template in a templates directory.
pub const TEMPLATE_SUFFIX: &str = ".yaml.j2";

/// What one template adds to a pod once rendered.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Fragment {
    /// Whether this template may be injected into Windows pods.
    #[serde(default)]
    pub supports_windows: bool,
    /// Containers this template cannot share a pod with (another mesh's proxy, which binds the
    /// same ports): a pod that already runs one, as a container or an init container, is not
    /// given this template.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicts_with: Vec<String>,
    #[serde(default)]
    pub containers: Vec<Container>,
    /// Placed before the pod's own init containers, so a native sidecar (`restartPolicy:
    /// Always`) is running while the pod's init containers run and outlives the app containers.
    #[serde(default)]
    pub init_containers: Vec<Container>,
    #[serde(default)]
    pub volumes: Vec<Volume>,
    /// Added to every application container.
    #[serde(default)]
    pub volume_mounts: Vec<VolumeMount>,
    /// Added to every application container.
    #[serde(default)]
    pub env: Vec<EnvVar>,
    #[serde(default)]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// SHA-256 of the fragment's JSON, taken once when it is rendered (the status hash is
    /// built from it on every review).
    #[serde(skip)]
    pub digest: [u8; 32],
    /// Each item's JSON, encoded once when the fragment is rendered: a patch is written from
    /// these bytes.
    #[serde(skip)]
    pub json: Encoded,
    /// The ports its sidecars declare, read once when it is rendered (the port check of
    /// every review reads these).
    #[serde(skip)]
    pub ports: Vec<SidecarPort>,
    /// Its variant for a `Guaranteed` pod, made the first time such a pod needs it.
    #[serde(skip)]
    pub guaranteed: Memo<Guaranteed>,
}

/// A port a sidecar of a rendering declares, read once when the rendering is sealed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidecarPort {
    /// Whether the sidecar is one of the rendering's init containers (else a container).
    pub init: bool,
    /// The sidecar's name.
    pub sidecar: String,
    pub number: i32,
    /// As declared, `TCP` when absent.
    pub protocol: String,
    /// The number as JSON writes it: the text a pod's ports are searched for first.
    pub digits: String,
}

/// The ports of a rendering's sidecars, init containers first.
pub fn sidecar_ports(init_containers: &[Container], containers: &[Container]) -> Vec<SidecarPort> {
    let each = |init: bool, list: &[Container]| {
        list.iter()
            .flat_map(move |c| {
                c.ports.iter().flatten().map(move |p| SidecarPort {
                    init,
                    sidecar: c.name.clone(),
                    number: p.container_port,
                    protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_owned()),
                    digits: p.container_port.to_string(),
                })
            })
            .collect::<Vec<_>>()
    };
    let mut out = each(true, init_containers);
    out.extend(each(false, containers));
    out
}

/// A rendering made for a `Guaranteed` pod (`fit::for_guaranteed`).
#[derive(Debug)]
pub struct Guaranteed {
    pub fragment: Arc<Fragment>,
    /// `(sidecar, resource)` for each resource a sidecar sets no amount for.
    pub unbounded: Vec<(String, &'static str)>,
}

/// A value derived from a [`Fragment`] the first time a review needs it, and kept with it: a
/// cache, so two fragments are equal whatever theirs hold, and a copy starts empty.
#[derive(Debug)]
pub struct Memo<T>(OnceLock<T>);

impl<T> Memo<T> {
    pub fn get_or_init(&self, make: impl FnOnce() -> T) -> &T {
        self.0.get_or_init(make)
    }
}

impl<T> Default for Memo<T> {
    fn default() -> Self {
        Self(OnceLock::new())
    }
}

impl<T> Clone for Memo<T> {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl<T> PartialEq for Memo<T> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// The JSON of each item of a [`Fragment`], index for index.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Encoded {
    pub containers: Vec<Piece>,
    pub init_containers: Vec<Piece>,
    pub volumes: Vec<Piece>,
    pub volume_mounts: Vec<Piece>,
    pub env: Vec<Piece>,
    pub image_pull_secrets: Vec<Piece>,
}

/// One item's JSON, encoded once when its fragment is rendered; a patch copies it.
///
/// A long item also keeps its base64 once a patch has needed it ([`Piece::base64`]), so that
/// the next patch copies it instead of encoding it again.
#[derive(Clone, Debug, Default)]
pub struct Piece {
    pub json: String,
    /// `(k, the base64 of json[k..k + a whole number of groups of three])`, for the offset `k`
    /// (0, 1 or 2) the first patch asked for. Replicas of a workload get the same patch, so
    /// the same offset.
    base64: OnceLock<(usize, Box<[u8]>)>,
}

impl PartialEq for Piece {
    fn eq(&self, other: &Self) -> bool {
        self.json == other.json
    }
}

impl Piece {
    /// Below this length a piece is encoded with the patch around it.
    pub const BASE64_KEPT: usize = 256;

    pub fn new(json: String) -> Self {
        Self {
            json,
            base64: OnceLock::new(),
        }
    }

    /// The base64 of the piece's bytes from `k` (0, 1 or 2) to the end of its last whole
    /// group of three: kept for the first `k` asked for, encoded anew for another.
    pub fn base64(&self, k: usize) -> Cow<'_, [u8]> {
        let encode = || {
            let bytes = &self.json.as_bytes()[k.min(self.json.len())..];
            let whole = &bytes[..bytes.len() / 3 * 3];
            base64_simd::STANDARD
                .encode_to_string(whole)
                .into_bytes()
                .into_boxed_slice()
        };
        let (kept, base64) = self.base64.get_or_init(|| (k, encode()));
        if *kept == k {
            Cow::Borrowed(base64)
        } else {
            Cow::Owned(encode().into_vec())
        }
    }
}

fn encode_each<T: Serialize>(items: &[T]) -> Vec<Piece> {
    items
        .iter()
        // k8s-openapi types always serialize.
        .map(|item| Piece::new(serde_json::to_string(item).unwrap_or_default()))
        .collect()
}

impl Fragment {
    /// Takes the digest and encodes every item, once, after the fragment is read (or changed).
    pub fn seal(mut self) -> Self {
        // Serializing derived structs cannot fail; an empty input would only weaken drift
        // detection, never break injection.
        self.digest = Sha256::digest(serde_json::to_vec(&self).unwrap_or_default()).into();
        self.json = Encoded {
            containers: encode_each(&self.containers),
            init_containers: encode_each(&self.init_containers),
            volumes: encode_each(&self.volumes),
            volume_mounts: encode_each(&self.volume_mounts),
            env: encode_each(&self.env),
            image_pull_secrets: encode_each(&self.image_pull_secrets),
        };
        self.ports = sidecar_ports(&self.init_containers, &self.containers);
        self.guaranteed = Default::default();
        self
    }

    /// Names of the containers this fragment injects, regular and init.
    pub fn sidecar_names(&self) -> impl Iterator<Item = &str> {
        self.containers
            .iter()
            .chain(&self.init_containers)
            .map(|c| c.name.as_str())
    }
}

/// Names a template may use besides the pod that read nothing of it: the configuration's
/// values, the template's overrides, and minijinja's own functions (but not `debug`, which
/// prints the whole context).
const HARMLESS: &[&str] = &[
    "values",
    "overrides",
    "namespace",
    "range",
    "dict",
    "loop",
    "lipsum",
    "cycler",
    "joiner",
];

/// Whether the source includes, imports or extends another template (whose reads the analysis
/// of this one does not see).
fn uses_other_templates(source: &str) -> bool {
    source.match_indices("{%").any(|(at, _)| {
        let tag = source[at + 2..].trim_start_matches(['-', '+']).trim_start();
        ["include", "import", "from", "extends"].iter().any(|word| {
            tag.strip_prefix(word)
                .is_some_and(|rest| !rest.starts_with(|c: char| c.is_alphanumeric() || c == '_'))
        })
    })
}

/// What `template` (with this source) reads of the pod context.
fn reads_of(template: &minijinja::Template<'_, '_>, source: &str) -> Reads {
    let mut reads = Reads::new(uses_other_templates(source));
    for path in template.undeclared_variables(true) {
        let mut parts = path.split('.');
        match parts.next() {
            Some("pod") => reads.read(parts),
            Some(root) if HARMLESS.contains(&root) => {}
            _ => reads.all = true,
        }
    }
    reads
}

/// A template that failed to compile, render or parse.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("template {file}: {detail}")]
    Compile { file: String, detail: String },
    #[error("template {file}: rendering failed: {detail}")]
    Render { file: String, detail: String },
    #[error("template {file}: rendered output is not a valid sidecar fragment: {detail}")]
    Fragment { file: String, detail: String },
    #[error("template {file}: {detail}")]
    Invalid { file: String, detail: String },
    #[error("template {file}: {detail}")]
    Overrides { file: String, detail: String },
    #[error("templates {first} and {second} both inject a container named {container:?}")]
    Conflict {
        first: String,
        second: String,
        container: String,
    },
}

/// A template's name and hash ([`TemplateSet::hash`]).
pub type Injection = (Arc<str>, Arc<str>);

/// The compiled templates, keyed by name.
pub struct TemplateSet {
    env: Environment<'static>,
    /// Per template, what a review reads of it, together: a review looks a template up by
    /// name for what it reads, its overrides and its hash, and the four maps these were kept
    /// in (its defaults apart) were four sets of nodes and keys for a cold review to fetch
    /// (docs/benchmarks-history.md, "What the goals needed").
    templates: BTreeMap<String, Compiled>,
    values: Value,
    cache: RenderCache,
    owned: Owned,
    /// Each template's source, for the policy exporter (which reads its syntax tree); kept
    /// apart from [`Compiled`], which a review reads.
    sources: BTreeMap<String, String>,
}

/// One template's part of [`TemplateSet`].
struct Compiled {
    /// Its name and a short hash of its source and the configuration's `values` (it changes
    /// exactly when the configuration changes what the template can render), shared with every
    /// answer that reports an injection.
    injection: Injection,
    /// What it reads of the pod context.
    reads: Reads,
    /// The annotations it declares it reads.
    declared: Declared,
    /// Its overrides when the pod sets none (checked once, at load).
    defaults: Overrides<'static>,
}

/// A template's overrides for one pod: the checked values, and their JSON, which is part of
/// the render-cache key. A pod that sets none borrows the template's defaults, values and JSON
/// both made once, at load.
#[derive(Clone, Debug, PartialEq)]
pub struct Overrides<'s> {
    pub values: Cow<'s, BTreeMap<String, serde_json::Value>>,
    json: Cow<'s, [u8]>,
}

impl Overrides<'static> {
    pub fn owned(values: BTreeMap<String, serde_json::Value>) -> Self {
        let json = if values.is_empty() {
            Vec::new()
        } else {
            // A map of JSON values always serializes.
            serde_json::to_vec(&values).unwrap_or_default()
        };
        Self {
            values: Cow::Owned(values),
            json: Cow::Owned(json),
        }
    }
}

impl Overrides<'_> {
    fn borrowed(&self) -> Overrides<'_> {
        Overrides {
            values: Cow::Borrowed(&*self.values),
            json: Cow::Borrowed(&*self.json),
        }
    }
}

/// Rendered fragments, looked up two ways.
///
/// - By template, pod context and overrides: rendering is a pure function of the three (the
///   context is all of the pod a template can read), and every replica of a workload has the
///   same context (its name is empty under `generateName`), so most reviews neither render nor
///   read YAML.
/// - By template and rendered text: a pod context seen for the first time (a new ReplicaSet,
///   whose `pod-template-hash` differs) mostly renders what an earlier one rendered, and then
///   shares its fragment: the YAML of an output is read once, not once per context.
#[derive(Default)]
struct RenderCache {
    by_context: Table<Fragment>,
    by_text: Table<Fragment>,
    /// Digests of lists of renderings, by the bytes they are computed from.
    digests: Table<str>,
    /// Status annotations, with their JSON, by the bytes of what they describe.
    statuses: Table<Quoted>,
}

/// A text and the same text as a JSON string (quoted and escaped), made together once, for
/// values that are written into many patches.
#[derive(Debug, PartialEq, Eq)]
pub struct Quoted {
    pub text: String,
    pub json: String,
}

impl Quoted {
    pub fn new(text: String) -> Self {
        let mut json = Vec::with_capacity(text.len() + 16);
        super::json::write_str(&mut json, &text);
        // Escaping keeps UTF-8 as it is and adds only ASCII.
        let json = String::from_utf8(json).unwrap_or_default();
        Self { text, json }
    }
}

/// Bound on each table of cached renderings; a table starts over when it is full.
const CACHE_LIMIT: usize = 4096;

/// A table of cached renderings. Read far more often than written (a write is a rendering
/// not seen before), and read by every serving thread at once: under a mutex, a thread that
/// was preempted while it held the lock (the machine's other work wants the CPU too) made the
/// other serving threads sleep until it ran again, and every request on them waited (`perf`
/// counted 136-171 futex calls in 4 s at 24,000 reviews a second, from these tables and the
/// metrics; docs/benchmarks-history.md, "Locks on the serving path"). Readers of a read-write lock
/// do not wait for one another.
type Table<T> = std::sync::RwLock<foldhash::HashMap<Vec<u8>, Arc<T>>>;

fn cached<T: ?Sized>(table: &Table<T>, key: &[u8]) -> Option<Arc<T>> {
    table.read().ok()?.get(key).cloned()
}

/// `make(key)`, made once per distinct key and kept in `table`.
fn remembered<T: ?Sized>(
    table: &Table<T>,
    key: Vec<u8>,
    make: impl FnOnce(&[u8]) -> Arc<T>,
) -> Arc<T> {
    if let Some(known) = cached(table, &key) {
        return known;
    }
    let made = make(&key);
    keep(table, key, made.clone());
    made
}

fn keep<T: ?Sized>(table: &Table<T>, key: Vec<u8>, value: Arc<T>) {
    if let Ok(mut entries) = table.write() {
        if entries.len() >= CACHE_LIMIT {
            entries.clear();
        }
        entries.insert(key, value);
    }
}

impl std::fmt::Debug for TemplateSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TemplateSet")
            .field("names", &self.templates.keys())
            .finish_non_exhaustive()
    }
}

fn file_name(name: &str) -> String {
    format!("{name}{TEMPLATE_SUFFIX}")
}

/// Renders minijinja errors with their file and line and the chain of causes.
fn describe(err: &minijinja::Error) -> String {
    let mut out = match (err.name(), err.line()) {
        (Some(file), Some(line)) => format!("line {line} ({file}): {}", err.kind()),
        _ => err.kind().to_string(),
    };
    if let Some(detail) = err.detail() {
        out.push_str(": ");
        out.push_str(detail);
    }
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

impl TemplateSet {
    /// Compiles every template and renders it once against a sample pod, so that syntax errors,
    /// undefined variables and malformed fragments fail here rather than at request time.
    pub fn compile(
        sources: Vec<(String, String)>,
        values: &BTreeMap<String, serde_json::Value>,
    ) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        // Output is YAML, not HTML: no auto-escaping (use `| tojson` to quote a value).
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        env.set_keep_trailing_newline(true);
        let mut templates = BTreeMap::new();
        let mut texts = BTreeMap::new();
        let values_json = serde_json::to_vec(values).unwrap_or_default();
        for (name, source) in sources {
            let file = file_name(&name);
            if name.is_empty() || name.contains([',', '/', ' ']) {
                return Err(TemplateError::Invalid {
                    file,
                    detail: "a template name must be non-empty without ',', '/' or spaces".into(),
                });
            }
            let header =
                overrides::declared(&source).map_err(|detail| TemplateError::Overrides {
                    file: file.clone(),
                    detail,
                })?;
            let mut h = Sha256::new();
            h.update(source.as_bytes());
            h.update([0]);
            h.update(&values_json);
            let hash: String = h.finalize()[..8]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            env.add_template_owned(file.clone(), source.clone())
                .map_err(|e| TemplateError::Compile {
                    file: file.clone(),
                    detail: describe(&e),
                })?;
            let template = env
                .get_template(&file)
                .map_err(|e| TemplateError::Compile {
                    file: file.clone(),
                    detail: describe(&e),
                })?;
            // The declared defaults, checked as a pod that sets none of them sees them.
            let none: BTreeMap<String, String> = BTreeMap::new();
            let defaults =
                overrides::resolve(&header, &none).map_err(|e| TemplateError::Overrides {
                    file: file.clone(),
                    detail: e.to_string(),
                })?;
            let entry = Compiled {
                injection: (name.as_str().into(), hash.into()),
                reads: reads_of(&template, &source),
                declared: header,
                defaults: Overrides::owned(defaults),
            };
            texts.insert(name.clone(), source);
            templates.insert(name, entry);
        }
        let mut set = Self {
            env,
            templates,
            values: Value::from_serialize(values),
            cache: RenderCache::default(),
            owned: Owned::default(),
            sources: texts,
        };
        set.owned = set.check_samples()?;
        Ok(set)
    }

    /// Renders every template for two sample pods, one bare and one with ports, labels and an
    /// owner. Both must render; container names must be unique; and what [`Owned`] records
    /// must not differ between the two, since the context leaves it out by name.
    fn check_samples(&self) -> Result<Owned, TemplateError> {
        let bare = PodContext::sample(Sample::Bare);
        let busy = PodContext::sample(Sample::Busy);
        let mut owned = Owned::default();
        let mut owner: BTreeMap<String, String> = BTreeMap::new();
        for (name, entry) in &self.templates {
            let file = file_name(name);
            // The defaults were checked when the template was compiled.
            let defaults = entry.defaults.borrowed();
            let first = self.render(name, &bare, &defaults)?;
            let second = self.render(name, &busy, &defaults)?;
            let keys = |f: &Fragment| {
                (
                    f.sidecar_names()
                        .map(str::to_owned)
                        .collect::<BTreeSet<_>>(),
                    f.volumes
                        .iter()
                        .map(|v| v.name.clone())
                        .collect::<BTreeSet<_>>(),
                    f.labels.keys().cloned().collect::<BTreeSet<_>>(),
                    f.annotations.keys().cloned().collect::<BTreeSet<_>>(),
                )
            };
            let static_keys = keys(&first);
            if static_keys != keys(&second) {
                return Err(TemplateError::Invalid {
                    file,
                    detail: "the names of its containers and volumes and the keys of its labels and annotations must not depend on the pod".into(),
                });
            }
            let mut seen = BTreeSet::new();
            for c in first.sidecar_names() {
                if c.is_empty() {
                    return Err(TemplateError::Invalid {
                        file,
                        detail: "a container has no name".into(),
                    });
                }
                if !seen.insert(c) {
                    return Err(TemplateError::Invalid {
                        file,
                        detail: format!("container {c:?} is defined twice"),
                    });
                }
                if let Some(first) = owner.insert(c.to_owned(), name.clone()) {
                    return Err(TemplateError::Conflict {
                        first: file_name(&first),
                        second: file,
                        container: c.to_owned(),
                    });
                }
            }
            if static_keys.1.contains("") {
                return Err(TemplateError::Invalid {
                    file,
                    detail: "a volume has no name".into(),
                });
            }
            let (sidecars, volumes, labels, annotations) = static_keys;
            owned.sidecars.extend(sidecars);
            owned.volumes.extend(volumes);
            owned.labels.extend(labels);
            owned.annotations.extend(annotations);
        }
        Ok(owned)
    }

    /// Template `name` rendered for the bare sample pod with its default overrides (what the
    /// policy exporter's backstop reads of a template it cannot read for every pod).
    pub fn sample(&self, name: &str) -> Result<Arc<Fragment>, TemplateError> {
        let none = Overrides::owned(BTreeMap::new());
        let defaults = self
            .templates
            .get(name)
            .map_or(none.borrowed(), |t| t.defaults.borrowed());
        self.render(name, &PodContext::sample(Sample::Bare), &defaults)
    }

    /// What template `name` reads of the pod context; everything for an unknown name.
    pub fn reads(&self, name: &str) -> &Reads {
        static ALL: Reads = Reads::ALL;
        self.templates.get(name).map_or(&ALL, |t| &t.reads)
    }

    /// What the templates put on pods under fixed names (see [`Owned`]).
    pub fn owned(&self) -> &Owned {
        &self.owned
    }

    /// The annotations template `name` declares it reads.
    pub fn declared(&self, name: &str) -> Option<&Declared> {
        self.templates.get(name).map(|t| &t.declared)
    }

    /// The overrides template `name` sees for a pod with these annotations: its values, checked,
    /// or the defaults.
    pub fn overrides_for(
        &self,
        name: &str,
        annotations: &(impl overrides::Annotations + ?Sized),
    ) -> Result<Overrides<'_>, BadValue> {
        match self.templates.get(name) {
            // Most pods set none of a template's override annotations: the defaults apply.
            Some(t)
                if t.declared
                    .keys()
                    .any(|a| annotations.annotation(a).is_some()) =>
            {
                overrides::resolve(&t.declared, annotations).map(Overrides::owned)
            }
            Some(t) => Ok(t.defaults.borrowed()),
            None => Ok(Overrides::owned(BTreeMap::new())),
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.templates.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.templates.keys().map(String::as_str)
    }

    /// The template's hash (of its source and the configuration's values), empty for an
    /// unknown name. The metric of injections per template carries it.
    pub fn hash(&self, name: &str) -> &str {
        self.templates.get(name).map_or("", |t| &t.injection.1)
    }

    /// A template's name and hash, shared (for metrics labels).
    pub fn injection(&self, name: &str) -> Injection {
        match self.templates.get(name) {
            Some(t) => t.injection.clone(),
            None => (name.into(), "".into()),
        }
    }

    /// Template `name`'s source, as it was compiled.
    pub fn source(&self, name: &str) -> Option<&str> {
        self.sources.get(name).map(String::as_str)
    }

    /// Renders a source of the caller's (a template rewritten by the policy exporter) with
    /// this set's environment and `values` only, and reads it as a fragment: no pod, no
    /// overrides, nothing cached.
    pub fn render_source(&self, name: &str, source: &str) -> Result<Fragment, TemplateError> {
        let file = file_name(name);
        let text = self
            .env
            .render_str(
                source,
                minijinja::context! { values => self.values.clone() },
            )
            .map_err(|e| TemplateError::Render {
                file,
                detail: describe(&e),
            })?;
        self.read_fragment(name, &text)
    }

    /// Evaluates an expression that reads nothing of the pod (only `values`), for the policy
    /// exporter.
    pub fn evaluate(&self, expression: &str) -> Result<Value, String> {
        self.env
            .compile_expression(expression)
            .and_then(|e| e.eval(minijinja::context! { values => self.values.clone() }))
            .map_err(|e| describe(&e))
    }

    /// Renders one template for a pod, with its checked overrides ([`Self::overrides_for`]).
    pub fn render(
        &self,
        name: &str,
        pod: &PodContext<'_>,
        overrides: &Overrides<'_>,
    ) -> Result<Arc<Fragment>, TemplateError> {
        // The serialized context is its own key (equal bytes, equal rendering), marked apart
        // from the keys the engine builds from a request.
        let key = |mut key: Vec<u8>| {
            key.push(b'T');
            key.extend(serde_json::to_vec(pod).unwrap_or_default());
            key
        };
        self.render_with(name, overrides, key, || Ok(pod.clone()))
    }

    /// Renders one template for a pod. The render-cache key is the template and its
    /// overrides (`values` belong to the set, which is rebuilt when they change), to which
    /// `key` appends what stands for the pod context: equal keys must mean equal contexts.
    /// `context` builds the context, only when the rendering is not cached.
    pub fn render_with<'c, E: From<TemplateError>>(
        &self,
        name: &str,
        overrides: &Overrides<'_>,
        key: impl FnOnce(Vec<u8>) -> Vec<u8>,
        context: impl FnOnce() -> Result<PodContext<'c>, E>,
    ) -> Result<Arc<Fragment>, E> {
        // Room for the pod context's part, written once into the same buffer.
        let mut start = Vec::with_capacity(name.len() + overrides.json.len() + 2 + 512);
        start.extend_from_slice(name.as_bytes());
        start.push(0);
        start.extend_from_slice(&overrides.json);
        start.push(0);
        let full = key(start);
        if let Some(fragment) = cached(&self.cache.by_context, &full) {
            return Ok(fragment);
        }
        let pod = context()?;
        let text = self.render_text(name, &pod, &overrides.values)?;
        let mut by_text = Vec::with_capacity(name.len() + 1 + text.len());
        by_text.extend_from_slice(name.as_bytes());
        by_text.push(0);
        by_text.extend_from_slice(text.as_bytes());
        let fragment = match cached(&self.cache.by_text, &by_text) {
            Some(fragment) => fragment,
            None => {
                let fragment = Arc::new(self.read_fragment(name, &text)?);
                keep(&self.cache.by_text, by_text, fragment.clone());
                fragment
            }
        };
        keep(&self.cache.by_context, full, fragment.clone());
        Ok(fragment)
    }

    /// `digest(input)`, computed once per distinct input (a pure function, so kept like a
    /// rendering).
    pub fn digest_with(&self, input: Vec<u8>, digest: impl FnOnce(&[u8]) -> String) -> Arc<str> {
        remembered(&self.cache.digests, input, |input| digest(input).into())
    }

    /// [`Self::digest_with`] for a text that is also written as JSON.
    pub fn quoted_with(&self, input: Vec<u8>, text: impl FnOnce() -> String) -> Arc<Quoted> {
        remembered(&self.cache.statuses, input, |_| {
            Arc::new(Quoted::new(text()))
        })
    }

    fn render_text(
        &self,
        name: &str,
        pod: &PodContext<'_>,
        overrides: &BTreeMap<String, serde_json::Value>,
    ) -> Result<String, TemplateError> {
        let file = file_name(name);
        let template = self
            .env
            .get_template(&file)
            .map_err(|e| TemplateError::Render {
                file: file.clone(),
                detail: describe(&e),
            })?;
        let ctx = minijinja::context! {
            pod => Value::from_serialize(pod),
            values => self.values.clone(),
            overrides => Value::from_serialize(overrides),
        };
        template.render(ctx).map_err(|e| TemplateError::Render {
            file,
            detail: describe(&e),
        })
    }

    fn read_fragment(&self, name: &str, text: &str) -> Result<Fragment, TemplateError> {
        let fragment: Fragment = if text.trim().is_empty() {
            Fragment::default()
        } else {
            // Comments of a rendered fragment are never read: the parser need not keep them.
            let mut options = serde_saphyr::Options::default();
            options.emit_comments = false;
            serde_saphyr::from_str_with_options(text, options).map_err(|e| {
                TemplateError::Fragment {
                    file: file_name(name),
                    detail: e.to_string(),
                }
            })?
        };
        Ok(fragment.seal())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::context::{Field, Keys, Owner};
    use serde_json::json;

    fn compile(src: &str) -> Result<TemplateSet, TemplateError> {
        TemplateSet::compile(vec![("t".into(), src.into())], &BTreeMap::new())
    }

    #[test]
    fn syntax_error_names_file_and_line() {
        let err = compile("containers:\n  - name: a\n    image: {{ x }\n").expect_err("broken");
        let msg = err.to_string();
        assert!(msg.contains("t.yaml.j2"), "{msg}");
        assert!(msg.contains("line 3"), "{msg}");
    }

    #[test]
    fn undefined_variable_fails_at_load() {
        let err = compile("containers:\n  - name: a\n    image: {{ values.nope }}\n")
            .expect_err("strict undefined");
        let msg = err.to_string();
        assert!(msg.contains("t.yaml.j2") && msg.contains("line 3"), "{msg}");
    }

    #[test]
    fn unknown_fragment_key_fails_at_load() {
        let err = compile("container:\n  - name: a\n").expect_err("typo");
        assert!(
            err.to_string().contains("not a valid sidecar fragment"),
            "{err}"
        );
    }

    #[test]
    fn duplicate_container_across_templates_is_a_conflict() {
        let src = "containers:\n  - name: same\n    image: x:1\n";
        let err = TemplateSet::compile(
            vec![("a".into(), src.into()), ("b".into(), src.into())],
            &BTreeMap::new(),
        )
        .expect_err("conflict");
        assert!(matches!(err, TemplateError::Conflict { .. }), "{err}");
    }

    fn ctx<'a>(namespace: &'a str, spec: serde_json::Value) -> PodContext<'a> {
        PodContext {
            name: "",
            generate_name: "web-",
            namespace,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            service_account: "default",
            spec,
            owner: Owner::default(),
        }
    }

    #[test]
    fn equal_contexts_share_one_rendering() {
        let set = compile(
            "containers:\n  - name: c\n    image: img:1\n    args: [\"{{ pod.namespace }}\"]\n",
        )
        .expect("compiles");
        let none = Overrides::owned(BTreeMap::new());
        let first = set
            .render("t", &ctx("a", json!({})), &none)
            .expect("renders");
        let again = set
            .render("t", &ctx("a", json!({})), &none)
            .expect("renders");
        assert!(
            Arc::ptr_eq(&first, &again),
            "same context must hit the cache"
        );
        let other = set
            .render("t", &ctx("b", json!({})), &none)
            .expect("renders");
        assert_eq!(
            other.containers[0].args.as_deref(),
            Some(&["b".to_owned()][..])
        );
    }

    /// The cache key covers everything a template reads: the spec and the overrides too.
    #[test]
    fn the_cache_tells_apart_what_templates_read() {
        let set = compile(
            "{# overrides:\n  example.com/level: {type: string, default: info}\n#}\ncontainers:\n  - name: c\n    image: img:1\n    args: [{{ overrides[\"example.com/level\"] | tojson }}{% for c in pod.spec.containers %}{% for p in c.ports | default([]) %}, \"{{ p.containerPort }}\"{% endfor %}{% endfor %}]\n",
        )
        .expect("compiles");
        let args = |spec: serde_json::Value, level: &str| {
            let overrides =
                Overrides::owned([("example.com/level".to_owned(), json!(level))].into());
            set.render("t", &ctx("a", spec), &overrides)
                .expect("renders")
                .containers[0]
                .args
                .clone()
                .unwrap_or_default()
        };
        let no_ports = json!({"containers": [{"name": "app"}]});
        let ports = json!({"containers": [{"name": "app", "ports": [{"containerPort": 8080}]}]});
        assert_eq!(args(no_ports.clone(), "info"), ["info"]);
        assert_eq!(args(ports.clone(), "info"), ["info", "8080"]);
        assert_eq!(args(ports, "debug"), ["debug", "8080"]);
        assert_eq!(args(no_ports, "info"), ["info"]);
    }

    #[test]
    fn names_that_depend_on_the_pod_are_refused() {
        let err = compile("containers:\n  - name: c-{{ pod.namespace }}\n    image: x:1\n")
            .expect_err("name depends on the namespace");
        assert!(
            err.to_string().contains("must not depend on the pod"),
            "{err}"
        );
        let err = compile("annotations:\n  \"{{ pod.owner.kind }}\": x\n").expect_err("key");
        assert!(
            err.to_string().contains("must not depend on the pod"),
            "{err}"
        );
    }

    #[test]
    fn template_hash_follows_source_and_values() {
        let src = "containers:\n  - name: c\n    image: {{ values.image }}\n";
        let values = |image: &str| BTreeMap::from([("image".to_owned(), serde_json::json!(image))]);
        let set = |src: &str, image| {
            TemplateSet::compile(vec![("t".into(), src.into())], &values(image)).expect("compiles")
        };
        let base = set(src, "a:1").hash("t").to_owned();
        assert_eq!(base.len(), 16);
        assert_eq!(set(src, "a:1").hash("t"), base);
        assert_ne!(set(src, "a:2").hash("t"), base);
        assert_ne!(set(&format!("{src}# x\n"), "a:1").hash("t"), base);
        assert_eq!(set(src, "a:1").hash("nope"), "");
    }

    #[test]
    fn renders_pod_context() {
        let set = compile(
            "containers:\n  - name: c\n    image: img:1\n    args: [{{ pod.namespace | tojson }}, \"{{ pod.generateName }}\"]\n",
        )
        .expect("compiles");
        let f = set
            .render(
                "t",
                &ctx("team: a", json!({})),
                &Overrides::owned(BTreeMap::new()),
            )
            .expect("renders");
        assert_eq!(
            f.containers[0].args.as_deref(),
            Some(&["team: a".to_owned(), "web-".to_owned()][..])
        );
    }

    fn reads(src: &str) -> Reads {
        compile(src).expect("compiles").reads("t").clone()
    }

    /// What a template reads is told from its source; anything the analysis cannot follow
    /// reads everything.
    #[test]
    fn reads_are_told_from_the_source() {
        let r = reads(
            "containers: []\n# {{ pod.labels.app | default('x') }} {{ pod.namespace | upper }} {{ values | length }}\n",
        );
        assert!(!r.all);
        assert!(r.field(Field::Namespace) && !r.field(Field::Name) && !r.field(Field::Owner));
        assert_eq!(r.labels, Keys::Some(["app".to_owned()].into()));
        assert_eq!(r.annotations, Keys::None);
        let r = reads(
            "containers: []\n# {% for c in pod.spec.containers %}{{ c.ports | default([]) }}{% endfor %}{{ pod.labels | length }}\n",
        );
        assert_eq!(r.labels, Keys::All);
        // The fields of `pod.spec` the cache key takes, told once: the one it names.
        let spec = |r: &Reads| {
            Field::ALL
                .into_iter()
                .filter(|f| f.in_spec() && r.field(*f))
                .collect::<Vec<_>>()
        };
        let every = Field::ALL
            .into_iter()
            .filter(|f| f.in_spec())
            .collect::<Vec<_>>();
        assert_eq!(spec(&r), [Field::Containers]);
        assert_eq!(
            spec(&reads("containers: []\n# {{ pod.spec | tojson }}\n")),
            every
        );
        assert_eq!(spec(&reads("containers: []\n# {{ pod.namespace }}\n")), []);
        for everything in [
            "containers: []\n# {{ pod | tojson }}\n",
            "containers: []\n# {% set p = pod %}{{ p.name }}\n",
            "containers: []\n# {{ pod['namespace'] }}\n",
            "containers: []\n# {{ debug() | length }}\n",
            "containers: []\n# {{ somethingelse | default('') }}\n",
            "containers: []\n{%- include 'other.yaml.j2' ignore missing %}\n",
        ] {
            assert!(reads(everything).all, "{everything}");
            assert_eq!(spec(&reads(everything)), every, "{everything}");
        }
        assert!(uses_other_templates("a {%- include 'x' %}"));
        assert!(uses_other_templates("{% from 'x' import m %}"));
        assert!(uses_other_templates("{%+ extends 'x' %}"));
        assert!(!uses_other_templates(
            "{% for important in x %}{% endfor %}"
        ));
    }
}
