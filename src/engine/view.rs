//! The AdmissionReview as the engine reads it: a borrowed view of the request body.
//!
//! Only what the injector and the validator read is read (metadata, the names, env names and
//! mounts of containers, volume names, the spec fields the template context shows); strings
//! are borrowed from the body wherever JSON lets them be (no escapes), and everything else is
//! stepped over (checked, never built) by the [`super::json`] reader. A container, a volume
//! and the spec fields the template context projects are also kept as their JSON text, so that
//! the render-cache key is built from the request's own bytes and the typed form is built only
//! when something needs it (a cache miss, the validator's comparison of a sidecar).
//!
//! The view reads fields as k8s-openapi does: `null` is absent, a missing string is empty, a
//! map's repeated key keeps the last value. Where the view cannot read a body (a repeated
//! field, a value of the wrong type in a field it reads, JSON the reader refuses),
//! [`super::review`] reads it the typed way and builds the view from the typed object's
//! canonical JSON, so both roads lead to the same engine. Fields the injector never reads are
//! not checked beyond their JSON: the API server has decoded the object before it calls a
//! webhook.

use std::borrow::Cow;

use serde::Deserialize;

pub use super::json::Raw;
use super::json::{JsonError, Reader, Result as R};

/// A string of the body: borrowed when it has no escapes.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(transparent)]
pub struct Str<'a>(#[serde(borrow)] pub Cow<'a, str>);

impl Str<'_> {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for Str<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Str<'_> {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for Str<'_> {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// A string-to-string map (labels, annotations, nodeSelector): its entries sorted by key, each
/// key once (a repeated key keeps the last value, as k8s-openapi's map does), so it iterates
/// as a `BTreeMap` would. A pod has a handful, which a sorted list finds as fast as a tree
/// without a node per map; the API server writes them sorted, so reading one is appending.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StrMap<'a>(Vec<(Str<'a>, Str<'a>)>);

type Entry<'s, 'a> = (&'s Str<'a>, &'s Str<'a>);

impl<'a> StrMap<'a> {
    pub const fn new() -> Self {
        Self(Vec::new())
    }

    /// Sets `key` to `value`, replacing an earlier value.
    pub fn insert(&mut self, key: Str<'a>, value: Str<'a>) {
        match self.0.last() {
            Some((last, _)) if *last >= key => {
                match self.0.binary_search_by(|(k, _)| k.cmp(&key)) {
                    Ok(i) => self.0[i].1 = value,
                    Err(i) => self.0.insert(i, (key, value)),
                }
            }
            _ => self.0.push((key, value)),
        }
    }

    pub fn get(&self, key: &str) -> Option<&Str<'a>> {
        // A pod's handful of labels or annotations: tested for equality one by one, which
        // compares lengths first, instead of ordered by their bytes as a search must.
        if self.0.len() <= 8 {
            return self
                .0
                .iter()
                .find(|(k, _)| k.as_str() == key)
                .map(|(_, v)| v);
        }
        self.0
            .binary_search_by(|(k, _)| k.as_str().cmp(key))
            .ok()
            .map(|i| &self.0[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = Entry<'_, 'a>> + ExactSizeIterator {
        self.into_iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'s, 'a> IntoIterator for &'s StrMap<'a> {
    type Item = Entry<'s, 'a>;
    type IntoIter = std::iter::Map<
        std::slice::Iter<'s, (Str<'a>, Str<'a>)>,
        fn(&'s (Str<'a>, Str<'a>)) -> Entry<'s, 'a>,
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

impl<'a> FromIterator<(Str<'a>, Str<'a>)> for StrMap<'a> {
    fn from_iter<I: IntoIterator<Item = (Str<'a>, Str<'a>)>>(entries: I) -> Self {
        let mut map = Self::new();
        for (key, value) in entries {
            map.insert(key, value);
        }
        map
    }
}

impl<'a, const N: usize> From<[(Str<'a>, Str<'a>); N]> for StrMap<'a> {
    fn from(entries: [(Str<'a>, Str<'a>); N]) -> Self {
        entries.into_iter().collect()
    }
}

impl super::overrides::Annotations for StrMap<'_> {
    fn annotation(&self, key: &str) -> Option<&str> {
        self.get(key).map(Str::as_str)
    }
}

fn text<'s>(s: &'s Option<Str<'_>>) -> &'s str {
    s.as_ref().map_or("", |s| s.as_str())
}

/// The review envelope: what the typed `AdmissionReview<Pod>` requires is required here too,
/// so that a body the view reads is one the typed path reads.
#[derive(Debug)]
pub struct ReviewView<'a> {
    pub api_version: Str<'a>,
    pub kind: Str<'a>,
    pub request: Option<RequestView<'a>>,
}

/// The request of a review (see `kube::core::admission::AdmissionRequest`, whose required fields
/// it requires, read with the same types but borrowed).
#[derive(Debug)]
pub struct RequestView<'a> {
    pub uid: Str<'a>,
    pub kind: Gvk<'a>,
    pub sub_resource: Option<Str<'a>>,
    pub name: Option<Str<'a>>,
    pub namespace: Option<Str<'a>>,
    pub operation: kube::core::admission::Operation,
    /// Boxed, and read into its box: a pod view is about 500 bytes, which would otherwise be
    /// copied at every level it is returned through.
    pub object: Option<Box<PodView<'a>>>,
    pub old_object: Option<Box<PodView<'a>>>,
}

/// `kube::core::GroupVersionKind`, borrowed.
#[derive(Debug)]
pub struct Gvk<'a> {
    pub group: Str<'a>,
    pub version: Str<'a>,
    pub kind: Str<'a>,
}

impl RequestView<'_> {
    pub fn name(&self) -> &str {
        text(&self.name)
    }

    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_ref().map(|s| s.as_str())
    }

    pub fn sub_resource(&self) -> &str {
        text(&self.sub_resource)
    }
}

impl<'a> ReviewView<'a> {
    /// Reads an AdmissionReview from its JSON text.
    pub fn parse(text: &'a str) -> Result<Self, JsonError> {
        let mut r = Reader::new(text);
        let review = review(&mut r)?;
        r.end()?;
        Ok(review)
    }
}

/// A pod.
#[derive(Clone, Debug, Default)]
pub struct PodView<'a> {
    pub metadata: Option<MetaView<'a>>,
    pub spec: Option<SpecView<'a>>,
}

