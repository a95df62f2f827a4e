//! A strict JSON reader over a borrowed text, for the view ([`super::view`]): it reads the
//! members the engine needs and steps over everything else, checking it, without building it.
//!
//! Why not serde_json here: stepping over the bench's 5.5 KB review costs serde_json about
//! 70,000 instructions (jiter about 74,000, simd-json about 60,000 with AVX2), most of a
//! review's instruction budget (docs/benchmarks-history.md, "What the goals needed"). This reader
//! steps over it for about 65,000; what it saves is in reading: nothing it skips is built, a
//! member's JSON is kept while its fields are read, so no value is read twice. A string is tested
//! sixteen bytes at a time (SSE2, part of x86_64, through `safe_arch`), eight at a time elsewhere,
//! and a string read or stepped over is inlined where it is read: most names and values are one
//! test.
//!
//! It accepts a subset of what serde_json accepts, never more (`tests/json_reader.rs` holds it
//! to that on generated and hostile texts): where it refuses, the review takes the typed road,
//! so being stricter costs time, never an answer. It is stricter in two places: a `\u` escape
//! must not leave a lone surrogate even in a string that is skipped, and nesting stops at
//! [`DEPTH`] levels everywhere, where serde_json stops typed values (it steps over ignored
//! values of any depth).

use std::borrow::Cow;

/// Nesting limit: serde_json reads 127 levels into typed values and refuses 128.
pub const DEPTH: u32 = 127;

/// What went wrong, and where (a byte offset into the text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonError {
    pub what: &'static str,
    pub at: usize,
}

impl std::fmt::Display for JsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at byte {}", self.what, self.at)
    }
}

impl std::error::Error for JsonError {}

pub type Result<T> = std::result::Result<T, JsonError>;

/// A JSON value as it is written in the text (checked), for reading it later the typed way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Raw<'a>(&'a str);

impl<'a> Raw<'a> {
    pub fn get(&self) -> &'a str {
        self.0
    }
}

pub struct Reader<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
    depth: u32,
}

