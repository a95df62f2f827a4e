//! Offline removal of what injection added (`uninject`): the documents `inject` reads, with
//! the sidecars, volumes, mounts, env vars, image pull secrets, labels and annotations of
//! their pods and pod templates taken back out.
//!
//! What was added is known from the status annotation: its templates are rendered again as
//! the pod was given them, for the containers and volumes its `context` says the rendering
//! saw ([`render_recorded`]), and must still hash to its `hash`. Of that rendering, an item
//! is removed only where injection could have added it: a sidecar unless the status records
//! it as `kept` (the pod's own); of a list injection appends to (volumes, image pull secrets,
//! and the mounts and env vars of a container that received the templates'), the last items,
//! as long as they are, in the templates' order, items as the templates write them, each the
//! list's only one of its name (and path); a label or annotation whose value is the
//! template's. Injection appends an item only where the list has none of that name, after the
//! items it had, so an item that differs from the template's, or comes before the pod's own,
//! is the author's. One the same as the template's, last in its list, cannot be told apart
//! from ours (the status does not record what the pod had) and is removed: see
//! docs/COMMANDS.md, `uninject`.
//!
//! Documents are read and written back as [`crate::engine::manifest`] reads and writes them:
//! one that is not changed, or cannot be read, byte for byte.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Container;
use serde_json::{Map, Value};

use crate::engine::config::Injector;
use crate::engine::context::Owner;
use crate::engine::fit;
use crate::engine::inject::{InjectError, PodFacts, Rendered, Status, render_recorded, targets};
use crate::engine::manifest::{self, ManifestError};
use crate::engine::template::Piece;
use crate::engine::view::{PodView, pod_json};

/// What `uninject` did to one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Undone {
    /// Not a pod, and no pod template at the place its kind keeps one.
    NotATemplate,
    /// A pod or pod template without the status annotation: not injected.
    NotInjected,
    /// The templates its status records were removed.
    Removed { templates: Vec<String> },
}

/// Why an injected pod template cannot be uninjected.
#[derive(Debug, thiserror::Error)]
pub enum Cannot {
    #[error("its status annotation {key} does not parse: {message}")]
    Status { key: String, message: String },
    #[error(
        "it was injected by revision {theirs:?} and this configuration is revision {ours:?}: \
         uninject it with the configuration of the revision that injected it"
    )]
    Revision { theirs: String, ours: String },
    #[error("the templates its status records cannot be rendered again: {0}")]
    Render(#[source] InjectError),
    #[error(
        "its templates [{templates}] no longer render what was injected (the status's hash \
         {hash}): uninject it with the configuration it was injected with, and the namespace \
         it is in (--namespace, -n, when the document names none)"
    )]
    Differs { templates: String, hash: String },
}