#[derive(Clone, Debug, Default)]
pub struct MetaView<'a> {
    pub name: Option<Str<'a>>,
    pub generate_name: Option<Str<'a>>,
    pub namespace: Option<Str<'a>>,
    pub labels: Option<StrMap<'a>>,
    pub annotations: Option<StrMap<'a>>,
    pub owner_references: Option<Vec<OwnerView<'a>>>,
    pub deletion_timestamp: Option<Raw<'a>>,
}

#[derive(Clone, Debug, Default)]
pub struct OwnerView<'a> {
    pub api_version: Option<Str<'a>>,
    pub kind: Option<Str<'a>>,
    pub name: Option<Str<'a>>,
    pub controller: Option<bool>,
}

impl OwnerView<'_> {
    pub fn api_version(&self) -> &str {
        text(&self.api_version)
    }
    pub fn kind(&self) -> &str {
        text(&self.kind)
    }
    pub fn name(&self) -> &str {
        text(&self.name)
    }
}

#[derive(Clone, Debug, Default)]
pub struct SpecView<'a> {
    pub containers: Option<Vec<ContainerView<'a>>>,
    pub init_containers: Option<Vec<ContainerView<'a>>>,
    pub volumes: Option<Vec<VolumeView<'a>>>,
    pub image_pull_secrets: Option<Vec<NameView<'a>>>,
    pub host_network: Option<bool>,
    pub node_selector: Option<StrMap<'a>>,
    pub os: Option<Raw<'a>>,
    pub service_account_name: Option<Str<'a>>,
    pub security_context: Option<Raw<'a>>,
    pub priority_class_name: Option<Str<'a>>,
    pub runtime_class_name: Option<Str<'a>>,
    pub restart_policy: Option<Str<'a>>,
    pub share_process_namespace: Option<bool>,
    pub hostname: Option<Str<'a>>,
    pub subdomain: Option<Str<'a>>,
    /// Pod-level `resources` (the pod's budget), as JSON.
    pub resources: Option<Raw<'a>>,
}

impl<'a> SpecView<'a> {
    pub fn containers(&self) -> &[ContainerView<'a>] {
        self.containers.as_deref().unwrap_or_default()
    }
    pub fn init_containers(&self) -> &[ContainerView<'a>] {
        self.init_containers.as_deref().unwrap_or_default()
    }
    pub fn volumes(&self) -> &[VolumeView<'a>] {
        self.volumes.as_deref().unwrap_or_default()
    }
    pub fn image_pull_secrets(&self) -> &[NameView<'a>] {
        self.image_pull_secrets.as_deref().unwrap_or_default()
    }
    pub fn service_account_name(&self) -> &str {
        text(&self.service_account_name)
    }

    /// `spec.os.name`, read as k8s-openapi reads `PodOS` (a missing name is empty).
    pub fn os_name(&self) -> Result<Option<String>, serde_json::Error> {
        #[derive(Deserialize)]
        struct Os {
            #[serde(default)]
            name: Option<String>,
        }
        self.os
            .map(|raw| serde_json::from_str::<Os>(raw.get()).map(|o| o.name.unwrap_or_default()))
            .transpose()
    }
}

/// Something with a name (an image pull secret, an env var).
#[derive(Clone, Debug, Default)]
pub struct NameView<'a> {
    pub name: Option<Str<'a>>,
}

impl NameView<'_> {
    pub fn name(&self) -> &str {
        text(&self.name)
    }
}

#[derive(Clone, Debug, Default)]
pub struct MountView<'a> {
    pub name: Option<Str<'a>>,
    pub mount_path: Option<Str<'a>>,
}

impl MountView<'_> {
    pub fn name(&self) -> &str {
        text(&self.name)
    }
    pub fn mount_path(&self) -> &str {
        text(&self.mount_path)
    }
}

/// An object's members as they came: each key with its value's JSON, in order.
pub type Members<'a> = Vec<(Str<'a>, Raw<'a>)>;

/// The object written back from its members (a repeated key stays repeated), for reading it
/// the typed way.
fn object_json(members: &Members<'_>) -> String {
    let mut out = String::with_capacity(
        members
            .iter()
            .map(|(k, v)| k.len() + v.get().len() + 4)
            .sum::<usize>()
            + 2,
    );
    out.push('{');
    for (i, (k, v)) in members.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        // A key is a string: it always serializes.
        out.push_str(&serde_json::to_string(k.as_str()).unwrap_or_default());
        out.push(':');
        out.push_str(v.get());
    }
    out.push('}');
    out
}

/// A container: the fields the engine reads, and its JSON. The container is read once: the
/// fields the engine reads (its name, env names, mount names and paths) are read in the same
/// pass that checks the rest.
#[derive(Clone, Debug)]
pub struct ContainerView<'a> {
    pub name: Str<'a>,
    /// The fields the template context projects (`image`, `command`, `args`, `workingDir`,
    /// `ports`), as JSON.
    pub image: Option<Raw<'a>>,
    pub command: Option<Raw<'a>>,
    pub args: Option<Raw<'a>>,
    pub working_dir: Option<Raw<'a>>,
    pub ports: Option<Raw<'a>>,
    /// `resources`, as JSON (read for the pod's QoS class only).
    pub resources: Option<Raw<'a>>,
    pub env: Option<Vec<NameView<'a>>>,
    pub volume_mounts: Option<Vec<MountView<'a>>>,
    /// The container as it is written (a repeated member stays repeated).
    pub json: Raw<'a>,
}

impl ContainerView<'_> {
    /// The typed container (k8s-openapi), for a field-by-field comparison.
    pub fn typed(&self) -> Result<k8s_openapi::api::core::v1::Container, serde_json::Error> {
        serde_json::from_str(self.json.get())
    }
}

/// A volume: its name and its members, read in one pass.
#[derive(Clone, Debug)]
pub struct VolumeView<'a> {
    pub name: Str<'a>,
    /// Every member.
    pub members: Members<'a>,
    /// Whether its (last) `projected` member projects a token, when the reader could tell in
    /// the same pass; else [`Self::is_token_volume`] reads that member's JSON again.
    pub projects_token: Option<bool>,
}