/// Bytes that end the plain run of a string: the quote, the backslash, control characters.
static STOP: [bool; 256] = {
    let mut table = [false; 256];
    let mut i = 0;
    while i < 0x20 {
        table[i] = true;
        i += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};

impl<'a> Reader<'a> {
    pub fn new(text: &'a str) -> Self {
        Self {
            text,
            bytes: text.as_bytes(),
            pos: 0,
            depth: 0,
        }
    }

    fn error<T>(&self, what: &'static str) -> Result<T> {
        Err(JsonError { what, at: self.pos })
    }

    #[inline(always)]
    fn ws(&mut self) {
        self.pos = ws_end(self.bytes, self.pos);
    }

    /// The end of the text: only whitespace may follow the value.
    pub fn end(&mut self) -> Result<()> {
        self.ws();
        if self.pos != self.bytes.len() {
            return self.error("trailing characters");
        }
        Ok(())
    }

    #[inline(always)]
    fn eat(&mut self, byte: u8) -> bool {
        if self.bytes.get(self.pos) == Some(&byte) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// [`Self::eat`] after any whitespace: the byte is tested first, since compact JSON (what
    /// the API server sends) has none.
    #[inline(always)]
    fn eat_ws(&mut self, byte: u8) -> bool {
        if self.eat(byte) {
            return true;
        }
        self.ws();
        self.eat(byte)
    }

    fn expect(&mut self, byte: u8, what: &'static str) -> Result<()> {
        if self.eat_ws(byte) {
            Ok(())
        } else {
            self.error(what)
        }
    }

    fn enter(&mut self) -> Result<()> {
        self.depth += 1;
        if self.depth > DEPTH {
            return self.error("nested too deep");
        }
        Ok(())
    }

    fn literal(&mut self, word: &'static [u8]) -> Result<()> {
        if self.bytes[self.pos..].starts_with(word) {
            self.pos += word.len();
            Ok(())
        } else {
            self.error("expected a value")
        }
    }

    /// `null`, consumed; false (nothing consumed) for any other value.
    pub fn null(&mut self) -> Result<bool> {
        // The byte first: compact JSON has no whitespace before a value.
        match self.bytes.get(self.pos) {
            Some(b'n') => {}
            Some(b' ' | b'\n' | b'\r' | b'\t') => self.ws(),
            _ => return Ok(false),
        }
        if self.bytes.get(self.pos) == Some(&b'n') {
            self.literal(b"null")?;
            return Ok(true);
        }
        Ok(false)
    }

    pub fn bool(&mut self) -> Result<bool> {
        self.ws();
        match self.bytes.get(self.pos) {
            Some(b't') => self.literal(b"true").map(|()| true),
            Some(b'f') => self.literal(b"false").map(|()| false),
            _ => self.error("expected a boolean"),
        }
    }

    /// A string, borrowed from the text unless it has escapes.
    #[inline(always)]
    pub fn string(&mut self) -> Result<Cow<'a, str>> {
        let bytes = self.bytes;
        let mut p = self.pos;
        if bytes.get(p) != Some(&b'"') {
            p = ws_end(bytes, p);
            self.pos = p;
            if bytes.get(p) != Some(&b'"') {
                return self.error("expected a string");
            }
        }
        let start = p + 1;
        let end = plain_run(bytes, start);
        self.pos = end;
        // The common case, a string without escapes, returns here; the rest is out of line.
        if bytes.get(end) == Some(&b'"') {
            self.pos = end + 1;
            return Ok(Cow::Borrowed(&self.text[start..end]));
        }
        self.string_rest(start)
    }

    /// [`Self::string`] at a byte that is not the closing quote.
    #[inline(never)]
    fn string_rest(&mut self, start: usize) -> Result<Cow<'a, str>> {
        match self.bytes.get(self.pos) {
            Some(b'\\') => {
                let mut owned = String::with_capacity(self.pos - start + 16);
                owned.push_str(&self.text[start..self.pos]);
                self.escaped(Some(&mut owned))?;
                Ok(Cow::Owned(owned))
            }
            Some(_) => self.error("control character in a string"),
            None => self.error("unterminated string"),
        }
    }

    /// Steps over the plain run of a string.
    #[inline(always)]
    fn plain(&mut self) {
        self.pos = plain_run(self.bytes, self.pos);
    }

    /// The rest of a string from its first backslash, decoded into `out` when given.
    fn escaped(&mut self, mut out: Option<&mut String>) -> Result<()> {
        loop {
            match self.bytes.get(self.pos) {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(());
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let ch = match self.bytes.get(self.pos) {
                        Some(b'"') => '"',
                        Some(b'\\') => '\\',
                        Some(b'/') => '/',
                        Some(b'b') => '\u{8}',
                        Some(b'f') => '\u{c}',
                        Some(b'n') => '\n',
                        Some(b'r') => '\r',
                        Some(b't') => '\t',
                        Some(b'u') => {
                            self.pos += 1;
                            let ch = self.unicode()?;
                            if let Some(out) = out.as_deref_mut() {
                                out.push(ch);
                            }
                            continue;
                        }
                        _ => return self.error("invalid escape"),
                    };
                    self.pos += 1;
                    if let Some(out) = out.as_deref_mut() {
                        out.push(ch);
                    }
                }
                Some(_) => {
                    let start = self.pos;
                    self.plain();
                    if self.pos == start {
                        return self.error("control character in a string");
                    }
                    if let Some(out) = out.as_deref_mut() {
                        out.push_str(&self.text[start..self.pos]);
                    }
                }
                None => return self.error("unterminated string"),
            }
        }
    }

    fn hex4(&mut self) -> Result<u32> {
        let Some(digits) = self.bytes.get(self.pos..self.pos + 4) else {
            return self.error("unterminated escape");
        };
        let mut n = 0;
        for &d in digits {
            let v = match d {
                b'0'..=b'9' => d - b'0',
                b'a'..=b'f' => d - b'a' + 10,
                b'A'..=b'F' => d - b'A' + 10,
                _ => return self.error("invalid escape"),
            };
            n = n * 16 + u32::from(v);
        }
        self.pos += 4;
        Ok(n)
    }

    /// A `\u` escape after the `u`: one character, a surrogate pair taken whole.
    fn unicode(&mut self) -> Result<char> {
        let first = self.hex4()?;
        let code = match first {
            0xD800..=0xDBFF => {
                if !self.bytes[self.pos..].starts_with(b"\\u") {
                    return self.error("lone surrogate");
                }
                self.pos += 2;
                let second = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&second) {
                    return self.error("lone surrogate");
                }
                0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
            }
            0xDC00..=0xDFFF => return self.error("lone surrogate"),
            code => code,
        };
        match char::from_u32(code) {
            Some(ch) => Ok(ch),
            None => self.error("invalid escape"),
        }
    }

    /// Steps over one value of any kind, checking it. Iterative: a deep value cannot exhaust
    /// the stack, and nesting past [`DEPTH`] is refused. The position lives in a local here
    /// (this loop is most of a review's reading), and goes back to `self` on the way out.
    #[inline(always)]
    pub fn skip(&mut self) -> Result<()> {
        // A string without escapes, most of what is stepped over, without the container
        // machinery; any other value (or string) goes the whole way (whitespace before a value
        // too: compact JSON, what the API server sends, has none).
        if self.bytes.get(self.pos) == Some(&b'"') {
            let end = plain_run(self.bytes, self.pos + 1);
            if self.bytes.get(end) == Some(&b'"') {
                self.pos = end + 1;
                return Ok(());
            }
        }
        self.skip_any()
    }

    /// [`Self::skip`] for any value.
    ///
    /// Compact JSON (what the API server sends) has no whitespace between tokens, so each step
    /// tests for the byte it expects first and looks for whitespace only when that test fails.
    /// Whether the innermost container is an object is kept in a flag; the bit stack of outer
    /// containers is read only when one closes.
    ///
    /// One function of some 120 lines on purpose: it is the loop most of a review's
    /// instructions run in, and its states are jumps within it, not calls.
    #[inline(never)]
    fn skip_any(&mut self) -> Result<()> {
        let bytes = self.bytes;
        let mut p = self.pos;
        // Bit i: the container open at relative level i is an object.
        let mut objects: u128 = 0;
        let mut level: u32 = 0;
        // Nesting is counted in `level` alone: the reader's depth is `self.depth + level` here,
        // and `self.depth` again once the value is over.
        let room = DEPTH - self.depth;
        let mut object = false;
        macro_rules! fail {
            ($what:expr) => {{
                self.pos = p;
                return Err(JsonError { what: $what, at: p });
            }};
        }
        // The byte at `p`, after any whitespace.
        macro_rules! next {
            () => {
                match bytes.get(p) {
                    Some(b' ' | b'\n' | b'\r' | b'\t') => {
                        p = ws_end(bytes, p);
                        bytes.get(p)
                    }
                    other => other,
                }
            };
        }
        macro_rules! string {
            () => {{
                // At the opening quote.
                p = plain_run(bytes, p + 1);
                match bytes.get(p) {
                    Some(b'"') => p += 1,
                    Some(b'\\') => {
                        self.pos = p;
                        self.escaped(None)?;
                        p = self.pos;
                    }
                    Some(_) => fail!("control character in a string"),
                    None => fail!("unterminated string"),
                }
            }};
        }
        macro_rules! key_colon {
            () => {{
                if bytes.get(p) != Some(&b'"') && next!() != Some(&b'"') {
                    fail!("expected a key");
                }
                string!();
                if bytes.get(p) != Some(&b':') && next!() != Some(&b':') {
                    fail!("expected `:`");
                }
                p += 1;
            }};
        }
        'value: loop {
            match bytes.get(p) {
                Some(&open @ (b'{' | b'[')) => {
                    p += 1;
                    if level == room {
                        fail!("nested too deep");
                    }
                    object = open == b'{';
                    objects = (objects << 1) | u128::from(object);
                    level += 1;
                    let close = if object { b'}' } else { b']' };
                    if bytes.get(p) != Some(&close) && next!() != Some(&close) {
                        if object {
                            key_colon!();
                        }
                        continue 'value;
                    }
                    // Empty: closed at once, below.
                }
                Some(b'"') => string!(),
                Some(b'-' | b'0'..=b'9') => match number_end(bytes, p) {
                    Ok(end) => p = end,
                    Err(at) => {
                        p = at;
                        fail!("invalid number");
                    }
                },
                Some(b't') if bytes[p..].starts_with(b"true") => p += 4,
                Some(b'f') if bytes[p..].starts_with(b"false") => p += 5,
                Some(b'n') if bytes[p..].starts_with(b"null") => p += 4,
                Some(b' ' | b'\n' | b'\r' | b'\t') => {
                    p = ws_end(bytes, p);
                    continue 'value;
                }
                Some(_) => fail!("expected a value"),
                None => fail!("unexpected end"),
            }
            // After a value (or at the end of an empty container): the next member or element,
            // or the end of containers.
            loop {
                if level == 0 {
                    self.pos = p;
                    return Ok(());
                }
                match bytes.get(p) {
                    Some(b',') => {
                        p += 1;
                        if object {
                            key_colon!();
                        }
                        continue 'value;
                    }
                    Some(b'}') if object => {}
                    Some(b']') if !object => {}
                    Some(b' ' | b'\n' | b'\r' | b'\t') => {
                        p = ws_end(bytes, p);
                        continue;
                    }
                    Some(_) => fail!("expected `,` or the end of a container"),
                    None => fail!("unexpected end"),
                }
                p += 1;
                level -= 1;
                objects >>= 1;
                object = objects & 1 != 0;
            }
        }
    }

    /// An object read by `read` from its exact compact text, as the API server writes it (its
    /// members in the order its type declares them, no whitespace): `read` eats what it
    /// expects ([`Self::eat_text`], [`Self::plain_rest`]) and gives `None` as soon as the text
    /// differs, and the reader then goes back to where it was, for the caller to read the
    /// object the general way. Inside, the reader counts the object's level, as the general
    /// way does, so a value stepped over in it has the nesting room it would have there; and
    /// an object the general way would refuse as nested too deep is not read here.
    #[inline(always)]
    pub fn compact<T>(&mut self, read: impl FnOnce(&mut Self) -> Option<T>) -> Option<T> {
        if self.depth >= DEPTH {
            return None;
        }
        let pos = self.pos;
        self.depth += 1;
        let value = read(self);
        self.depth -= 1;
        if value.is_none() {
            self.pos = pos;
        }
        value
    }

    /// `text`, eaten when the text goes on with exactly it.
    #[inline(always)]
    pub fn eat_text(&mut self, text: &[u8]) -> Option<()> {
        if self.bytes.get(self.pos..)?.starts_with(text) {
            self.pos += text.len();
            Some(())
        } else {
            None
        }
    }

    /// After a string's opening quote: the string, borrowed, when it has no escape or control
    /// character (its closing quote eaten); `None` (nothing eaten) otherwise.
    #[inline(always)]
    pub fn plain_rest(&mut self) -> Option<&'a str> {
        let end = plain_run(self.bytes, self.pos);
        if self.bytes.get(end) != Some(&b'"') {
            return None;
        }
        let s = self.text.get(self.pos..end)?;
        self.pos = end + 1;
        Some(s)
    }

    /// What `read` reads; if it fails, the reader goes back to where it was (for the caller
    /// to read the value another way) and this is `None`.
    pub fn attempt<T>(&mut self, read: impl FnOnce(&mut Self) -> Result<T>) -> Option<T> {
        let (pos, depth) = (self.pos, self.depth);
        match read(self) {
            Ok(value) => Some(value),
            Err(_) => {
                (self.pos, self.depth) = (pos, depth);
                None
            }
        }
    }

    /// What `read` reads, and the JSON text it read.
    pub fn spanned<T>(
        &mut self,
        read: impl FnOnce(&mut Self) -> Result<T>,
    ) -> Result<(T, Raw<'a>)> {
        self.ws();
        let start = self.pos;
        let value = read(self)?;
        Ok((value, Raw(&self.text[start..self.pos])))
    }

    /// One value as it is written, checked.
    pub fn raw(&mut self) -> Result<Raw<'a>> {
        self.ws();
        let start = self.pos;
        self.skip()?;
        Ok(Raw(&self.text[start..self.pos]))
    }

    /// An object: `member` is called with each key, and must read or skip its value.
    #[inline]
    pub fn object(
        &mut self,
        member: impl FnMut(&mut Self, Cow<'a, str>) -> Result<()>,
    ) -> Result<()> {
        self.items(true, member)
    }

    /// An array: `element` is called for each element, and must read or skip it.
    #[inline]
    pub fn array(&mut self, mut element: impl FnMut(&mut Self) -> Result<()>) -> Result<()> {
        self.items(false, |r, _| element(r))
    }

    /// The items of an object (each called with its key) or an array (with an empty key),
    /// separated by commas. The loop is compiled into each reader, with the reader's items
    /// inlined in it: one loop for all readers, calling each item through a pointer (as until
    /// 26 November), cost a typical review's view about 4,600 instructions more
    /// (docs/benchmarks-history.md, "What the goals needed").
    #[inline(always)]
    fn items(
        &mut self,
        object: bool,
        mut item: impl FnMut(&mut Self, Cow<'a, str>) -> Result<()>,
    ) -> Result<()> {
        let (open, close, expected) = if object {
            (b'{', b'}', "expected an object")
        } else {
            (b'[', b']', "expected an array")
        };
        if !self.eat_ws(open) {
            return self.error(expected);
        }
        self.enter()?;
        if !self.eat_ws(close) {
            loop {
                let key = if object {
                    let key = self.string()?;
                    self.expect(b':', "expected `:`")?;
                    key
                } else {
                    Cow::Borrowed("")
                };
                item(self, key)?;
                if self.eat_ws(b',') {
                    continue;
                }
                if self.eat(close) {
                    break;
                }
                return self.error("expected `,` or the end of a container");
            }
        }
        self.depth -= 1;
        Ok(())
    }

    /// A required-type failure at the current value.
    pub fn wrong(&self, what: &'static str) -> JsonError {
        JsonError { what, at: self.pos }
    }
}

/// Whether `s` is written in a JSON string as it is: no quote, backslash or control
/// character (the bytes serde_json escapes).
#[inline]
pub fn is_plain(s: &str) -> bool {
    plain_run(s.as_bytes(), 0) == s.len()
}

/// Writes `s` as a JSON string, escaped as serde_json escapes it: a string with nothing to
/// escape (one SIMD test for most) is copied between its quotes.
#[inline]
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    if is_plain(s) {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        // Writing into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, s);
    }
}

