//! Finding the answer in a reply, the way the reference grader's `parse` does: candidate
//! spans are found by patterns of increasing generality (a "final answer is" phrase, then
//! `\boxed{...}`, then "answer:", then any LaTeX span or bare number), each with a priority;
//! within the best priority that yields anything, spans are tried from the rightmost end
//! backwards and the first one that parses wins. The text of the first span tried is kept as
//! well: the reference also compares those texts as plain strings.
use super::latex;
use super::normalize::{normalize, BoxedMode};
use super::pyexpr;
use super::value::{Expr, Num, Value};
use fancy_regex::{Captures, Regex};
use std::sync::LazyLock;

/// What `parse` gives for one text: the parsed value of the chosen span, and the text of the
/// first span tried (normalised LaTeX or the number as read).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Extracted {
    pub value: Option<Value>,
    pub text: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Latex,
    Expr,
}

struct Pattern {
    re: Regex,
    kind: Kind,
    priority: u32,
    /// A `\boxed{...}` pattern, whose priority a caller may raise to the top.
    boxed: bool,
}

/// The LaTeX spans a candidate can be: `$$..$$`, `\[..\]`, `$..$`, `\(..\)`, ` [..] ` and a bare
/// numeric `\frac{a}{b}` (the last only outside boxes). With `boxed`, the span must hold a
/// `\boxed{...}`.
fn env_pattern(prefix: &str, boxed: bool) -> String {
    let shape = |content: &str| {
        if boxed {
            format!(r"{content}*?\\boxed\{{{content}+?\}}{content}*?")
        } else {
            format!("{content}+?")
        }
    };
    let display_dollar = shape(r"(?:[^$]|\$(?!\$))");
    let display_bracket = shape(r"(?:[^\\]|\\(?!\]))");
    let inline_dollar = shape(r"(?:\\[$]|[^\n$])");
    let inline_paren = shape(r"(?:[^\\\n]|\\(?!\)))");
    let inline_bracket = shape(r"[^\n\]\[]");
    let mut alts = vec![
        format!(r"(?<!\\)\$\$(?P<{prefix}latexDisplayDollar>{display_dollar})(?<!\\)\$\$"),
        format!(r"(?<!\\)\\\[(?P<{prefix}latexDisplayBracket>{display_bracket})(?<!\\)\\\]"),
        format!(r"(?<!\\|\d)\$(?P<{prefix}latexInlineDollar>{inline_dollar})(?<!\\)\$"),
        format!(r"(?<!\\)\\\((?P<{prefix}latexInlineParenthesis>{inline_paren})(?<!\\)\\\)"),
        format!(r"\s\[(?P<{prefix}latexInlineBracket>{inline_bracket})\]\s"),
    ];
    if !boxed {
        let n = r"-?\d+(?:[.,]\d+)?";
        alts.push(format!(r"(?P<{prefix}latexFraction>-?\\frac\{{{n}\}}\{{{n}\}})"));
    }
    let percent = format!(r"(?P<{prefix}percent>(?:\\?%|[Pp]ercent|[Pp]ercentage|[Pp]ct))");
    format!(r"(?:(?:{})\s*{percent}?)", alts.join("|"))
}

/// Up to six LaTeX spans joined by `,`, `and` or `or` (`$1$, $2$ and $3$`).
fn env_list(boxed: bool) -> String {
    let mut s = env_pattern("first_", boxed);
    for i in 1..=5 {
        let lead = if boxed { r"\s*" } else { "" };
        s.push_str(&format!(
            r"{lead}(?:\s*(?:,?and|,?or|,)\s*{})?",
            env_pattern(&format!("next{i}_"), boxed)
        ));
    }
    if boxed {
        s
    } else {
        format!("(?:{s})")
    }
}

const CURRENCY: &str = "$€£¥₹₽₪₩₫฿₡₢₣₤₥₦₧₨₩₪₫₭₮₯₰₱₲₳₴₵₶₷₸₹₺₻₼₽₾₿";

fn expr_or_number() -> (String, String, String) {
    let number = concat!(
        r"(?<!\d)(?:",
        r"(?P<integer1>-?[1-9]\d{0,2}(?:[ ,]\d{3})+)(?P<decimal1>\.\d+)?|",
        r"(?P<integer2>-?\d+)(?P<decimal2>[.,]\d+)|",
        r"(?P<decimal3>\.\d+)|",
        r"(?P<integer3>-?\d+)",
        r")(?P<percent>\s*(?:%|[Pp]ercent|\s*[Pp]ercentage|\s*[Pp]ct))?"
    );
    let chars = r"[\d.\s+\-*×/^()÷]";
    let ops = r"[+\-*×/^()÷]";
    let expr = format!(r"(?P<expr>-?\(?-?\d{chars}*{ops}{chars}+\)?)");
    let prefix = r"(?:^|\s|=)(?:\*\*)?";
    let suffix = r"(?:\*\*)?(?:\.|,|:|\s|\)|\$|$)";
    let with_expr = format!("(?:{prefix}{expr}{suffix})");
    let with_number = format!("(?:{prefix}[{CURRENCY}]?{number})");
    let either = format!("(?:{with_expr}|{with_number})");
    (with_expr, with_number, either)
}

