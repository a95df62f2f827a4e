//! Certificates the server looks after itself (the chart's `selfManaged` mode): when a CA and
//! a serving certificate are issued, renewed, rolled over and dropped ([`plan`]), decided
//! without I/O from what the TLS Secret holds, what the webhook configurations trust and the
//! time. The server's shell reads those and takes the steps.

pub mod issue;
pub mod plan;
pub mod stored;