/// The bytes of `s` as they are written inside a JSON string (without the quotes).
pub fn write_str_body(out: &mut Vec<u8>, s: &str) {
    if is_plain(s) {
        out.extend_from_slice(s.as_bytes());
    } else {
        let at = out.len();
        write_str(out, s);
        out.remove(at);
        out.pop();
    }
}

/// The end of the whitespace that starts at `i`. Indentation comes in runs of spaces, taken
/// eight at a time.
#[inline(always)]
pub(crate) fn ws_end(bytes: &[u8], mut i: usize) -> usize {
    loop {
        match bytes.get(i) {
            Some(b' ' | b'\n' | b'\r' | b'\t') => i += 1,
            _ => return i,
        }
        while let Some(word) = bytes.get(i..i + 8) {
            if word != b"        " {
                break;
            }
            i += 8;
        }
    }
}

/// The end of the plain run of a string that starts at `i`, eight bytes at a time: a word
/// holds a stop byte when one of its bytes equals `"` or `\\` or is below 0x20. Each test can
/// also flag a byte after a true one (a borrow), never before, so the lowest flag is the first
/// stop.
///
/// On x86_64 sixteen bytes are tested at a time with SSE2 (part of the architecture), the
/// eight-byte test taking the last few.
#[inline(always)]
pub(crate) fn plain_run(bytes: &[u8], i: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    let i = match plain_run_sse2(bytes, i) {
        Ok(stop) => return stop,
        Err(rest) => rest,
    };
    plain_run_swar(bytes, i)
}

