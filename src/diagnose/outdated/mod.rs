//! `outdated`, the judging half: which recorded pods run sidecars other than what the current
//! configuration injects, which workload owns them, and how a restart and a rollout are read.
//!
//! - [`check`]: one pod against the configuration (the webhooks' own engine).
//! - [`workload`]: pod to workload, the restart patch, rollout status.
//! - [`report`]: grouping, table and JSON.
//!
//! Pure: recorded API objects in, answers out. The API calls and the command are in
//! `crate::cli::outdated`.

pub mod check;
pub mod report;
pub mod workload;
