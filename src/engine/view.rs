//! The AdmissionReview as the engine reads it: a borrowed view of the request body.
//!
//! Only what the injector and the validator read is deserialized (metadata, the names, env
//! names and mounts of containers, volume names, the spec fields the template context shows);
//! strings are borrowed from the body wherever JSON lets them be (no escapes), and everything
//! else is skipped without being built. A container, a volume and the spec fields the template
//! context projects are also kept as their raw JSON, so that the render-cache key is built from
//! the request's own bytes and the typed form is built only when something needs it (a cache
//! miss, the validator's comparison of a sidecar).
//!
//! The view reads fields as k8s-openapi does: `null` is absent, a missing string is empty, a
//! map's repeated key keeps the last value. Where the view cannot read a body (a repeated
//! field, a value of the wrong type in a field it reads), [`super::review`] reads it the typed
//! way and builds the view from the typed object's canonical JSON, so both roads lead to the
//! same engine. Fields the injector never reads are not checked here: the API server has
//! decoded the object before it calls a webhook.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

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

/// A string-to-string map (labels, annotations, nodeSelector).
pub type StrMap<'a> = BTreeMap<Str<'a>, Str<'a>>;

fn text<'s>(s: &'s Option<Str<'_>>) -> &'s str {
    s.as_ref().map_or("", |s| s.as_str())
}

/// The review envelope: what the typed `AdmissionReview<Pod>` requires is required here too,
/// so that a body the view reads is one the typed path reads.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewView<'a> {
    #[serde(borrow)]
    pub api_version: Str<'a>,
    #[serde(borrow)]
    pub kind: Str<'a>,
    #[serde(default, borrow)]
    pub request: Option<RequestView<'a>>,
    #[serde(default, rename = "response")]
    _response: Option<IgnoredAny>,
}

/// The request of a review (see `kube::core::admission::AdmissionRequest`, whose required fields
/// it requires, read with the same types but borrowed).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestView<'a> {
    #[serde(borrow)]
    pub uid: Str<'a>,
    #[serde(borrow)]
    pub kind: Gvk<'a>,
    #[serde(borrow, rename = "resource")]
    _resource: Gvr<'a>,
    #[serde(default, borrow)]
    pub sub_resource: Option<Str<'a>>,
    #[serde(default, borrow, rename = "requestKind")]
    _request_kind: Option<Gvk<'a>>,
    #[serde(default, borrow, rename = "requestResource")]
    _request_resource: Option<Gvr<'a>>,
    #[serde(default, borrow, rename = "requestSubResource")]
    _request_sub_resource: Option<Str<'a>>,
    #[serde(default, borrow)]
    pub name: Option<Str<'a>>,
    #[serde(default, borrow)]
    pub namespace: Option<Str<'a>>,
    pub operation: kube::core::admission::Operation,
    #[serde(borrow, rename = "userInfo")]
    _user_info: UserInfo<'a>,
    #[serde(default, borrow)]
    pub object: Option<PodView<'a>>,
    #[serde(default, borrow)]
    pub old_object: Option<PodView<'a>>,
    #[serde(default, rename = "dryRun")]
    _dry_run: bool,
    #[serde(default, rename = "options")]
    _options: Option<k8s_openapi::apimachinery::pkg::runtime::RawExtension>,
}

/// `kube::core::GroupVersionKind`, borrowed.
#[derive(Debug, Deserialize)]
pub struct Gvk<'a> {
    #[serde(borrow)]
    pub group: Str<'a>,
    #[serde(borrow)]
    pub version: Str<'a>,
    #[serde(borrow)]
    pub kind: Str<'a>,
}

/// `kube::core::GroupVersionResource`, borrowed.
#[derive(Debug, Deserialize)]
struct Gvr<'a> {
    #[serde(borrow, rename = "group")]
    _group: Str<'a>,
    #[serde(borrow, rename = "version")]
    _version: Str<'a>,
    #[serde(borrow, rename = "resource")]
    _resource: Str<'a>,
    #[serde(default, borrow, rename = "api_version")]
    _api_version: Str<'a>,
}

