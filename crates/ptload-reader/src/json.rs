//! A pull reader of JSON text, for the few documents the reader parses:
//! safetensors headers, sharded sets' indexes, DCP's sharding info and
//! placements files. Tokens come one at a time, so a caller holds only
//! what it keeps, refuses what it does not expect while it reads (a
//! tensor past `max_tensors`, a shape past 64 dimensions), and nothing is
//! recursive: nesting is a stack of bounded depth ([`MAX_DEPTH`]), and a
//! deeper document is an error, never a stack overflow.
//!
//! The grammar is RFC 8259's: no comments, no trailing commas, strings
//! checked for escapes and control characters (a lone surrogate escape is
//! an error), numbers as JSON writes them, nothing but whitespace after
//! the value.

use std::borrow::Cow;
use std::fmt;

/// How deep arrays and objects may nest.
pub(crate) const MAX_DEPTH: usize = 128;

/// One token of a document.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Token<'a> {
    BeginObject,
    EndObject,
    BeginArray,
    EndArray,
    /// A key of the object being read; its value comes next. Borrowed
    /// from the text unless it has escapes.
    Key(Cow<'a, str>),
    Str(Cow<'a, str>),
    /// A number written without fraction or exponent that fits.
    Int(i128),
    /// Any other number.
    Float(f64),
    Bool(bool),
    Null,
}

impl Token<'_> {
    /// A word for what the token is, for errors.
    pub(crate) fn what(&self) -> &'static str {
        match self {
            Token::BeginObject => "an object",
            Token::EndObject => "the end of an object",
            Token::BeginArray => "a list",
            Token::EndArray => "the end of a list",
            Token::Key(_) => "a key",
            Token::Str(_) => "a string",
            Token::Int(_) | Token::Float(_) => "a number",
            Token::Bool(_) => "a boolean",
            Token::Null => "null",
        }
    }
}

/// A malformed document, or one the caller refuses: what and at which
/// byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JsonError {
    pub(crate) message: String,
    pub(crate) at: usize,
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at byte {}", self.message, self.at)
    }
}

impl std::error::Error for JsonError {}

pub(crate) type JsonResult<T> = std::result::Result<T, JsonError>;

#[derive(Debug, Clone, Copy)]
enum Frame {
    /// In an object: whether a member was read, and whether its key was
    /// read and its value is next.
    Object {
        first: bool,
        value_next: bool,
    },
    Array {
        first: bool,
    },
}

/// The reader: [`next`](Reader::next) hands out tokens until the value
/// ends, then `None` (after checking that only whitespace follows).
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    text: &'a [u8],
    /// The same text, checked UTF-8 once: strings are slices of it.
    str_text: &'a str,
    at: usize,
    stack: Vec<Frame>,
    done: bool,
}

