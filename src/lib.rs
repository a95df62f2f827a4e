//! sidecar-injector: a Kubernetes admission webhook that injects sidecars rendered from
//! templates, and a companion validator that checks they are still there.
//!
//! The core ([`config`], [`template`], [`view`], [`inject`], [`validate`], [`review`],
//! [`manifest`]) does no I/O: a review (read through the borrowed [`view`]) and a configuration
//! go in, a patch or a verdict comes out. The webhook server and
//! the CLI are shells around it, so they can never disagree; [`outdated`] judges a cluster's
//! pods with the same core.

pub mod cli;
pub mod engine;
pub mod load;
pub mod server;

pub use engine::{
    config, explain, inject, manifest, outdated, overrides, review, template, validate, view,
};
