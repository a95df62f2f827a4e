//! Answers remembered by the bytes they answer.
//!
//! The replicas of a workload arrive at admission alike but for two things the API server
//! gives each pod: the request's uid, and the suffix of its ServiceAccount token volume's name
//! (`kube-api-access-` and five random characters, in the volume and in every container's
//! mount of it). The ReplicaSet controller creates each from the same template under
//! `generateName`, before the API server names it, and the API server writes the same defaults
//! and the same `managedFields` entry into each (its time is to the second, so the bytes change
//! from one second to the next). A rollout, a scale-up or a node drain sends them in bursts.
//! (The e2e suite checks this against a real API server.)
//!
//! [`Memo`] keeps recent answers by their body with the uid and the token name's suffix left
//! out: a body equal to a remembered one outside those is answered with the remembered answer
//! and its own uid written in, without being read again. A body is kept the second time its
//! kind comes, so bodies that never repeat cost a hash and two scans each, not a copy.
//!
//! It answers exactly what [`review::answer_for`] answers (tests/properties.rs, properties 8
//! and 9, hold the two equal on generated and hostile bodies):
//!
//! - A body is remembered only when the view read it and read its uid where the light scan
//!   below finds it, as written (no escapes), so that the answer depends on those bytes only
//!   by echoing them; and only when the answer echoes the uid once, as written.
//! - Its token name's suffix is left out only when the body has no `\u` escape (so no other
//!   string can spell the name), every string that starts with `kube-api-access-` is
//!   that one name, and the view read it exactly there: as the name of the pod's one token
//!   volume and of mounts of it, which the engine compares with other names only and keeps
//!   out of the template context. The name is then one no other string in the body or the
//!   templates can equal, whatever its suffix, so another suffix changes no comparison. And
//!   the body is kept only when, reviewed again with another suffix, it gets the same answer
//!   byte for byte (so the answer does not carry the name either).
//! - A body is answered from memory only when, outside its uid and its token name's suffix, it
//!   is the remembered body byte for byte (the suffixes where the remembered body had them, as
//!   long and of the same letters and digits), its uid is printable ASCII with nothing to
//!   escape, and it was sent to the same webhook and entry and arrives under the same injector
//!   (a reload starts a new memory). Such a body is the remembered one with other plain
//!   strings where the view read the uid and the token name, so the view reads it alike in
//!   everything else.
//!
//! Bounded: at most `entries` answers and [`BYTES`] bytes of bodies and answers; when either is
//! full the memory starts over, as the render cache's tables do, but no sooner than [`CHURN`]
//! lookups per entry after it last did (meanwhile it answers what it kept and keeps nothing
//! new): with more bodies repeating in turn than it holds, each would otherwise be copied in
//! and dropped before it came again.

use std::hash::{BuildHasher as _, Hasher as _};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

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
    /// Read-write: an answer from memory only reads it, so the serving threads never wait
    /// for one another there (a thread preempted while it held a mutex made the others sleep;
    /// docs/benchmarks-history.md, "Locks on the serving path").
    table: RwLock<Table>,
    /// Lookups since the answers last started over: they start over when full only after
    /// [`CHURN`] times as many lookups as they hold, so that more bodies repeating than the
    /// memory holds (in turn) are not copied in on every request only to be dropped before
    /// they come again; while full, the answers kept are answered and no others kept. Counted
    /// outside the table, so that a lookup does not write it.
    since_start: AtomicUsize,
}

#[derive(Default)]
struct Table {
    answers: foldhash::HashMap<u64, Arc<Remembered>>,
    bytes: usize,
    /// Keys of bodies reviewed and not kept (now): a body is kept the second time it comes, so
    /// that bodies that never repeat cost a hash, not a copy of body and answer.
    seen: foldhash::HashMap<u64, Sighting>,
}

/// See [`Memo::since_start`].
const CHURN: usize = 4;

/// How many keys [`Table::seen`] records for each entry the memory holds before it forgets
/// them all.
const SEEN_PER_ENTRY: usize = 4;