/// `k8s_openapi::api::authentication::v1::UserInfo`, borrowed.
#[derive(Debug, Deserialize)]
struct UserInfo<'a> {
    #[serde(default, borrow, rename = "username")]
    _username: Option<Str<'a>>,
    #[serde(default, borrow, rename = "uid")]
    _uid: Option<Str<'a>>,
    #[serde(default, borrow, rename = "groups")]
    _groups: Option<Vec<Str<'a>>>,
    #[serde(default, borrow, rename = "extra")]
    _extra: Option<BTreeMap<Str<'a>, Vec<Str<'a>>>>,
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

/// A pod.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodView<'a> {
    /// Checked as k8s-openapi checks it: when present, exactly `v1`.
    #[serde(default, deserialize_with = "v1", rename = "apiVersion")]
    _api_version: (),
    /// Checked as k8s-openapi checks it: when present, exactly `Pod`.
    #[serde(default, deserialize_with = "pod_kind", rename = "kind")]
    _kind: (),
    #[serde(default, borrow)]
    pub metadata: Option<MetaView<'a>>,
    #[serde(default, borrow)]
    pub spec: Option<SpecView<'a>>,
}

fn exactly<'de, D: serde::Deserializer<'de>>(deserializer: D, want: &str) -> Result<(), D::Error> {
    let have = Str::deserialize(deserializer)?;
    if have.as_str() != want {
        return Err(serde::de::Error::invalid_value(
            serde::de::Unexpected::Str(&have),
            &want,
        ));
    }
    Ok(())
}

fn v1<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<(), D::Error> {
    exactly(deserializer, "v1")
}

fn pod_kind<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<(), D::Error> {
    exactly(deserializer, "Pod")
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MetaView<'a> {
    #[serde(default, borrow)]
    pub name: Option<Str<'a>>,
    #[serde(default, borrow)]
    pub generate_name: Option<Str<'a>>,
    #[serde(default, borrow)]
    pub namespace: Option<Str<'a>>,
    #[serde(default, borrow)]
    pub labels: Option<StrMap<'a>>,
    #[serde(default, borrow)]
    pub annotations: Option<StrMap<'a>>,
    #[serde(default, borrow)]
    pub owner_references: Option<Vec<OwnerView<'a>>>,
    #[serde(default, borrow)]
    pub deletion_timestamp: Option<&'a RawValue>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerView<'a> {
    #[serde(default, borrow)]
    pub api_version: Option<Str<'a>>,
    #[serde(default, borrow)]
    pub kind: Option<Str<'a>>,
    #[serde(default, borrow)]
    pub name: Option<Str<'a>>,
    #[serde(default)]
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

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecView<'a> {
    #[serde(default, borrow)]
    pub containers: Option<Vec<ContainerView<'a>>>,
    #[serde(default, borrow)]
    pub init_containers: Option<Vec<ContainerView<'a>>>,
    #[serde(default, borrow)]
    pub volumes: Option<Vec<VolumeView<'a>>>,
    #[serde(default, borrow)]
    pub image_pull_secrets: Option<Vec<NameView<'a>>>,
    #[serde(default)]
    pub host_network: Option<bool>,
    #[serde(default, borrow)]
    pub node_selector: Option<StrMap<'a>>,
    #[serde(default, borrow)]
    pub os: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub service_account_name: Option<Str<'a>>,
    #[serde(default, borrow)]
    pub security_context: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub priority_class_name: Option<Str<'a>>,
    #[serde(default, borrow)]
    pub runtime_class_name: Option<Str<'a>>,
    #[serde(default, borrow)]
    pub restart_policy: Option<Str<'a>>,
    #[serde(default)]
    pub share_process_namespace: Option<bool>,
    #[serde(default, borrow)]
    pub hostname: Option<Str<'a>>,
    #[serde(default, borrow)]
    pub subdomain: Option<Str<'a>>,
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
#[derive(Clone, Debug, Default, Deserialize)]
pub struct NameView<'a> {
    #[serde(default, borrow)]
    pub name: Option<Str<'a>>,
}

impl NameView<'_> {
    pub fn name(&self) -> &str {
        text(&self.name)
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MountView<'a> {
    #[serde(default, borrow)]
    pub name: Option<Str<'a>>,
    #[serde(default, borrow)]
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
pub type Members<'a> = Vec<(Str<'a>, &'a RawValue)>;

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

fn present(raw: &RawValue) -> Option<&RawValue> {
    (raw.get() != "null").then_some(raw)
}

/// Reads a member that is a string or `null`. The value is JSON the outer deserializer has
/// already checked, so a string without escapes is its text between the quotes, borrowed.
fn member_str<'a, E: serde::de::Error>(raw: &'a RawValue) -> Result<Str<'a>, E> {
    let json = raw.get();
    match json.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
        Some(text) if !text.contains('\\') => Ok(Str(Cow::Borrowed(text))),
        _ => Ok(member::<Option<Str<'a>>, E>(raw)?.unwrap_or_default()),
    }
}

