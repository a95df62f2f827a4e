//! The marker alphabet: the private-use characters (no template writes them) that stand, in a
//! rendering, for what the policy computes; how markers are made; and the one parser of marked
//! text into its pieces.
//!
//! - `OPEN i CLOSE`: value `i` read of the pod ([`marker`]).
//! - `ITER j CLOSE`: value `j` an iteration reads ([`iter`]). While the loops are found, a
//!   rendering writes `ITER j.t CLOSE`, value `j` in iteration `t` ([`iteration_marker`]).
//! - `INT j CLOSE`: value `j` an iteration reads, as a whole value of type int (a
//!   `containerPort`: [`int`]). While the loops are found, a rendering writes the number
//!   `INT_BASE + 10 * j + t` ([`int_marker`] reads it back).
//! - `LOOP_OPEN k CLOSE body LOOP_ELSE else LOOP_END`: loop `k`'s output in a string
//!   ([`loop_open`]); in a list, an object with the key [`LOOP_KEY`] among the items.
//!
//! Imports nothing of the exporter: every other file of it reads markers through this one.

/// Opens and closes a marker in rendered text.
pub const OPEN: char = '\u{E000}';
pub const CLOSE: char = '\u{E001}';
/// Opens a marker of a value an iteration reads (closed by [`CLOSE`]).
pub const ITER: char = '\u{E002}';
/// Open, split and close a loop's output in a string: `LOOP_OPEN k CLOSE body LOOP_ELSE else
/// LOOP_END`.
pub const LOOP_OPEN: char = '\u{E003}';
pub const LOOP_ELSE: char = '\u{E004}';
pub const LOOP_END: char = '\u{E005}';
/// Opens a marker that is a whole value of type int (a `containerPort`).
pub const INT: char = '\u{E006}';
/// The key of the object that stands for a loop's items in a list.
pub const LOOP_KEY: &str = "\u{E003}loop";

/// Integer markers: `INT_BASE + 10 * emit + iteration`. Within i32, far from any port.
pub const INT_BASE: i64 = 1_100_000_000;

/// Whether a rendered string holds anything the policy computes.
pub fn symbolic(s: &str) -> bool {
    s.contains([OPEN, ITER, LOOP_OPEN, INT])
}

/// The marker of value `i` read of the pod.
pub fn marker(i: usize) -> String {
    format!("{OPEN}{i}{CLOSE}")
}

/// The marker of value `j` an iteration reads, in text.
pub fn iter(j: usize) -> String {
    format!("{ITER}{j}{CLOSE}")
}

/// The marker of value `j` an iteration reads, where it is a whole value of type int.
pub fn int(j: usize) -> String {
    format!("{INT}{j}{CLOSE}")
}

/// The value a whole string [`int`] marks, if it is one.
pub fn int_ref(s: &str) -> Option<usize> {
    s.strip_prefix(INT)
        .and_then(|r| r.strip_suffix(CLOSE))
        .and_then(|n| n.parse::<usize>().ok())
}

/// What opens loop `k`'s output in a string (its body follows).
pub fn loop_open(k: usize) -> String {
    format!("{LOOP_OPEN}{k}{CLOSE}")
}

/// A minijinja expression that writes a marker of value `j` in the iteration it renders in:
/// the number `INT_BASE + 10 * j + loop.index0` for a whole number, else `ITER j.t CLOSE`.
pub fn iteration_marker(j: usize, whole_number: bool) -> String {
    // JSON string syntax is a subset of what minijinja reads.
    let literal = |text: &str| serde_json::to_string(text).unwrap_or_default();
    match whole_number {
        true => format!("({} + loop.index0)", INT_BASE + 10 * j as i64),
        false => format!(
            "({} ~ loop.index0 ~ {})",
            literal(&format!("{ITER}{j}.")),
            literal(&CLOSE.to_string())
        ),
    }
}

/// `(emit, iteration)` of a number a rendering wrote for [`iteration_marker`].
pub fn int_marker(n: i64) -> Option<(usize, usize)> {
    let d = n.checked_sub(INT_BASE)?;
    (0..100_000_000)
        .contains(&d)
        .then_some(((d / 10) as usize, (d % 10) as usize))
}

/// Why marked text does not read back into pieces.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MarkerError {
    #[error("a broken marker {0:?}")]
    Broken(String),
    #[error("an unclosed marker")]
    Unclosed,
    #[error("a loop inside a loop")]
    Nested,
    #[error("an else outside a loop")]
    StrayElse,
    #[error("a loop end outside a loop")]
    StrayEnd,
    #[error("an unclosed loop")]
    UnclosedLoop,
}

