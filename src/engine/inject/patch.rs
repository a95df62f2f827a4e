//! The edits written as a JSONPatch: into one buffer, from the pieces each rendered item was
//! encoded to once, and to base64 in one pass.

use std::borrow::Cow;

use crate::engine::inject::plan::Edit;
use crate::engine::json;
use crate::engine::template::Piece;
use crate::engine::view::{ContainerView, PodView};

/// A JSONPatch: the bytes written for it, with each long fragment piece left out and noted
/// where it belongs. A long piece's JSON is copied only if the whole JSON is asked for
/// ([`Patch::json`]); its base64, kept with the piece, is what an AdmissionReview answer
/// copies ([`Patch::base64_into`]). Copying the piece's JSON into the patch as well was half
/// of what a review copied, and a cold review fetches every byte it copies from memory
/// (docs/benchmarks-history.md, "What the goals needed").
#[derive(Debug, Default)]
pub struct Patch<'p> {
    /// The patch's bytes, long pieces left out.
    written: Vec<u8>,
    /// Each long piece, with the offset in `written` where it belongs (in order).
    pub(super) pieces: Vec<(usize, &'p Piece)>,
}

impl From<Vec<u8>> for Patch<'_> {
    /// A patch's JSON, with no piece kept: its base64 is encoded whole.
    fn from(json: Vec<u8>) -> Self {
        Self {
            written: json,
            pieces: Vec::new(),
        }
    }
}

/// Base64 written in groups of three bytes, from pieces of any length: the bytes of a group
/// that is not complete yet wait in `carry`.
pub(super) struct Base64Writer<'o> {
    pub(super) out: &'o mut Vec<u8>,
    pub(super) carry: [u8; 3],
    pub(super) carried: usize,
}

impl Base64Writer<'_> {
    pub(super) fn plain(&mut self, mut bytes: &[u8]) {
        if self.carried > 0 {
            let take = (3 - self.carried).min(bytes.len());
            self.carry[self.carried..self.carried + take].copy_from_slice(&bytes[..take]);
            self.carried += take;
            bytes = &bytes[take..];
            if self.carried < 3 {
                return;
            }
            base64_simd::STANDARD.encode_append(self.carry, self.out);
            self.carried = 0;
        }
        let whole = bytes.len() / 3 * 3;
        base64_simd::STANDARD.encode_append(&bytes[..whole], self.out);
        let rest = &bytes[whole..];
        self.carry[..rest.len()].copy_from_slice(rest);
        self.carried = rest.len();
    }

    /// The last group, padded.
    pub(super) fn finish(self) {
        base64_simd::STANDARD.encode_append(&self.carry[..self.carried], self.out);
    }
}

impl Patch<'_> {
    /// The length of the patch's JSON.
    pub fn len(&self) -> usize {
        self.written.len() + self.pieces.iter().map(|(_, p)| p.json.len()).sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The patch's JSON, long pieces copied in.
    pub fn json(&self) -> Cow<'_, [u8]> {
        if self.pieces.is_empty() {
            return Cow::Borrowed(&self.written);
        }
        let mut json = Vec::with_capacity(self.len());
        let mut done = 0;
        for &(at, piece) in &self.pieces {
            json.extend_from_slice(&self.written[done..at]);
            json.extend_from_slice(piece.json.as_bytes());
            done = at;
        }
        json.extend_from_slice(&self.written[done..]);
        Cow::Owned(json)
    }

    /// Appends the base64 of the patch to `out`: the written bytes are encoded (SIMD), each
    /// long piece's bytes are copied from its kept base64 but for the zero to two bytes at
    /// each end that share a group of three with the bytes around it, so the stretches join
    /// as one encoding of the whole JSON would write them.
    pub fn base64_into(&self, out: &mut Vec<u8>) {
        out.reserve(self.len().div_ceil(3) * 4);
        let mut w = Base64Writer {
            out,
            carry: [0; 3],
            carried: 0,
        };
        let mut done = 0;
        for &(at, piece) in &self.pieces {
            w.plain(&self.written[done..at]);
            done = at;
            let json = piece.json.as_bytes();
            // The piece's first `k` bytes complete the group before it.
            let k = ((3 - w.carried) % 3).min(json.len());
            w.plain(&json[..k]);
            let whole = (json.len() - k) / 3 * 3;
            if whole > 0 {
                w.out.extend_from_slice(&piece.base64(k));
            }
            w.plain(&json[k + whole..]);
        }
        w.plain(&self.written[done..]);
        w.finish();
    }
}

/// A JSONPatch written into one buffer, one `add` operation at a time.
pub(super) struct PatchWriter<'p> {
    pub(super) out: Vec<u8>,
    pub(super) pieces: Vec<(usize, &'p Piece)>,
}

