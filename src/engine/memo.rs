//! Answers remembered by the bytes they answer.
//!
//! The replicas of a workload that mounts no service account token
//! (`automountServiceAccountToken: false`) arrive at admission alike byte for byte but for the
//! request's uid: the ReplicaSet controller creates each from the same template under
//! `generateName`, before the API server names it, and the API server writes the same defaults
//! and the same `managedFields` entry into each (its time is to the second, so the bytes change
//! from one second to the next). A rollout, a scale-up or a node drain sends them in bursts.
//! Replicas that mount a token (the default) never arrive alike: the API server's
//! ServiceAccount admission names every pod's token volume `kube-api-access-` and five random
//! characters (the e2e suite checks both against a real API server).
//!
//! [`Memo`] keeps recent answers by their body with the uid left out: a body equal to a
//! remembered one outside its uid is answered with the remembered answer and its own uid
//! written in, without being read again. A body is kept the second time it comes, so bodies
//! that never repeat cost a hash each, not a copy.
//!
//! It answers exactly what [`review::answer_for`] answers (tests/properties.rs, property 8, holds
//! the two equal on generated and hostile bodies):
//!
//! - A body is remembered only when the view read it and read its uid where the light scan
//!   below finds it, as written (no escapes), so that the answer depends on those bytes only
//!   by echoing them; and only when the answer echoes the uid once, as written.
//! - A body is answered from memory only when, outside its uid, it is the remembered body byte
//!   for byte, its uid is printable ASCII with nothing to escape, and it was sent to the same
//!   webhook and entry and arrives under the same injector (a reload starts a new memory).
//!   Such a body is the remembered one with another plain string where the view read the uid,
//!   so the view reads it alike in everything else.
//!
//! Bounded: at most `entries` answers and [`BYTES`] bytes of bodies and answers; when either is
//! full the memory starts over, as the render cache's tables do.

use std::hash::{BuildHasher as _, Hasher as _};
use std::ops::Range;
use std::sync::{Arc, Mutex};

use crate::engine::config::Injector;
use crate::engine::inject::Entry;
use crate::engine::json::{plain_run, ws_end as ws};
use crate::engine::review::{self, Answer, Injected, Outcome, ReviewError, Summary, Webhook};

/// Bound on the bytes of the bodies and answers kept; one entry may take an eighth of it.
pub const BYTES: usize = 8 << 20;

/// The answers the default server keeps.
pub const DEFAULT_ENTRIES: usize = 512;

/// Recent answers, by body (see the module's documentation).
pub struct Memo {
    entries: usize,
    hasher: foldhash::fast::RandomState,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    answers: foldhash::HashMap<u64, Arc<Remembered>>,
    bytes: usize,
    /// Keys of bodies reviewed once and not kept: a body is kept the second time it comes, so
    /// that bodies that never repeat cost a hash, not a copy of body and answer.
    seen: foldhash::HashSet<u64>,
}

struct Remembered {
    injector: Arc<Injector>,
    webhook: Webhook,
    entry: Entry,
    body: Box<[u8]>,
    /// Where the uid's text is in `body`.
    uid: Range<usize>,
    answer: Box<[u8]>,
    /// Where the uid's text is in `answer`.
    answer_uid: Range<usize>,
    outcome: Outcome,
    summary: Summary,
    injected: Injected,
}

/// Whether an answer came from memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recall {
    /// Answered from memory.
    Hit,
    /// Reviewed (and remembered, the second time it comes, if it can be).
    Miss,
    /// Reviewed; the body is not of a shape the memory keeps (see the module's documentation),
    /// or the memory is off.
    Unkept,
}

impl Recall {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hit => "hit",
            Self::Miss => "miss",
            Self::Unkept => "unkept",
        }
    }
}

impl std::fmt::Debug for Memo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memo")
            .field("entries", &self.entries)
            .finish_non_exhaustive()
    }
}

impl Memo {
    /// A memory of at most `entries` answers; 0 turns it off.
    pub fn new(entries: usize) -> Self {
        Self {
            entries,
            hasher: foldhash::fast::RandomState::default(),
            table: Mutex::default(),
        }
    }

