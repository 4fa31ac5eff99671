//! A strict JSON reader over a request body, one pass from the front: the grammar of RFC 8259
//! checked as serde_json checks it, strings crossed 16 bytes a step, and no value built but
//! those asked for.
//!
//! Request bodies are mostly one long string (the prompt): a general parser spends most of its
//! time there, looking for the string's end a word at a time, then checking the whole body is
//! UTF-8. Here the end is found with vector compares, 16 bytes a step (SSE2), and only a string
//! holding a byte above ASCII is checked for UTF-8 (outside strings JSON is ASCII, and any
//! other byte is refused as a syntax error).

use std::borrow::Cow;
use std::fmt;

/// Deepest nesting of arrays and objects read, the top-level object included: serde_json's
/// limit for the values it builds (it skips ignored values at any depth; a scanner that
/// recurses must stop somewhere).
const MAX_DEPTH: usize = 127;

/// Why the body is not JSON, and the byte where that was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanError {
    what: Cow<'static, str>,
    at: usize,
}

impl fmt::Display for ScanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at byte {}", self.what, self.at)
    }
}

/// A string as it lies in the body.
#[derive(Debug, Clone, Copy)]
pub struct RawStr<'a> {
    /// The string as written, its quotes and escapes included.
    quoted: &'a [u8],
    /// Whether it holds an escape.
    escaped: bool,
    /// Where its opening quote is.
    at: usize,
}

impl<'a> RawStr<'a> {
    /// The bytes between the quotes, escapes as written.
    fn raw(&self) -> &'a [u8] {
        &self.quoted[1..self.quoted.len() - 1]
    }

    /// The string's text, escapes decoded (borrowed from the body when there are none).
    pub fn text(&self) -> Result<Cow<'a, str>, ScanError> {
        if !self.escaped {
            // Checked for UTF-8 when scanned, if it held a byte above ASCII.
            return std::str::from_utf8(self.raw())
                .map(Cow::Borrowed)
                .map_err(|e| not_utf8(e, self.at + 1));
        }
        // Rare: decoded by serde_json, which checks the `\u` escapes' surrogates as well.
        serde_json::from_slice::<String>(self.quoted)
            .map(Cow::Owned)
            .map_err(|e| ScanError {
                what: format!("bad string ({e})").into(),
                at: self.at,
            })
    }

    /// The string's text as bytes, escapes decoded: for a long string, the text without a
    /// second UTF-8 check of what [`Scan::string`] checked.
    pub fn bytes(&self) -> Result<Cow<'a, [u8]>, ScanError> {
        if self.escaped {
            return self.text().map(|t| Cow::Owned(t.into_owned().into_bytes()));
        }
        Ok(Cow::Borrowed(self.raw()))
    }

    /// Which of `keys` the string is exactly (escapes decoded).
    pub fn one_of(&self, keys: &[&str]) -> Option<usize> {
        if self.escaped {
            let text = self.text().ok()?;
            return keys.iter().position(|k| *k == text);
        }
        let raw = self.raw();
        keys.iter().position(|k| k.as_bytes() == raw)
    }
}

/// A number as written, classified as serde_json classifies it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    /// An integer from 0 to `u64::MAX`.
    Unsigned(u64),
    /// A negative integer from `i64::MIN`.
    Negative(i64),
    /// Anything else: a fraction, an exponent, or an integer too large for the two above.
    Float,
}