/// Sixteen bytes at a time: the first stop byte, or (`Err`) where fewer than 16 bytes are left.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn plain_run_sse2(bytes: &[u8], mut i: usize) -> std::result::Result<usize, usize> {
    use safe_arch::{
        cmp_eq_mask_i8_m128i, load_unaligned_m128i, min_u8_m128i, move_mask_i8_m128i,
        set_splat_i8_m128i,
    };
    let quote = set_splat_i8_m128i(b'"' as i8);
    let backslash = set_splat_i8_m128i(b'\\' as i8);
    let control = set_splat_i8_m128i(0x1f);
    while let Some(chunk) = bytes.get(i..i + 16) {
        let mut sixteen = [0; 16];
        sixteen.copy_from_slice(chunk);
        let v = load_unaligned_m128i(&sixteen);
        // A byte is below 0x20 when its unsigned minimum with 0x1f is itself.
        let stop = cmp_eq_mask_i8_m128i(v, quote)
            | cmp_eq_mask_i8_m128i(v, backslash)
            | cmp_eq_mask_i8_m128i(min_u8_m128i(v, control), v);
        let mask = move_mask_i8_m128i(stop);
        if mask != 0 {
            return Ok(i + mask.trailing_zeros() as usize);
        }
        i += 16;
    }
    Err(i)
}

