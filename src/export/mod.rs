//! The configuration exported as admission policies that run inside the API server: no
//! network hop, nothing that can be down.
//!
//! - [`backstop()`]: a ValidatingAdmissionPolicy holding what CEL can check of the validator's
//!   contract, so that an opted-in pod the injector did not reach is refused with a message
//!   that says so, whatever the webhooks' failure policies.
//! - [`mutating()`]: one MutatingAdmissionPolicy for every template, whose JSONPatch adds what
//!   the webhook adds (only what is missing), so that the API server injects by itself.
//!
//! Both are another rendering of the same decision: who is opted in and skipped, which
//! templates a pod asks for, what each template renders ([`read`], into a [`symbolic`]
//! result). Documents are JSON values; the CLI writes them as YAML. Pure, like the engine
//! whose decisions it renders: no I/O, no shell module (`tests/layout.rs`).
//!
//! Each file imports only files before it in this order: [`markers`] (the marker alphabet),
//! [`cel`] (literals, the pod expressions both policies share), [`loops`] (loops over the
//! pod's lists), [`symbolic`] (the result and its CEL), `translate` (expressions to CEL),
//! `items` (expressions over the pod's list items), `walk` (the syntax tree), `trials` (renderings and trials), [`read`], [`objects`] (what
//! both policies share), then [`backstop`](mod@backstop) and [`mutating`](mod@mutating).
//! This file only re-exports.

pub mod backstop;
pub mod cel;
mod items;
pub mod loops;
pub mod markers;
pub mod mutating;
pub mod objects;
pub mod read;
pub mod symbolic;
mod translate;
mod trials;
mod walk;

pub use backstop::backstop;
pub use mutating::mutating;
pub use objects::{
    CONFIG_ANNOTATION, ExportError, MutatingVersion, Selection, base_name, check_revision, to_yaml,
};