struct Remembered {
    injector: Arc<Injector>,
    webhook: Webhook,
    entry: Entry,
    body: Box<[u8]>,
    /// Where the uid's text is in `body`.
    uid: Range<usize>,
    /// Where the token name's suffix is, from the end of the uid on (see [`token_suffixes`]).
    suffixes: Vec<Range<usize>>,
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
            table: RwLock::default(),
            since_start: AtomicUsize::new(0),
        }
    }

    /// Forgets every answer (the server calls it when a reload replaces the injector; an answer
    /// of the old one could not be recalled anyway, but its memory would be kept).
    pub fn clear(&self) {
        if let Ok(mut table) = self.table.write() {
            *table = Table::default();
            self.since_start.store(0, Ordering::Relaxed);
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
        let suffixes = token_suffixes(&body[uid.end..]);
        let key = self.key(webhook, entry, body, &uid, &suffixes);
        let (known, sighting, room) = self.recall(key);
        if let Some(known) = known
            && Arc::ptr_eq(&known.injector, inj)
            && known.webhook == webhook
            && known.entry == entry
            && known.uid.start == uid.start
            && body[..uid.start] == known.body[..uid.start]
            && known.suffixes == suffixes
            && equal_but(&body[uid.end..], &known.body[known.uid.end..], &suffixes)
        {
            return (Ok(known.answer_to(&body[uid])), Recall::Hit);
        }
        // Where the view read the uid and the token name matters only to a body that may be
        // kept now.
        if !(room && matches!(sighting, Sighting::Again | Sighting::Checked)) {
            return (review::answer_for(inj, webhook, entry, body), Recall::Miss);
        }
        let (answer, located) = review::answer_located(inj, webhook, entry, body);
        if let Ok(answer) = &answer
            && located.uid.as_ref() == Some(&uid)
        {
            let keep = suffixes.is_empty()
                || (read_where(&located, &uid, &suffixes)
                    && (sighting == Sighting::Checked
                        || self.same_for_another_suffix(
                            inj, webhook, entry, body, &uid, &suffixes, answer,
                        )));
            let noted = match (keep, suffixes.is_empty()) {
                (false, _) => Sighting::Refused,
                (true, false) => Sighting::Checked,
                (true, true) => Sighting::Again,
            };
            if noted != sighting {
                self.note(key, noted);
            }
            if keep {
                self.keep(key, inj, webhook, entry, body, uid, suffixes, answer);
            }
        }
        (answer, Recall::Miss)
    }

    /// Whether `body` with another suffix where its token name's `suffixes` are (from the end
    /// of its uid on) gets `answer` byte for byte (see the module's documentation).
    #[allow(clippy::too_many_arguments)]
    fn same_for_another_suffix(
        &self,
        inj: &Injector,
        webhook: Webhook,
        entry: Entry,
        body: &[u8],
        uid: &Range<usize>,
        suffixes: &[Range<usize>],
        answer: &Answer,
    ) -> bool {
        let mut other = body.to_vec();
        for s in suffixes {
            for b in &mut other[uid.end + s.start..uid.end + s.end] {
                *b = another_letter(*b);
            }
        }
        match review::answer_for(inj, webhook, entry, &other) {
            Ok(again) => {
                again.body == answer.body
                    && again.outcome == answer.outcome
                    && again.summary == answer.summary
                    && again.injected == answer.injected
            }
            Err(_) => false,
        }
    }

    /// Where the body's uid is, if the memory is on and the body is of a shape it keeps.
    fn keepable(&self, body: &[u8]) -> Option<Range<usize>> {
        if self.entries == 0 || body.len() > BYTES / 8 {
            return None;
        }
        uid_span(body).filter(|uid| body[uid.clone()].iter().all(|b| (0x20..0x7f).contains(b)))
    }

    fn key(
        &self,
        webhook: Webhook,
        entry: Entry,
        body: &[u8],
        uid: &Range<usize>,
        suffixes: &[Range<usize>],
    ) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write_u8(webhook as u8);
        h.write_u8(entry as u8);
        h.write_usize(uid.start);
        h.write(&body[..uid.start]);
        let rest = &body[uid.end..];
        let mut at = 0;
        for s in suffixes {
            h.write(&rest[at..s.start]);
            h.write_usize(s.start);
            h.write_usize(s.len());
            at = s.end;
        }
        h.write(&rest[at..]);
        h.finish()
    }

    /// The answer kept under `key`; if there is none, how `key` came before (it is noted,
    /// within a bound, for the next); and whether there is room to keep it now. A hit only
    /// reads the table; the rest is noted under its write lock.
    fn recall(&self, key: u64) -> (Option<Arc<Remembered>>, Sighting, bool) {
        let since_start = self
            .since_start
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        match self.table.read() {
            Ok(table) => {
                if let Some(known) = table.answers.get(&key) {
                    return (Some(known.clone()), Sighting::Again, true);
                }
            }
            Err(_) => return (None, Sighting::First, false),
        }
        let Ok(mut table) = self.table.write() else {
            return (None, Sighting::First, false);
        };
        // Kept by another thread in between.
        if let Some(known) = table.answers.get(&key) {
            return (Some(known.clone()), Sighting::Again, true);
        }
        let room =
            table.answers.len() < self.entries || since_start >= self.entries.saturating_mul(CHURN);
        if table.seen.len() >= self.entries.saturating_mul(SEEN_PER_ENTRY) {
            table.seen.clear();
        }
        match table.seen.get(&key) {
            Some(&before) => (None, before, room),
            None => {
                table.seen.insert(key, Sighting::Again);
                (None, Sighting::First, room)
            }
        }
    }

    /// Notes how the body under `key` is to be taken when it comes again (a body that is kept
    /// and later forgotten when the memory starts over comes again too).
    fn note(&self, key: u64, sighting: Sighting) {
        if let Ok(mut table) = self.table.write() {
            table.seen.insert(key, sighting);
        }
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
        suffixes: Vec<Range<usize>>,
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
            suffixes,
            answer: answer.body.as_slice().into(),
            answer_uid,
            outcome: answer.outcome,
            summary: answer.summary.clone(),
            injected: answer.injected.clone(),
        });
        let Ok(mut table) = self.table.write() else {
            return;
        };
        if table.answers.len() >= self.entries || table.bytes + size > BYTES {
            if self.since_start.load(Ordering::Relaxed) < self.entries.saturating_mul(CHURN) {
                // Full, and filled too recently to start over (another thread came first).
                return;
            }
            // Starts over; the record of keys seen has a bound of its own.
            table.answers.clear();
            table.bytes = 0;
            self.since_start.store(0, Ordering::Relaxed);
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

/// How a body's key came before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sighting {
    /// Never (as far as the bounded record of keys goes).
    First,
    /// Before: kept now, if it can be.
    Again,
    /// Before, and kept with its token name's suffix left out once the check with another
    /// suffix held: kept again without that check (a memory that started over, when full, does
    /// not review such bodies twice each time it takes them back).
    Checked,
    /// Before, and not to be kept (the check with another suffix did not hold).
    Refused,
}

