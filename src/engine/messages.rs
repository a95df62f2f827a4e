//! The sentences a person reads about a pod's sidecars: what the validating webhook finds wrong,
//! what the exported backstop refuses (the same findings, written into its CEL as constants, so
//! the two can never word one problem differently), and the notes an injection comes with.
//!
//! Each names the sidecar, its template and the list as the pod's JSON does, so that the
//! person who ran `kubectl apply` can find it.

/// `sidecar "proxy" (template "proxy")`.
pub fn sidecar(container: &str, template: &str) -> String {
    format!("sidecar {}", sidecar_of(container, template))
}

/// `"proxy" (template "proxy")`: a sidecar named in a list of sidecars.
pub fn sidecar_of(container: &str, template: &str) -> String {
    format!("{container:?} (template {template:?})")
}

pub fn sidecar_changed(container: &str, template: &str, fields: &[String]) -> String {
    format!(
        "{} was changed: {}; these fields belong to the injector",
        sidecar(container, template),
        fields.join(", ")
    )
}

pub fn sidecar_in_wrong_list(container: &str, template: &str, list: &str, other: &str) -> String {
    format!(
        "{} must be in spec.{list} but is in spec.{other}",
        sidecar(container, template)
    )
}

pub fn sidecar_missing(container: &str, template: &str, list: &str) -> String {
    format!(
        "{} is missing from spec.{list}",
        sidecar(container, template)
    )
}

pub fn sidecar_not_native(container: &str, template: &str) -> String {
    format!(
        "{} must have restartPolicy: Always (a native sidecar)",
        sidecar(container, template)
    )
}

pub fn sidecar_image(container: &str, template: &str, image: &str) -> String {
    format!(
        "{} must run image {image}: the injector owns it",
        sidecar(container, template)
    )
}

pub fn volume_missing(volume: &str, template: &str) -> String {
    format!("volume {volume:?} (template {template:?}) is missing from spec.volumes")
}

pub fn status_missing(annotation: &str) -> String {
    format!("annotation {annotation} is missing: the pod did not pass through the sidecar injector")
}

/// A sidecar of a pod another revision injected (whose templates are not at hand).
pub fn other_revision_sidecar_changed(container: &str, fields: &[String]) -> String {
    format!(
        "sidecar {container:?} was changed: {}; these fields belong to the injector",
        fields.join(", ")
    )
}

pub fn other_revision_sidecar_removed(container: &str, list: &str) -> String {
    format!("sidecar {container:?} was removed from spec.{list}")
}

/// The note of a pod that brought a container under a sidecar's name.
pub fn sidecar_kept(container: &str, template: &str) -> String {
    format!(
        "the pod already has a container named {container:?}; it was kept and template {template:?}'s sidecar was not injected"
    )
}

pub fn not_for_windows(template: &str) -> String {
    format!("template {template:?} was not injected: it does not support Windows pods")
}

pub fn conflicts_with(template: &str, container: &str) -> String {
    format!(
        "template {template:?} was not injected: the pod already runs {container:?}, which it conflicts with (conflictsWith: another mesh's proxy binds the same ports)"
    )
}

/// The refusal of a pod whose own container declares a port a sidecar declares too.
pub fn port_clash(
    template: &str,
    sidecar: &str,
    port: &str,
    protocol: &str,
    container: &str,
    annotation: &str,
) -> String {
    format!(
        "template {template:?}: sidecar {sidecar:?} declares port {port}/{protocol}, which the pod's container {container:?} declares too: in the pod's one network namespace only one of them can bind it. Give {container:?} another port, or leave template {template:?} out ({annotation})"
    )
}

/// The note of a pod whose containers annotation names no container of its own.
pub fn target_missing(annotation: &str, name: &str) -> String {
    format!(
        "annotation {annotation} names {name:?}, which is not one of the pod's own containers or init containers: nothing of the templates is added to it"
    )
}

/// The refusal of a pod that opts out (`label: "false"`) in a namespace labelled
/// `label: required`, by the validating webhook and by the backstop alike. `pod` is its name,
/// quoted (`"web"`, or `"web-"*` for one still to be named); `exempt_here` the service
/// accounts exempt in `namespace` ([`listed`]).
pub fn required_opt_out(
    pod: &str,
    label: &str,
    required: &str,
    namespace: &str,
    service_account: &str,
    exempt_here: &str,
) -> String {
    format!(
        "sidecar-injector: pod {pod} opts out of sidecar injection ({label}=\"false\"), but its namespace {namespace:?} requires sidecars ({label}={required}). Only pods of the service accounts the injector's configuration exempts (required.exempt) may run there without them; exempt in {namespace:?}: {exempt_here}; the pod runs as {service_account:?}. To fix: remove the label {label} from the pod so that it is injected, or ask the injector's operator to add \"{namespace}/{service_account}\" to required.exempt"
    )
}

/// Names in a sentence: `"a", "b"`, or `none` for no name.
pub fn listed(names: &[&str]) -> String {
    if names.is_empty() {
        return "none".into();
    }
    names
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}