    /// Forgets every answer (the server calls it when a reload replaces the injector; an answer
    /// of the old one could not be recalled anyway, but its memory would be kept).
    pub fn clear(&self) {
        if let Ok(mut table) = self.table.lock() {
            *table = Table::default();
        }
    }

    /// The answer [`review::answer_for`] gives, from memory when it can be.
    pub fn answer(
        &self,
        inj: &Arc<Injector>,
        webhook: Webhook,
        entry: Entry,
        body: &[u8],
    ) -> (Result<Answer, ReviewError>, Recall) {
        let Some(uid) = self.keepable(body) else {
            return (
                review::answer_for(inj, webhook, entry, body),
                Recall::Unkept,
            );
        };
        let key = self.key(webhook, entry, body, &uid);
        let (known, first_time) = self.recall(key);
        if let Some(known) = known
            && Arc::ptr_eq(&known.injector, inj)
            && known.webhook == webhook
            && known.entry == entry
            && known.uid.start == uid.start
            && body[..uid.start] == known.body[..uid.start]
            && body[uid.end..] == known.body[known.uid.end..]
        {
            return (Ok(known.answer_to(&body[uid])), Recall::Hit);
        }
        let (answer, read_at) = review::answer_located(inj, webhook, entry, body);
        if let Ok(answer) = &answer
            && read_at == Some(uid.clone())
            && !first_time
        {
            self.keep(key, inj, webhook, entry, body, uid, answer);
        }
        (answer, Recall::Miss)
    }

    /// Where the body's uid is, if the memory is on and the body is of a shape it keeps.
    fn keepable(&self, body: &[u8]) -> Option<Range<usize>> {
        if self.entries == 0 || body.len() > BYTES / 8 {
            return None;
        }
        uid_span(body).filter(|uid| body[uid.clone()].iter().all(|b| (0x20..0x7f).contains(b)))
    }

    fn key(&self, webhook: Webhook, entry: Entry, body: &[u8], uid: &Range<usize>) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write_u8(webhook as u8);
        h.write_u8(entry as u8);
        h.write_usize(uid.start);
        h.write(&body[..uid.start]);
        h.write(&body[uid.end..]);
        h.finish()
    }

    /// The answer kept under `key`; if there is none, whether `key` comes for the first time
    /// (it is noted, within a bound, for the next), under one lock.
    fn recall(&self, key: u64) -> (Option<Arc<Remembered>>, bool) {
        let Ok(mut table) = self.table.lock() else {
            return (None, true);
        };
        if let Some(known) = table.answers.get(&key) {
            return (Some(known.clone()), false);
        }
        if table.seen.len() >= self.entries.saturating_mul(4) {
            table.seen.clear();
        }
        (None, table.seen.insert(key))
    }

    #[allow(clippy::too_many_arguments)]
    fn keep(
        &self,
        key: u64,
        inj: &Arc<Injector>,
        webhook: Webhook,
        entry: Entry,
        body: &[u8],
        uid: Range<usize>,
        answer: &Answer,
    ) {
        let Some(answer_uid) = echoed_once(&answer.body, &body[uid.clone()]) else {
            return;
        };
        let size = body.len() + answer.body.len();
        if size > BYTES / 8 {
            return;
        }
        let remembered = Arc::new(Remembered {
            injector: inj.clone(),
            webhook,
            entry,
            body: body.into(),
            uid,
            answer: answer.body.as_slice().into(),
            answer_uid,
            outcome: answer.outcome,
            summary: answer.summary.clone(),
            injected: answer.injected.clone(),
        });
        let Ok(mut table) = self.table.lock() else {
            return;
        };
        if table.answers.len() >= self.entries || table.bytes + size > BYTES {
            *table = Table::default();
        }
        if let Some(replaced) = table.answers.insert(key, remembered) {
            table.bytes -= replaced.body.len() + replaced.answer.len();
        }
        table.bytes += size;
    }
}