/// Reads a member's value in the form `T`, as the error type of the outer deserializer.
fn member<'a, T: Deserialize<'a>, E: serde::de::Error>(raw: &'a RawValue) -> Result<T, E> {
    serde_json::from_str(raw.get()).map_err(E::custom)
}

/// A container: the fields the engine reads, and every member's JSON. The container is
/// scanned once: each member is taken as raw JSON and only the ones the engine reads are read
/// again (its name, env names, mount names and paths).
#[derive(Clone, Debug)]
pub struct ContainerView<'a> {
    pub name: Str<'a>,
    /// The fields the template context projects (`image`, `command`, `args`, `workingDir`,
    /// `ports`), as JSON.
    pub image: Option<&'a RawValue>,
    pub command: Option<&'a RawValue>,
    pub args: Option<&'a RawValue>,
    pub working_dir: Option<&'a RawValue>,
    pub ports: Option<&'a RawValue>,
    pub env: Option<Vec<NameView<'a>>>,
    pub volume_mounts: Option<Vec<MountView<'a>>>,
    /// Every member.
    pub members: Members<'a>,
}

impl<'de: 'a, 'a> Deserialize<'de> for ContainerView<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = ContainerView<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a container")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut c = ContainerView {
                    name: Str::default(),
                    image: None,
                    command: None,
                    args: None,
                    working_dir: None,
                    ports: None,
                    env: None,
                    volume_mounts: None,
                    members: Vec::with_capacity(16),
                };
                // A field the engine reads, given twice, is left to the typed road (k8s-openapi
                // keeps the last; the view does not guess).
                let mut read = 0u8;
                while let Some(key) = map.next_key::<Str<'de>>()? {
                    let raw: &'de RawValue = map.next_value()?;
                    let bit = match key.as_str() {
                        "name" => {
                            c.name = member_str(raw)?;
                            1
                        }
                        "image" => {
                            c.image = present(raw);
                            2
                        }
                        "command" => {
                            c.command = present(raw);
                            4
                        }
                        "args" => {
                            c.args = present(raw);
                            8
                        }
                        "workingDir" => {
                            c.working_dir = present(raw);
                            16
                        }
                        "ports" => {
                            c.ports = present(raw);
                            32
                        }
                        "env" => {
                            c.env = member(raw)?;
                            64
                        }
                        "volumeMounts" => {
                            c.volume_mounts = member(raw)?;
                            128
                        }
                        _ => 0,
                    };
                    if read & bit != 0 {
                        return Err(serde::de::Error::custom(format_args!(
                            "duplicate field `{}`",
                            key.as_str()
                        )));
                    }
                    read |= bit;
                    c.members.push((key, raw));
                }
                Ok(c)
            }
        }
        deserializer.deserialize_map(Visit(std::marker::PhantomData))
    }
}