impl<'a> Reader<'a> {
    /// A reader of `text`, which must be UTF-8.
    pub(crate) fn new(text: &'a [u8]) -> JsonResult<Reader<'a>> {
        let str_text = std::str::from_utf8(text).map_err(|e| JsonError {
            message: "not UTF-8".into(),
            at: e.valid_up_to(),
        })?;
        Ok(Reader {
            text,
            str_text,
            at: 0,
            stack: Vec::new(),
            done: false,
        })
    }

    /// An error at the current byte.
    pub(crate) fn error(&self, message: impl Into<String>) -> JsonError {
        JsonError {
            message: message.into(),
            at: self.at,
        }
    }

    fn skip_space(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.text.get(self.at) {
            self.at += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    /// The next token; `None` once the document's value has ended.
    #[allow(clippy::should_implement_trait)]
    pub(crate) fn next(&mut self) -> JsonResult<Option<Token<'a>>> {
        self.skip_space();
        match self.stack.last().copied() {
            None if self.done => match self.peek() {
                None => Ok(None),
                Some(_) => Err(self.error("characters after the value")),
            },
            None => self.value().map(Some),
            Some(Frame::Array { first }) => {
                if self.peek() == Some(b']') {
                    return Ok(Some(self.close(Token::EndArray)));
                }
                if !first {
                    self.expect(b',', "',' or ']'")?;
                    self.skip_space();
                }
                if let Some(Frame::Array { first }) = self.stack.last_mut() {
                    *first = false;
                }
                self.value().map(Some)
            }
            Some(Frame::Object {
                value_next: true, ..
            }) => {
                if let Some(Frame::Object { value_next, .. }) = self.stack.last_mut() {
                    *value_next = false;
                }
                self.value().map(Some)
            }
            Some(Frame::Object { first, .. }) => {
                if self.peek() == Some(b'}') {
                    return Ok(Some(self.close(Token::EndObject)));
                }
                if !first {
                    self.expect(b',', "',' or '}'")?;
                    self.skip_space();
                }
                if self.peek() != Some(b'"') {
                    return Err(self.error("expected a key (a string)"));
                }
                let key = self.string()?;
                self.skip_space();
                self.expect(b':', "':' after a key")?;
                if let Some(Frame::Object { first, value_next }) = self.stack.last_mut() {
                    *first = false;
                    *value_next = true;
                }
                Ok(Some(Token::Key(key)))
            }
        }
    }

    /// The closing bracket of the innermost list or object, at the
    /// current byte: the container ends.
    fn close(&mut self, token: Token<'a>) -> Token<'a> {
        self.at += 1;
        self.stack.pop();
        self.ended();
        token
    }

    fn expect(&mut self, byte: u8, what: &str) -> JsonResult<()> {
        if self.peek() == Some(byte) {
            self.at += 1;
            Ok(())
        } else if self.peek().is_none() {
            Err(self.error(format!("the text ends where {what} is expected")))
        } else {
            Err(self.error(format!("expected {what}")))
        }
    }

    /// A value ended (a scalar read, or a container closed): the document
    /// is done when nothing encloses it.
    fn ended(&mut self) {
        if self.stack.is_empty() {
            self.done = true;
        }
    }

    fn open(&mut self, frame: Frame) -> JsonResult<()> {
        if self.stack.len() == MAX_DEPTH {
            return Err(self.error(format!("nested more than {MAX_DEPTH} deep")));
        }
        self.at += 1;
        self.stack.push(frame);
        Ok(())
    }

    fn value(&mut self) -> JsonResult<Token<'a>> {
        let token = match self.peek() {
            Some(b'{') => {
                self.open(Frame::Object {
                    first: true,
                    value_next: false,
                })?;
                return Ok(Token::BeginObject);
            }
            Some(b'[') => {
                self.open(Frame::Array { first: true })?;
                return Ok(Token::BeginArray);
            }
            Some(b'"') => Token::Str(self.string()?),
            Some(b't') => self.literal("true", Token::Bool(true))?,
            Some(b'f') => self.literal("false", Token::Bool(false))?,
            Some(b'n') => self.literal("null", Token::Null)?,
            Some(b'-' | b'0'..=b'9') => self.number()?,
            Some(_) => return Err(self.error("expected a value")),
            None => return Err(self.error("the text ends where a value is expected")),
        };
        self.ended();
        Ok(token)
    }

    fn literal(&mut self, word: &str, token: Token<'a>) -> JsonResult<Token<'a>> {
        let end = self.at + word.len();
        if self.text.get(self.at..end) == Some(word.as_bytes()) {
            self.at = end;
            Ok(token)
        } else {
            Err(self.error("expected a value"))
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.at;
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
        self.at - start
    }

    fn number(&mut self) -> JsonResult<Token<'a>> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        let leading_zero = self.peek() == Some(b'0');
        let whole = self.digits();
        if whole == 0 || (leading_zero && whole > 1) {
            return Err(self.error("a malformed number"));
        }
        let mut integral = true;
        if self.peek() == Some(b'.') {
            self.at += 1;
            integral = false;
            if self.digits() == 0 {
                return Err(self.error("a malformed number"));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            integral = false;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            if self.digits() == 0 {
                return Err(self.error("a malformed number"));
            }
        }
        let digits = self.text.get(start..self.at).unwrap_or_default();
        // The common case, a size: digits that fit in a u64.
        if integral && digits.len() <= 19 && digits.first().is_some_and(u8::is_ascii_digit) {
            let n = digits
                .iter()
                .fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
            return Ok(Token::Int(i128::from(n)));
        }
        // ASCII by construction.
        let text = std::str::from_utf8(digits).unwrap_or_default();
        // `-0` is the float negative zero, as serde_json and Python read it.
        if integral && text != "-0" {
            if let Ok(n) = text.parse::<i128>() {
                return Ok(Token::Int(n));
            }
        }
        text.parse::<f64>()
            .map(Token::Float)
            .map_err(|_| self.error("a malformed number"))
    }

    fn hex4(&mut self) -> JsonResult<u32> {
        let digits = self
            .text
            .get(self.at..self.at + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| self.error("a malformed \\u escape"))?;
        let v =
            u32::from_str_radix(digits, 16).map_err(|_| self.error("a malformed \\u escape"))?;
        self.at += 4;
        Ok(v)
    }

    /// A run of plain characters from the current byte: up to a quote, a
    /// backslash or a control character. The text is UTF-8 and the run
    /// ends at an ASCII byte, so it is UTF-8 too.
    fn run(&mut self) -> &'a str {
        let start = self.at;
        let len = self
            .text
            .get(start..)
            .unwrap_or_default()
            .iter()
            .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
            .unwrap_or(self.text.len() - start);
        self.at = start + len;
        let text: &'a str = self.str_text;
        text.get(start..self.at).unwrap_or_default()
    }

    /// A string, the reader at its opening quote: borrowed from the text
    /// when it has no escape.
    fn string(&mut self) -> JsonResult<Cow<'a, str>> {
        self.at += 1;
        let first = self.run();
        if self.peek() == Some(b'"') {
            self.at += 1;
            return Ok(Cow::Borrowed(first));
        }
        let mut out = String::from(first);
        loop {
            match self.peek() {
                Some(b'"') => {
                    self.at += 1;
                    return Ok(Cow::Owned(out));
                }
                Some(b'\\') => {
                    self.at += 1;
                    let escaped = self.peek();
                    self.at += 1;
                    let c = match escaped {
                        Some(b'"') => '"',
                        Some(b'\\') => '\\',
                        Some(b'/') => '/',
                        Some(b'b') => '\u{8}',
                        Some(b'f') => '\u{c}',
                        Some(b'n') => '\n',
                        Some(b'r') => '\r',
                        Some(b't') => '\t',
                        Some(b'u') => {
                            let first = self.hex4()?;
                            let code = match first {
                                0xD800..=0xDBFF => {
                                    if self.text.get(self.at..self.at + 2) != Some(b"\\u") {
                                        return Err(self.error("a lone surrogate in a \\u escape"));
                                    }
                                    self.at += 2;
                                    let second = self.hex4()?;
                                    if !(0xDC00..=0xDFFF).contains(&second) {
                                        return Err(self.error("a lone surrogate in a \\u escape"));
                                    }
                                    0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
                                }
                                0xDC00..=0xDFFF => {
                                    return Err(self.error("a lone surrogate in a \\u escape"))
                                }
                                c => c,
                            };
                            char::from_u32(code)
                                .ok_or_else(|| self.error("a malformed \\u escape"))?
                        }
                        _ => return Err(self.error("a malformed escape")),
                    };
                    out.push(c);
                    out.push_str(self.run());
                }
                Some(_) => return Err(self.error("a control character in a string")),
                None => return Err(self.error("the text ends inside a string")),
            }
        }
    }

    /// Skips the rest of a value whose first token was `first` (nothing
    /// for a scalar, up to the matching end for a list or object).
    pub(crate) fn skip(&mut self, first: &Token<'_>) -> JsonResult<()> {
        let mut depth = match first {
            Token::BeginObject | Token::BeginArray => 1usize,
            _ => return Ok(()),
        };
        while depth > 0 {
            match self.next()? {
                Some(Token::BeginObject | Token::BeginArray) => depth += 1,
                Some(Token::EndObject | Token::EndArray) => depth -= 1,
                Some(_) => {}
                None => return Err(self.error("the text ends inside a value")),
            }
        }
        Ok(())
    }

    /// The next token, which must be there (inside a value).
    pub(crate) fn token(&mut self) -> JsonResult<Token<'a>> {
        self.next()?
            .ok_or_else(|| self.error("the text ends where a value is expected"))
    }

    /// The start of an object, or an error naming `what` it should be.
    pub(crate) fn begin_object(&mut self, what: &str) -> JsonResult<()> {
        match self.token()? {
            Token::BeginObject => Ok(()),
            t => Err(self.error(format!("{what} is {}, not an object", t.what()))),
        }
    }

    /// The next key of the object being read, `None` at its end.
    pub(crate) fn key(&mut self) -> JsonResult<Option<Cow<'a, str>>> {
        match self.token()? {
            Token::Key(k) => Ok(Some(k)),
            Token::EndObject => Ok(None),
            t => Err(self.error(format!("expected a key, found {}", t.what()))),
        }
    }

