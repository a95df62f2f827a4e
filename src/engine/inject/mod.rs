//! The injection decision: whether a pod is injected, with what, and the edits that get it there,
//! one file per stage:
//!
//! - [`status`]: the status annotation, what it records and its hash;
//! - [`facts`]: what a request says of a pod (which webhook entry sent it, its namespace);
//! - [`rules`]: opted in or not, skipped or not, which templates it asks for, in words;
//! - [`decide`]: the decision, each template rendered once for the pod's context
//!   ([`crate::engine::context`]);
//! - [`plan`]: the decision as a list of [`Edit`]s, only what is missing, or applied to a typed
//!   pod ([`apply`]);
//! - [`patch`]: the edits written as a JSONPatch ([`to_patch`]) for the API server; a property
//!   test holds the two encodings equal.
//!
//! Each file imports only files above it in this list.

pub mod decide;
pub mod facts;
pub mod patch;
pub mod plan;
pub mod rules;
pub mod status;

pub use decide::{Decision, Plan, decide, render_recorded};
pub use facts::{Entry, PodFacts};
pub use patch::{Patch, to_patch, to_patch_base64};
pub use plan::{Edit, Part, apply, plan_edits};
pub use rules::{
    InjectError, OptOut, SkipReason, opt_in, required_opt_out, revision_name, targets,
};
pub use status::{Rendered, Status};

pub use crate::engine::context::Seen;

#[cfg(test)]
mod tests;
