//! Bounds on request documents, checked in one linear pass before a parser sees them.
//!
//! A YAML parser's cost grows with the product of a document's length and its flow nesting (libyaml re-checks every
//! open level on each token), so a few hundred kilobytes of `{"a":{"a":…` kept a server core busy for seconds. Every
//! document is therefore scanned first:
//! - JSON (a body starting with `{` or `[`) is scanned exactly for nesting depth and then parsed with `serde_json`,
//!   which is linear; no YAML parser sees it.
//! - YAML is at most [`MAX_YAML_BYTES`], has at most [`MAX_YAML_FLOW_OPENERS`] `[` and `{` characters in all (inside
//!   strings too), its flow and block (indentation, `- `) nesting together is at most [`MAX_DEPTH`], and it may not use
//!   aliases (`*name`), whose expansion could multiply the document.
//!
//! The total count of `[` and `{` is what makes the YAML bound sound: libyaml's flow depth can never exceed it,
//! whatever the scan below makes of quotes, plain scalars or block scalars (measured: 100 KB of `[` took libyaml 33 s
//! in a release build). The depth scan reads indicators only where a token can start (line start, after `: `, `- `,
//! `,`, `[`, `{`) and skips quoted scalars, comments and block scalars; it gives the clearer message in common cases.

use crate::error::ApiError;

/// The deepest nesting of mappings and sequences a document may have.
pub const MAX_DEPTH: usize = 32;

/// The largest YAML document accepted (JSON documents are bounded by the route's body limit only).
pub const MAX_YAML_BYTES: usize = 128 * 1024;

/// The most places a YAML document may have where an alias could start (`*` after a blank, a line start, `[`, `{`,
/// `,` or `:`, inside strings too): with at most this many aliases, expansion multiplies a document at most 16 times,
/// whatever the depth scan makes of quotes. Aliases the scan finds are refused outright.
pub const MAX_YAML_ALIAS_MARKS: usize = 8;

/// The most `[` and `{` characters a YAML document may hold, wherever they are (a bound on libyaml's flow depth, whose
/// cost per token grows with that depth).
pub const MAX_YAML_FLOW_OPENERS: usize = 256;

/// At most this many conversion warnings are returned for one document; the rest are counted in a last warning.
pub const MAX_WARNINGS: usize = 50;

/// Each warning is cut to at most this many bytes.
pub const MAX_WARNING_BYTES: usize = 300;

fn too_deep(at: usize) -> ApiError {
    ApiError::parse(format!(
        "the document nests deeper than {MAX_DEPTH} levels (at byte {at}); allowed are at most {MAX_DEPTH} nested \
         mappings and lists"
    ))
}

/// Whether a body is meant as JSON (its first non-blank character opens an object or array).
pub fn looks_like_json(text: &str) -> bool {
    matches!(text.trim_start().as_bytes().first(), Some(b'{') | Some(b'['))
}

