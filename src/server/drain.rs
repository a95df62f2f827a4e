//! Graceful drain of the webhook's connections on shutdown.
//!
//! hyper closes an idle HTTP/1.1 connection at once on a graceful shutdown, which loses a
//! request whose bytes are already on their way. Here a connection is asked to shut down only
//! when it is busy (its response then carries `Connection: close`; HTTP/2 gets a GOAWAY) or has
//! been quiet for [`QUIET`]. The drain finishes when every connection has ended.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hyper_util::server::graceful::GracefulConnection;
use tokio::sync::{mpsc, watch};

/// How long an idle connection is given to start a request once shutdown has begun.
pub const QUIET: Duration = Duration::from_millis(200);

/// Tracks connections; [`Drain::finish`] signals them and waits for them.
pub struct Drain {
    signal: watch::Sender<bool>,
    alive: mpsc::Sender<()>,
    done: mpsc::Receiver<()>,
}

impl Default for Drain {
    fn default() -> Self {
        Self::new()
    }
}

impl Drain {
    pub fn new() -> Self {
        let (signal, _) = watch::channel(false);
        let (alive, done) = mpsc::channel(1);
        Self {
            signal,
            alive,
            done,
        }
    }

    /// A handle for one connection; the drain waits for it to be dropped.
    pub fn watch(&self) -> ConnWatch {
        ConnWatch {
            signal: self.signal.subscribe(),
            _alive: self.alive.clone(),
            activity: Arc::new(Activity::new()),
        }
    }

    /// Signals every connection and resolves when all have ended.
    pub async fn finish(self) {
        let Self {
            signal,
            alive,
            mut done,
        } = self;
        let _ = signal.send(true);
        drop(alive);
        // Resolves with None once every connection's sender is dropped.
        let _ = done.recv().await;
    }
}

/// Requests in flight on one connection and when the last one started.
#[derive(Debug)]
pub struct Activity {
    epoch: Instant,
    in_flight: AtomicUsize,
    last_start_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            epoch: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_start_ms: AtomicU64::new(0),
        }
    }

    fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_start_ms.load(Ordering::SeqCst));
        self.epoch.elapsed().saturating_sub(last)
    }
}

/// Marks a request in flight until dropped.
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One connection's view of the drain.
pub struct ConnWatch {
    signal: watch::Receiver<bool>,
    _alive: mpsc::Sender<()>,
    activity: Arc<Activity>,
}

/// Cloned into the connection's service to mark requests.
#[derive(Clone, Debug)]
pub struct ActivityHandle(Arc<Activity>);

impl ActivityHandle {
    pub fn start(&self) -> InFlight {
        let a = &self.0;
        a.in_flight.fetch_add(1, Ordering::SeqCst);
        let now = u64::try_from(a.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        a.last_start_ms.store(now, Ordering::SeqCst);
        InFlight(a.clone())
    }
}

impl ConnWatch {
    pub fn activity(&self) -> ActivityHandle {
        ActivityHandle(self.activity.clone())
    }

    /// Drives `conn` to completion, shutting it down gracefully once the drain begins.
    pub async fn serve<C>(mut self, conn: C) -> C::Output
    where
        C: GracefulConnection + Future,
    {
        let mut conn = pin!(conn);
        tokio::select! {
            output = conn.as_mut() => return output,
            _ = self.signal.wait_for(|draining| *draining) => {}
        }
        loop {
            let busy = self.activity.in_flight.load(Ordering::SeqCst) > 0;
            if busy || self.activity.idle_for() >= QUIET {
                break;
            }
            tokio::select! {
                output = conn.as_mut() => return output,
                () = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
        }
        conn.as_mut().graceful_shutdown();
        conn.await
    }
}
