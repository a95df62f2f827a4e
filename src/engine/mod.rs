//! The engine: everything that decides. A review (read through the borrowed [`view`]) or a
//! manifest, and a checked configuration ([`config`]), go in; a decision, a JSONPatch, a
//! verdict or the text a command prints comes out.
//!
//! Pure: no tokio, no sockets, no files, no environment, no clock. Bytes and strings arrive
//! already read; the shells ([`crate::server`], [`crate::cli`], [`crate::load`]) do the I/O and
//! import the engine, never the other way round.

pub mod config;
pub mod context;
pub mod explain;
pub mod fit;
pub mod inject;
pub mod json;
pub mod manifest;
pub mod memo;
pub mod messages;
pub mod overrides;
pub mod review;
pub mod template;
pub mod uninject;
pub mod validate;
pub mod view;