impl<'p> PatchWriter<'p> {
    #[inline]
    pub(super) fn text(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }

    pub(super) fn piece(&mut self, piece: &'p Piece) {
        if piece.json.len() >= Piece::BASE64_KEPT {
            self.pieces.push((self.out.len(), piece));
        } else {
            self.text(piece.json.as_bytes());
        }
    }

    /// An `add` operation at `path`, then `key` when given. The path's tokens are field
    /// names, indexes and `-`, written as they are; the key (a label or annotation name) is
    /// escaped, as RFC 6901 and then JSON say.
    pub(super) fn op(&mut self, path: &[&str], key: Option<&str>, value: impl FnOnce(&mut Self)) {
        self.text(if self.out.is_empty() {
            br#"[{"op":"add","path":""#
        } else {
            br#",{"op":"add","path":""#
        });
        for token in path {
            debug_assert!(
                token
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-'),
                "{token:?} needs escaping"
            );
            self.text(b"/");
            self.text(token.as_bytes());
        }
        if let Some(key) = key {
            self.text(b"/");
            // `~` is written `~0` and `/` is written `~1`; then JSON string escaping, of the
            // parts between them (`~0` and `~1` need none). A key with nothing to escape for
            // JSON (every key a Kubernetes name allows) is written in one pass.
            if json::is_plain(key) {
                self.out.reserve(key.len() + 4);
                for b in key.bytes() {
                    match b {
                        b'~' => self.out.extend_from_slice(b"~0"),
                        b'/' => self.out.extend_from_slice(b"~1"),
                        _ => self.out.push(b),
                    }
                }
            } else {
                self.escaped_key(key);
            }
        }
        self.text(br#"","value":"#);
        value(self);
        self.text(b"}");
    }

    /// A key as a pointer token, part by part (see [`Self::op`]).
    fn escaped_key(&mut self, key: &str) {
        for (i, run) in key.split('/').enumerate() {
            if i > 0 {
                self.text(b"~1");
            }
            for (j, part) in run.split('~').enumerate() {
                if j > 0 {
                    self.text(b"~0");
                }
                json::write_str_body(&mut self.out, part);
            }
        }
    }

    /// Init containers placed before the pod's own, one op each, or the list created with
    /// them when the pod has none (`has_init`).
    fn prepend_init_containers(
        &mut self,
        has_init: bool,
        pieces: impl ExactSizeIterator<Item = &'p Piece>,
    ) {
        if has_init {
            for (i, piece) in pieces.enumerate() {
                let mut buf = [0; 20];
                let i = index_token(i, &mut buf);
                self.op(&["spec", "initContainers", i], None, |w| w.piece(piece));
            }
        } else {
            self.op(&["spec", "initContainers"], None, |w| {
                w.text(b"[");
                for (i, piece) in pieces.enumerate() {
                    if i > 0 {
                        w.text(b",");
                    }
                    w.piece(piece);
                }
                w.text(b"]");
            });
        }
    }

    fn json_str(&mut self, s: &str) {
        json::write_str(&mut self.out, s);
    }

    pub(super) fn finish(mut self) -> Patch<'p> {
        if self.out.is_empty() {
            self.text(b"[");
        }
        self.text(b"]");
        Patch {
            written: self.out,
            pieces: self.pieces,
        }
    }
}

