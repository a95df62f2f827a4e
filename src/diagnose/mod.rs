//! Cluster diagnostics: what was read of a cluster, judged. Not the admission engine, but built
//! on it: the pods and installations judged here are judged by the engine's own decisions, so
//! `check` and `outdated` can never disagree with the webhooks.
//!
//! - [`check`]: whether a live installation works (webhook configurations, `caBundle` against
//!   the served chain, endpoints, backstop, policy mode, the cluster's version, a dry-run pod).
//! - [`outdated`]: which recorded pods run sidecars other than what the configuration injects
//!   now, which workload owns them, and how their rollouts are read.
//!
//! Pure, like the engine: no tokio, no sockets, no files, no environment, no clock. The shells in
//! [`crate::cli::check`] and [`crate::cli::outdated`] read the cluster (and the time) and hand
//! this module what they read; it imports [`crate::engine`], never a shell.

pub mod check;
pub mod outdated;