static PATTERNS: LazyLock<Vec<Pattern>> = LazyLock::new(|| {
    let mut out = Vec::new();
    let mut add = |re: String, kind, priority| {
        let re = Regex::new(&re).unwrap_or_else(|e| panic!("answer pattern does not compile: {e}"));
        let boxed = re.as_str().contains(r"\\boxed");
        out.push(Pattern { re, kind, priority, boxed });
    };
    // LaTeX spans (`.` spans lines here).
    let envs = env_list(false);
    add(format!(r"(?s)(?i:final answer is):?\s*{envs}\.?\s?I hope"), Kind::Latex, 0);
    add(format!(r"(?s)(?i:final answer.{{0,100}}?)\s+is:?\s*{envs}"), Kind::Latex, 50);
    add(format!(r"(?s)(?i:answer):.{{0,50}}?{envs}"), Kind::Latex, 100);
    add(format!(r"(?s)(?i:answer).{{0,50}}?{envs}"), Kind::Latex, 200);
    add(format!(r"(?s){envs}"), Kind::Latex, 300);
    add(format!(r"(?s){}", env_list(true)), Kind::Latex, 50);
    // A box whose end cannot be told by a pattern: from the first `\boxed{` to the last `}`;
    // the box itself is cut out by the normalisation.
    add(r"(?s)(?P<first_latexBoxed>\\boxed\{.+\})".to_string(), Kind::Latex, 50);
    // Plain numbers and arithmetic.
    let (with_expr, with_number, either) = expr_or_number();
    add(format!(r"(?i:final answer is):?\s*{either}\.?\s?I hope"), Kind::Expr, 0);
    add(format!(r"(?i:final answer.{{0,100}}?)\s+is:?{either}"), Kind::Expr, 50);
    add(format!(r"(?i:answer):(?:.{{0,100}}=\s*|.{{0,50}}?){either}(?!\s*=)"), Kind::Expr, 100);
    add(format!(r"(?i:answer)(?:.{{0,100}}=\s*|.{{0,50}}?){either}(?!\s*=)"), Kind::Expr, 200);
    add(with_expr, Kind::Expr, 300);
    add(with_number, Kind::Expr, 300);
    out
});

const ENV_KINDS: &[&str] = &[
    "latexDisplayDollar",
    "latexDisplayBracket",
    "latexInlineDollar",
    "latexInlineParenthesis",
    "latexInlineBracket",
    "latexFraction",
    "latexBoxed",
];

/// Reads the answer of `text` as the reference's `parse` does.
pub fn extract(text: &str) -> Extracted {
    extract_with(text, false)
}

/// `extract`, optionally with boxed answers ranked above every other pattern (the reference's
/// `boxed_match_priority=0`).
pub fn extract_with(text: &str, boxed_first: bool) -> Extracted {
    let priority = |p: &Pattern| if boxed_first && p.boxed { 0 } else { p.priority };
    let mut patterns: Vec<&Pattern> = PATTERNS.iter().collect();
    // Stable: LaTeX patterns stay ahead of expression patterns of the same priority.
    patterns.sort_by_key(|p| priority(p));
    let mut first_text: Option<String> = None;
    let mut i = 0;
    while i < patterns.len() {
        let level = priority(patterns[i]);
        let group: Vec<&Pattern> =
            patterns[i..].iter().copied().take_while(|p| priority(p) == level).collect();
        i += group.len();
        let mut found: Vec<(usize, usize, Kind, Captures)> = Vec::new();
        for p in &group {
            for caps in p.re.captures_iter(text) {
                // The engine gives up on pathological backtracking; the matches so far stand.
                let Ok(caps) = caps else { break };
                let m = caps.get(0).expect("group 0");
                found.push((m.start(), m.end(), p.kind, caps));
            }
        }
        // Rightmost end first; of two ending together, the longer first.
        found.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        for (_, _, kind, caps) in &found {
            let (value, span_text) = match kind {
                Kind::Latex => latex_candidate(caps),
                Kind::Expr => expr_candidate(caps),
            };
            if first_text.is_none() && !span_text.is_empty() {
                first_text = Some(span_text);
            }
            if value.is_some() {
                return Extracted { value, text: first_text };
            }
        }
    }
    Extracted { value: None, text: first_text }
}