/// Checks a JSON document's nesting depth: `[` and `{` outside strings, in one pass.
pub fn check_json_depth(text: &str) -> Result<(), ApiError> {
    let mut depth = 0usize;
    let mut in_str = false;
    let mut escaped = false;
    for (i, &c) in text.as_bytes().iter().enumerate() {
        if in_str {
            if escaped {
                escaped = false;
            } else if c == b'\\' {
                escaped = true;
            } else if c == b'"' {
                in_str = false;
            }
            continue;
        }
        match c {
            b'"' => in_str = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(too_deep(i));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// Checks a YAML document: its size, nesting (flow and block together) and that it has no aliases.
pub fn check_yaml(text: &str) -> Result<(), ApiError> {
    if text.len() > MAX_YAML_BYTES {
        return Err(ApiError::new(
            "too_large",
            format!(
                "the YAML document has {} bytes; allowed are at most {MAX_YAML_BYTES} (send JSON for more)",
                text.len()
            ),
        ));
    }
    let b = text.as_bytes();
    let openers = b.iter().filter(|c| matches!(c, b'[' | b'{')).count();
    if openers > MAX_YAML_FLOW_OPENERS {
        return Err(ApiError::parse(format!(
            "the YAML document has {openers} '[' or '{{' characters; allowed are at most {MAX_YAML_FLOW_OPENERS} \
             (inside strings too): send it as JSON, which has no such limit"
        )));
    }
    let marks = (0..b.len())
        .filter(|&i| {
            b[i] == b'*'
                && (i == 0 || matches!(b[i - 1], b' ' | b'\t' | b'\n' | b'\r' | b'[' | b'{' | b',' | b':'))
                && b.get(i + 1).is_some_and(|n| !n.is_ascii_whitespace())
        })
        .count();
    if marks > MAX_YAML_ALIAS_MARKS {
        return Err(ApiError::parse(format!(
            "the YAML document has {marks} places where an alias (*name) could start; allowed are at most \
             {MAX_YAML_ALIAS_MARKS} (inside strings too): send it as JSON, which has no aliases"
        )));
    }
    let mut flow = 0usize;
    // Inside a quoted scalar: its quote character.
    let mut quote: Option<u8> = None;
    // Lines indented deeper than this belong to a block scalar.
    let mut block_scalar: Option<usize> = None;
    // Indentation of the open block levels.
    let mut block: Vec<usize> = Vec::new();
    let mut line_start = 0usize;
    while line_start <= b.len() {
        let line_end = b[line_start..].iter().position(|&c| c == b'\n').map_or(b.len(), |p| line_start + p);
        let line = &b[line_start..line_end];
        let indent = line.iter().take_while(|&&c| c == b' ').count();
        let blank = line[indent..].iter().all(|c| c.is_ascii_whitespace());
        let mut i = 0;
        if quote.is_none() && flow == 0 {
            if let Some(bi) = block_scalar {
                if blank || indent > bi {
                    line_start = line_end + 1;
                    continue;
                }
                block_scalar = None;
            }
            if blank || line.get(indent) == Some(&b'#') {
                line_start = line_end + 1;
                continue;
            }
            while block.last().is_some_and(|&l| l > indent) {
                block.pop();
            }
            if block.last() != Some(&indent) {
                block.push(indent);
            }
            if block.len() > MAX_DEPTH {
                return Err(too_deep(line_start));
            }
            i = indent;
        }
        // The previous significant byte on this line: where a token may start.
        let mut token_start = quote.is_none();
        let mut dashes = 0usize;
        while i < line.len() {
            let c = line[i];
            if let Some(q) = quote {
                if q == b'"' && c == b'\\' {
                    i += 2;
                    continue;
                }
                if c == q {
                    if q == b'\'' && line.get(i + 1) == Some(&b'\'') {
                        i += 2;
                        continue;
                    }
                    quote = None;
                    token_start = false;
                }
                i += 1;
                continue;
            }
            match c {
                b' ' | b'\t' | b'\r' => {
                    i += 1;
                    continue;
                }
                b'#' if i == 0 || matches!(line[i - 1], b' ' | b'\t') => break,
                _ => {}
            }
            if token_start {
                match c {
                    b'"' | b'\'' => {
                        quote = Some(c);
                        i += 1;
                        continue;
                    }
                    b'*' if line.get(i + 1).is_some_and(|n| !n.is_ascii_whitespace()) => {
                        return Err(ApiError::parse(format!(
                            "the document uses a YAML alias (at byte {}); aliases are not accepted, write the value out",
                            line_start + i
                        )));
                    }
                    b'|' | b'>' if flow == 0 => {
                        block_scalar = Some(indent);
                        break;
                    }
                    b'-' if flow == 0 && line.get(i + 1).is_none_or(|n| *n == b' ') => {
                        dashes += 1;
                        if block.len() + dashes > MAX_DEPTH {
                            return Err(too_deep(line_start + i));
                        }
                        i += 1;
                        continue;
                    }
                    _ => {}
                }
            }
            match c {
                // In block context a bracket inside a plain scalar is text; at a token start it opens a collection.
                b'[' | b'{' if flow > 0 || token_start => {
                    flow += 1;
                    if flow + block.len() + dashes > MAX_DEPTH {
                        return Err(too_deep(line_start + i));
                    }
                    token_start = true;
                }
                b']' | b'}' if flow > 0 => {
                    flow -= 1;
                    token_start = false;
                }
                b',' if flow > 0 => token_start = true,
                b':' => token_start = flow > 0 || line.get(i + 1).is_none_or(|n| n.is_ascii_whitespace()),
                b'?' => token_start = true,
                _ => token_start = false,
            }
            i += 1;
        }
        line_start = line_end + 1;
    }
    Ok(())
}

/// Conversion warnings, bounded in number and size: at most [`MAX_WARNINGS`], each at most [`MAX_WARNING_BYTES`].
#[derive(Debug, Default)]
pub struct Warnings {
    list: Vec<String>,
    dropped: usize,
}

/// Cuts `s` to at most `max` bytes at a character boundary, marking the cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max.saturating_sub(3);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

impl Warnings {
    /// Whether more warnings would be dropped (only counted).
    pub fn full(&self) -> bool {
        self.list.len() >= MAX_WARNINGS
    }

    /// Adds a warning (cut to size), or counts it when the list is full.
    pub fn push(&mut self, w: String) {
        if self.full() {
            self.dropped += 1;
        } else {
            self.list.push(truncate(&w, MAX_WARNING_BYTES));
        }
    }

    /// Counts a warning without building it (the list is full).
    pub fn count_dropped(&mut self) {
        self.dropped += 1;
    }

    /// The warnings, with a last one counting those dropped.
    pub fn finish(mut self) -> Vec<String> {
        if self.dropped > 0 {
            self.list.push(format!("… and {} more warnings (at most {MAX_WARNINGS} are listed)", self.dropped));
        }
        self.list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested_json(n: usize) -> String {
        format!("{}1{}", "{\"a\":".repeat(n), "}".repeat(n))
    }

    #[test]
    fn json_depth_is_counted_outside_strings() {
        check_json_depth(&nested_json(MAX_DEPTH)).unwrap();
        let e = check_json_depth(&nested_json(MAX_DEPTH + 1)).unwrap_err();
        assert_eq!(e.code, "parse_error");
        assert!(e.message.contains("deeper than 32"), "{}", e.message);
        check_json_depth(&format!("{{\"a\": \"{}\\\"\"}}", "[{".repeat(100))).unwrap();
        // An unclosed deep prefix is refused as early as the limit is crossed.
        assert!(check_json_depth(&"{\"a\":".repeat(100_000)).is_err());
    }

    #[test]
    fn yaml_flow_and_block_nesting_are_bounded() {
        check_yaml(&nested_json(20)).unwrap();
        assert!(check_yaml(&nested_json(MAX_DEPTH + 1)).is_err());
        assert!(check_yaml(&"[".repeat(40)).is_err());
        let mut deep = String::new();
        for i in 0..40 {
            deep += &format!("{}k{i}:\n", " ".repeat(i));
        }
        assert!(check_yaml(&deep).is_err(), "block nesting by indentation");
        assert!(check_yaml(&format!("a: {}b\n", "- ".repeat(40))).is_err(), "block nesting by dashes");
        // Brackets inside quotes, plain scalars, comments and block scalars are not nesting.
        let ok = format!(
            "name: x\ncommand: [sh, -c, \"{b}\", '{b}']\nrun: echo {b}\n# {b}\nscript: |\n  {b}\n  {b}\nafter: 1\n",
            b = "[[[{{{".repeat(6)
        );
        check_yaml(&ok).unwrap();
    }

    /// A depth scan can be misled by text it takes for a quoted or block scalar; the total count of openers cannot.
    #[test]
    fn yaml_flow_openers_are_bounded_in_all_and_parsing_stays_fast() {
        let hidden = format!("a: |\n  \"\nb: {}\nc: \"\n", "[".repeat(300));
        let e = check_yaml(&hidden).unwrap_err();
        assert!(e.message.contains("300 '[' or '{'"), "{}", e.message);
        // The worst document within the bounds parses quickly.
        let worst = format!("x: {}{}{}", "[".repeat(MAX_YAML_FLOW_OPENERS), "a, ".repeat(40_000), "]".repeat(256));
        assert!(worst.len() <= MAX_YAML_BYTES);
        check_yaml(&worst).unwrap_err(); // deeper than MAX_DEPTH for the scan; parse it anyway to time it
        let t = std::time::Instant::now();
        let _ = serde_norway::from_str::<serde_norway::Value>(&worst);
        assert!(t.elapsed() < std::time::Duration::from_secs(5), "{:?}", t.elapsed());
    }

    #[test]
    fn yaml_aliases_and_size_are_refused() {
        let e = check_yaml("a: &x [1, 2]\nb: *x\n").unwrap_err();
        assert!(e.message.contains("alias"), "{}", e.message);
        assert!(check_yaml("a: [*x]\n").is_err());
        check_yaml("command: [\"ls *.txt\", 'a * b']\nx: 2 * 3\n").unwrap();
        // An alias the scan would take for text inside a block scalar still counts towards the sound bound.
        let hidden = format!("a: |\n  \"\nb: [{}]\nc: \"\n", "*x, ".repeat(9));
        let e = check_yaml(&hidden).unwrap_err();
        assert!(e.message.contains("9 places"), "{}", e.message);
        let e = check_yaml(&format!("a: \"{}\"\n", "x".repeat(MAX_YAML_BYTES))).unwrap_err();
        assert_eq!(e.status(), 413);
    }

    #[test]
    fn warnings_are_bounded_in_number_and_size() {
        let mut w = Warnings::default();
        for i in 0..1000 {
            w.push(format!("{i}{}", "é".repeat(1000)));
        }
        let v = w.finish();
        assert_eq!(v.len(), MAX_WARNINGS + 1);
        assert!(v.iter().all(|x| x.len() <= MAX_WARNING_BYTES + 3), "cut at a character boundary");
        assert!(v.last().unwrap().contains("950 more"), "{:?}", v.last());
    }
}
