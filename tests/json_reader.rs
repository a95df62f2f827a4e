//! The view's JSON reader (`engine::json`) against serde_json, on generated texts: it never
//! accepts what serde_json refuses (a refusal only sends a review down the typed road), it
//! accepts every valid text within the nesting limit, and what it reads as a string or keeps as
//! a value's JSON is what serde_json reads there.

use proptest::prelude::*;
use serde::de::IgnoredAny;
use serde_json::Value;
use sidecar_injector::engine::json::{JsonError, Reader};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 512,
        ..ProptestConfig::default()
    }
}

fn reads(text: &str) -> bool {
    let mut r = Reader::new(text);
    r.skip().and_then(|()| r.end()).is_ok()
}

/// The value of `text` read the way the view reads: every object and array through the
/// reader's `object` and `array` (their loops, not `skip`), each member's value from its JSON.
fn read_through(text: &str) -> Result<Value, JsonError> {
    let mut r = Reader::new(text);
    let value = match text.trim_start().as_bytes().first() {
        Some(b'{') => {
            let mut members = serde_json::Map::new();
            r.object(|r, key| {
                let value = read_through(r.raw()?.get())?;
                members.insert(key.into_owned(), value);
                Ok(())
            })?;
            Value::Object(members)
        }
        Some(b'[') => {
            let mut elements = Vec::new();
            r.array(|r| {
                elements.push(read_through(r.raw()?.get())?);
                Ok(())
            })?;
            Value::Array(elements)
        }
        _ => serde_json::from_str(r.raw()?.get()).expect("a checked scalar reads"),
    };
    r.end()?;
    Ok(value)
}

fn serde_reads(text: &str) -> bool {
    serde_json::from_str::<IgnoredAny>(text).is_ok()
}

fn string() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,16}",
        "[a-z]{0,40}",
        Just("\u{0}\u{1f}\"\\/\u{7f}é😀".to_owned()),
    ]
}

fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        string().prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::vec((string(), inner), 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Pieces that make or break JSON, spliced into a valid text.
fn splice() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "",
        "\"",
        "\\",
        "\\u",
        "\\ud800",
        "\\udc00",
        "\\ud83d\\ude00",
        "\\x",
        "\u{1}",
        "\n",
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "-",
        "0",
        "01",
        "1.",
        ".5",
        "1e",
        "1e+",
        "-0",
        "true",
        "tru",
        "null",
        "nul",
        " ",
        "\t",
        "\u{a0}",
        "é",
        "\"a\":",
        ",]",
        ",}",
    ])
}

proptest! {
    #![proptest_config(config())]

    /// Valid texts, compact and pretty: both read them, and the reader keeps each member's
    /// JSON exactly as serde_json's raw value does.
    #[test]
    fn valid_texts_are_read(value in json(), pretty in any::<bool>()) {
        let text = if pretty {
            serde_json::to_string_pretty(&value).expect("serializes")
        } else {
            serde_json::to_string(&value).expect("serializes")
        };
        prop_assert!(serde_reads(&text));
        prop_assert!(reads(&text), "refused a valid text: {text}");
        if let Value::Object(_) = value {
            let expected: std::collections::BTreeMap<String, Box<serde_json::value::RawValue>> =
                serde_json::from_str(&text).expect("reads");
            let mut got = std::collections::BTreeMap::new();
            let mut r = Reader::new(&text);
            r.object(|r, key| {
                got.insert(key.into_owned(), r.raw()?.get().to_owned());
                Ok(())
            })
            .expect("reads");
            for (key, raw) in &expected {
                prop_assert_eq!(got.get(key).map(String::as_str), Some(raw.get()));
            }
        }
    }

    /// Whitespace between every two tokens (before commas, colons and closing brackets too,
    /// where a pretty printer puts none): the reader reads the text and keeps the same members.
    #[test]
    fn whitespace_anywhere_between_tokens(value in json()) {
        let compact = serde_json::to_string(&value).expect("serializes");
        let ws = " \t\n\r  ";
        let mut spaced = String::from(ws);
        let (mut in_string, mut escaped) = (false, false);
        for ch in compact.chars() {
            if in_string {
                spaced.push(ch);
                match (escaped, ch) {
                    (true, _) => escaped = false,
                    (false, '\\') => escaped = true,
                    (false, '"') => {
                        in_string = false;
                        spaced.push_str(ws);
                    }
                    _ => {}
                }
                continue;
            }
            let structural = matches!(ch, '{' | '}' | '[' | ']' | ':' | ',' | '"');
            if structural {
                spaced.push_str(ws);
            }
            spaced.push(ch);
            if ch == '"' {
                in_string = true;
            } else if structural {
                spaced.push_str(ws);
            }
        }
        prop_assert!(serde_reads(&spaced));
        prop_assert!(reads(&spaced), "refused a valid text: {spaced:?}");
        // And read container by container, as the view reads, to the same value.
        let expected: Value = serde_json::from_str(&spaced).expect("reads");
        prop_assert_eq!(read_through(&spaced), Ok(expected), "{:?}", spaced);
    }

    /// Strings, escaped as serde_json escapes them and as hostile writers do: the reader reads
    /// what serde_json reads, or refuses where serde_json refuses.
    #[test]
    fn strings_read_alike(raw in r#"([a-z"\\/]|\\u[0-9a-fA-F]{4}|\\[bfnrtu"\\/x]|[\u{0}-\u{1f}]|é){0,12}"#) {
        let text = format!("\"{raw}\"");
        let theirs = serde_json::from_str::<String>(&text).ok();
        let mut r = Reader::new(&text);
        let ours = r.string().and_then(|s| r.end().map(|()| s.into_owned())).ok();
        match (&ours, &theirs) {
            (Some(a), Some(b)) => prop_assert_eq!(a, b),
            (Some(a), None) => prop_assert!(false, "read {a:?} where serde_json refuses {text}"),
            // serde_json refuses lone surrogates in a string it reads, as the reader does.
            (None, Some(_)) => prop_assert!(false, "refused a string serde_json reads: {text}"),
            (None, None) => {}
        }
    }

    /// Any valid text with a piece spliced in, or cut short: whatever the reader accepts,
    /// serde_json accepts.
    #[test]
    fn never_more_than_serde_json(value in json(), at in any::<prop::sample::Index>(), piece in splice(), cut in any::<bool>()) {
        let text = serde_json::to_string(&value).expect("serializes");
        let mut at = at.index(text.len() + 1);
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        let broken = if cut {
            text[..at].to_owned()
        } else {
            format!("{}{piece}{}", &text[..at], &text[at..])
        };
        if reads(&broken) {
            prop_assert!(serde_reads(&broken), "read what serde_json refuses: {broken}");
        }
    }
}

#[test]
fn nesting_stops_at_the_typed_limit() {
    // serde_json reads 127 levels into typed values and refuses 128; it steps over ignored
    // values of any depth. The reader stops at 127 everywhere (stricter, never looser).
    for depth in [1, 64, 126, 127, 128, 1000] {
        let array = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let object = format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth));
        for text in [array, object] {
            assert_eq!(reads(&text), depth <= 127, "depth {depth}");
            assert!(serde_reads(&text), "depth {depth}");
            let typed = serde_json::from_str::<Value>(&text).is_ok();
            assert_eq!(typed, depth <= 127, "depth {depth}");
        }
    }
}
