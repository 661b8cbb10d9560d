//! Clean-up of an extracted LaTeX answer before it is parsed, reproducing the reference's
//! normalisation step (`latex2sympy2_extended.normalize_latex` with the settings `math_verify`
//! uses): unwrap `\boxed{...}`, drop sizing and display commands, dollars and trailing unit
//! words, spell `\dfrac` as `\frac`, and repair shorthand such as `\frac12` and `\sqrt2`.
//! Verdicts depend on the exact rewrites, odd ones included, so each step follows the
//! reference's behaviour rather than what would be cleanest.
use fancy_regex::Regex as FancyRegex;
use regex::Regex;
use std::sync::LazyLock;

/// Which `\boxed{...}` contents to keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoxedMode {
    /// Every box, joined with commas.
    All,
    /// The last box, plus boxes just before it that look like parts of one list answer.
    Last,
}

fn re(p: &str) -> Regex {
    Regex::new(p).expect("valid regex")
}
fn fancy(p: &str) -> FancyRegex {
    FancyRegex::new(p).expect("valid regex")
}

static LEFT: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"\\m?left(\\\{|\{|\\\||\||\[|\(|\\rbracl|\\lgroup|\\lbrace|\\lbrack|\\vert|\\lvert|\\lceil|\\lfloor|\\langle|\\llcorner|\\ulcorner)",
    )
});
static RIGHT: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"\\m?right(\\\}|\}|\\\||\||\]|\)|\\rbrack|\\rgroup|\\rbrace|\\vert|\\rvert|\\rceil|\\rfloor|\\rangle|\\lrcorner|\\urcorner)",
    )
});
/// `(n)_{k}`, a falling factorial.
static PERMUTATION: LazyLock<Regex> =
    LazyLock::new(|| re(r"\(([a-zA-Z0-9+\-*/\\ ]+?)\)_\{([a-zA-Z0-9+\-*/\\ ]+?)\}"));