/// A document `uninject` writes back as it came.
#[derive(Debug, thiserror::Error)]
pub enum UninjectError {
    /// It cannot be read, its pod template does not parse, or it cannot be written.
    #[error(transparent)]
    Read(#[from] ManifestError),
    #[error("document {index} ({id}): cannot be uninjected: {source}")]
    Object {
        index: usize,
        id: String,
        #[source]
        source: Cannot,
    },
}

/// What `uninject` writes: the YAML stream, and one line for each object saying what was
/// removed from it or why it was left as it is (for standard error).
#[derive(Debug, Default)]
pub struct Uninjected {
    /// Every document: uninjected, or as it came.
    pub yaml: String,
    /// One line for each object, in the input's order: `document N (Kind/name): removed t1,
    /// t2`, or `document N (Kind/name): left as it is: why`.
    pub notes: Vec<String>,
    /// How many objects were uninjected.
    pub removed: usize,
    /// The documents written back as they came because they cannot be read or uninjected.
    pub errors: Vec<UninjectError>,
}

/// `uninject -f`: every document with what injection added removed; one that cannot be read
/// or uninjected is written back as it came, with its error, and the others all the same.
/// `namespace` is the one documents that name none are in (templates render per namespace).
pub fn uninject(inj: &Injector, text: &str, namespace: Option<&str>) -> Uninjected {
    let mut out = Uninjected {
        yaml: String::with_capacity(text.len()),
        ..Uninjected::default()
    };
    for (i, piece) in manifest::split_documents(text).into_iter().enumerate() {
        let index = i + 1;
        let output = match manifest::read_document(piece.text) {
            Ok(value) => undo_document(inj, index, &value, namespace, &mut out),
            Err(e) => {
                out.errors.push(
                    ManifestError::Yaml {
                        index,
                        message: e.to_string(),
                    }
                    .into(),
                );
                None
            }
        };
        let written = match output {
            Some(value) => {
                match manifest::write_changed(piece.marker, piece.text, &value, &mut out.yaml) {
                    Ok(()) => true,
                    Err(message) => {
                        out.errors.push(
                            ManifestError::Write {
                                index,
                                id: manifest::object_id(&value),
                                message,
                            }
                            .into(),
                        );
                        false
                    }
                }
            }
            None => false,
        };
        if !written {
            out.yaml.push_str(piece.marker);
            out.yaml.push_str(piece.text);
        }
    }
    out
}

/// Document `index` (`value`, read) uninjected, when something was removed; its lines go to
/// `out`. A `kind: List` is one document: an item that cannot be uninjected leaves it whole.
fn undo_document(
    inj: &Injector,
    index: usize,
    value: &Value,
    namespace: Option<&str>,
    out: &mut Uninjected,
) -> Option<Value> {
    if value.is_null() {
        return None;
    }
    let Some(items) = manifest::list_items(value) else {
        let id = manifest::object_id(value);
        let place = format!("document {index} ({id})");
        return match undo_object(inj, index, &id, value, namespace) {
            Ok((undone, output)) => {
                report(inj, &place, &undone, out);
                output
            }
            Err(error) => {
                out.errors.push(error);
                None
            }
        };
    };
    let mut list = value.clone();
    let mut lines = Uninjected::default();
    let mut changed = false;
    for (position, item) in items.iter().enumerate() {
        let id = manifest::object_id(item);
        let place = format!("document {index} (List), item {} ({id})", position + 1);
        match undo_object(inj, index, &id, item, namespace) {
            Ok((undone, output)) => {
                report(inj, &place, &undone, &mut lines);
                if let (Some(output), Some(slot)) =
                    (output, list.pointer_mut(&format!("/items/{position}")))
                {
                    *slot = output;
                    changed = true;
                }
            }
            Err(error) => {
                out.errors.push(error);
                return None;
            }
        }
    }
    out.notes.append(&mut lines.notes);
    out.removed += lines.removed;
    changed.then_some(list)
}

/// The line for an object, into `out`.
fn report(inj: &Injector, place: &str, undone: &Undone, out: &mut Uninjected) {
    let line = match undone {
        Undone::NotATemplate => {
            format!("{place}: left as it is: not a pod and has no pod template")
        }
        Undone::NotInjected => format!(
            "{place}: left as it is: no {} annotation, so not injected",
            inj.config.status_annotation
        ),
        Undone::Removed { templates } if templates.is_empty() => {
            format!("{place}: removed the status annotation (it records no template)")
        }
        Undone::Removed { templates } => format!("{place}: removed {}", templates.join(", ")),
    };
    if let Undone::Removed { .. } = undone {
        out.removed += 1;
    }
    out.notes.push(line);
}

/// One object (a document, or a List's item) of document `index`: what was done, and the
/// object uninjected when something was removed.
fn undo_object(
    inj: &Injector,
    index: usize,
    id: &str,
    value: &Value,
    namespace: Option<&str>,
) -> Result<(Undone, Option<Value>), UninjectError> {
    let Some(tokens) = manifest::template_path(value) else {
        return Ok((Undone::NotATemplate, None));
    };
    let Some(template) = manifest::at(value, tokens) else {
        return Ok((Undone::NotATemplate, None));
    };
    let unreadable = |message: String| ManifestError::PodTemplate {
        index,
        id: id.to_owned(),
        message,
    };
    let pod = manifest::to_pod(template).map_err(unreadable)?;
    let json = pod_json(&pod);
    let view = PodView::parse(&json).map_err(|e| unreadable(e.to_string()))?;
    let key = inj.config.status_annotation.as_str();
    let Some(text) = view.annotation(key) else {
        return Ok((Undone::NotInjected, None));
    };
    let fail = |source| UninjectError::Object {
        index,
        id: id.to_owned(),
        source,
    };
    let status: Status = serde_json::from_str(text).map_err(|e| {
        fail(Cannot::Status {
            key: key.to_owned(),
            message: e.to_string(),
        })
    })?;
    if status.revision != inj.config.revision {
        return Err(fail(Cannot::Revision {
            theirs: status.revision,
            ours: inj.config.revision.clone(),
        }));
    }
    let own = Some(manifest::str_at(value, "/metadata/namespace")).filter(|ns| !ns.is_empty());
    let mut facts = PodFacts::new(&view, own.or(namespace));
    if !tokens.is_empty() {
        // As `inject` renders it: the workload is the pod's controller.
        facts.workload = Some(Owner {
            kind: manifest::str_at(value, "/kind").to_owned(),
            name: manifest::str_at(value, "/metadata/name").to_owned(),
        });
    }
    let rendered = render_recorded(inj, &facts, &status)
        .map_err(|e| fail(Cannot::Render(e)))?
        .ok_or_else(|| {
            fail(Cannot::Differs {
                templates: status.templates.join(", "),
                hash: status.hash.clone(),
            })
        })?;
    let targets: Option<Vec<String>> =
        targets(inj, &view).map(|t| t.into_iter().map(str::to_owned).collect());
    let mut output = value.clone();
    let pointer = jsonptr::PointerBuf::from_tokens(tokens.iter().copied());
    if let Some(t) = output.pointer_mut(pointer.as_str()) {
        take_out(t, key, &rendered, &status.kept, targets.as_deref());
    }
    Ok((
        Undone::Removed {
            templates: status.templates,
        },
        Some(output),
    ))
}

/// What `rendered` adds, taken out of pod template `t` (its `metadata` and `spec`, as JSON)
/// where injection could have added it (see the module's documentation), with the status
/// annotation `status_key`; `kept` and `targets` as the status and the containers
/// annotation say. A list or map left empty by it is removed: injection creates the
/// ones it adds to.
pub fn take_out(
    t: &mut Value,
    status_key: &str,
    rendered: &[Rendered],
    kept: &[String],
    targets: Option<&[String]>,
) {
    let sidecars: BTreeSet<&str> = rendered
        .iter()
        .flat_map(|r| r.fragment.sidecar_names())
        .collect();
    if let Some(spec) = t.get_mut("spec").and_then(Value::as_object_mut) {
        let mut inits: Vec<&Container> = Vec::new();
        let mut containers: Vec<&Container> = Vec::new();
        for r in rendered {
            let f = &*r.fragment;
            for (list, added, into) in [
                ("initContainers", &f.init_containers, &mut inits),
                ("containers", &f.containers, &mut containers),
            ] {
                for c in added.iter().filter(|c| !kept.contains(&c.name)) {
                    if take(spec, list, |item| name_of(item) == c.name) {
                        into.push(c);
                    }
                }
            }
        }
        shrink_budget(spec, &inits, &containers);
        let mut volumes = Vec::new();
        let mut secrets = Vec::new();
        for r in rendered {
            let f = &*r.fragment;
            for (v, piece) in f.volumes.iter().zip(&f.json.volumes) {
                volumes.push(Added::new(vec![("name", &v.name)], piece));
            }
            for (s, piece) in f.image_pull_secrets.iter().zip(&f.json.image_pull_secrets) {
                secrets.push(Added::new(vec![("name", &s.name)], piece));
            }
        }
        take_appended(spec, "volumes", &volumes);
        take_appended(spec, "imagePullSecrets", &secrets);
        for (list, init) in [("containers", false), ("initContainers", true)] {
            if init && targets.is_none() {
                continue;
            }
            let Some(items) = spec.get_mut(list).and_then(Value::as_array_mut) else {
                continue;
            };
            for container in items.iter_mut() {
                let name = name_of(container);
                if sidecars.contains(name) || targets.is_some_and(|t| !t.iter().any(|n| n == name))
                {
                    continue;
                }
                if let Some(container) = container.as_object_mut() {
                    take_mounts_and_env(container, rendered);
                }
            }
        }
    }
    if let Some(meta) = t.get_mut("metadata").and_then(Value::as_object_mut) {
        for r in rendered {
            let f = &*r.fragment;
            for (map, pairs) in [("labels", &f.labels), ("annotations", &f.annotations)] {
                for (key, value) in pairs.iter().filter(|(k, _)| *k != status_key) {
                    take_key(meta, map, key, |v| v.as_str() == Some(value.as_str()));
                }
            }
        }
        take_key(meta, "annotations", status_key, |_| true);
    }
    let empty = t
        .get("metadata")
        .and_then(Value::as_object)
        .is_some_and(Map::is_empty);
    if let (true, Some(fields)) = (empty, t.as_object_mut()) {
        fields.remove("metadata");
    }
}

/// The templates' mounts and env vars taken out of an application container.
fn take_mounts_and_env(container: &mut Map<String, Value>, rendered: &[Rendered]) {
    let mut mounts = Vec::new();
    let mut env = Vec::new();
    for r in rendered {
        let f = &*r.fragment;
        for (m, piece) in f.volume_mounts.iter().zip(&f.json.volume_mounts) {
            let keys = vec![("name", m.name.as_str()), ("mountPath", &m.mount_path)];
            mounts.push(Added::new(keys, piece));
        }
        for (e, piece) in f.env.iter().zip(&f.json.env) {
            env.push(Added::new(vec![("name", &e.name)], piece));
        }
    }
    take_appended(container, "volumeMounts", &mounts);
    take_appended(container, "env", &env);
}

/// An item a template appends to a list: the fields that name it (injection appends it only
/// where no item has any of them), and its JSON as the template writes it.
struct Added<'a> {
    keys: Vec<(&'static str, &'a str)>,
    json: Option<Value>,
}