/// Whether the token name's `suffixes` (from the end of the uid on) are exactly where the view
/// read the pod's token volume's name.
fn read_where(located: &review::Located, uid: &Range<usize>, suffixes: &[Range<usize>]) -> bool {
    let mut read: Vec<Range<usize>> = located
        .token_name
        .iter()
        .filter_map(|name| {
            let start = name.start.checked_sub(uid.end)? + TOKEN_PREFIX.len();
            Some(start..name.end.checked_sub(uid.end)?)
        })
        .collect();
    read.sort_by_key(|r| r.start);
    read == suffixes
}

/// How a ServiceAccount token volume's name begins.
const TOKEN_PREFIX: &[u8] = b"kube-api-access-";

/// A searcher for [`TOKEN_PREFIX`], built once. (Without the string's opening quote, checked
/// apart: a quote, common in JSON, would make a poor byte for the search to look for first.)
static TOKEN_FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(TOKEN_PREFIX));

/// The longest token name suffix left out (the API server draws five characters).
const SUFFIX_MAX: usize = 16;

/// Where the suffix of the one token volume name in `rest` (a body after its uid) is, at every
/// place a string starts with `kube-api-access-`: when every such string is that name, its
/// suffix is lower-case letters and digits (at most [`SUFFIX_MAX`]), and `rest` has no `\u`
/// escape: any other escape stands for a character no token name has (a quote, a backslash, a
/// slash, a control character), so no escaped string can spell one. Empty otherwise (the body
/// is then remembered with its token name, as it is).
fn token_suffixes(rest: &[u8]) -> Vec<Range<usize>> {
    let mut suffixes: Vec<Range<usize>> = Vec::new();
    for at in TOKEN_FINDER.find_iter(rest) {
        // A string that starts with the prefix (another that only contains it is not a name).
        if at == 0 || rest[at - 1] != b'"' {
            continue;
        }
        let start = at + TOKEN_PREFIX.len();
        let Some(len) = rest[start..]
            .iter()
            .take(SUFFIX_MAX + 1)
            .position(|b| !matches!(b, b'a'..=b'z' | b'0'..=b'9'))
        else {
            return Vec::new();
        };
        let suffix = start..start + len;
        if len == 0
            || rest[suffix.end] != b'"'
            || suffixes
                .first()
                .is_some_and(|first| rest[first.clone()] != rest[suffix.clone()])
        {
            return Vec::new();
        }
        suffixes.push(suffix);
    }
    // A `\\u` (or an escaped backslash before a `u`, which refuses a body for nothing).
    if !suffixes.is_empty()
        && memchr::memchr_iter(b'\\', rest).any(|at| rest.get(at + 1) == Some(&b'u'))
    {
        return Vec::new();
    }
    suffixes
}