impl Remembered {
    /// The remembered answer, for a request whose uid is `uid` (printable ASCII, nothing to
    /// escape: written in the answer as it is).
    fn answer_to(&self, uid: &[u8]) -> Answer {
        let (before, after) = (
            &self.answer[..self.answer_uid.start],
            &self.answer[self.answer_uid.end..],
        );
        let mut body = Vec::with_capacity(before.len() + uid.len() + after.len());
        body.extend_from_slice(before);
        body.extend_from_slice(uid);
        body.extend_from_slice(after);
        Answer {
            body,
            outcome: self.outcome,
            // `keepable` let only ASCII through.
            summary: self
                .summary
                .with_uid(std::str::from_utf8(uid).unwrap_or_default()),
            injected: self.injected.clone(),
        }
    }
}

/// Where `"uid":"<uid>"` is in `answer` (the uid's text), if it is there exactly once.
fn echoed_once(answer: &[u8], uid: &[u8]) -> Option<Range<usize>> {
    const KEY: &[u8] = br#""uid":""#;
    let mut needle = Vec::with_capacity(KEY.len() + uid.len() + 1);
    needle.extend_from_slice(KEY);
    needle.extend_from_slice(uid);
    needle.push(b'"');
    let mut found = memchr::memmem::find_iter(answer, &needle);
    let first = found.next()?;
    if found.next().is_some() {
        return None;
    }
    let start = first + KEY.len();
    Some(start..start + uid.len())
}

/// Where the text of `request.uid` is, when the review begins as the API server writes one:
/// string members (`kind`, `apiVersion`) and then `request`, whose first member is `uid`, all
/// written without escapes. Reads nothing else, and checks nothing past the uid: a body it
/// finds a uid in is answered from memory only when it equals, outside the uid, a body the view
/// read whole.
fn uid_span(body: &[u8]) -> Option<Range<usize>> {
    let mut at = ws(body, 0);
    at = ws(body, byte(body, at, b'{')?);
    // Bounded: the API server writes two members before `request`.
    for _ in 0..4 {
        let (key, next) = plain(body, at)?;
        at = ws(body, byte(body, ws(body, next), b':')?);
        if &body[key] == b"request" {
            at = ws(body, byte(body, at, b'{')?);
            let (key, next) = plain(body, at)?;
            if &body[key] != b"uid" {
                return None;
            }
            at = ws(body, byte(body, ws(body, next), b':')?);
            return plain(body, at).map(|(uid, _)| uid);
        }
        let (_, next) = plain(body, at)?;
        at = ws(body, byte(body, ws(body, next), b',')?);
    }
    None
}

/// Past `want` at `at`.
fn byte(body: &[u8], at: usize, want: u8) -> Option<usize> {
    (body.get(at) == Some(&want)).then_some(at + 1)
}