static REMOVE: LazyLock<FancyRegex> = LazyLock::new(|| {
    fancy(r#"\\mathrm\{th\}|\\!\s*|\\text\s*\{\s*\}|\\\$|\$|(?<!\\)["']|\\displaystyle"#)
});

/// Rewrites applied in one left-to-right pass; at each position the first pattern that
/// matches wins, so the order matters (`percentage` before `percent`).
const REWRITES: &[(&str, &str)] = &[
    (r"\\math(?:rm|it|bf)", r"\text"),
    (r"\\text(?:normal|bf|it|rm)", r"\text"),
    (r"\\(?:d|t|c)frac", r"\frac"),
    (r"\s\.", " 0."),
    (r"\{\.", "{0."),
    (r"\~\=", r"\approx"),
    (r"\s*\{\s*,\s*\}", ","),
    (r"(?<![a-zA-Z])(?:,?\s*(?:and|or))(?![a-zA-Z])", ","),
    (r"(?:,?\s*\\text\{\s*(?:and|or)\s*\})", ","),
    (r"(?<!\\)\\\s", " "),
    (r"infinity", r"\infty"),
    (r",?(?:\\ldots)", " "),
    (r"\s*percentage", r"\%"),
    (r"\\text\{percentage\}", r"\%"),
    (r"\s*percent", r"\%"),
    (r"\\text\{percent\}", r"\%"),
    (r"\s*pct", r"\%"),
    (r"\\text\{pct\}", r"\%"),
    (r"(?:(?<!\\)inf(?!inity))", r"\infty"),
    (r" sqrt", r"\sqrt"),
];

static REWRITE: LazyLock<FancyRegex> = LazyLock::new(|| {
    let alts: Vec<String> =
        REWRITES.iter().enumerate().map(|(i, (p, _))| format!("(?P<r{i}>{p})")).collect();
    fancy(&alts.join("|"))
});
static DOUBLE_SLASH: LazyLock<Regex> = LazyLock::new(|| re(r"\\\\([a-zA-Z])"));
static UNIT_TEXT: LazyLock<Regex> =
    LazyLock::new(|| re(r"(\\(?:text|mbox)\{.*?\})(\^\d|\{\^\d\})?$"));

/// Trailing words read as units and dropped (`12 cm`, `5 apples`). The list, odd entries and
/// all, is the reference's: the words are regex fragments, so `.` matches any character.
const UNITS: &[&str] = &[
    "integerpoint",
    "feet",
    "sue",
    "digit",
    "pound",
    "meal",
    "edge",
    "student",
    "children ticket",
    "multiple",
    "east",
    "degree",
    "mph",
    "kmph",
    "ft",
    "m square",
    " m east",
    "sq m",
    "deg",
    "mile",
    "q .",
    "monkey",
    "prime",
    "ratio",
    "profit of rs",
    "rd",
    "o",
    "gm",
    "p . m",
    "lb",
    "tile",
    "per",
    "dm",
    "lt",
    "gain",
    "ab",
    "way",
    "west",
    "a .",
    "b .",
    "c .",
    "d .",
    "e .",
    "f .",
    "g .",
    "h .",
    "t",
    "h",
    "no change",
    "men",
    "soldier",
    "pie",
    "bc",
    "excess",
    "st",
    "inches",
    "noon",
    "cent",
    "by",
    "gal",
    "kmh",
    "c",
    "acre",
    "rise",
    "a . m",
    "th",
    "π r 2",
    "sq",
    "mark",
    "l",
    "toy",
    "coin",
    "sq . m",
    "gallon",
    "° f",
    "profit",
    "minw",
    "yr",
    "women",
    "am",
    "pm",
    "hr",
    "cu cm",
    "square",
    "v â € ™",
    "are",
    "rupee",
    "rounds",
    "cubic",
    "cc",
    "mtr",
    "s",
    "ohm",
    "number",
    "kmph",
    "day",
    "hour",
    "minute",
    "min",
    "second",
    "man",
    "woman",
    "sec",
    "cube",
    "mt",
    "sq inch",
    "mp",
    "∏ cm ³",
    "hectare",
    "more",
    "sec",
    "unit",
    "cu . m",
    "cm 2",
    "rs .",
    "rs",
    "kg",
    "g",
    "month",
    "km",
    "m",
    "cm",
    "mm",
    "apple",
    "liter",
    "loss",
    "yard",
    "pure",
    "year",
    "increase",
    "decrease",
    "d",
    "less",
    "Surface",
    "litre",
    "pi sq m",
    "s .",
    "metre",
    "meter",
    "inch",
];

static UNIT_WORD: LazyLock<Regex> =
    LazyLock::new(|| re(&format!(r"(\d|\}}|\s)\s*(?:(?:{})(?:s|es)?)\s*$", UNITS.join("|"))));

static MALFORMED: LazyLock<Vec<(Regex, &'static str)>> = LazyLock::new(|| {
    vec![
        (re(r"\^\s?\((.*?)\)"), r"^{${1}}"),
        (re(r"sqrt\s?\((.*?)\)"), r"\sqrt{${1}}"),
        (re(r"\\frac\s?(\d)\s?(\d+)"), r"\frac{${1}}{${2}}"),
        (re(r"\\log_\s?(\d)\s?(\d+)"), r"\log_{${1}}{${2}}"),
        (re(r"\\frac\s?\{(.*?)\}\s?(\d)"), r"\frac{${1}}{${2}}"),
        (re(r"\\frac\s?(\d)\s?\{(.*?)\}"), r"\frac{${1}}{${2}}"),
        (re(r"\\sqrt\s?(\d)"), r"\sqrt{${1}}"),
    ]
});