/// Whether `a` and `b` are equal but in `suffixes` (which are in both, in order).
fn equal_but(a: &[u8], b: &[u8], suffixes: &[Range<usize>]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut at = 0;
    for s in suffixes {
        if a[at..s.start] != b[at..s.start] {
            return false;
        }
        at = s.end;
    }
    a[at..] == b[at..]
}

/// Another lower-case letter or digit than `b`.
fn another_letter(b: u8) -> u8 {
    match b {
        b'z' => b'a',
        b'9' => b'0',
        b => b + 1,
    }
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
        for body in &bodies[..2] {
            // Kept the second time it comes.
            assert_eq!(ask(&memo, &inj, body).1, Recall::Miss);
            assert_eq!(ask(&memo, &inj, body).1, Recall::Miss);
        }
        assert_eq!(memo.table.read().unwrap().answers.len(), 2);
        // Full, and filled in fewer than CHURN x 2 lookups: the third is not kept, and the
        // answers kept are still answered.
        assert_eq!(ask(&memo, &inj, &bodies[2]).1, Recall::Miss);
        assert_eq!(ask(&memo, &inj, &bodies[2]).1, Recall::Miss);
        assert_eq!(ask(&memo, &inj, &bodies[0]).1, Recall::Hit);
        // The eighth lookup: the memory starts over with the third.
        assert_eq!(ask(&memo, &inj, &bodies[2]).1, Recall::Miss);
        assert_eq!(memo.table.read().unwrap().answers.len(), 1);
        assert_eq!(ask(&memo, &inj, &bodies[2]).1, Recall::Hit);
        assert_eq!(ask(&memo, &inj, &bodies[0]).1, Recall::Miss);
        assert_eq!(ask(&memo, &inj, &bodies[0]).1, Recall::Hit);
        memo.clear();
        assert_eq!(memo.table.read().unwrap().bytes, 0);
        assert_eq!(ask(&memo, &inj, &bodies[0]).1, Recall::Miss);
    }

    /// A replica: another uid, and another suffix of its token volume's name.
    fn replica(uid: &str, suffix: &str) -> Vec<u8> {
        String::from_utf8(with_uid(uid))
            .unwrap()
            .replace(
                "kube-api-access-x7k2p",
                &format!("kube-api-access-{suffix}"),
            )
            .into_bytes()
    }

    /// A memory of `entries` answers that has seen two replicas (and kept the second).
    fn two_replicas_seen(entries: usize) -> (Arc<Injector>, Memo) {
        let inj = Arc::new(Injector::embedded(None).unwrap());
        let memo = Memo::new(entries);
        assert_eq!(ask(&memo, &inj, &replica("a", "q8z2w")).1, Recall::Miss);
        assert_eq!(ask(&memo, &inj, &replica("b", "m4n7b")).1, Recall::Miss);
        (inj, memo)
    }

    #[test]
    fn a_replica_with_its_own_token_name_is_answered_from_memory() {
        let (inj, memo) = two_replicas_seen(4);
        for (uid, suffix) in [("c", "bcd2f"), ("d", "x7k2p"), ("e", "zzzzz")] {
            let body = replica(uid, suffix);
            let (answer, recall) = ask(&memo, &inj, &body);
            assert_eq!(recall, Recall::Hit, "{suffix}");
            let reviewed = review::answer(&inj, Webhook::Mutate, &body).unwrap();
            assert_eq!(answer, reviewed.body);
        }
        // Another length, an upper-case letter, a `\u` escape elsewhere: read again.
        for body in [
            replica("f", "q8z2"),
            replica("g", "Q8z2w"),
            String::from_utf8(replica("h", "q8z2w"))
                .unwrap()
                .replacen("\"app\"", "\"\\u0061pp\"", 1)
                .into_bytes(),
        ] {
            assert_ne!(ask(&memo, &inj, &body).1, Recall::Hit);
        }
    }

    #[test]
    fn a_memory_that_started_over_takes_a_checked_replica_back() {
        let (inj, memo) = two_replicas_seen(1);
        let checked = |memo: &Memo| {
            let table = memo.table.read().unwrap();
            table
                .seen
                .values()
                .filter(|s| **s == Sighting::Checked)
                .count()
        };
        assert_eq!(checked(&memo), 1);
        // Another body kept: the memory (one entry) starts over, and may again after CHURN
        // lookups.
        let other = BODY.replacen("\"namespace\"", " \"namespace\"", 1);
        ask(&memo, &inj, other.as_bytes());
        ask(&memo, &inj, other.as_bytes());
        for _ in 0..3 {
            assert_eq!(ask(&memo, &inj, other.as_bytes()).1, Recall::Hit);
        }
        let before = checked(&memo);
        // Taken back as checked.
        assert_eq!(ask(&memo, &inj, &replica("c", "bcd2f")).1, Recall::Miss);
        assert_eq!(checked(&memo), before);
        let body = replica("d", "zz9z9");
        let (answer, recall) = ask(&memo, &inj, &body);
        assert_eq!(recall, Recall::Hit);
        assert_eq!(
            answer,
            review::answer(&inj, Webhook::Mutate, &body).unwrap().body
        );
    }

    #[test]
    fn a_token_name_written_elsewhere_is_not_left_out() {
        let rest = br#"{"volumes":[{"name":"kube-api-access-ab1"}],"x":"kube-api-access-ab1"}"#;
        assert_eq!(token_suffixes(rest).len(), 2);
        for rest in [
            &br#"{"a":"kube-api-access-ab1","b":"kube-api-access-ab2"}"#[..],
            br#"{"a":"kube-api-access-ab1","b":"\u0061"}"#,
            br#"{"a":"kube-api-access-Ab1"}"#,
            br#"{"a":"kube-api-access-ab1-x"}"#,
            br#"{"a":"kube-api-access-"}"#,
            br#"{"a":"kube-api-access-abcdefghijklmnopq"}"#,
        ] {
            assert!(
                token_suffixes(rest).is_empty(),
                "{}",
                String::from_utf8_lossy(rest)
            );
        }
        // A string naming the token volume's name where the view does not read it as one (a
        // label): the body is reviewed, never answered for another suffix.
        let inj = Arc::new(Injector::embedded(None).unwrap());
        let memo = Memo::new(4);
        let labelled = |uid: &str, suffix: &str| {
            String::from_utf8(replica(uid, suffix))
                .unwrap()
                .replacen(
                    "\"labels\": {",
                    &format!("\"labels\": {{\"v\":\"kube-api-access-{suffix}\","),
                    1,
                )
                .into_bytes()
        };
        for (uid, suffix) in [("a", "q8z2w"), ("b", "m4n7b"), ("c", "bcd2f")] {
            let body = labelled(uid, suffix);
            assert!(!token_suffixes(&body).is_empty());
            assert_eq!(ask(&memo, &inj, &body).1, Recall::Miss);
        }
    }

    #[test]
    fn an_answer_echoing_the_uid_twice_is_not_kept() {
        assert_eq!(echoed_once(br#"{"uid":"a"}"#, b"a"), Some(8..9));
        assert_eq!(echoed_once(br#"{"uid":"a","x":{"uid":"a"}}"#, b"a"), None);
        assert_eq!(echoed_once(br#"{"uid":"ab"}"#, b"a"), None);
    }
}