/// A reading position in a body.
pub struct Scan<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Scan<'a> {
    /// A reader at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, at: 0 }
    }

    /// An error at the current position.
    pub fn error(&self, what: impl Into<Cow<'static, str>>) -> ScanError {
        self.error_at(self.at, what)
    }

    /// An error at byte `at`.
    pub fn error_at(&self, at: usize, what: impl Into<Cow<'static, str>>) -> ScanError {
        ScanError {
            what: what.into(),
            at,
        }
    }

    /// The current position: bytes read so far.
    pub fn position(&self) -> usize {
        self.at
    }

    /// The next byte that is not whitespace, not taken.
    pub fn peek(&mut self) -> Option<u8> {
        while let Some(&b) = self.bytes.get(self.at) {
            if !matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
                return Some(b);
            }
            self.at += 1;
        }
        None
    }

    /// Takes `byte` after any whitespace, or fails naming what was `expected`.
    pub fn expect(&mut self, byte: u8, expected: &str) -> Result<(), ScanError> {
        match self.peek() {
            Some(b) if b == byte => {
                self.at += 1;
                Ok(())
            }
            found => Err(self.unexpected(found, expected)),
        }
    }

    /// An error for finding `found` where `expected` was due.
    pub fn unexpected(&self, found: Option<u8>, expected: &str) -> ScanError {
        match found {
            None => self.error(format!("expected {expected}, found the body's end (EOF)")),
            Some(b) if b.is_ascii_graphic() => {
                self.error(format!("expected {expected}, found `{}`", b as char))
            }
            Some(b) => self.error(format!("expected {expected}, found byte 0x{b:02x}")),
        }
    }

    /// Nothing but whitespace is left.
    pub fn end(&mut self) -> Result<(), ScanError> {
        match self.peek() {
            None => Ok(()),
            Some(_) => Err(self.error("trailing characters after the JSON value")),
        }
    }

    /// Reads the members of an object whose `{` is next: `member` is called with each key, the
    /// scanner placed before its value, which it must read.
    pub fn object(
        &mut self,
        depth: usize,
        mut member: impl FnMut(&mut Self, RawStr<'a>, usize) -> Result<(), ScanError>,
    ) -> Result<(), ScanError> {
        self.expect(b'{', "a JSON object")?;
        let depth = self.deeper(depth)?;
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(());
        }
        loop {
            let key = match self.peek() {
                Some(b'"') => self.string()?,
                found => return Err(self.unexpected(found, "a key (a string)")),
            };
            self.expect(b':', "`:`")?;
            member(self, key, depth)?;
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(());
                }
                found => return Err(self.unexpected(found, "`,` or `}`")),
            }
        }
    }

    /// Reads the elements of an array whose `[` is next, `element` reading each.
    pub fn array(
        &mut self,
        depth: usize,
        mut element: impl FnMut(&mut Self, usize) -> Result<(), ScanError>,
    ) -> Result<(), ScanError> {
        self.expect(b'[', "a JSON array")?;
        let depth = self.deeper(depth)?;
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(());
        }
        loop {
            element(self, depth)?;
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(());
                }
                found => return Err(self.unexpected(found, "`,` or `]`")),
            }
        }
    }

    /// One level deeper than `depth`, within [`MAX_DEPTH`].
    fn deeper(&self, depth: usize) -> Result<usize, ScanError> {
        if depth >= MAX_DEPTH {
            return Err(self.error("nested too deep (recursion limit exceeded)"));
        }
        Ok(depth + 1)
    }

    /// Reads any value and drops it, checking its grammar.
    pub fn skip(&mut self, depth: usize) -> Result<(), ScanError> {
        match self.peek() {
            Some(b'"') => self.string().map(drop),
            Some(b'{') => self.object(depth, |s, _, d| s.skip(d)),
            Some(b'[') => self.array(depth, |s, d| s.skip(d)),
            Some(b'-' | b'0'..=b'9') => self.number().map(drop),
            Some(b't' | b'f' | b'n') => self.literal().map(drop),
            found => Err(self.unexpected(found, "a JSON value")),
        }
    }

    /// Reads `true`, `false` or `null` (`Some(bool)` or `None`).
    pub fn literal(&mut self) -> Result<Option<bool>, ScanError> {
        let rest = &self.bytes[self.at..];
        for (word, value) in [
            (&b"true"[..], Some(true)),
            (b"false", Some(false)),
            (b"null", None),
        ] {
            if rest.starts_with(word) {
                self.at += word.len();
                return Ok(value);
            }
        }
        Err(self.error("expected `true`, `false` or `null` (an invalid literal)"))
    }

    /// Reads a number whose first byte is next.
    pub fn number(&mut self) -> Result<Number, ScanError> {
        let negative = self.take(b'-');
        let magnitude = match self.bytes.get(self.at) {
            Some(b'0') => {
                self.at += 1;
                Some(0)
            }
            Some(b'1'..=b'9') => self.integer_digits(),
            _ => return Err(self.error("invalid number: a digit must follow `-`")),
        };
        let mut float = false;
        if self.take(b'.') {
            float = true;
            if !self.bytes.get(self.at).is_some_and(u8::is_ascii_digit) {
                return Err(self.error("invalid number: a digit must follow `.`"));
            }
            self.digits();
        }
        if self.take(b'e') || self.take(b'E') {
            float = true;
            let _ = self.take(b'+') || self.take(b'-');
            if !self.bytes.get(self.at).is_some_and(u8::is_ascii_digit) {
                return Err(self.error("invalid number: a digit must follow the exponent"));
            }
            self.digits();
        }
        Ok(match (float, negative, magnitude) {
            (false, false, Some(n)) => Number::Unsigned(n),
            // serde_json reads `-0` as a float.
            (false, true, Some(n)) if n > 0 => 0i64
                .checked_sub_unsigned(n)
                .map_or(Number::Float, Number::Negative),
            _ => Number::Float,
        })
    }

    /// Takes the ASCII digits that come next, and their value (`None` past `u64::MAX`).
    fn integer_digits(&mut self) -> Option<u64> {
        let mut value = Some(0u64);
        while let Some(&digit) = self.bytes.get(self.at).filter(|b| b.is_ascii_digit()) {
            value = value.and_then(|v| v.checked_mul(10)?.checked_add(u64::from(digit - b'0')));
            self.at += 1;
        }
        value
    }

    /// Takes `byte` if it is next (no whitespace skipped).
    fn take(&mut self, byte: u8) -> bool {
        let next = self.bytes.get(self.at) == Some(&byte);
        self.at += usize::from(next);
        next
    }

    /// Takes the ASCII digits that come next.
    fn digits(&mut self) {
        while self.bytes.get(self.at).is_some_and(u8::is_ascii_digit) {
            self.at += 1;
        }
    }

    /// Reads a string whose opening quote is next.
    pub fn string(&mut self) -> Result<RawStr<'a>, ScanError> {
        let open = self.at;
        self.at += 1;
        let mut escaped = false;
        let mut non_ascii = false;
        loop {
            let (found, high) = find_special(self.bytes, self.at);
            non_ascii |= high;
            let Some(i) = found else {
                self.at = self.bytes.len();
                return Err(self.error("the body ended (EOF) inside a string"));
            };
            self.at = i;
            match self.bytes[i] {
                b'"' => break,
                b'\\' => {
                    escaped = true;
                    self.escape()?;
                }
                _ => return Err(self.error("a control character inside a string")),
            }
        }
        self.at += 1;
        let quoted = &self.bytes[open..self.at];
        if non_ascii {
            std::str::from_utf8(quoted).map_err(|e| not_utf8(e, open))?;
        }
        Ok(RawStr {
            quoted,
            escaped,
            at: open,
        })
    }

    /// Takes the escape whose `\` is next.
    fn escape(&mut self) -> Result<(), ScanError> {
        self.at += 1;
        match self.bytes.get(self.at) {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => self.at += 1,
            Some(b'u') => {
                let hex = self.bytes.get(self.at + 1..self.at + 5);
                if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                    return Err(self.error("invalid escape: `\\u` takes four hex digits"));
                }
                self.at += 5;
            }
            None => return Err(self.error("the body ended (EOF) inside a string")),
            Some(_) => return Err(self.error("invalid escape in a string")),
        }
        Ok(())
    }
}