impl VolumeView<'_> {
    /// The volume's JSON, written back from its members.
    pub fn json(&self) -> String {
        object_json(&self.members)
    }

    /// A ServiceAccount token volume as the ServiceAccount admission plugin adds it: its name is
    /// random per pod (`kube-api-access-*`) and it projects a token.
    pub fn is_token_volume(&self) -> Result<bool, serde_json::Error> {
        if !self.name.starts_with("kube-api-access-") {
            return Ok(false);
        }
        let mut projected = self
            .members
            .iter()
            .filter(|(k, _)| k.as_str() == "projected");
        match (projected.next(), projected.next()) {
            (None, _) => Ok(false),
            (Some(_), None) if self.projects_token.is_some() => {
                Ok(self.projects_token == Some(true))
            }
            (Some((_, raw)), None) => projects_a_token(raw.get()).map_err(serde::de::Error::custom),
            // As the typed `Volume` refuses it.
            (Some(_), Some(_)) => Err(serde::de::Error::custom("duplicate field `projected`")),
        }
    }
}

static EMPTY: StrMap<'static> = StrMap::new();

/// A typed pod's canonical JSON, to read it through the view (offline callers, the typed road
/// of [`crate::engine::review`], tests).
pub fn pod_json(pod: &k8s_openapi::api::core::v1::Pod) -> Vec<u8> {
    // A k8s-openapi type always serializes.
    serde_json::to_vec(pod).unwrap_or_default()
}

impl<'a> PodView<'a> {
    /// Reads a pod from JSON.
    pub fn parse(json: &'a [u8]) -> Result<Self, serde_json::Error> {
        let text = std::str::from_utf8(json).map_err(serde::de::Error::custom)?;
        let mut r = Reader::new(text);
        let pod = pod(&mut r).and_then(|pod| r.end().map(|()| pod));
        pod.map_err(serde::de::Error::custom)
    }

    pub fn meta(&self) -> &MetaView<'a> {
        static NONE: MetaView<'static> = MetaView {
            name: None,
            generate_name: None,
            namespace: None,
            labels: None,
            annotations: None,
            owner_references: None,
            deletion_timestamp: None,
        };
        self.metadata.as_ref().unwrap_or(&NONE)
    }

    pub fn labels(&self) -> &StrMap<'a> {
        self.meta().labels.as_ref().unwrap_or(&EMPTY)
    }

    pub fn annotations(&self) -> &StrMap<'a> {
        self.meta().annotations.as_ref().unwrap_or(&EMPTY)
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels().get(key).map(|v| v.as_str())
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations().get(key).map(|v| v.as_str())
    }

    pub fn name(&self) -> &str {
        text(&self.meta().name)
    }

    pub fn generate_name(&self) -> &str {
        text(&self.meta().generate_name)
    }

    pub fn containers(&self) -> &[ContainerView<'a>] {
        self.spec.as_ref().map_or(&[], |s| s.containers())
    }

    pub fn init_containers(&self) -> &[ContainerView<'a>] {
        self.spec.as_ref().map_or(&[], |s| s.init_containers())
    }

    /// Whether a container or an init container has this name.
    pub fn has_container(&self, name: &str) -> bool {
        self.containers()
            .iter()
            .chain(self.init_containers())
            .any(|c| c.name.as_str() == name)
    }
}

// === Reading ===
//
// Each reader follows what serde's derive would do for the typed field: an unknown member is
// stepped over, a known member given twice is refused, `null` is an absent optional field, a
// required field that is missing is refused, and a value of another type is refused.

/// Marks a known member as read; a second time is refused.
fn once(r: &Reader<'_>, read: &mut u32, bit: u32) -> R<()> {
    if *read & bit != 0 {
        return Err(r.wrong("duplicate field"));
    }
    *read |= bit;
    Ok(())
}

#[inline(always)]
fn string<'a>(r: &mut Reader<'a>) -> R<Str<'a>> {
    r.string().map(Str)
}

fn optional<'a, T>(r: &mut Reader<'a>, read: impl FnOnce(&mut Reader<'a>) -> R<T>) -> R<Option<T>> {
    if r.null()? {
        Ok(None)
    } else {
        read(r).map(Some)
    }
}

fn opt_string<'a>(r: &mut Reader<'a>) -> R<Option<Str<'a>>> {
    optional(r, string)
}

fn opt_bool(r: &mut Reader<'_>) -> R<Option<bool>> {
    optional(r, Reader::bool)
}

fn opt_raw<'a>(r: &mut Reader<'a>) -> R<Option<Raw<'a>>> {
    optional(r, Reader::raw)
}

/// Lists start with room for a pod's usual few: growing a list from empty was a reallocation
/// (and the growing code) several times a review. A container's env vars and mounts (`ROOM`
/// 8) come more often by the dozen than the others (4).
fn list<'a, T, const ROOM: usize>(
    r: &mut Reader<'a>,
    mut read: impl FnMut(&mut Reader<'a>) -> R<T>,
) -> R<Vec<T>> {
    let mut out = Vec::with_capacity(ROOM);
    r.array(|r| {
        out.push(read(r)?);
        Ok(())
    })?;
    Ok(out)
}

fn str_map<'a>(r: &mut Reader<'a>) -> R<StrMap<'a>> {
    // Room for a pod's usual labels at once (a Deployment's pod has four or five): growing
    // from empty took two allocations for them.
    let mut map = StrMap(Vec::with_capacity(8));
    r.object(|r, key| {
        let value = string(r)?;
        map.insert(Str(key), value);
        Ok(())
    })?;
    Ok(map)
}

fn required<T>(r: &Reader<'_>, value: Option<T>) -> R<T> {
    value.ok_or_else(|| r.wrong("missing field"))
}

/// Reads an object's members into places: `"key" => reader => place` reads the member `key`
/// with `reader` into `place` (`_` checks it and keeps nothing). Each key may come once; any
/// other member is stepped over.
macro_rules! members {
    ($r:expr, { $($key:literal => $read:expr => $place:expr),* $(,)? }) => {{
        let mut read = 0u32;
        $r.object(|r, key| {
            let mut bit = 1u32;
            $(
                if &*key == $key {
                    once(r, &mut read, bit)?;
                    // `_` places take readers that only check (their value is `()`).
                    #[allow(clippy::let_unit_value)]
                    {
                        $place = $read(r)?;
                    }
                    return Ok(());
                }
                bit <<= 1;
            )*
            let _ = bit;
            r.skip()
        })
    }};
}

