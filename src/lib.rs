//! sidecar-injector: a Kubernetes admission webhook that injects sidecars rendered from
//! templates, and a companion validator that checks they are still there.
//!
//! - [`engine`] decides everything and does no I/O: a review (read through the borrowed
//!   [`view`]) or a manifest, and a checked [`config`], go in; a patch, a verdict or the text a
//!   command prints comes out ([`engine::context`], [`template`], [`overrides`], [`inject`],
//!   [`validate`], [`review`], [`manifest`], [`explain`], [`uninject`]).
//! - [`diagnose`] judges what was read of a cluster, with the engine's decisions and no I/O
//!   either: [`outdated`] a cluster's pods, [`diagnose::check`] an installation.
//! - [`export`] writes the configuration as admission policies that run inside the API server
//!   (a ValidatingAdmissionPolicy backstop, a MutatingAdmissionPolicy); pure like the engine,
//!   whose decisions it renders in CEL.
//! - [`certs`]: when the certificates the server manages itself are issued, renewed and
//!   rolled over, decided without I/O (the server takes the steps).
//! - [`server`]: the webhook and admin servers (sockets, TLS, reloads, limits, shutdown).
//! - [`cli`]: the commands, `serve`, `inject`, `uninject`, `review`, `explain`, `outdated`,
//!   `export` and `check` (whose API-server calls live in [`cli::outdated`] and
//!   [`cli::check`]).
//! - [`load`]: reading a configuration and its templates from files, for both shells.
//!
//! The shells import the engine, never the reverse, so the webhook server, the validator and
//! the offline commands can never disagree. The engine's modules are re-exported here, so
//! `sidecar_injector::review`, `sidecar_injector::inject` and the rest name them directly.

pub mod certs;
pub mod cli;
pub mod diagnose;
pub mod engine;
pub mod export;
pub mod load;
pub mod server;

pub use engine::{
    config, explain, inject, manifest, memo, overrides, review, template, uninject, validate, view,
};

pub use diagnose::outdated;

/// Every binary of the project (the server and CLI, the benchmarks, the tests) allocates with
/// mimalloc: a review makes a few dozen short-lived allocations, and glibc's malloc and free
/// were about an eighth of an engine review's instructions (`bench/profile.sh`). Built without
/// transparent huge pages (`no_thp`): with them the webhook's peak RSS under load went from
/// 19 MiB to 37 MiB. Its v2 series (`v2`), not v3: in the server, where a review's allocations
/// and hyper's interleave, v3's page retiring and arena bitmaps showed in the profile, and the
/// webhook spent 19.4-19.7 µs of CPU a request with v2 against 20.1-22.5 with v3
/// (docs/benchmarks-history.md, "The allocator in the server, not the engine").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
