//! Live reload of the serving certificate and of the configuration with its templates.
//!
//! Directory notifications trigger a re-check (kubelet replaces a `..data` symlink in a mounted
//! directory; cert-manager rewrites files), and a periodic re-check catches anything missed. A
//! change is applied only when the bytes differ and a second look a moment later finds the same
//! bytes; a broken change keeps the last good state and says so in the logs and in
//! `sidecar_injector_reloads_total{result="error"}`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher as _};

use super::metrics::ReloadKind;
use super::routes::State;
use super::tls::{CertFiles, Resolver};

/// What is being served, and the last change that was refused (so it is reported once).
#[derive(Clone, Copy, Debug)]
pub struct Tracked {
    pub served: [u8; 32],
    pub refused: Option<[u8; 32]>,
}

impl Tracked {
    pub fn new(served: [u8; 32]) -> Self {
        Self {
            served,
            refused: None,
        }
    }

    /// Whether bytes with this fingerprint still need looking at.
    fn is_new(&self, fingerprint: [u8; 32]) -> bool {
        fingerprint != self.served && Some(fingerprint) != self.refused
    }
}

/// How long a new reading must stay the same before it is applied. A file rewritten in place
/// (an editor, `cp`, a shell redirect) is empty or half written between its truncation and the
/// last write; a re-check landing in that moment must not take the half for the whole, nor
/// report it as broken. A reading that has moved on is left to the event or tick that follows.
const SETTLE: Duration = Duration::from_millis(100);

pub struct Reloader {
    pub state: Arc<State>,
    /// The certificate files, as last loaded, and where a new pair goes.
    pub cert_files: Option<(CertFiles, Tracked, Arc<Resolver>)>,
    /// Configuration file and the directories to watch for it.
    pub config: Option<(PathBuf, Tracked, Vec<PathBuf>)>,
    pub interval: Duration,
}
pub async fn run(mut r: Reloader) {
    if r.cert_files.is_none() && r.config.is_none() {
        return;
    }
    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some((files, _, _)) = &r.cert_files {
        dirs.extend(files.watch_dirs());
    }
    if let Some((_, _, config_dirs)) = &r.config {
        dirs.extend(config_dirs.iter().cloned());
    }
    dirs.sort();
    dirs.dedup();
    // Kept alive for the life of this task: dropping it stops the notifications.
    let _watcher = match notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|event| is_change(&event.kind)) {
            let _ = tx.try_send(());
        }
    }) {
        Ok(mut watcher) => {
            for dir in &dirs {
                if let Err(error) = watcher.watch(dir, RecursiveMode::NonRecursive) {
                    tracing::warn!(dir = %dir.display(), %error, "cannot watch directory; relying on the periodic re-check");
                }
            }
            Some(watcher)
        }
        Err(error) => {
            tracing::warn!(%error, "file notifications unavailable; relying on the periodic re-check");
            None
        }
    };
    let mut tick = tokio::time::interval(r.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        let cause = tokio::select! {
            Some(()) = rx.recv() => {
                // Let a burst of events (a symlink swap is several) settle first.
                tokio::time::sleep(Duration::from_millis(100)).await;
                while rx.try_recv().is_ok() {}
                "change notified"
            }
            _ = tick.tick() => "periodic",
        };
        tracing::debug!(cause, "re-checking the certificate and configuration files");
        // Reading, hashing and (on a change) building the templates is blocking work: off the
        // threads that answer reviews.
        r = match tokio::task::spawn_blocking(move || {
            r.check_certificate();
            r.check_config();
            r
        })
        .await
        {
            Ok(r) => r,
            Err(error) => {
                return tracing::error!(%error, "file re-check failed; live reload stopped");
            }
        };
    }
}