/// The cpu and memory of a `resources` member's `requests` and `limits` (`[requests,
/// limits]`, each `[cpu, memory]`), as written; other resources stepped over. Read on demand
/// (a pod's QoS class), with the view's reader: a review reads none unless it needs them.
pub fn resource_amounts(json: &str) -> R<[[Option<Cow<'_, str>>; 2]; 2]> {
    fn amounts<'a>(r: &mut Reader<'a>) -> R<[Option<Cow<'a, str>>; 2]> {
        let mut a: [Option<Cow<'a, str>>; 2] = Default::default();
        optional(r, |r| {
            r.object(|r, key| match &*key {
                "cpu" => {
                    a[0] = Some(r.string()?);
                    Ok(())
                }
                "memory" => {
                    a[1] = Some(r.string()?);
                    Ok(())
                }
                _ => r.skip(),
            })
        })?;
        Ok(a)
    }
    let mut r = Reader::new(json);
    let mut out: [[Option<Cow<'_, str>>; 2]; 2] = Default::default();
    optional(&mut r, |r| {
        r.object(|r, key| match &*key {
            "requests" => {
                out[0] = amounts(r)?;
                Ok(())
            }
            "limits" => {
                out[1] = amounts(r)?;
                Ok(())
            }
            _ => r.skip(),
        })
    })?;
    r.end()?;
    Ok(out)
}

/// Each `(containerPort, protocol)` of a container's `ports` member (the protocol as
/// written, `TCP` when absent), in order; other fields stepped over.
pub fn each_port(json: &str, mut port: impl FnMut(i32, &str)) -> R<()> {
    let mut r = Reader::new(json);
    optional(&mut r, |r| {
        r.array(|r| {
            let (mut number, mut protocol) = (None, None);
            r.object(|r, key| match &*key {
                "containerPort" => {
                    let raw = r.raw()?;
                    number = raw.get().parse::<i32>().ok();
                    Ok(())
                }
                "protocol" => {
                    protocol = optional(r, Reader::string)?;
                    Ok(())
                }
                _ => r.skip(),
            })?;
            if let Some(number) = number {
                port(number, protocol.as_deref().unwrap_or("TCP"));
            }
            Ok(())
        })
    })?;
    r.end()
}

fn review<'a>(r: &mut Reader<'a>) -> R<ReviewView<'a>> {
    let (mut api_version, mut kind, mut request) = (None, None, None);
    members!(r, {
        "apiVersion" => |r: &mut Reader<'a>| string(r).map(Some) => api_version,
        "kind" => |r: &mut Reader<'a>| string(r).map(Some) => kind,
        "request" => |r: &mut Reader<'a>| optional(r, request_view) => request,
        "response" => Reader::skip => _,
    })?;
    Ok(ReviewView {
        api_version: required(r, api_version)?,
        kind: required(r, kind)?,
        request,
    })
}

fn operation(r: &mut Reader<'_>) -> R<kube::core::admission::Operation> {
    use serde::de::IntoDeserializer as _;
    let name = r.string()?;
    let de: serde::de::value::StrDeserializer<'_, serde::de::value::Error> =
        name.as_ref().into_deserializer();
    kube::core::admission::Operation::deserialize(de).map_err(|_| r.wrong("unknown operation"))
}

fn request_view<'a>(r: &mut Reader<'a>) -> R<RequestView<'a>> {
    let (mut uid, mut kind, mut resource, mut operation_, mut user_info) =
        (None, None, None, None, None);
    let (mut sub_resource, mut name, mut namespace, mut object, mut old_object) =
        (None, None, None, None, None);
    members!(r, {
        "uid" => |r: &mut Reader<'a>| string(r).map(Some) => uid,
        "kind" => |r: &mut Reader<'a>| gvk(r).map(Some) => kind,
        "resource" => |r: &mut Reader<'a>| gvr(r).map(Some) => resource,
        "subResource" => opt_string => sub_resource,
        "requestKind" => |r: &mut Reader<'a>| optional(r, gvk) => _,
        "requestResource" => |r: &mut Reader<'a>| optional(r, gvr) => _,
        "requestSubResource" => opt_string => _,
        "name" => opt_string => name,
        "namespace" => opt_string => namespace,
        "operation" => |r: &mut Reader<'a>| operation(r).map(Some) => operation_,
        "userInfo" => |r: &mut Reader<'a>| self::user_info(r).map(Some) => user_info,
        "object" => |r: &mut Reader<'a>| optional(r, boxed_pod) => object,
        "oldObject" => |r: &mut Reader<'a>| optional(r, boxed_pod) => old_object,
        "dryRun" => Reader::bool => _,
        "options" => Reader::skip => _,
    })?;
    required(r, resource)?;
    required(r, user_info)?;
    Ok(RequestView {
        uid: required(r, uid)?,
        kind: required(r, kind)?,
        sub_resource,
        name,
        namespace,
        operation: required(r, operation_)?,
        object,
        old_object,
    })
}

/// `{"group":"…","version":"…",THIRD"…"}`, a group, version and kind (or resource) as the API
/// server writes one (`third` is `,"kind":"` or `,"resource":"`): its three strings, or `None`
/// (nothing read) for the general reader. Four of them in every review: read the general way
/// they were about 2,600 instructions of a review's 58,000.
#[inline(never)]
fn compact_gv<'a>(r: &mut Reader<'a>, third: &'static [u8]) -> Option<[&'a str; 3]> {
    r.compact(|r| {
        r.eat_text(b"{\"group\":\"")?;
        let group = r.plain_rest()?;
        r.eat_text(b",\"version\":\"")?;
        let version = r.plain_rest()?;
        r.eat_text(third)?;
        let last = r.plain_rest()?;
        r.eat_text(b"}")?;
        Some([group, version, last])
    })
}

fn gvk<'a>(r: &mut Reader<'a>) -> R<Gvk<'a>> {
    if let Some([group, version, kind]) = compact_gv(r, b",\"kind\":\"") {
        let s = |s| Str(Cow::Borrowed(s));
        return Ok(Gvk {
            group: s(group),
            version: s(version),
            kind: s(kind),
        });
    }
    let [group, version, kind] = string_members(r, &["group", "version", "kind"])?;
    Ok(Gvk {
        group: required(r, group)?,
        version: required(r, version)?,
        kind: required(r, kind)?,
    })
}

