//! Graceful drain of the webhook's connections on shutdown.
//!
//! hyper's graceful shutdown of an HTTP/1.1 connection can cut a request that is already on its
//! way. Here, once the drain begins, an HTTP/2 connection gets a GOAWAY (its open streams
//! finish); an HTTP/1.1 connection answers whatever it is serving with `Connection: close`
//! (see [`ActivityHandle::draining_response`]) and is closed by us only when it has no request
//! in flight and has been quiet for [`QUIET`]. The drain finishes when every connection has
//! ended.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hyper_util::server::graceful::GracefulConnection;
use tokio::sync::{mpsc, watch};

/// How long an idle connection is given to start a request once shutdown has begun.
pub const QUIET: Duration = Duration::from_secs(1);

/// Tracks connections; [`Drain::finish`] signals them and waits for them.
pub struct Drain {
    signal: watch::Sender<bool>,
    draining: Arc<AtomicBool>,
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
        let draining = Arc::new(AtomicBool::new(false));
        Self {
            signal,
            draining,
            alive,
            done,
        }
    }

    /// A handle for one connection; the drain waits for it to be dropped.
    pub fn watch(&self) -> ConnWatch {
        ConnWatch {
            signal: self.signal.subscribe(),
            _alive: self.alive.clone(),
            activity: Arc::new(Activity::new(self.draining.clone())),
        }
    }

    /// Signals every connection and resolves when all have ended.
    pub async fn finish(self) {
        let Self {
            signal,
            draining,
            alive,
            mut done,
        } = self;
        draining.store(true, Ordering::SeqCst);
        let _ = signal.send(true);
        drop(alive);
        // Resolves with None once every connection's sender is dropped.
        let _ = done.recv().await;
    }
}

/// Requests in flight on one connection and when one last started or finished.
#[derive(Debug)]
pub struct Activity {
    epoch: Instant,
    in_flight: AtomicUsize,
    last_activity_ms: AtomicU64,
    http2: AtomicBool,
    /// Whether a request has ever started on this connection.
    requested: AtomicBool,
    draining: Arc<AtomicBool>,
}

impl Activity {
    fn new(draining: Arc<AtomicBool>) -> Self {
        Self {
            epoch: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_activity_ms: AtomicU64::new(0),
            http2: AtomicBool::new(false),
            requested: AtomicBool::new(false),
            draining,
        }
    }

    fn touch(&self) {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_activity_ms.store(now, Ordering::SeqCst);
    }

    fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_activity_ms.load(Ordering::SeqCst));
        self.epoch.elapsed().saturating_sub(last)
    }
}

/// Marks a request in flight until dropped.
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        // A keep-alive client sends its next request right after this response: measure
        // quiet from the end of a request, not its start.
        self.0.touch();
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
    /// Marks a request of this HTTP version in flight.
    pub fn start(&self, version: http::Version) -> InFlight {
        let a = &self.0;
        if version == http::Version::HTTP_2 {
            a.http2.store(true, Ordering::SeqCst);
        }
        a.in_flight.fetch_add(1, Ordering::SeqCst);
        a.requested.store(true, Ordering::SeqCst);
        a.touch();
        InFlight(a.clone())
    }

    /// Once draining, an HTTP/1.1 response says `Connection: close`, so the client opens a new
    /// connection (to another replica) for its next request instead of racing our close.
    pub fn draining_response<B>(&self, version: http::Version, response: &mut http::Response<B>) {
        if self.0.draining.load(Ordering::SeqCst) && version != http::Version::HTTP_2 {
            response.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
        }
    }
}

impl ConnWatch {
    pub fn activity(&self) -> ActivityHandle {
        ActivityHandle(self.activity.clone())
    }

    /// Drives `conn` until it ends, or until the drain has begun and it is done serving, or
    /// until `first_request` has passed without a request: hyper's header-read timeout starts
    /// only once a client has shown which HTTP version it speaks, and HTTP/2 has none, so a
    /// client that sends nothing (or an endless HTTP/2 preface) would otherwise hold its
    /// socket forever. `None`: the connection was closed by dropping it.
    pub async fn serve<C>(mut self, conn: C, first_request: Duration) -> Option<C::Output>
    where
        C: GracefulConnection + Future,
    {
        let mut conn = pin!(conn);
        let activity = self.activity.clone();
        let silent = async move {
            tokio::time::sleep(first_request).await;
            if activity.requested.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            output = conn.as_mut() => return Some(output),
            () = silent => return None,
            _ = self.signal.wait_for(|draining| *draining) => {}
        }
        if self.activity.http2.load(Ordering::SeqCst) {
            conn.as_mut().graceful_shutdown();
            return Some(conn.await);
        }
        loop {
            let idle = self.activity.in_flight.load(Ordering::SeqCst) == 0;
            if idle && self.activity.idle_for() >= QUIET {
                return None;
            }
            tokio::select! {
                output = conn.as_mut() => return Some(output),
                () = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
        }
    }
}