/// The LaTeX spans of a match, each normalised and parsed; several spans that all parse make
/// one set.
fn latex_candidate(caps: &Captures) -> (Option<Value>, String) {
    let mut spans = Vec::new();
    for prefix in std::iter::once("first_".to_string()).chain((1..=5).map(|i| format!("next{i}_")))
    {
        let hit = ENV_KINDS.iter().find_map(|k| {
            caps.name(&format!("{prefix}{k}"))
                .filter(|m| !m.as_str().is_empty())
                .map(|m| (m.as_str(), *k))
        });
        if let Some((span, kind)) = hit {
            let percent =
                caps.name(&format!("{prefix}percent")).is_some_and(|m| !m.as_str().is_empty());
            spans.push((span, kind, percent));
        }
    }
    let mut values = Vec::new();
    let mut texts = Vec::new();
    for (span, kind, percent) in spans {
        let mode = if kind == "latexBoxed" { BoxedMode::Last } else { BoxedMode::All };
        let norm = normalize(span, mode);
        let mut value = parse_latex(&norm);
        if percent {
            value = match value {
                Some(Value::Expr(e)) => Some(Value::Expr(e.percent())),
                _ => None,
            };
        }
        values.push(value);
        texts.push(norm);
    }
    if values.is_empty() {
        return (None, String::new());
    }
    if values.len() > 1 && values.iter().all(Option::is_some) {
        let mut items = Vec::new();
        for v in values.into_iter().flatten() {
            match v {
                Value::Set(inner) => items.extend(inner),
                v => items.push(v),
            }
        }
        return (Some(Value::Set(items)), texts.join(" and "));
    }
    (values.swap_remove(0), texts.swap_remove(0))
}

static EQ_SPLIT: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?<!\\|<|!|>)=").expect("valid regex"));

/// Parses normalised LaTeX; a chain `a = b = c` that does not parse is retried on its last part.
pub fn parse_latex(norm: &str) -> Option<Value> {
    match latex::parse(norm) {
        Ok(v) => Some(v),
        Err(_) => {
            let last = last_equation_part(norm);
            if last != norm {
                latex::parse(last).ok()
            } else {
                None
            }
        }
    }
}

fn last_equation_part(s: &str) -> &str {
    if s.contains(',') || s.contains(';') {
        return s;
    }
    let mut parts = Vec::new();
    let mut last = 0;
    for m in EQ_SPLIT.find_iter(s).flatten() {
        parts.push(&s[last..m.start()]);
        last = m.end();
    }
    parts.push(&s[last..]);
    if parts.len() > 2 {
        parts[parts.len() - 1]
    } else {
        s
    }
}

/// A plain number (with separators, a decimal comma, a percent sign) or an arithmetic
/// expression.
fn expr_candidate(caps: &Captures) -> (Option<Value>, String) {
    let group = |names: &[&str]| {
        names
            .iter()
            .find_map(|n| caps.name(n).map(|m| m.as_str()).filter(|s| !s.is_empty()))
            .unwrap_or("")
    };
    let integer = group(&["integer1", "integer2", "integer3"]);
    let decimal = group(&["decimal1", "decimal2", "decimal3"]);
    let percent = !group(&["percent"]).is_empty();
    if !integer.is_empty() || !decimal.is_empty() {
        let digits: String = integer.chars().filter(|c| *c != ',' && *c != ' ').collect();
        let mut digits = digits.trim_start_matches('0').to_string();
        if digits.is_empty() {
            digits = "0".into();
        }
        let text = format!("{digits}{}", decimal.replace(',', "."));
        let Some(num) = number_literal(&text) else { return (None, text) };
        let e = Expr::Num(num);
        let e = if percent { e.percent() } else { e };
        return (Some(Value::Expr(e)), text);
    }
    let expr = group(&["expr"]);
    if expr.is_empty() {
        return (None, String::new());
    }
    let value = pyexpr::parse(&expr.replace('\n', " ").replace('^', "**")).map(Value::Expr);
    (value, expr.to_string())
}

/// sympy's `Number(str)`: an integer, or a float when there is a decimal point.
fn number_literal(text: &str) -> Option<Num> {
    if text.contains('.') {
        return text.parse::<f64>().ok().map(Num::Float);
    }
    match text.parse::<i128>() {
        Ok(n) => Some(Num::Int(n)),
        Err(_) => text.parse::<f64>().ok().map(Num::Float),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_of(s: &str) -> Option<String> {
        extract(s).text
    }

    #[test]
    fn patterns_compile_and_pick_the_expected_span() {
        assert_eq!(text_of("The answer is 5."), Some("5".into()));
        assert_eq!(
            text_of("So 6 times 7 is 42, and the final result is \\boxed{42}. Note 43 is wrong."),
            Some("42".into())
        );
        assert_eq!(text_of("She has 1,000 coins."), Some("1000".into()));
        assert_eq!(text_of("We get $\\frac{1}{2}$."), Some("\\frac{1}{2}".into()));
        assert_eq!(text_of("The values are $1$, $2$, and $3$."), Some("3".into()));
        assert_eq!(text_of("no digits here"), None);
        assert_eq!(text_of("First \\boxed{3}, then the result is \\boxed{5}."), Some("3,5".into()));
    }
}