/// `kube::core::GroupVersionResource`: checked, not kept.
fn gvr(r: &mut Reader<'_>) -> R<()> {
    if compact_gv(r, b",\"resource\":\"").is_some() {
        return Ok(());
    }
    let [group, version, resource, _] =
        string_members(r, &["group", "version", "resource", "api_version"])?;
    required(r, group.and(version).and(resource)).map(drop)
}

/// An object whose members named in `keys` are strings, each given once; any other member is
/// stepped over. One reader for the two group/version/kind objects of a review and one for the
/// two group/version/resource objects, not inlined: a reader generated for each by
/// [`members!`] was 87 lines of code that a cold review fetched from memory
/// (docs/benchmarks-history.md, "What the goals needed").
#[inline(never)]
fn string_members<'a, const N: usize>(
    r: &mut Reader<'a>,
    keys: &'static [&'static str; N],
) -> R<[Option<Str<'a>>; N]> {
    let mut found = [const { None }; N];
    let mut read = 0u32;
    r.object(|r, key| {
        for (i, want) in keys.iter().enumerate() {
            if &*key == *want {
                once(r, &mut read, 1 << i)?;
                found[i] = Some(string(r)?);
                return Ok(());
            }
        }
        r.skip()
    })?;
    Ok(found)
}

/// A list of strings, checked and not kept.
fn strings(r: &mut Reader<'_>) -> R<()> {
    r.array(|r| r.string().map(drop))
}

/// `k8s_openapi::api::authentication::v1::UserInfo`: checked, not kept.
fn user_info<'a>(r: &mut Reader<'a>) -> R<()> {
    members!(r, {
        "username" => opt_string => _,
        "uid" => opt_string => _,
        "groups" => |r: &mut Reader<'a>| optional(r, strings) => _,
        "extra" => |r: &mut Reader<'a>| optional(r, |r| r.object(|r, _| strings(r))) => _,
    })
}

/// `apiVersion` and `kind` are checked as k8s-openapi checks them: when present, exactly these.
fn exactly(r: &mut Reader<'_>, want: &str) -> R<()> {
    if r.string()? != want {
        return Err(r.wrong("unexpected apiVersion or kind"));
    }
    Ok(())
}

fn pod<'a>(r: &mut Reader<'a>) -> R<PodView<'a>> {
    boxed_pod(r).map(|pod| *pod)
}

fn boxed_pod<'a>(r: &mut Reader<'a>) -> R<Box<PodView<'a>>> {
    let mut pod = Box::<PodView<'a>>::default();
    members!(r, {
        "apiVersion" => |r: &mut Reader<'a>| exactly(r, "v1") => _,
        "kind" => |r: &mut Reader<'a>| exactly(r, "Pod") => _,
        "metadata" => |r: &mut Reader<'a>| optional(r, meta) => pod.metadata,
        "spec" => |r: &mut Reader<'a>| optional(r, spec) => pod.spec,
    })?;
    Ok(pod)
}

fn meta<'a>(r: &mut Reader<'a>) -> R<MetaView<'a>> {
    let mut m = MetaView::default();
    members!(r, {
        "name" => opt_string => m.name,
        "generateName" => opt_string => m.generate_name,
        "namespace" => opt_string => m.namespace,
        "labels" => |r: &mut Reader<'a>| optional(r, str_map) => m.labels,
        "annotations" => |r: &mut Reader<'a>| optional(r, str_map) => m.annotations,
        "ownerReferences" => |r: &mut Reader<'a>| optional(r, |r| list::<_, 4>(r, owner)) => m.owner_references,
        "deletionTimestamp" => opt_raw => m.deletion_timestamp,
    })?;
    Ok(m)
}

fn owner<'a>(r: &mut Reader<'a>) -> R<OwnerView<'a>> {
    let mut o = OwnerView::default();
    members!(r, {
        "apiVersion" => opt_string => o.api_version,
        "kind" => opt_string => o.kind,
        "name" => opt_string => o.name,
        "controller" => opt_bool => o.controller,
    })?;
    Ok(o)
}

fn spec<'a>(r: &mut Reader<'a>) -> R<SpecView<'a>> {
    let mut s = SpecView::default();
    members!(r, {
        "containers" => |r: &mut Reader<'a>| optional(r, |r| list::<_, 4>(r, container)) => s.containers,
        "initContainers" => |r: &mut Reader<'a>| optional(r, |r| list::<_, 4>(r, container)) => s.init_containers,
        "volumes" => |r: &mut Reader<'a>| optional(r, |r| list::<_, 4>(r, volume)) => s.volumes,
        "imagePullSecrets" => |r: &mut Reader<'a>| optional(r, |r| list::<_, 4>(r, name_view)) => s.image_pull_secrets,
        "hostNetwork" => opt_bool => s.host_network,
        "nodeSelector" => |r: &mut Reader<'a>| optional(r, str_map) => s.node_selector,
        "os" => opt_raw => s.os,
        "serviceAccountName" => opt_string => s.service_account_name,
        "securityContext" => opt_raw => s.security_context,
        "priorityClassName" => opt_string => s.priority_class_name,
        "runtimeClassName" => opt_string => s.runtime_class_name,
        "restartPolicy" => opt_string => s.restart_policy,
        "shareProcessNamespace" => opt_bool => s.share_process_namespace,
        "hostname" => opt_string => s.hostname,
        "subdomain" => opt_string => s.subdomain,
        "resources" => opt_raw => s.resources,
    })?;
    Ok(s)
}

fn name_view<'a>(r: &mut Reader<'a>) -> R<NameView<'a>> {
    // An env var as the API server writes one: `{"name":"…"}`, with `,"value":"…"` or
    // `,"valueFrom":{…}` after the name. Read the general way, one was about 460 instructions.
    let compact = r.compact(|r| {
        r.eat_text(b"{\"name\":\"")?;
        let name = r.plain_rest()?;
        if r.eat_text(b",\"value\":\"").is_some() {
            r.plain_rest()?;
        } else if r.eat_text(b",\"valueFrom\":").is_some() {
            r.skip().ok()?;
        }
        r.eat_text(b"}")?;
        Some(name)
    });
    if let Some(name) = compact {
        return Ok(NameView {
            name: Some(Str(Cow::Borrowed(name))),
        });
    }
    let mut n = NameView::default();
    members!(r, { "name" => opt_string => n.name })?;
    Ok(n)
}