impl<'a> Added<'a> {
    fn new(keys: Vec<(&'static str, &'a str)>, piece: &Piece) -> Self {
        Self {
            keys,
            json: serde_json::from_str(&piece.json).ok(),
        }
    }

    /// Whether `item`, of `items`, is this one as injection appends it: the one item of
    /// `items` with each of its keys, carrying what the template writes.
    fn is(&self, item: &Value, items: &[Value]) -> bool {
        let named = |field: &str, value: &str| {
            items
                .iter()
                .filter(|i| i.get(field).and_then(Value::as_str) == Some(value))
                .count()
                == 1
        };
        self.keys.iter().all(|(field, value)| {
            item.get(*field).and_then(Value::as_str) == Some(*value) && named(field, value)
        }) && self.json.as_ref().is_some_and(|want| carries(item, want))
    }
}

/// Removes from `fields[list]` what injection appended of `added` (the templates' items, in
/// the order they are appended): its last items, as long as they are, in order, items of
/// `added` as the templates write them, each the list's only one of its name (and path).
/// Injection appends only what the list has none of, after the items it had, in the
/// templates' order; an item of the pod's own before them, or out of that order, is kept.
fn take_appended(fields: &mut Map<String, Value>, list: &str, added: &[Added<'_>]) {
    let Some(items) = fields.get(list).and_then(Value::as_array) else {
        return;
    };
    let mut next = added.len();
    let mut keep = items.len();
    for item in items.iter().rev() {
        let Some(k) = added[..next].iter().rposition(|a| a.is(item, items)) else {
            break;
        };
        next = k;
        keep -= 1;
    }
    if keep == items.len() {
        return;
    }
    if let Some(items) = fields.get_mut(list).and_then(Value::as_array_mut) {
        items.truncate(keep);
        if items.is_empty() {
            fields.remove(list);
        }
    }
}

/// Removes item `i` of `fields[list]`, and the list when it is left empty.
fn remove_at(fields: &mut Map<String, Value>, list: &str, i: usize) {
    if let Some(items) = fields.get_mut(list).and_then(Value::as_array_mut) {
        if i < items.len() {
            items.remove(i);
        }
        if items.is_empty() {
            fields.remove(list);
        }
    }
}

/// Removes the first item of `fields[list]` that `is` holds for (and the list when it is left
/// empty); whether there was one.
fn take(fields: &mut Map<String, Value>, list: &str, is: impl Fn(&Value) -> bool) -> bool {
    let position = fields
        .get(list)
        .and_then(Value::as_array)
        .and_then(|items| items.iter().position(is));
    match position {
        Some(i) => {
            remove_at(fields, list, i);
            true
        }
        None => false,
    }
}

/// Removes `meta[map][key]` when `ours` holds for its value (and the map when it is left
/// empty).
fn take_key(meta: &mut Map<String, Value>, map: &str, key: &str, ours: impl Fn(&Value) -> bool) {
    let Some(entries) = meta.get_mut(map).and_then(Value::as_object_mut) else {
        return;
    };
    if entries.get(key).is_some_and(ours) {
        entries.remove(key);
        if entries.is_empty() {
            meta.remove(map);
        }
    }
}

/// Whether `have` carries everything `want` writes: the same scalars, lists of the same length
/// item by item, and every field of `want` in maps (a field the API server defaulted since,
/// such as a volume's `defaultMode`, is allowed).
fn carries(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(have), Value::Object(want)) => want
            .iter()
            .all(|(k, w)| have.get(k).is_some_and(|h| carries(h, w))),
        (Value::Array(have), Value::Array(want)) => {
            have.len() == want.len() && have.iter().zip(want).all(|(h, w)| carries(h, w))
        }
        _ => have == want,
    }
}

