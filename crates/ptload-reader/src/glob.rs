//! Name patterns: `*` any run of characters, `?` one.

/// Glob match: `*` any run (possibly empty), `?` one character.
pub fn glob(pattern: &str, text: &str) -> bool {
    glob_captures(pattern, text).is_some()
}

/// Glob match returning what each `*` matched, in order.
///
/// The pattern is split at `*` into literal parts (where `?` matches any one
/// character): the first must match at the start, the last at the end, and
/// each middle part at its leftmost place after the previous one; the
/// captures are what lies between. Leftmost placement finds a match whenever
/// one exists, without backtracking.
pub(crate) fn glob_captures<'t>(pattern: &str, text: &'t str) -> Option<Vec<&'t str>> {
    let t: Vec<(usize, char)> = text.char_indices().collect();
    let parts: Vec<Vec<char>> = pattern.split('*').map(|p| p.chars().collect()).collect();
    let matches_at = |part: &[char], at: usize| {
        part.len() <= t.len().saturating_sub(at)
            && part
                .iter()
                .zip(t.iter().skip(at))
                .all(|(&p, &(_, c))| p == '?' || p == c)
    };
    let byte = |i: usize| t.get(i).map_or(text.len(), |&(b, _)| b);
    let (first, rest) = parts.split_first()?;
    if rest.is_empty() {
        return (first.len() == t.len() && matches_at(first, 0)).then(Vec::new);
    }
    let (last, middle) = rest.split_last()?;
    let tail = t.len().checked_sub(last.len())?;
    if !matches_at(first, 0) || first.len() > tail || !matches_at(last, tail) {
        return None;
    }
    let mut captures = Vec::with_capacity(parts.len() - 1);
    let mut pos = first.len();
    for part in middle {
        let found = (pos..=tail.checked_sub(part.len())?).find(|&at| matches_at(part, at))?;
        // Positions come from char_indices: always on a boundary.
        captures.push(text.get(byte(pos)..byte(found))?);
        pos = found + part.len();
    }
    captures.push(text.get(byte(pos)..byte(tail))?);
    Some(captures)
}