fn mount<'a>(r: &mut Reader<'a>) -> R<MountView<'a>> {
    // A mount as the API server writes one: `{"name":"…","mountPath":"…"}`, with
    // `,"readOnly":true` (or false) between.
    let compact = r.compact(|r| {
        r.eat_text(b"{\"name\":\"")?;
        let name = r.plain_rest()?;
        if r.eat_text(b",\"readOnly\":").is_some() {
            r.eat_text(b"true").or_else(|| r.eat_text(b"false"))?;
        }
        r.eat_text(b",\"mountPath\":\"")?;
        let path = r.plain_rest()?;
        r.eat_text(b"}")?;
        Some((name, path))
    });
    if let Some((name, path)) = compact {
        return Ok(MountView {
            name: Some(Str(Cow::Borrowed(name))),
            mount_path: Some(Str(Cow::Borrowed(path))),
        });
    }
    let mut m = MountView::default();
    members!(r, {
        "name" => opt_string => m.name,
        "mountPath" => opt_string => m.mount_path,
    })?;
    Ok(m)
}

/// A member's value, as JSON text, and absent when it is `null`.
fn present(raw: Raw<'_>) -> Option<Raw<'_>> {
    (raw.get() != "null").then_some(raw)
}

fn container<'a>(r: &mut Reader<'a>) -> R<ContainerView<'a>> {
    let mut c = ContainerView {
        name: Str::default(),
        image: None,
        command: None,
        args: None,
        working_dir: None,
        ports: None,
        resources: None,
        env: None,
        volume_mounts: None,
        json: Raw::default(),
    };
    // A field the engine reads, given twice, is left to the typed road (k8s-openapi keeps the
    // last; the view does not guess).
    let mut read = 0;
    let ((), json) = r.spanned(|r| {
        r.object(|r, key| {
            match &*key {
                "name" => {
                    once(r, &mut read, 1)?;
                    c.name = opt_string(r)?.unwrap_or_default();
                }
                "env" => {
                    once(r, &mut read, 2)?;
                    c.env = optional(r, |r| list::<_, 8>(r, name_view))?;
                }
                "volumeMounts" => {
                    once(r, &mut read, 4)?;
                    c.volume_mounts = optional(r, |r| list::<_, 8>(r, mount))?;
                }
                field => {
                    let slot = match field {
                        "image" => Some((8, &mut c.image)),
                        "command" => Some((16, &mut c.command)),
                        "args" => Some((32, &mut c.args)),
                        "workingDir" => Some((64, &mut c.working_dir)),
                        "ports" => Some((128, &mut c.ports)),
                        "resources" => Some((256, &mut c.resources)),
                        _ => None,
                    };
                    match slot {
                        Some((bit, slot)) => {
                            once(r, &mut read, bit)?;
                            *slot = present(r.raw()?);
                        }
                        None => r.skip()?,
                    }
                }
            }
            Ok(())
        })
    })?;
    c.json = json;
    Ok(c)
}

/// Whether a volume's `projected` member has a source with a `serviceAccountToken`, read as
/// the typed `ProjectedVolumeSource` would be: a field given twice is refused.
fn projected_token<'a>(r: &mut Reader<'a>) -> R<bool> {
    let token = |r: &mut Reader<'a>| -> R<bool> {
        let mut token = None;
        members!(r, { "serviceAccountToken" => opt_raw => token })?;
        Ok(token.is_some())
    };
    let mut sources = None;
    optional(r, |r| {
        members!(r, {
            "sources" => |r: &mut Reader<'a>| optional(r, |r| {
                let mut any = false;
                r.array(|r| {
                    any |= token(r)?;
                    Ok(())
                })?;
                Ok(any)
            }) => sources,
        })
    })?;
    Ok(sources.unwrap_or(false))
}

/// [`projected_token`] of a `projected` member's JSON.
fn projects_a_token(json: &str) -> R<bool> {
    let mut r = Reader::new(json);
    let token = projected_token(&mut r)?;
    r.end()?;
    Ok(token)
}