/// Normalises an extracted answer.
pub fn normalize(text: &str, boxed: BoxedMode) -> String {
    let mut text = extract_boxed(text, boxed);

    text = text.replace(r"\mathrm{T}", "T").replace(r"\mathrm{d}", "d").replace(r"{\rm d}", "d");
    text = text
        .replace(r"\left[\begin{matrix}", r"\begin{bmatrix}")
        .replace(r"\end{matrix}\right]", r"\end{bmatrix}");
    text = LEFT.replace_all(&text, "${1}").into_owned();
    text = RIGHT.replace_all(&text, "${1}").into_owned();
    text = PERMUTATION.replace_all(&text, r"\frac{(${1})!}{((${1})-(${2}))!}").into_owned();
    text = fancy_replace(&REMOVE, &text, |_| String::new());
    text = fancy_replace(&REWRITE, &text, |caps| {
        let i = (0..REWRITES.len())
            .find(|i| caps.name(&format!("r{i}")).is_some())
            .expect("one alternative matched");
        REWRITES[i].1.to_string()
    });
    text = text.replace(['\n', '\t'], " ");
    if !text.contains("matrix") {
        text = DOUBLE_SLASH.replace_all(&text, r"\${1}").into_owned();
    }

    // Units: a trailing `\text{...}` (with an optional `^2`), then trailing unit words.
    let stripped = UNIT_TEXT.replace(&text, "").trim().to_string();
    if !stripped.is_empty() && stripped != text {
        text = stripped;
    }
    for _ in 0..2 {
        let stripped = UNIT_WORD.replace(&text, "${1}").into_owned();
        if !stripped.is_empty() && stripped != text {
            text = stripped;
        }
    }

    if text.starts_with('.') {
        text.insert(0, '0');
    }
    if text == "0.5" {
        text = r"\frac{1}{2}".to_string();
    }

    for (pattern, replacement) in MALFORMED.iter() {
        text = pattern.replace_all(&text, *replacement).into_owned();
    }
    text = text.replace(" sqrt", r"\sqrt");
    text = fix_sqrt(&text);
    text = fix_fracs(&text);
    text = fix_a_slash_b(&text);
    text.trim().to_string()
}

/// `Regex::replace_all` for the backtracking engine; a match the engine gives up on (too much
/// backtracking) ends the rewriting there.
fn fancy_replace(
    re: &FancyRegex,
    text: &str,
    mut with: impl FnMut(&fancy_regex::Captures) -> String,
) -> String {
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for caps in re.captures_iter(text) {
        let Ok(caps) = caps else { break };
        let m = caps.get(0).expect("group 0");
        out.push_str(&text[last..m.start()]);
        out.push_str(&with(&caps));
        last = m.end();
    }
    out.push_str(&text[last..]);
    out
}

/// The contents of `\boxed{...}` / `\fbox{...}`, searched from the right. Without a box the text
/// is returned as is; an unclosed last box keeps everything after its command.
pub fn extract_boxed(text: &str, mode: BoxedMode) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut results: Vec<String> = Vec::new();
    let mut current = chars.len();
    let mut last_start: Option<usize> = None;
    let mut max_pos = chars.len();
    loop {
        let boxed = rfind(&chars, "\\boxed", current);
        let fbox = rfind(&chars, "\\fbox", current);
        let start = match (boxed, fbox) {
            (None, None) => break,
            (b, f) => b.max(f).expect("one found"),
        };
        let cmd_len = if boxed == Some(start) { 6 } else { 5 };
        let mut next = start + cmd_len;
        while next < max_pos && chars[next].is_whitespace() {
            next += 1;
        }
        if next >= max_pos {
            break;
        }
        if chars[next] != '{' {
            if results.is_empty() {
                results.push(chars[next..].iter().collect());
            }
            break;
        }
        let Some(end) = closing_brace(&chars, next, max_pos) else {
            if results.is_empty() {
                results.push(chars[next..].iter().collect());
            }
            break;
        };
        let content: String = chars[next + 1..end].iter().collect::<String>().trim().to_string();
        if let (BoxedMode::Last, Some(prev_start)) = (mode, last_start) {
            let between = &chars[(end + 1).min(prev_start)..prev_start];
            let prev = results.last().cloned().unwrap_or_default();
            let separated = between.iter().collect::<String>();
            let close = between.len() < 10;
            let listed = content != prev
                && between.len() < 70
                && ["and", "or", ",", ";"].iter().any(|s| separated.contains(s));
            if !(close || listed) {
                break;
            }
        }
        results.push(content);
        last_start = Some(start);
        max_pos = start;
        current = start;
    }
    if results.is_empty() {
        return text.to_string();
    }
    results.reverse();
    results.join(",")
}

/// Last index `< before` where `needle` starts.
fn rfind(chars: &[char], needle: &str, before: usize) -> Option<usize> {
    let n: Vec<char> = needle.chars().collect();
    (0..before.saturating_sub(n.len() - 1))
        .rev()
        .find(|&i| i + n.len() <= chars.len() && chars[i..i + n.len()] == n[..])
}

