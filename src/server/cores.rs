//! The threads that serve connections: one per CPU the process may use, each with a
//! single-threaded tokio runtime of its own, and each accepted connection handed to one of
//! them in turn, where it stays until it ends.
//!
//! Why not the multi-threaded runtime for connections: with it, a connection's task moves
//! between workers (work stealing), every socket is polled through one shared driver, and a
//! worker woken to steal waits for a CPU behind whatever runs there. On two shared cores at
//! 0.4 of the transport's rate that turned a review's few microseconds into a tail of isolated
//! requests of 0.5–1 ms (and a pure 6-µs spin did the same), and the engine cost the server
//! about twice its own time (docs/benchmarks-history.md, "At 85e782b"). Here a connection's
//! requests, its TLS state and its socket's readiness all stay on one thread. What that gives up:
//! one connection (one HTTP/2 connection with all its streams) is served by one core, about 30,000
//! typical reviews a second on this machine, far more than any API server sends.
//!
//! The listener, the admin port and the reloads stay on the caller's runtime; only accepted
//! connections come here. The threads end when the [`Cores`] is dropped (in-flight connections
//! are the drain's to wait for, [`super::drain`]).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::TcpStream;
use tokio::sync::mpsc;

type Job = Box<dyn FnOnce() + Send>;

/// The serving threads; connections are given to them in turn.
pub struct Cores {
    threads: Vec<mpsc::UnboundedSender<Job>>,
    next: AtomicUsize,
}

/// How many serving threads `requested` means: itself when not 0, else `TOKIO_WORKER_THREADS`
/// when set (tokio's own variable, so one setting sizes both this and a multi-threaded
/// runtime), else one per CPU this process may use (std reads the cgroup's CPU quota: the
/// chart's 500m limit gives one).
pub fn count(requested: usize) -> usize {
    if requested > 0 {
        return requested;
    }
    std::env::var("TOKIO_WORKER_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

impl Cores {
    /// Starts `threads` serving threads (at least one).
    pub fn start(threads: usize) -> std::io::Result<Self> {
        let mut senders = Vec::with_capacity(threads.max(1));
        for i in 0..threads.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (send, mut jobs) = mpsc::unbounded_channel::<Job>();
            std::thread::Builder::new()
                .name(format!("serve-{i}"))
                .spawn(move || {
                    runtime.block_on(async move {
                        while let Some(job) = jobs.recv().await {
                            job();
                        }
                    });
                    // Dropping the runtime here cancels what is still running: the drain
                    // has waited for it, or given up on it.
                })?;
            senders.push(send);
        }
        Ok(Self {
            threads: senders,
            next: AtomicUsize::new(0),
        })
    }

    pub fn len(&self) -> usize {
        self.threads.len()
    }

    pub fn is_empty(&self) -> bool {
        self.threads.is_empty()
    }

    /// Serves `tcp` on the next thread in turn: `serve` is called there with the connection
    /// registered with that thread's runtime, and what it returns runs there to its end.
    pub fn serve<F, Fut>(&self, tcp: TcpStream, serve: F)
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let tcp = match tcp.into_std() {
            Ok(tcp) => tcp,
            Err(error) => return tracing::debug!(%error, "cannot hand a connection over"),
        };
        let job: Job = Box::new(move || match TcpStream::from_std(tcp) {
            Ok(tcp) => {
                tokio::spawn(serve(tcp));
            }
            Err(error) => tracing::debug!(%error, "cannot take a connection over"),
        });
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.threads.len();
        // A thread that is gone (its runtime failed) drops the connection with the job.
        let _ = self.threads[i].send(job);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;

    #[test]
    fn count_takes_the_request_first() {
        assert_eq!(count(3), 3);
        assert!(count(0) >= 1);
    }

    /// Connections go to the threads in turn, are served there (an echo), and each stays on
    /// the thread it was given to.
    #[tokio::test]
    async fn connections_are_spread_over_the_threads_and_served() {
        let cores = Cores::start(2).unwrap();
        assert_eq!(cores.len(), 2);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Each connection's thread before and after it awaited.
        let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        for n in 0..4u8 {
            let client = tokio::spawn(async move {
                let mut c = TcpStream::connect(addr).await.unwrap();
                c.write_all(&[n]).await.unwrap();
                let mut back = [0u8; 1];
                c.read_exact(&mut back).await.unwrap();
                back[0]
            });
            let (tcp, _) = listener.accept().await.unwrap();
            let seen = seen.clone();
            cores.serve(tcp, move |mut tcp| async move {
                let thread = || std::thread::current().name().unwrap_or("?").to_owned();
                let before = thread();
                let mut byte = [0u8; 1];
                tcp.read_exact(&mut byte).await.unwrap();
                seen.lock().unwrap().push((before, thread()));
                tcp.write_all(&byte).await.unwrap();
            });
            assert_eq!(client.await.unwrap(), n);
        }
        let seen = seen.lock().unwrap().clone();
        let expected = ["serve-0", "serve-1", "serve-0", "serve-1"];
        assert_eq!(seen.len(), 4);
        for ((before, after), want) in seen.iter().zip(expected) {
            assert_eq!((before.as_str(), after.as_str()), (want, want));
        }
    }
}