/// The error for a string that is not UTF-8, `at` its first byte.
fn not_utf8(e: std::str::Utf8Error, at: usize) -> ScanError {
    ScanError {
        what: format!("the body is not UTF-8 ({e}), so not JSON").into(),
        at: at + e.valid_up_to(),
    }
}

/// Where the first `"`, `\` or control byte (below 0x20) at or after `from` is, and whether a
/// byte above ASCII came before it.
fn find_special(bytes: &[u8], from: usize) -> (Option<usize>, bool) {
    let rest = bytes.get(from..).unwrap_or_default();
    #[cfg(target_arch = "x86_64")]
    let (rest, from, high) = match sse2::find_special(rest) {
        sse2::Found::At(i, high) => return (Some(from + i), high),
        sse2::Found::NotBefore(done, high) => (&rest[done..], from + done, high),
    };
    #[cfg(not(target_arch = "x86_64"))]
    let high = false;
    match rest.iter().position(|&b| is_special(b)) {
        Some(i) => (Some(from + i), high || !rest[..i].is_ascii()),
        None => (None, high || !rest.is_ascii()),
    }
}

/// Whether `b` ends the plain run of a string: a quote, a backslash or a control byte.
fn is_special(b: u8) -> bool {
    b == b'"' || b == b'\\' || b < 0x20
}