    /// A string value, or an error naming `what` it should be.
    pub(crate) fn string_value(&mut self, what: &str) -> JsonResult<String> {
        match self.token()? {
            Token::Str(s) => Ok(s.into_owned()),
            t => {
                let found = t.what();
                self.skip(&t)?;
                Err(self.error(format!("{what} is {found}, not a string")))
            }
        }
    }

    /// A list of unsigned integers, at most `most` of them.
    pub(crate) fn u64_list(&mut self, what: &str, most: usize) -> JsonResult<Vec<u64>> {
        match self.token()? {
            Token::BeginArray => {}
            t => return Err(self.error(format!("{what} is {}, not a list", t.what()))),
        }
        let mut out = Vec::new();
        loop {
            match self.token()? {
                Token::EndArray => return Ok(out),
                Token::Int(n) => {
                    let n = u64::try_from(n)
                        .map_err(|_| self.error(format!("{what} holds {n}, not a size")))?;
                    if out.len() == most {
                        return Err(self.error(format!("{what} holds more than {most} numbers")));
                    }
                    out.push(n);
                }
                t => return Err(self.error(format!("{what} holds {}, not a size", t.what()))),
            }
        }
    }

    /// A list of exactly two unsigned integers (`[begin, end]`).
    pub(crate) fn u64_pair(&mut self, what: &str) -> JsonResult<[u64; 2]> {
        let not = |r: &Self| r.error(format!("{what} is not [begin, end]"));
        if self.token()? != Token::BeginArray {
            return Err(not(self));
        }
        let mut pair = [0u64; 2];
        for slot in &mut pair {
            match self.token()? {
                Token::Int(n) => *slot = u64::try_from(n).map_err(|_| not(self))?,
                _ => return Err(not(self)),
            }
        }
        if self.token()? != Token::EndArray {
            return Err(not(self));
        }
        Ok(pair)
    }