/// One step of marked text, as [`tokens`] reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token<'s> {
    Text(&'s str),
    Marker(usize),
    Iter(usize),
    LoopOpen(usize),
    LoopElse,
    LoopEnd,
}

/// Marked text as its steps, in order: the one reader of the alphabet.
fn tokens(s: &str) -> impl Iterator<Item = Result<Token<'_>, MarkerError>> {
    let special = [OPEN, ITER, LOOP_OPEN, LOOP_ELSE, LOOP_END];
    let mut rest = s;
    std::iter::from_fn(move || {
        let c = rest.chars().next()?;
        if !special.contains(&c) {
            let end = rest.find(special).unwrap_or(rest.len());
            let (text, after) = rest.split_at(end);
            rest = after;
            return Some(Ok(Token::Text(text)));
        }
        let after = &rest[c.len_utf8()..];
        let token = match c {
            LOOP_ELSE => Token::LoopElse,
            LOOP_END => Token::LoopEnd,
            _ => {
                let Some(close) = after.find(CLOSE) else {
                    rest = "";
                    return Some(Err(MarkerError::Unclosed));
                };
                let digits = &after[..close];
                rest = &after[close + CLOSE.len_utf8()..];
                let Ok(n) = digits.parse::<usize>() else {
                    return Some(Err(MarkerError::Broken(digits.to_owned())));
                };
                return Some(Ok(match c {
                    OPEN => Token::Marker(n),
                    ITER => Token::Iter(n),
                    _ => Token::LoopOpen(n),
                }));
            }
        };
        rest = after;
        Some(Ok(token))
    })
}

/// A string of the fragment, read back into its parts.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    Text(String),
    /// A value read of the pod ([`marker`]).
    Marker(usize),
    /// A value one iteration reads ([`iter`]).
    Iter(usize),
    Loop {
        k: usize,
        body: Vec<Piece>,
        other: Vec<Piece>,
    },
}

/// Reads a string with markers and loops into its parts.
pub fn parse(s: &str) -> Result<Vec<Piece>, MarkerError> {
    let mut pieces = Vec::new();
    // The loop open: its number, the pieces before it, its body once its `else` is reached.
    let mut open: Option<(usize, Vec<Piece>, Option<Vec<Piece>>)> = None;
    for token in tokens(s) {
        match token? {
            Token::Text(t) => pieces.push(Piece::Text(t.to_owned())),
            Token::Marker(n) => pieces.push(Piece::Marker(n)),
            Token::Iter(n) => pieces.push(Piece::Iter(n)),
            Token::LoopOpen(k) => {
                if open.is_some() {
                    return Err(MarkerError::Nested);
                }
                open = Some((k, std::mem::take(&mut pieces), None));
            }
            Token::LoopElse => {
                let Some(top) = open.as_mut() else {
                    return Err(MarkerError::StrayElse);
                };
                top.2 = Some(std::mem::take(&mut pieces));
            }
            Token::LoopEnd => {
                let Some((k, outer, Some(body))) = open.take() else {
                    return Err(MarkerError::StrayEnd);
                };
                let other = std::mem::replace(&mut pieces, outer);
                pieces.push(Piece::Loop { k, body, other });
            }
        }
    }
    if open.is_some() {
        return Err(MarkerError::UnclosedLoop);
    }
    Ok(pieces)
}

/// The markers of values read of the pod in a string, with the text around them, for tests.
#[cfg(test)]
pub fn pieces(s: &str) -> Vec<Result<&str, usize>> {
    let mut out: Vec<Result<&str, usize>> = tokens(s)
        .filter_map(|t| match t {
            Ok(Token::Text(t)) => Some(Ok(t)),
            Ok(Token::Marker(n)) => Some(Err(n)),
            _ => None,
        })
        .collect();
    if out.is_empty() {
        out.push(Ok(s));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_split_back_into_text_and_expressions() {
        let s = format!("a{}b{}", marker(3), marker(10));
        assert_eq!(pieces(&s), vec![Ok("a"), Err(3), Ok("b"), Err(10)]);
        assert_eq!(pieces("plain"), vec![Ok("plain")]);
        assert_eq!(pieces(""), vec![Ok("")]);
    }
}