/// A string at `at` with nothing escaped in it: its text, and where it ends.
fn plain(body: &[u8], at: usize) -> Option<(Range<usize>, usize)> {
    let start = byte(body, at, b'"')?;
    let end = plain_run(body, start);
    byte(body, end, b'"').map(|next| (start..end, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uid_is_found_where_the_api_server_writes_it() {
        let body = br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"abc","object":{}}}"#;
        let span = uid_span(body).unwrap();
        assert_eq!(&body[span], b"abc");
        let pretty = b"{\n  \"apiVersion\" : \"v1\",\n  \"request\" :\t{ \"uid\" : \"x-1\" } }";
        assert_eq!(&pretty[uid_span(pretty).unwrap()], b"x-1");
    }

    #[test]
    fn other_shapes_are_not_kept() {
        for body in [
            &br#"{"request":{"kind":{},"uid":"abc"}}"#[..],
            br#"{"kind":{"a":1},"request":{"uid":"abc"}}"#,
            br#"{"request":{"uid":"a\"bc"}}"#,
            br#"{"request":{"u\u0069d":"abc"}}"#,
            br#"{"request":{"uid":"abc"#,
            br#"["request"]"#,
            br#"{"a":"","b":"","c":"","d":"","request":{"uid":"abc"}}"#,
            b"",
        ] {
            assert_eq!(uid_span(body), None, "{}", String::from_utf8_lossy(body));
        }
    }

    const BODY: &str = include_str!("../../tests/inputs/inject/pod-v1.json");
    const UID: &str = "7f0c4d2e-3b1a-4c5d-9e8f-0a1b2c3d4e5f";

    fn with_uid(uid: &str) -> Vec<u8> {
        BODY.replacen(UID, uid, 1).into_bytes()
    }

    fn ask(memo: &Memo, inj: &Arc<Injector>, body: &[u8]) -> (Vec<u8>, Recall) {
        let (answer, recall) = memo.answer(inj, Webhook::Mutate, Entry::Pod, body);
        (answer.expect("answered").body, recall)
    }

    #[test]
    fn a_replica_is_answered_from_memory_with_its_own_uid() {
        let inj = Arc::new(Injector::embedded(None).unwrap());
        let memo = Memo::new(4);
        assert_eq!(ask(&memo, &inj, BODY.as_bytes()).1, Recall::Miss);
        // Kept the second time.
        assert_eq!(ask(&memo, &inj, &with_uid("second")).1, Recall::Miss);
        let (answer, recall) = ask(&memo, &inj, &with_uid("other-uid"));
        assert_eq!(recall, Recall::Hit);
        let reviewed = review::answer(&inj, Webhook::Mutate, &with_uid("other-uid")).unwrap();
        assert_eq!(answer, reviewed.body);
        assert!(String::from_utf8_lossy(&answer).contains(r#""uid":"other-uid""#));
        // Another webhook, another body, a memory that is off: reviewed.
        for _ in 0..2 {
            let (_, recall) = memo.answer(&inj, Webhook::Validate, Entry::Pod, BODY.as_bytes());
            assert_eq!(recall, Recall::Miss);
        }
        let (_, recall) = memo.answer(&inj, Webhook::Validate, Entry::Pod, BODY.as_bytes());
        assert_eq!(recall, Recall::Hit);
        let moved = BODY.replacen("\"namespace\"", "\"namespace\" ", 1);
        assert_eq!(ask(&memo, &inj, moved.as_bytes()).1, Recall::Miss);
        assert_eq!(ask(&Memo::new(0), &inj, BODY.as_bytes()).1, Recall::Unkept);
    }

    #[test]
    fn the_memory_is_bounded_and_forgets_on_clear() {
        let inj = Arc::new(Injector::embedded(None).unwrap());
        let memo = Memo::new(2);
        let bodies: Vec<Vec<u8>> = (0..3)
            .map(|i| {
                BODY.replacen(
                    "\"namespace\"",
                    &format!("{}\"namespace\"", " ".repeat(i)),
                    1,
                )
                .into_bytes()
            })
            .collect();
        for body in &bodies {
            // Kept the second time it comes.
            assert_eq!(ask(&memo, &inj, body).1, Recall::Miss);
            assert_eq!(ask(&memo, &inj, body).1, Recall::Miss);
            assert!(memo.table.lock().unwrap().answers.len() <= 2);
        }
        // The third started the memory over.
        assert_eq!(ask(&memo, &inj, &bodies[2]).1, Recall::Hit);
        assert_eq!(ask(&memo, &inj, &bodies[0]).1, Recall::Miss);
        memo.clear();
        assert_eq!(memo.table.lock().unwrap().bytes, 0);
        assert_eq!(ask(&memo, &inj, &bodies[0]).1, Recall::Miss);
    }

    #[test]
    fn an_answer_echoing_the_uid_twice_is_not_kept() {
        assert_eq!(echoed_once(br#"{"uid":"a"}"#, b"a"), Some(8..9));
        assert_eq!(echoed_once(br#"{"uid":"a","x":{"uid":"a"}}"#, b"a"), None);
        assert_eq!(echoed_once(br#"{"uid":"ab"}"#, b"a"), None);
    }
}