fn name_of(item: &Value) -> &str {
    item.get("name").and_then(Value::as_str).unwrap_or("")
}

/// The pod-level budget (`spec.resources`) shrunk by what the removed sidecars asked for
/// ([`fit::shrunk_budget`]).
fn shrink_budget(spec: &mut Map<String, Value>, inits: &[&Container], containers: &[&Container]) {
    let Some(resources) = spec.get_mut("resources") else {
        return;
    };
    let Ok(json) = serde_json::to_string(resources) else {
        return;
    };
    for (list, resource, amount) in fit::shrunk_budget(Some(&json), inits, containers) {
        if let Some(amounts) = resources.get_mut(list).and_then(Value::as_object_mut) {
            amounts.insert(resource.to_owned(), Value::String(amount));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: shop\n  labels:\n    sidecar-injector.io/inject: \"true\"\nspec:\n  containers:\n    - name: app\n      image: nginx:1.27\n";

    /// `POD` with its app container given `env` (YAML flow items), injected and uninjected:
    /// the app container's env after.
    fn env_after(env: &str) -> Value {
        let inj = Injector::embedded(None).expect("embedded");
        let pod = format!("{POD}      env: [{env}]\n");
        let injected = manifest::inject(&inj, &pod, None).expect("injects").yaml;
        let out = uninject(&inj, &injected, None);
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        assert_eq!(out.removed, 1, "{:?}", out.notes);
        let value = manifest::read_document(&out.yaml).expect("YAML");
        value
            .pointer("/spec/containers/0/env")
            .cloned()
            .unwrap_or(Value::Null)
    }

    #[test]
    fn the_authors_env_is_kept_where_injection_cannot_have_added_it() {
        // A value of their own: injection would have added nothing of that name.
        assert_eq!(
            env_after("{name: APP_LOG_DIR, value: /logs}"),
            serde_json::json!([{"name": "APP_LOG_DIR", "value": "/logs"}])
        );
        // The template's value, before one of their own: injection appends after.
        assert_eq!(
            env_after("{name: APP_LOG_DIR, value: /var/log/app}, {name: MODE, value: a}"),
            serde_json::json!([
                {"name": "APP_LOG_DIR", "value": "/var/log/app"},
                {"name": "MODE", "value": "a"}
            ])
        );
        // The template's value, last: it cannot be told from ours, and goes (docs/COMMANDS.md).
        assert_eq!(
            env_after("{name: MODE, value: a}, {name: APP_LOG_DIR, value: /var/log/app}"),
            serde_json::json!([{"name": "MODE", "value": "a"}])
        );
        // A list left empty goes: injection creates the list it appends to, so an empty one
        // of their own cannot be told from none (docs/COMMANDS.md).
        assert_eq!(env_after(""), Value::Null);
    }

    #[test]
    fn an_item_carries_what_the_template_writes_whatever_was_defaulted_since() {
        let want = serde_json::json!({"name": "v", "configMap": {"name": "c"}});
        let defaulted =
            serde_json::json!({"name": "v", "configMap": {"name": "c", "defaultMode": 420}});
        assert!(carries(&defaulted, &want));
        assert!(!carries(&want, &defaulted));
        let other = serde_json::json!({"name": "v", "configMap": {"name": "d"}});
        assert!(!carries(&other, &want));
        assert!(!carries(
            &serde_json::json!([1, 2]),
            &serde_json::json!([1])
        ));
    }

    #[test]
    fn a_pod_without_status_and_other_documents_are_left_as_they_are() {
        let inj = Injector::embedded(None).expect("embedded");
        let text = format!(
            "# mine\n{POD}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c}}\n---\n"
        );
        let out = uninject(&inj, &text, None);
        assert_eq!(out.yaml, text);
        assert_eq!(out.removed, 0);
        assert_eq!(
            out.notes,
            [
                "document 1 (Pod/web): left as it is: no sidecar-injector.io/status annotation, so not injected",
                "document 2 (ConfigMap/c): left as it is: not a pod and has no pod template",
            ]
        );
    }
}