/// Writes edits as a JSONPatch (its JSON bytes) against the pod they were planned for. Paths
/// are written token by token, so `~` and `/` in keys are escaped by construction; a missing
/// array or map is created whole instead of appended to. Values are the fragment's JSON,
/// encoded when it was rendered.
pub fn to_patch<'p>(pod: &PodView<'_>, edits: &[Edit<'p>]) -> Patch<'p> {
    write_patch(pod, edits)
}

/// [`to_patch`]'s bytes in base64, as an AdmissionReview response carries them (SIMD: SSSE3
/// or AVX2 where the CPU has them; long pieces copied from their kept base64).
pub fn to_patch_base64(pod: &PodView<'_>, edits: &[Edit<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    write_patch(pod, edits).base64_into(&mut out);
    out
}

/// `i` in decimal, written into `buf`: a patch path's array index without an allocation.
pub(super) fn index_token(mut i: usize, buf: &mut [u8; 20]) -> &str {
    const DIGITS: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    if let Some(digit) = DIGITS.get(i) {
        return digit;
    }
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (i % 10) as u8;
        i /= 10;
        if i == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    std::str::from_utf8(&buf[at..]).unwrap_or("0")
}

fn write_patch<'p>(pod: &PodView<'_>, edits: &[Edit<'p>]) -> Patch<'p> {
    // The bench's typical patch is 4.7 KB: 3.5 KB of it long pieces, which are not copied in,
    // and 1.2 KB written.
    let mut w = PatchWriter {
        out: Vec::with_capacity(2048),
        pieces: Vec::with_capacity(4),
    };
    let spec = pod.spec.as_ref();
    let has_init = spec.is_some_and(|s| s.init_containers.is_some());
    let has_volumes = spec.is_some_and(|s| s.volumes.is_some());
    let has_secrets = spec.is_some_and(|s| s.image_pull_secrets.is_some());
    // A mount or env var of the pod's own init container `i` lands after the init containers
    // this patch places before them.
    let prepended: usize = edits
        .iter()
        .map(|e| match e {
            Edit::PrependInitContainers(cs) => cs.len(),
            _ => 0,
        })
        .sum();
    let slot = |i: usize, init: bool, has: fn(&ContainerView<'_>) -> bool| match init {
        false => (pod.containers().get(i).is_some_and(has), ("containers", i)),
        true => (
            pod.init_containers().get(i).is_some_and(has),
            ("initContainers", i + prepended),
        ),
    };
    let meta = pod.metadata.as_ref();
    let has_labels = meta.is_some_and(|m| m.labels.is_some());
    let has_annotations = meta.is_some_and(|m| m.annotations.is_some());
    // Arrays created by an earlier edit of this patch: appended to from then on.
    let mut created: Vec<(&str, Option<(&str, usize)>)> = Vec::new();
    let mut append = |w: &mut PatchWriter<'p>,
                      exists: bool,
                      field: &'static str,
                      container: Option<(&'static str, usize)>,
                      piece: &'p Piece| {
        let mut buf = [0; 20];
        let digits = container.map(|(list, i)| (list, index_token(i, &mut buf)));
        let mut path = ["spec", "containers", "", field, "-"];
        let path: &mut [&str] = match &digits {
            Some((list, d)) => {
                path[1] = list;
                path[2] = d;
                &mut path[..]
            }
            None => {
                path[1] = field;
                &mut path[..3]
            }
        };
        let last = path.len() - 1;
        if exists || created.contains(&(field, container)) {
            path[last] = "-";
            w.op(path, None, |w| w.piece(piece));
        } else {
            created.push((field, container));
            w.op(&path[..last], None, |w| {
                w.text(b"[");
                w.piece(piece);
                w.text(b"]");
            });
        }
    };
    let mut map_created = (false, false);

    for edit in edits {
        match edit {
            Edit::PrependInitContainers(cs) => {
                w.prepend_init_containers(has_init, cs.iter().map(|c| c.piece))
            }
            Edit::AppendContainer(c) => append(&mut w, true, "containers", None, c.piece),
            Edit::AddVolume(v) => append(&mut w, has_volumes, "volumes", None, v.piece),
            Edit::AddImagePullSecret(s) => {
                append(&mut w, has_secrets, "imagePullSecrets", None, s.piece)
            }
            Edit::AddVolumeMount {
                container: i,
                init,
                mount,
            } => {
                let (exists, at) = slot(*i, *init, |c| c.volume_mounts.is_some());
                append(&mut w, exists, "volumeMounts", Some(at), mount.piece);
            }
            Edit::AddEnv {
                container: i,
                init,
                env,
            } => {
                let (exists, at) = slot(*i, *init, |c| c.env.is_some());
                append(&mut w, exists, "env", Some(at), env.piece);
            }
            Edit::SetLabel { key, value } => {
                set_entry(
                    &mut w,
                    (has_labels, &mut map_created.0),
                    "labels",
                    key,
                    (value, None),
                );
            }
            Edit::SetAnnotation { key, value, json } => {
                set_entry(
                    &mut w,
                    (has_annotations, &mut map_created.1),
                    "annotations",
                    key,
                    (value, *json),
                );
            }
            // Only amounts the budget sets are grown: the lists exist.
            Edit::SetPodResource {
                list,
                resource,
                value,
            } => w.op(&["spec", "resources", list], Some(resource), |w| {
                w.json_str(value)
            }),
        }
    }
    w.finish()
}

/// A label or an annotation: the map is created with it unless the pod has it or an earlier
/// edit created it (`(exists, created)`). The value comes with its JSON when that was written
/// once for many patches.
fn set_entry(
    w: &mut PatchWriter<'_>,
    (exists, created): (bool, &mut bool),
    map: &str,
    key: &str,
    (value, json): (&str, Option<&str>),
) {
    let value = |w: &mut PatchWriter<'_>| match json {
        Some(json) => w.text(json.as_bytes()),
        None => w.json_str(value),
    };
    if !exists && !*created {
        *created = true;
        w.op(&["metadata", map], None, |w| {
            w.text(b"{");
            w.json_str(key);
            w.text(b":");
            value(w);
            w.text(b"}");
        });
    } else {
        // `add` on an existing member replaces it, which is what the status annotation needs.
        w.op(&["metadata", map], Some(key), value);
    }
}