fn volume<'a>(r: &mut Reader<'a>) -> R<VolumeView<'a>> {
    let mut v = VolumeView {
        name: Str::default(),
        members: Vec::with_capacity(4),
        projects_token: None,
    };
    let mut read = 0;
    r.object(|r, key| {
        let raw = match &*key {
            "name" => {
                // The name given twice is left to the typed road, as for a container.
                once(r, &mut read, 1)?;
                let (name, raw) = r.spanned(opt_string)?;
                v.name = name.unwrap_or_default();
                raw
            }
            // Told in this pass when it reads; a member it cannot read is only kept (checked
            // as JSON), as any member the engine does not read, and told later if asked.
            "projected" => match r.attempt(|r| r.spanned(projected_token)) {
                Some((token, raw)) => {
                    v.projects_token = Some(token);
                    raw
                }
                None => {
                    v.projects_token = None;
                    r.raw()?
                }
            },
            _ => r.raw()?,
        };
        v.members.push((Str(key), raw));
        Ok(())
    })?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The review's kind and resource objects are read as the typed review reads them: the view
    /// accepts exactly the envelopes `AdmissionReview<Pod>` accepts (a repeated, missing or
    /// non-string member refused; an unknown one stepped over).
    #[test]
    fn kinds_and_resources_are_read_as_the_typed_review_reads_them() {
        let kind = r#"{"group":"","version":"v1","kind":"Pod"}"#;
        let resource = r#"{"group":"","version":"v1","resource":"pods"}"#;
        let review = |kind: &str, resource: &str| {
            format!(
                r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u","kind":{kind},"resource":{resource},"requestKind":{kind},"requestResource":{resource},"operation":"CREATE","userInfo":{{}}}}}}"#
            )
        };
        let cases = [
            (kind.to_owned(), resource.to_owned()),
            (
                r#"{"group":"","group":"","version":"v1","kind":"Pod"}"#.into(),
                resource.into(),
            ),
            (r#"{"group":"","version":"v1"}"#.into(), resource.into()),
            (
                r#"{"group":"","version":1,"kind":"Pod"}"#.into(),
                resource.into(),
            ),
            (
                r#"{"group":"","version":"v1","kind":"Pod","x":[1,{"y":2}]}"#.into(),
                resource.into(),
            ),
            (
                kind.into(),
                r#"{"group":"","version":"v1","resource":"pods","resource":"x"}"#.into(),
            ),
            (kind.into(), r#"{"group":"","version":"v1"}"#.into()),
            (
                kind.into(),
                r#"{"group":"","version":"v1","resource":null}"#.into(),
            ),
            (
                kind.into(),
                r#"{"group":"","version":"v1","resource":"pods","api_version":"v"}"#.into(),
            ),
            (
                kind.into(),
                r#"{"group":"","version":"v1","resource":"pods","api_version":7}"#.into(),
            ),
        ];
        for (kind, resource) in cases {
            let body = review(&kind, &resource);
            let typed = serde_json::from_str::<
                kube::core::admission::AdmissionReview<k8s_openapi::api::core::v1::Pod>,
            >(&body);
            let ours = ReviewView::parse(&body);
            assert_eq!(ours.is_ok(), typed.is_ok(), "{body}: {ours:?} / {typed:?}");
            if let Ok(view) = ours {
                let request = view.request.expect("a request");
                assert_eq!(
                    (
                        request.kind.group.as_str(),
                        request.kind.version.as_str(),
                        request.kind.kind.as_str()
                    ),
                    ("", "v1", "Pod")
                );
            }
        }
    }

    /// The map reads as a `BTreeMap` of the same entries would: sorted, a repeated key keeping
    /// the last value, whatever order the entries come in.
    #[test]
    fn a_str_map_is_a_sorted_map() {
        let mut seed = 7u64;
        for len in 0..40 {
            let mut ours = StrMap::new();
            let mut tree = std::collections::BTreeMap::new();
            for i in 0..len {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let key = format!("k{}", (seed >> 33) % 12);
                let value = format!("v{i}");
                ours.insert(Str(key.clone().into()), Str(value.clone().into()));
                tree.insert(key, value);
            }
            let got: Vec<(&str, &str)> =
                ours.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let want: Vec<(&str, &str)> =
                tree.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            assert_eq!(got, want);
            assert_eq!(ours.len(), tree.len());
            for k in 0..13 {
                let key = format!("k{k}");
                assert_eq!(
                    ours.get(&key).map(Str::as_str),
                    tree.get(&key).map(String::as_str)
                );
            }
        }
    }

    #[test]
    fn strings_are_borrowed_unless_escaped() {
        let body = br#"{"metadata":{"name":"web","labels":{"a":"b\u0041"}},"spec":{"containers":[{"name":"app","env":[{"name":"X"}]}]}}"#;
        let pod = PodView::parse(body).expect("reads");
        assert!(matches!(
            pod.meta().name.as_ref().map(|s| &s.0),
            Some(Cow::Borrowed("web"))
        ));
        assert_eq!(pod.label("a"), Some("bA"));
        assert_eq!(pod.containers()[0].name.as_str(), "app");
        let typed = pod.containers()[0].typed().expect("typed");
        assert_eq!(typed.env.map(|e| e.len()), Some(1));
    }

    #[test]
    fn a_volume_is_read_in_one_pass_and_written_back_whole() {
        let body = br#"{"spec":{"volumes":[{"name":"kube-api-access-x1","projected":{"sources":[{"serviceAccountToken":{"path":"token"}}]}},{"name":"kube-api-access-x2","projected":{"sources":[{"configMap":{"name":"c"}}]}},{"name":"d\u0041ta","emptyDir":{}}]}}"#;
        let pod = PodView::parse(body).expect("reads");
        let volumes = pod.spec.as_ref().expect("spec").volumes();
        assert_eq!(volumes[0].name.as_str(), "kube-api-access-x1");
        assert!(volumes[0].is_token_volume().expect("reads"));
        assert!(!volumes[1].is_token_volume().expect("reads"));
        assert_eq!(volumes[2].name.as_str(), "dAta");
        assert!(!volumes[2].is_token_volume().expect("reads"));
        let typed: k8s_openapi::api::core::v1::Volume =
            serde_json::from_str(&volumes[0].json()).expect("typed");
        assert_eq!(typed.name, "kube-api-access-x1");
        assert!(typed.projected.is_some());
        // Told in the same pass, not by reading the member again.
        assert_eq!(volumes[0].projects_token, Some(true));
        assert_eq!(volumes[1].projects_token, Some(false));
        assert_eq!(volumes[2].projects_token, None);
    }

    /// A `projected` member the token reader cannot read (a source that is not an object, a
    /// field given twice) is kept as JSON like any other member, the rest of the pod is read,
    /// and the token question gets the answer it got before: the typed refusal.
    #[test]
    fn a_projected_member_not_read_in_pass_is_told_as_before() {
        for projected in [
            r#"{"sources":[1]}"#,
            r#"{"sources":[],"sources":[]}"#,
            r#"{"sources":[{"serviceAccountToken":{},"serviceAccountToken":{}}]}"#,
        ] {
            let body = format!(
                r#"{{"spec":{{"volumes":[{{"name":"kube-api-access-x","projected":{projected}}},{{"name":"after"}}]}}}}"#
            );
            let pod = PodView::parse(body.as_bytes()).expect("reads");
            let volumes = pod.spec.as_ref().expect("spec").volumes();
            assert_eq!(volumes[0].projects_token, None, "{projected}");
            assert_eq!(volumes[0].members[1].1.get(), projected);
            assert_eq!(volumes[1].name.as_str(), "after");
            assert!(volumes[0].is_token_volume().is_err(), "{projected}");
            assert_eq!(
                volumes[0].is_token_volume().is_err(),
                projects_a_token(projected).is_err()
            );
        }
    }

    #[test]
    fn a_token_volume_is_told_as_the_typed_source_would_tell_it() {
        assert_eq!(projects_a_token("null"), Ok(false));
        assert_eq!(projects_a_token(r#"{"sources":null}"#), Ok(false));
        assert_eq!(
            projects_a_token(r#"{"sources":[{"serviceAccountToken":null}]}"#),
            Ok(false)
        );
        assert_eq!(
            projects_a_token(
                r#"{"defaultMode":420,"sources":[{"configMap":{}},{"serviceAccountToken":{"path":"t"}}]}"#
            ),
            Ok(true)
        );
        assert!(projects_a_token(r#"{"sources":[],"sources":[]}"#).is_err());
        assert!(
            projects_a_token(
                r#"{"sources":[{"serviceAccountToken":{},"serviceAccountToken":{}}]}"#
            )
            .is_err()
        );
        assert!(projects_a_token(r#"{"sources":{}}"#).is_err());
    }

    #[test]
    fn null_is_absent_and_a_repeated_map_key_keeps_the_last() {
        let body = br#"{"metadata":{"name":null,"labels":{"a":"1","a":"2"}},"spec":{"containers":null,"hostNetwork":null}}"#;
        let pod = PodView::parse(body).expect("reads");
        assert_eq!(pod.name(), "");
        assert_eq!(pod.label("a"), Some("2"));
        assert!(pod.containers().is_empty());
    }

    /// The compact readers of env vars, mounts and group/version/kind objects read what the
    /// general readers read, and refuse what they refuse: each text is read as it is (the
    /// compact reader's shape where it fits) and with a space after its `{` (which only the
    /// general reader reads).
    #[test]
    fn compact_objects_read_as_the_general_reader_reads_them() {
        fn both<T: std::fmt::Debug + PartialEq>(
            text: &str,
            read: impl for<'a> Fn(&mut Reader<'a>) -> R<T>,
        ) -> (Option<T>, Option<T>) {
            let spaced = text.replacen('{', "{ ", 1);
            let once = |t: &str| {
                let mut r = Reader::new(t);
                read(&mut r).and_then(|v| r.end().map(|()| v)).ok()
            };
            (once(text), once(&spaced))
        }
        let env = |r: &mut Reader<'_>| name_view(r).map(|n| n.name.map(|s| s.to_string()));
        for text in [
            r#"{"name":"A"}"#,
            r#"{"name":"A","value":"v"}"#,
            r#"{"name":"A","value":""}"#,
            r#"{"name":"A","valueFrom":{"secretKeyRef":{"name":"s","key":"k"}}}"#,
            r#"{"name":"A","valueFrom":null}"#,
            r#"{"name":"A","value":"v","x":1}"#,
            r#"{"name":"A","value":5}"#,
            r#"{"name":"A\u0041","value":"v"}"#,
            r#"{"name":"A","value":"v\"w"}"#,
            r#"{"name":"A","valueFrom":{"x":tru}}"#,
            r#"{"name":"A","valueFrom":{"x":1}"#,
            r#"{"name":"A","name":"B"}"#,
            r#"{"name":null}"#,
            r#"{"name":5}"#,
            r#"{"value":"v"}"#,
        ] {
            let (compact, general) = both(text, env);
            assert_eq!(compact, general, "{text}");
        }
        let mount = |r: &mut Reader<'_>| {
            mount(r).map(|m| {
                (
                    m.name.map(|s| s.to_string()),
                    m.mount_path.map(|s| s.to_string()),
                )
            })
        };
        for text in [
            r#"{"name":"a","mountPath":"/p"}"#,
            r#"{"name":"a","readOnly":true,"mountPath":"/p"}"#,
            r#"{"name":"a","readOnly":false,"mountPath":"/p"}"#,
            r#"{"name":"a","readOnly":1,"mountPath":"/p"}"#,
            r#"{"name":"a","readOnly":truex,"mountPath":"/p"}"#,
            r#"{"name":"a","mountPath":"/p","subPath":"s"}"#,
            r#"{"name":"a","mountPath":"/p","mountPath":"/q"}"#,
            r#"{"name":"a\/b","mountPath":"/p"}"#,
            r#"{"mountPath":"/p","name":"a"}"#,
        ] {
            let (compact, general) = both(text, mount);
            assert_eq!(compact, general, "{text}");
        }
        let kind = |r: &mut Reader<'_>| {
            gvk(r).map(|g| {
                (
                    g.group.to_string(),
                    g.version.to_string(),
                    g.kind.to_string(),
                )
            })
        };
        for text in [
            r#"{"group":"","version":"v1","kind":"Pod"}"#,
            r#"{"group":"apps","version":"v1","kind":"Deployment"}"#,
            r#"{"group":"","version":"v1","kind":"Pod","x":1}"#,
            r#"{"group":"","version":"v1","kind":"P\u006fd"}"#,
            r#"{"group":"","version":"v1"}"#,
            r#"{"group":"","version":"v1","kind":"Pod","kind":"X"}"#,
        ] {
            let (compact, general) = both(text, kind);
            assert_eq!(compact, general, "{text}");
        }
        for text in [
            r#"{"group":"","version":"v1","resource":"pods"}"#,
            r#"{"group":"","version":"v1","resource":"pods","api_version":"v"}"#,
            r#"{"group":"","version":"v1","resource":"pods","api_version":7}"#,
            r#"{"group":"","version":"v1","resource":7}"#,
        ] {
            let (compact, general) = both(text, gvr);
            assert_eq!(compact, general, "{text}");
        }
    }

    #[test]
    fn a_repeated_field_or_a_wrong_type_is_not_read() {
        assert!(PodView::parse(br#"{"metadata":{"name":"a","name":"b"}}"#).is_err());
        assert!(PodView::parse(br#"{"spec":{"containers":[{"name":5}]}}"#).is_err());
        assert!(PodView::parse(br#"{"spec":{"containers":[{"name":"a","name":"b"}]}}"#).is_err());
        assert!(PodView::parse(br#"{"apiVersion":"v2"}"#).is_err());
        assert!(PodView::parse(br#"{"kind":null}"#).is_err());
        assert!(PodView::parse(br#"{"spec":{"volumes":[{"name":"a","name":"b"}]}}"#).is_err());
        assert!(PodView::parse(br#"{"spec":{"volumes":[{"name":1}]}}"#).is_err());
        // A field the engine does not read may repeat: the typed container keeps the last.
        let pod =
            PodView::parse(br#"{"spec":{"containers":[{"name":"a","tty":true,"tty":false}]}}"#)
                .expect("reads");
        assert_eq!(pod.containers()[0].typed().expect("typed").tty, Some(false));
    }
}