impl ContainerView<'_> {
    /// The typed container (k8s-openapi), for a field-by-field comparison.
    pub fn typed(&self) -> Result<k8s_openapi::api::core::v1::Container, serde_json::Error> {
        serde_json::from_str(&object_json(&self.members))
    }
}

/// A volume: its name and its members, read in one pass.
#[derive(Clone, Debug)]
pub struct VolumeView<'a> {
    pub name: Str<'a>,
    /// Every member.
    pub members: Members<'a>,
}

impl<'de: 'a, 'a> Deserialize<'de> for VolumeView<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = VolumeView<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a volume")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut v = VolumeView {
                    name: Str::default(),
                    members: Vec::with_capacity(4),
                };
                let mut named = false;
                while let Some(key) = map.next_key::<Str<'de>>()? {
                    let raw: &'de RawValue = map.next_value()?;
                    if key.as_str() == "name" {
                        // The name given twice is left to the typed road, as for a container.
                        if named {
                            return Err(serde::de::Error::custom("duplicate field `name`"));
                        }
                        named = true;
                        v.name = member_str(raw)?;
                    }
                    v.members.push((key, raw));
                }
                Ok(v)
            }
        }
        deserializer.deserialize_map(Visit(std::marker::PhantomData))
    }
}

impl VolumeView<'_> {
    /// The volume's JSON, written back from its members.
    pub fn json(&self) -> String {
        object_json(&self.members)
    }

    /// A ServiceAccount token volume as the ServiceAccount admission plugin adds it: its name is
    /// random per pod (`kube-api-access-*`) and it projects a token.
    pub fn is_token_volume(&self) -> Result<bool, serde_json::Error> {
        #[derive(Deserialize)]
        struct Volume {
            #[serde(default)]
            projected: Option<Projected>,
        }
        #[derive(Deserialize)]
        struct Projected {
            #[serde(default)]
            sources: Option<Vec<Source>>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Source {
            #[serde(default)]
            service_account_token: Option<IgnoredAny>,
        }
        if !self.name.starts_with("kube-api-access-") {
            return Ok(false);
        }
        let mut projected = self
            .members
            .iter()
            .filter(|(k, _)| k.as_str() == "projected");
        let v = match (projected.next(), projected.next()) {
            // The one member that tells, read alone.
            (Some((_, raw)), None) => Volume {
                projected: serde_json::from_str(raw.get())?,
            },
            _ => serde_json::from_str(&self.json())?,
        };
        Ok(v.projected.is_some_and(|p| {
            p.sources
                .iter()
                .flatten()
                .any(|s| s.service_account_token.is_some())
        }))
    }
}

static EMPTY: StrMap<'static> = BTreeMap::new();

/// A typed pod's canonical JSON, to read it through the view (offline callers, the typed road
/// of [`crate::engine::review`], tests).
pub fn pod_json(pod: &k8s_openapi::api::core::v1::Pod) -> Vec<u8> {
    // A k8s-openapi type always serializes.
    serde_json::to_vec(pod).unwrap_or_default()
}

impl<'a> PodView<'a> {
    /// Reads a pod from JSON.
    pub fn parse(json: &'a [u8]) -> Result<Self, serde_json::Error> {
        match std::str::from_utf8(json) {
            Ok(text) => serde_json::from_str(text),
            Err(_) => serde_json::from_slice(json),
        }
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn null_is_absent_and_a_repeated_map_key_keeps_the_last() {
        let body = br#"{"metadata":{"name":null,"labels":{"a":"1","a":"2"}},"spec":{"containers":null,"hostNetwork":null}}"#;
        let pod = PodView::parse(body).expect("reads");
        assert_eq!(pod.name(), "");
        assert_eq!(pod.label("a"), Some("2"));
        assert!(pod.containers().is_empty());
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