/// Whether a notification says something in a watched directory changed. Opening or reading a
/// file is no change: the re-check itself opens the files, and on Linux notify reports opens,
/// so taking them for changes re-checks the files ten times a second for ever.
fn is_change(kind: &notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode, EventKind};
    match kind {
        // A file written and closed: the best moment to look.
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

impl Reloader {
    fn check_certificate(&mut self) {
        let Some((files, tracked, resolver)) = &mut self.cert_files else {
            return;
        };
        let read = || {
            let fingerprint = files.fingerprint();
            let key = fingerprint.as_ref().copied().unwrap_or_default();
            (fingerprint, key)
        };
        let Some((fingerprint, _)) = settled(tracked, read, SETTLE) else {
            return;
        };
        let fingerprint = match fingerprint {
            Ok(fingerprint) => fingerprint,
            Err(error) => {
                // Mid-rotation a file can be missing for a moment; the next event or tick
                // picks up the finished pair, so this is only worth a debug line.
                return tracing::debug!(%error, "certificate files not readable right now");
            }
        };
        match files.load() {
            Ok(loaded) => {
                resolver.set(loaded.key);
                *tracked = Tracked::new(loaded.fingerprint);
                self.state.metrics.certificate_expiry(loaded.not_after);
                self.state.metrics.reload(ReloadKind::Certificate, true);
                tracing::info!(cert = %files.cert.display(), not_after = loaded.not_after, "serving certificate reloaded");
            }
            Err(error) => {
                tracked.refused = Some(fingerprint);
                self.state.metrics.reload(ReloadKind::Certificate, false);
                tracing::error!(%error, "new certificate is unusable; still serving the previous one");
            }
        }
    }

    fn check_config(&mut self) {
        let Some((path, tracked, _)) = &mut self.config else {
            return;
        };
        let read = || {
            let sources = crate::load::Sources::read(path);
            let fingerprint = match &sources {
                Ok(sources) => sources.fingerprint(),
                Err(error) => error_fingerprint(error),
            };
            (sources, fingerprint)
        };
        let Some((sources, fingerprint)) = settled(tracked, read, SETTLE) else {
            return;
        };
        let sources = match sources {
            Ok(sources) => sources,
            Err(error) => {
                tracked.refused = Some(fingerprint);
                self.state.metrics.reload(ReloadKind::Config, false);
                return tracing::error!(%error, "configuration unreadable; keeping the previous one");
            }
        };
        match sources.build(crate::load::own_namespace()) {
            Ok(injector) => {
                for advice in &injector.advisories {
                    tracing::warn!(%advice, "configuration reloaded with a warning");
                }
                self.state.injector.store(Arc::new(injector));
                self.state.memo.clear();
                self.state.config_changed.notify_one();
                *tracked = Tracked::new(fingerprint);
                self.state.metrics.reload(ReloadKind::Config, true);
                tracing::info!(config = %path.display(), "configuration and templates reloaded");
            }
            Err(error) => {
                tracked.refused = Some(fingerprint);
                self.state.metrics.reload(ReloadKind::Config, false);
                tracing::error!(%error, "new configuration is invalid; keeping the previous one");
            }
        }
    }
}

/// A new reading, once it has stayed the same for `settle`; `None` when there is nothing new or
/// the files are still changing (the event or tick that follows looks again).
fn settled<T>(
    tracked: &Tracked,
    mut read: impl FnMut() -> (T, [u8; 32]),
    settle: Duration,
) -> Option<(T, [u8; 32])> {
    let (_, first) = read();
    if !tracked.is_new(first) {
        return None;
    }
    std::thread::sleep(settle);
    let (reading, again) = read();
    if again != first {
        tracing::debug!("watched files still changing; looking again later");
        return None;
    }
    Some((reading, again))
}

/// Identifies an error that happened before any bytes could be fingerprinted, so the same
/// failure is reported once rather than at every tick.
fn error_fingerprint(error: &crate::engine::config::ConfigError) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(error.to_string().as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use notify::event::{
        AccessKind, AccessMode, CreateKind, EventKind, ModifyKind, RemoveKind, RenameMode,
    };

    use std::time::Duration;

    use super::{Tracked, is_change, settled};

    /// Readings a test hands out in turn, counting how many were taken.
    fn readings(
        list: &[u8],
    ) -> (
        impl FnMut() -> (u8, [u8; 32]),
        std::rc::Rc<std::cell::Cell<usize>>,
    ) {
        let taken = std::rc::Rc::new(std::cell::Cell::new(0));
        let (list, count) = (list.to_vec(), taken.clone());
        let read = move || {
            let byte = list[count.get()];
            count.set(count.get() + 1);
            (byte, [byte; 32])
        };
        (read, taken)
    }

    #[test]
    fn a_reading_is_applied_only_once_it_holds_still() {
        let tracked = Tracked::new([1; 32]);
        // Half written (2), then whole (3): not applied; the next look decides.
        let (read, taken) = readings(&[2, 3]);
        assert_eq!(settled(&tracked, read, Duration::ZERO).map(|r| r.0), None);
        assert_eq!(taken.get(), 2);
        // The same bytes twice: applied.
        let (read, _) = readings(&[3, 3]);
        assert_eq!(
            settled(&tracked, read, Duration::ZERO).map(|r| r.0),
            Some(3)
        );
        // What is served, or what was refused, is not looked at twice.
        let (read, taken) = readings(&[1]);
        assert_eq!(settled(&tracked, read, Duration::ZERO).map(|r| r.0), None);
        assert_eq!(taken.get(), 1);
        let refused = Tracked {
            served: [1; 32],
            refused: Some([4; 32]),
        };
        let (read, taken) = readings(&[4]);
        assert_eq!(settled(&refused, read, Duration::ZERO).map(|r| r.0), None);
        assert_eq!(taken.get(), 1);
    }

    #[test]
    fn opening_or_reading_a_file_is_no_change_and_writing_one_is() {
        for read in [
            AccessKind::Open(AccessMode::Any),
            AccessKind::Open(AccessMode::Read),
            AccessKind::Read,
            AccessKind::Close(AccessMode::Read),
            AccessKind::Any,
        ] {
            assert!(!is_change(&EventKind::Access(read)), "{read:?}");
        }
        for change in [
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
            EventKind::Create(CreateKind::Any),
            EventKind::Modify(ModifyKind::Any),
            EventKind::Modify(ModifyKind::Name(RenameMode::To)),
            EventKind::Remove(RemoveKind::File),
            EventKind::Any,
        ] {
            assert!(is_change(&change), "{change:?}");
        }
    }
}