    /// A list of strings.
    pub(crate) fn string_list(&mut self, what: &str) -> JsonResult<Vec<String>> {
        match self.token()? {
            Token::BeginArray => {}
            t => return Err(self.error(format!("{what} is {}, not a list", t.what()))),
        }
        let mut out = Vec::new();
        loop {
            match self.token()? {
                Token::EndArray => return Ok(out),
                Token::Str(s) => out.push(s.into_owned()),
                t => return Err(self.error(format!("{what} holds {}, not a string", t.what()))),
            }
        }
    }

    /// Checks that nothing but whitespace follows the value.
    pub(crate) fn end(&mut self) -> JsonResult<()> {
        match self.next()? {
            None => Ok(()),
            Some(t) => Err(self.error(format!("{} after the value", t.what()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every token of `text`, or the first error.
    fn tokens(text: &str) -> JsonResult<Vec<Token<'_>>> {
        let mut r = Reader::new(text.as_bytes())?;
        let mut out = Vec::new();
        while let Some(t) = r.next()? {
            out.push(t);
        }
        Ok(out)
    }

    /// The same document as serde_json's value, rebuilt from the tokens.
    fn rebuilt(text: &str) -> JsonResult<serde_json::Value> {
        use serde_json::Value;
        let mut stack: Vec<(Value, Option<String>)> = Vec::new();
        let mut key: Option<String> = None;
        let mut top = None;
        for t in tokens(text)? {
            let v = match t {
                Token::BeginObject => {
                    stack.push((Value::Object(Default::default()), key.take()));
                    continue;
                }
                Token::BeginArray => {
                    stack.push((Value::Array(Vec::new()), key.take()));
                    continue;
                }
                Token::Key(k) => {
                    key = Some(k.into_owned());
                    continue;
                }
                Token::EndObject | Token::EndArray => {
                    let (v, k) = stack.pop().unwrap();
                    key = k;
                    v
                }
                Token::Str(s) => Value::String(s.into_owned()),
                Token::Int(n) => match (u64::try_from(n), i64::try_from(n)) {
                    (Ok(u), _) => Value::from(u),
                    (_, Ok(i)) => Value::from(i),
                    _ => Value::from(n as f64),
                },
                Token::Float(f) => Value::from(f),
                Token::Bool(b) => Value::Bool(b),
                Token::Null => Value::Null,
            };
            match stack.last_mut() {
                Some((Value::Object(m), _)) => {
                    m.insert(key.take().unwrap(), v);
                }
                Some((Value::Array(a), _)) => a.push(v),
                Some(_) => unreachable!(),
                None => top = Some(v),
            }
        }
        Ok(top.unwrap())
    }

    /// Accepted and refused as serde_json accepts and refuses, with the
    /// same value.
    #[test]
    fn documents_read_as_serde_json_reads_them() {
        let cases = [
            "{}",
            "[]",
            " { \"a\" : [1, -2, 3.5, 1e3, -0.0, true, false, null] } ",
            r#"{"a":{"b":{"c":[[],[{}]]}}}"#,
            r#""plain""#,
            r#""esc \" \\ \/ \b \f \n \r \t \u00e9 \ud83d\ude00 é""#,
            "18446744073709551615",
            "18446744073709551616",
            "-9223372036854775808",
            "0",
            "-0",
            "1E+2",
            "[1,2,]",
            "[,1]",
            "{,}",
            r#"{"a":1,}"#,
            r#"{"a" 1}"#,
            r#"{1:2}"#,
            "01",
            "1.",
            ".5",
            "-",
            "1e",
            "+1",
            "tru",
            "nul",
            "[1] 2",
            "[1",
            r#"{"a":1"#,
            "\"unterminated",
            "\"tab\there\"",
            r#""\ud800""#,
            r#""\udc00x""#,
            r#""\ud800\u0041""#,
            r#""\x""#,
            r#""\u12g4""#,
            "",
            "   ",
            "[1]\n",
            "NaN",
            "Infinity",
        ];
        for text in cases {
            let ours = rebuilt(text);
            let theirs: Result<serde_json::Value, _> = serde_json::from_str(text);
            match (&ours, &theirs) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{text}"),
                (Err(_), Err(_)) => {}
                _ => panic!("{text}: ours {ours:?}, serde_json {theirs:?}"),
            }
        }
    }

    #[test]
    fn nesting_deeper_than_the_limit_is_an_error_not_a_crash() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let e = tokens(&deep).unwrap_err();
        assert!(e.message.contains("nested"), "{e}");
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(tokens(&ok).is_ok());
    }

    #[test]
    fn text_that_is_not_utf8_is_an_error() {
        let e = Reader::new(b"[\"\xff\"]").unwrap_err();
        assert_eq!(e.at, 2);
    }

    #[test]
    fn skip_and_typed_reads() {
        let text = br#"{"x": {"deep": [1, {"y": 2}]}, "s": [1, 2], "n": "v", "l": ["a"]}"#;
        let mut r = Reader::new(text).unwrap();
        r.begin_object("doc").unwrap();
        assert_eq!(r.key().unwrap().as_deref(), Some("x"));
        let t = r.token().unwrap();
        r.skip(&t).unwrap();
        assert_eq!(r.key().unwrap().as_deref(), Some("s"));
        assert_eq!(r.u64_list("s", 4).unwrap(), [1, 2]);
        assert_eq!(r.key().unwrap().as_deref(), Some("n"));
        assert_eq!(r.string_value("n").unwrap(), "v");
        assert_eq!(r.key().unwrap().as_deref(), Some("l"));
        assert_eq!(r.string_list("l").unwrap(), ["a"]);
        assert_eq!(r.key().unwrap(), None);
        r.end().unwrap();
        let mut r = Reader::new(b"[1,2,3]").unwrap();
        assert!(r
            .u64_list("l", 2)
            .unwrap_err()
            .message
            .contains("more than 2"));
        let mut r = Reader::new(b"[-1]").unwrap();
        assert!(r.u64_list("l", 2).is_err());
    }
}