#[cfg(target_arch = "x86_64")]
mod sse2 {
    //! The search for a string's end, sixteen bytes a step with SSE2 (every x86-64 has it).

    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8, _mm_setzero_si128, _mm_xor_si128,
    };

    /// What the whole sixteen-byte steps of a search found.
    pub enum Found {
        /// The first special byte's offset, and whether a byte above ASCII came before it.
        At(usize, bool),
        /// None in the first `.0` bytes (the rest, under sixteen, is left to the caller), and
        /// whether any of those was above ASCII.
        NotBefore(usize, bool),
    }

    /// The first quote, backslash or control byte in `bytes`, searched sixteen bytes a step.
    pub fn find_special(bytes: &[u8]) -> Found {
        let steps = bytes.len() / 16;
        // SAFETY: SSE2 is in the x86-64 baseline, so the intrinsics need no check at run time;
        // each unaligned load reads the sixteen bytes at `16 * step`, inside `bytes` because
        // `step < bytes.len() / 16`.
        unsafe {
            let mut seen = _mm_setzero_si128();
            for step in 0..steps {
                let v = _mm_loadu_si128(bytes.as_ptr().add(16 * step).cast());
                let special = _mm_movemask_epi8(special(v)) as u32;
                if special != 0 {
                    let i = special.trailing_zeros();
                    let high_here = _mm_movemask_epi8(v) as u32 & ((1 << i) - 1);
                    let high = _mm_movemask_epi8(seen) != 0 || high_here != 0;
                    return Found::At(16 * step + i as usize, high);
                }
                seen = _mm_or_si128(seen, v);
            }
            Found::NotBefore(16 * steps, _mm_movemask_epi8(seen) != 0)
        }
    }

    /// Bytes set to all ones where `v` holds a quote, a backslash or a control byte.
    ///
    /// # Safety
    /// Only SSE2 instructions, which every x86-64 processor has.
    unsafe fn special(v: __m128i) -> __m128i {
        let backslash = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
        // x ^ 2 <= 0x20 (unsigned) exactly when x is a control byte or `"` (0x22): the
        // minimum of x ^ 2 and 0x20 is x ^ 2 itself.
        let flipped = _mm_xor_si128(v, _mm_set1_epi8(2));
        let control_or_quote = _mm_cmpeq_epi8(_mm_min_epu8(flipped, _mm_set1_epi8(0x20)), flipped);
        _mm_or_si128(backslash, control_or_quote)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `body` is one JSON value and nothing else, read by this scanner.
    fn accepted(body: &[u8]) -> bool {
        let mut scan = Scan::new(body);
        scan.skip(0).and_then(|()| scan.end()).is_ok()
    }

    /// The same, by serde_json over a body checked to be UTF-8 (what gpulb did before).
    fn serde_accepts(body: &[u8]) -> bool {
        std::str::from_utf8(body).is_ok()
            && serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok()
    }

    #[test]
    fn the_grammar_is_serde_jsons_on_every_small_edit_of_sample_bodies() {
        let samples: [&[u8]; 6] = [
            br#"{"model":"m","messages":[{"role":"user","content":"hi \"there\"\n\u00e9"}],"stream":true}"#,
            br#"{"prompt":[1,-2,3.5e-2,0,1e9],"n":null,"max_tokens":12,"x":{"a":[[],{}]}}"#,
            br#" { "a" : false , "b" : [ true , null ] , "c" : -0.0E+1 } "#,
            "{\"t\":\"caf\u{e9} \u{1f600} \\ud83d\\ude00\"}".as_bytes(),
            br#"[{"k":"v"},"s",12,{"\/":"\b\f\r\t"}]"#,
            br#""a string""#,
        ];
        let edits = b"\"\\{}[],:0-.eEtnu+ \x01\x1f\x7f\xc3\xff";
        let (mut checked, mut kept) = (0, 0);
        for sample in samples {
            assert!(accepted(sample), "{}", String::from_utf8_lossy(sample));
            for i in 0..sample.len() {
                let mut variants = vec![
                    sample[..i].to_vec(),
                    [&sample[..i], &sample[i + 1..]].concat(),
                ];
                for &b in edits {
                    let mut v = sample.to_vec();
                    v[i] = b;
                    variants.push(v);
                }
                for v in variants {
                    let ok = accepted(&v);
                    assert_eq!(ok, serde_accepts(&v), "{:?}", String::from_utf8_lossy(&v));
                    checked += 1;
                    kept += usize::from(ok);
                }
            }
        }
        // Both answers are common among the edits, so agreeing is not agreeing on one answer.
        assert!(
            checked > 2000 && kept > 300 && checked - kept > 300,
            "{kept} of {checked}"
        );
    }

    #[test]
    fn nesting_is_bounded_at_serde_jsons_limit_for_built_values() {
        let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        for depth in 120..=MAX_DEPTH {
            assert!(accepted(nested(depth).as_bytes()), "{depth}");
        }
        for depth in [MAX_DEPTH + 1, 100_000] {
            let e = Scan::new(nested(depth).as_bytes()).skip(0).unwrap_err();
            assert!(e.to_string().contains("recursion limit"), "{e}");
        }
        // serde_json refuses the same depth when it builds the value.
        assert!(serde_json::from_str::<serde_json::Value>(&nested(MAX_DEPTH)).is_ok());
        assert!(serde_json::from_str::<serde_json::Value>(&nested(MAX_DEPTH + 1)).is_err());
    }

    #[test]
    fn the_vector_search_finds_what_a_byte_search_finds() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for round in 0..2000 {
            let len = round % 70;
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    // Mostly plain text, sometimes a quote, backslash, control or high byte.
                    match state % 40 {
                        0 => b'"',
                        1 => b'\\',
                        2 => (state >> 8) as u8 & 0x1f,
                        3 => 0x80 | (state >> 8) as u8,
                        _ => b'a' + (state % 26) as u8,
                    }
                })
                .collect();
            for from in [0, 1, 5].into_iter().filter(|&f| f <= len) {
                let expected_at = bytes[from..].iter().position(|&b| is_special(b));
                let before = &bytes[from..from + expected_at.unwrap_or(len - from)];
                let expected = (expected_at.map(|i| from + i), !before.is_ascii());
                assert_eq!(
                    find_special(&bytes, from),
                    expected,
                    "{bytes:?} from {from}"
                );
            }
        }
    }

    #[test]
    fn strings_give_their_text_and_errors_say_where() {
        let mut scan = Scan::new(b"\"plain\" \"esc\\u00e9\\n\" \"caf\xc3\xa9\"");
        let plain = scan.string().unwrap();
        assert_eq!(plain.one_of(&["x", "plain"]), Some(1));
        assert!(!plain.escaped);
        scan.peek();
        let esc = scan.string().unwrap();
        assert_eq!(esc.one_of(&["esc\u{e9}\n"]), Some(0));
        assert_eq!(esc.text().unwrap(), "esc\u{e9}\n");
        assert_eq!(&*esc.bytes().unwrap(), "esc\u{e9}\n".as_bytes());
        scan.peek();
        assert_eq!(scan.string().unwrap().text().unwrap(), "caf\u{e9}");
        let e = Scan::new(b"\"ab\xff\"").string().unwrap_err();
        assert_eq!(e.at, 3);
        assert!(e.to_string().contains("not UTF-8"), "{e}");
        let e = Scan::new(b"\"a\nb\"").string().unwrap_err();
        assert_eq!(
            e.to_string(),
            "a control character inside a string at byte 2"
        );
        let mut scan = Scan::new(br#"{"a":1 "b":2}"#);
        let e = scan.skip(0).unwrap_err().to_string();
        assert_eq!(e, "expected `,` or `}`, found `\"` at byte 7");
    }

    #[test]
    fn numbers_are_classified_as_serde_json_classifies_them() {
        for (text, expected) in [
            ("0", Number::Unsigned(0)),
            ("18446744073709551615", Number::Unsigned(u64::MAX)),
            ("18446744073709551616", Number::Float),
            ("-1", Number::Negative(-1)),
            ("-0", Number::Float),
            ("10", Number::Unsigned(10)),
            ("-9223372036854775808", Number::Negative(i64::MIN)),
            ("-9223372036854775809", Number::Float),
            ("1.0", Number::Float),
            ("1e2", Number::Float),
        ] {
            assert_eq!(
                Scan::new(text.as_bytes()).number().unwrap(),
                expected,
                "{text}"
            );
            let serde: serde_json::Number = serde_json::from_str(text).unwrap();
            let serde = match (serde.as_u64(), serde.as_i64()) {
                (Some(n), _) => Number::Unsigned(n),
                (None, Some(n)) => Number::Negative(n),
                (None, None) => Number::Float,
            };
            assert_eq!(serde, expected, "serde_json on {text}");
        }
    }
}