/// Index of the brace closing the one at `open`, looking no further than `max_pos`.
fn closing_brace(chars: &[char], open: usize, max_pos: usize) -> Option<usize> {
    let mut depth = 1usize;
    let mut i = open;
    while i + 1 < max_pos {
        i += 1;
        match chars[i] {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// `\sqrt3` → `\sqrt{3}`.
fn fix_sqrt(text: &str) -> String {
    if !text.contains("\\sqrt") {
        return text.to_string();
    }
    let mut parts = text.split("\\sqrt");
    let mut out = parts.next().unwrap_or_default().to_string();
    for part in parts {
        let part = part.trim_start();
        match part.chars().next() {
            Some(c) if c != '{' && c != '[' => {
                out.push_str("\\sqrt{");
                out.push(c);
                out.push('}');
                out.push_str(&part[c.len_utf8()..]);
            }
            _ => {
                out.push_str("\\sqrt");
                out.push_str(part);
            }
        }
    }
    out
}

/// `\frac12` → `\frac{1}{2}`, `\frac1{2}` → `\frac{1}{2}`.
fn fix_fracs(text: &str) -> String {
    let mut parts = text.split("\\frac");
    let mut out = parts.next().unwrap_or_default().to_string();
    for part in parts {
        let part = part.trim_start();
        out.push_str("\\frac");
        let chars: Vec<char> = part.chars().collect();
        if chars.first() == Some(&'{') {
            out.push_str(part);
        } else if chars.len() < 2 {
            return text.to_string();
        } else {
            let (a, b) = (chars[0], chars[1]);
            let rest: String = chars[2..].iter().collect();
            if b != '{' {
                out.push_str(&format!("{{{a}}}{{{b}}}{rest}"));
            } else {
                out.push_str(&format!("{{{a}}}{b}{rest}"));
            }
        }
    }
    out
}

/// `3/4` as the whole answer → `\frac{3}{4}`.
fn fix_a_slash_b(text: &str) -> String {
    let parts: Vec<&str> = text.split('/').collect();
    if parts.len() != 2 {
        return text.to_string();
    }
    match (python_int(parts[0]), python_int(parts[1])) {
        (Some(a), Some(b)) if text == format!("{a}/{b}") => format!("\\frac{{{a}}}{{{b}}}"),
        _ => text.to_string(),
    }
}

/// Python's `int(str)`: surrounding whitespace and a sign allowed.
fn python_int(s: &str) -> Option<i128> {
    let t = s.trim();
    let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
    if digits.is_empty()
        || !digits.chars().all(|c| c.is_ascii_digit() || c == '_')
        || digits.starts_with('_')
        || digits.ends_with('_')
    {
        return None;
    }
    let n: i128 = digits.replace('_', "").parse().ok()?;
    Some(if t.starts_with('-') { -n } else { n })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxes_units_and_shorthand() {
        assert_eq!(normalize(r"\boxed{\dfrac{1}{2}}", BoxedMode::All), r"\frac{1}{2}");
        assert_eq!(normalize(r"\boxed{3} then \boxed{5}", BoxedMode::Last), "3,5");
        // Far apart (70 characters or more between them), only the last box counts.
        let far = format!(r"\boxed{{3}} and {} \boxed{{5}}", "x".repeat(70));
        assert_eq!(normalize(&far, BoxedMode::Last), "5");
        assert_eq!(normalize(&far, BoxedMode::All), "3,5");
        assert_eq!(normalize(r"12 \text{ cm}", BoxedMode::All), "12");
        assert_eq!(normalize(r"16\text{ m}^2", BoxedMode::All), "16");
        assert_eq!(normalize(r"\left( 1, 2 \right)", BoxedMode::All), "( 1, 2 )");
        assert_eq!(normalize(r"\sqrt2", BoxedMode::All), r"\sqrt{2}");
        assert_eq!(normalize(r"\frac73", BoxedMode::All), r"\frac{7}{3}");
        assert_eq!(normalize("0.5", BoxedMode::All), r"\frac{1}{2}");
        assert_eq!(normalize(".75", BoxedMode::All), "0.75");
        assert_eq!(normalize("1/6", BoxedMode::All), r"\frac{1}{6}");
        assert_eq!(normalize(r"\$18", BoxedMode::All), "18");
        assert_eq!(normalize("5 apples", BoxedMode::All), "5");
    }
}