// Only the last few bytes of a body, on x86_64: kept out of line, so that the SSE2 loop
// inlined into the string readers needs few registers.
#[cfg_attr(target_arch = "x86_64", inline(never), cold)]
#[cfg_attr(not(target_arch = "x86_64"), inline(always))]
fn plain_run_swar(bytes: &[u8], mut i: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    while let Some(word) = bytes.get(i..i + 8) {
        let mut eight = [0; 8];
        eight.copy_from_slice(word);
        let w = u64::from_le_bytes(eight);
        let quote = w ^ (ONES * u64::from(b'"'));
        let backslash = w ^ (ONES * u64::from(b'\\'));
        let flags = (quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash)
            | (w.wrapping_sub(ONES * 0x20) & !w);
        let flags = flags & HIGH;
        if flags != 0 {
            return i + (flags.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < bytes.len() && !STOP[bytes[i] as usize] {
        i += 1;
    }
    i
}

/// The end of the number that starts at `p`, or where its grammar breaks.
fn number_end(bytes: &[u8], mut p: usize) -> std::result::Result<usize, usize> {
    let digits = |mut p: usize| {
        while let Some(b'0'..=b'9') = bytes.get(p) {
            p += 1;
        }
        p
    };
    if bytes.get(p) == Some(&b'-') {
        p += 1;
    }
    match bytes.get(p) {
        Some(b'0') => p += 1,
        Some(b'1'..=b'9') => p = digits(p + 1),
        _ => return Err(p),
    }
    if bytes.get(p) == Some(&b'.') {
        let end = digits(p + 1);
        if end == p + 1 {
            return Err(end);
        }
        p = end;
    }
    if let Some(b'e' | b'E') = bytes.get(p) {
        p += 1;
        if let Some(b'+' | b'-') = bytes.get(p) {
            p += 1;
        }
        let end = digits(p);
        if end == p {
            return Err(end);
        }
        p = end;
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain run, however the SSE2 and eight-byte tests share the text, ends where a byte
    /// at a time says: every stop byte, at every offset, in texts of every length up to 48.
    #[test]
    fn plain_run_stops_where_a_byte_at_a_time_stops() {
        let reference = |bytes: &[u8], i: usize| {
            (i..bytes.len())
                .find(|&k| STOP[bytes[k] as usize])
                .unwrap_or(bytes.len())
        };
        for len in 0..48 {
            for fill in [b'a', b' ', 0x7f, 0x80, 0xc3, 0xff] {
                let plain = vec![fill; len];
                for start in 0..=len.min(3) {
                    assert_eq!(plain_run(&plain, start), reference(&plain, start));
                }
                for at in 0..len {
                    for stop in [b'"', b'\\', 0x00, 0x0a, 0x1f] {
                        let mut text = plain.clone();
                        text[at] = stop;
                        for start in 0..=at.min(3) {
                            assert_eq!(
                                plain_run(&text, start),
                                reference(&text, start),
                                "len {len}, fill {fill:#x}, stop {stop:#x} at {at}, from {start}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// `write_str` is serde_json's escaping, whichever way it takes: every byte below 0x80 at
    /// every place in texts long enough for the SIMD test, and non-ASCII text.
    #[test]
    fn strings_are_written_as_serde_json_writes_them() {
        let mut texts: Vec<String> = vec![String::new(), "é ü 🦀".into(), "\u{7f}\u{80}".into()];
        for len in [1, 15, 16, 17, 40] {
            for at in 0..len {
                for b in 0u8..0x80 {
                    let mut text = "a".repeat(len);
                    text.replace_range(at..=at, &char::from(b).to_string());
                    texts.push(text);
                }
            }
        }
        for text in texts {
            let expected = serde_json::to_string(&text).expect("serializes");
            let mut out = b"x".to_vec();
            write_str(&mut out, &text);
            assert_eq!(out[1..], *expected.as_bytes(), "{text:?}");
            let mut body = b"x".to_vec();
            write_str_body(&mut body, &text);
            assert_eq!(
                body[1..],
                expected.as_bytes()[1..expected.len() - 1],
                "{text:?}"
            );
        }
    }

    #[test]
    fn whitespace_runs_end_at_the_first_other_byte() {
        for len in 0..40 {
            for tail in [&b""[..], b"x", b"\t ", b"\n{"] {
                let mut text = vec![b' '; len];
                text[len / 2..]
                    .iter_mut()
                    .step_by(3)
                    .for_each(|b| *b = b'\n');
                text.extend_from_slice(tail);
                let end = text
                    .iter()
                    .position(|b| !b" \n\r\t".contains(b))
                    .unwrap_or(text.len());
                assert_eq!(
                    ws_end(&text, 0),
                    end,
                    "{:?}",
                    String::from_utf8_lossy(&text)
                );
            }
        }
    }

    /// A compact read is tried only where the general reader could enter the object, counts
    /// the object's level while it reads (what it steps over has the room it would have in the
    /// general reader), and leaves the reader where it was when it gives up.
    #[test]
    fn a_compact_read_keeps_the_nesting_limit_and_gives_up_cleanly() {
        let text = r#"{"a":[[1]]}"#;
        let mut r = Reader::new(text);
        r.depth = DEPTH;
        assert_eq!(r.compact(|r| r.eat_text(b"{")), None);
        assert_eq!((r.pos, r.depth), (0, DEPTH));
        // Two levels below the limit: the object and the outer array take the last two levels,
        // so the inner array is nested too deep, as the general reader says.
        r.depth = DEPTH - 2;
        let inside = r.compact(|r| {
            r.eat_text(br#"{"a":"#)?;
            r.skip().ok()
        });
        assert_eq!(inside, None);
        assert_eq!((r.pos, r.depth), (0, DEPTH - 2));
        let general = r.object(|r, _| r.skip());
        assert_eq!(general.map_err(|e| e.what), Err("nested too deep"));
        // Three levels below, both read it.
        let mut r = Reader::new(text);
        r.depth = DEPTH - 3;
        let inside = r.compact(|r| {
            r.eat_text(br#"{"a":"#)?;
            r.skip().ok()?;
            r.eat_text(b"}")
        });
        assert_eq!(inside, Some(()));
        assert_eq!((r.pos, r.depth), (text.len(), DEPTH - 3));
    }

    #[test]
    fn a_plain_rest_is_a_string_without_escapes() {
        let mut r = Reader::new(r#"abc","#);
        assert_eq!(r.plain_rest(), Some("abc"));
        assert_eq!(r.pos, 4);
        for text in [r#"a\"b""#, "a\nb\"", "abc"] {
            let mut r = Reader::new(text);
            assert_eq!(r.plain_rest(), None, "{text:?}");
            assert_eq!(r.pos, 0);
        }
    }

    fn skips(text: &str) -> bool {
        let mut r = Reader::new(text);
        r.skip().and_then(|()| r.end()).is_ok()
    }

    #[test]
    fn steps_over_what_json_allows() {
        for ok in [
            "0",
            "-0.5e+10",
            "1E5",
            "true",
            "null",
            r#""a\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00""#,
            "[]",
            "{}",
            r#"{"a":[1,{"b":null}],"c":{}}"#,
            " [ 1 , 2 ] ",
        ] {
            assert!(skips(ok), "{ok}");
        }
    }

    #[test]
    fn refuses_what_json_does_not_allow() {
        for bad in [
            "",
            "01",
            "1.",
            ".5",
            "-",
            "1e",
            "tru",
            "[1,]",
            "{,}",
            r#"{"a"}"#,
            r#"{"a":1,}"#,
            r#"{"a" 1}"#,
            "[1 2]",
            r#""\x""#,
            r#""\u12""#,
            "\"a\u{1}\"",
            r#""\ud800""#,
            r#""\udc00""#,
            r#""\ud800\u0041""#,
            "\"open",
            "[1] 2",
            "{\"a\":1]",
            "[1}",
        ] {
            assert!(!skips(bad), "{bad:?}");
        }
    }

    #[test]
    fn nesting_stops_at_the_limit() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(skips(&deep(DEPTH as usize)));
        assert!(!skips(&deep(DEPTH as usize + 1)));
        assert!(!skips(&deep(100_000)));
    }

    #[test]
    fn strings_are_borrowed_unless_escaped() {
        let mut r = Reader::new(r#"["plain","t\u00e9\nx"]"#);
        let mut got = Vec::new();
        r.array(|r| {
            got.push(r.string()?);
            Ok(())
        })
        .expect("reads");
        assert!(matches!(got[0], Cow::Borrowed("plain")));
        assert_eq!(got[1], "té\nx");
    }

    #[test]
    fn raw_is_the_value_as_written() {
        let mut r = Reader::new(r#"{"a": {"b" : [1, 2]} , "c":3}"#);
        let mut raws = Vec::new();
        r.object(|r, key| {
            raws.push((key, r.raw()?.get()));
            Ok(())
        })
        .expect("reads");
        assert_eq!(raws[0].1, r#"{"b" : [1, 2]}"#);
        assert_eq!(raws[1].1, "3");
    }
}
