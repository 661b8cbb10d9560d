//! A LaTeX math parser for final answers, reading them the way the reference grader's parser
//! (`latex2sympy2_extended`, behind `math_verify`) does on the forms answers take: numbers,
//! fractions, radicals, powers, implicit products, functions, relations, intervals, tuples and
//! sets. Its quirks are kept on purpose because graded verdicts depend on them: two adjacent
//! integers read as a mixed number (`2 3` is 5, `2\frac{1}{2}` is 5/2), `(a, b)` with a < b is
//! an open interval, braces standing alone make a set, `\text{...}` is one symbol. Anything
//! outside the subset is an error, which the caller treats like the reference's parse failure.
use super::value::{add_flat, mul_flat, Const, Expr, Func, Num, Rel, RelOp, Value};
use std::sync::LazyLock;
use thiserror::Error;

#[derive(Debug, Error, PartialEq)]
pub enum LatexError {
    #[error("unexpected character {0:?}")]
    Char(char),
    #[error("unsupported command \\{0}")]
    Command(String),
    #[error("unbalanced braces")]
    Unbalanced,
    #[error("unexpected {0}")]
    Unexpected(String),
    #[error("unexpected end of input")]
    End,
    #[error("number out of range: {0}")]
    Range(String),
    #[error("nested too deeply")]
    TooDeep,
}

type Res<T> = Result<T, LatexError>;

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    /// Digits with an optional decimal part, or an exponent form `1.5E3`.
    Num(String),
    Letter(char),
    /// `\name` without the backslash.
    Cmd(String),
    Ch(char),
    /// The content of `\text{...}` and its relatives.
    Text(String),
    /// A differential: `d` followed by a letter or a command name (`dx`, `d\theta`), which the
    /// reference's lexer reads as one symbol, the name kept as written.
    Diff(String),
    /// `\{` and `\}`.
    LSet,
    RSet,
    /// `\\`, the row break of a matrix.
    RowSep,
}

impl Tok {
    fn describe(&self) -> String {
        match self {
            Tok::Num(n) => n.clone(),
            Tok::Letter(c) | Tok::Ch(c) => c.to_string(),
            Tok::Cmd(c) => format!("\\{c}"),
            Tok::Text(t) => format!("\\text{{{t}}}"),
            Tok::Diff(d) => d.clone(),
            Tok::LSet => "\\{".into(),
            Tok::RSet => "\\}".into(),
            Tok::RowSep => "\\\\".into(),
        }
    }
}

const GREEK: &[&str] = &[
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "varepsilon",
    "zeta",
    "eta",
    "theta",
    "vartheta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "rho",
    "varrho",
    "sigma",
    "varsigma",
    "tau",
    "upsilon",
    "phi",
    "varphi",
    "chi",
    "psi",
    "omega",
    "Gamma",
    "Delta",
    "Theta",
    "Lambda",
    "Xi",
    "Sigma",
    "Upsilon",
    "Phi",
    "Psi",
    "Omega",
];

/// Symbol commands other than Greek letters (`\angle`, `\triangle`, `\prime`, ...): each reads as
/// a symbol of its own name, so `\angle 60^\circ` is a product, not 60.
const OTHER_SYMBOLS: &[&str] = &[
    "Bbbk",
    "wp",
    "nabla",
    "bigstar",
    "angle",
    "nexists",
    "diagdown",
    "measuredangle",
    "eth",
    "diagup",
    "sphericalangle",
    "clubsuit",
    "varnothing",
    "Diamond",
    "complement",
    "diamondsuit",
    "imath",
    "Finv",
    "triangledown",
    "heartsuit",
    "jmath",
    "Game",
    "triangle",
    "spadesuit",
    "ell",
    "hbar",
    "vartriangle",
    "hslash",
    "blacklozenge",
    "lozenge",
    "blacksquare",
    "mho",
    "blacktriangle",
    "sharp",
    "prime",
    "Im",
    "flat",
    "square",
    "backprime",
    "Re",
    "natural",
    "surd",
    "circledS",
];

/// A command that reads as a symbol: a Greek letter or one of [`OTHER_SYMBOLS`].
fn is_symbol_cmd(name: &str) -> bool {
    GREEK.contains(&name) || OTHER_SYMBOLS.contains(&name)
}

const FUNCS: &[&str] = &[
    "sin", "cos", "tan", "csc", "sec", "cot", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh",
    "log", "ln", "exp", "max", "min", "gcd", "lcm",
];

/// Commands that only change spacing or sizing.
const IGNORED: &[&str] = &[
    "left",
    "right",
    "mleft",
    "mright",
    "big",
    "Big",
    "bigg",
    "Bigg",
    "bigl",
    "bigr",
    "Bigl",
    "Bigr",
    "biggl",
    "biggr",
    "middle",
    "quad",
    "qquad",
    "displaystyle",
    "textstyle",
    "limits",
    "negthinspace",
    "negmedspace",
    "negthickspace",
    "thinspace",
    "medspace",
    "thickspace",
];

const TEXT_CMDS: &[&str] = &[
    "text",
    "mbox",
    "textbf",
    "textit",
    "textrm",
    "textnormal",
    "textsf",
    "texttt",
    "mathrm",
    "mathit",
    "mathbf",
    "mathsf",
    "mathtt",
];

/// The letter-only command names the reference's lexer reads as one token (read off the lexer of
/// latex2sympy2_extended 1.10.2, which math_verify 0.8.0 uses), space-separated.
const LEXER_COMMANDS: &str = concat!(
    "Bbbk Delta Diamond Finv Game Gamma Im Lambda Leftrightarrow Longrightarrow Omega Phi Pi Psi Re Rightarrow Sigma Theta Upsilon Xi ",
    "alpha angle approx arccos arccosh arccot arccsc arcosh arcsec arcsin arcsinh arctan arctanh arsinh artanh backprime beta bigstar ",
    "binom blacklozenge blacksquare blacktriangle boxed cap cdot ceil cfrac chi choose circledS clubsuit complement cos cosh cot csc ",
    "cup dbinom delta det dfrac diagdown diagup diamondsuit div ell emptyset epsilon equiv eta eth exp exponentialE flat floor frac ",
    "gamma gcd ge geq geqslant gt hbar heartsuit hfil hslash imath in infty int iota jmath kappa lambda langle lbrace lbrack lceil lcm ",
    "le leftrightarrow leq leqslant lfloor lgroup lim llcorner ln log longrightarrow lozenge lrcorner lt lvert mathit max ",
    "measuredangle medspace mho min mod mp mu nabla natural ne negmedspace negthickspace negthinspace neq nexists notin nu omega ",
    "omicron operatorname over partial phantom phi pi pm prime prod psi qquad quad rangle rbrace rbrack rceil rfloor rgroup rho ",
    "rightarrow rvert sec setminus sharp sigma sin sinh spadesuit sphericalangle sqrt square subseteq sum supseteq surd tan tanh tau ",
    "tbinom tfrac theta thickspace thinspace times to triangle triangledown ulcorner upsilon urcorner varepsilon varnothing varphi ",
    "varpi varrho varsigma vartheta vartriangle vbox vcenter vert vrule vskip vspace wp xRightarrow xi xrightarrow zeta",
);

/// Commands read whole although the lexer's vocabulary lacks them: the reference's normalisation
/// rewrites them before its lexer runs.
const READ_WHOLE: &[&str] = &["mathbb", "begin", "end", "circ", "degree", "infinity"];

/// How many letters of a command name the reference's lexer takes as the command. It has a fixed
/// vocabulary and takes the longest entry a name starts with, the rest being letters: `\angleRQB`
/// is `\angle` R Q B, `\pix` is π·x. A name starting with no entry is kept whole (and fails).
fn command_len(name: &str) -> usize {
    let vocabulary = || LEXER_COMMANDS.split(' ');
    if vocabulary().any(|c| c == name)
        || IGNORED.contains(&name)
        || TEXT_CMDS.contains(&name)
        || READ_WHOLE.contains(&name)
    {
        return name.len();
    }
    vocabulary().filter(|c| name.starts_with(c)).map(str::len).max().unwrap_or(name.len())
}

fn tokenize(s: &str) -> Res<Vec<Tok>> {
    let chars: Vec<char> = s.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit()))
        {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            if i + 1 < chars.len() && chars[i] == '.' && chars[i + 1].is_ascii_digit() {
                i += 1;
                while i < chars.len() && chars[i].is_ascii_digit() {
                    i += 1;
                }
            }
            let mut text: String = chars[start..i].iter().collect();
            // `1.5E3` is one number; a lower-case `e` is Euler's number.
            if chars.get(i) == Some(&'E') {
                let mut j = i + 1;
                if matches!(chars.get(j), Some('+' | '-')) {
                    j += 1;
                }
                if chars.get(j).is_some_and(|d| d.is_ascii_digit()) {
                    while j < chars.len() && chars[j].is_ascii_digit() {
                        j += 1;
                    }
                    text.extend(&chars[i..j]);
                    i = j;
                }
            }
            toks.push(Tok::Num(text));
        } else if let Some(env) = ENV_WORDS.iter().find(|w| starts_with(&chars, i, w)) {
            // Environment names are words of their own, whatever letters they contain.
            toks.extend(env.chars().map(Tok::Letter));
            i += env.chars().count();
        } else if let Some(word) = OPERATOR_WORDS.iter().find(|w| starts_with(&chars, i, w)) {
            return Err(LatexError::Unexpected((*word).to_string()));
        } else if let Some((name, end)) = differential(&chars, i) {
            toks.push(Tok::Diff(name));
            i = end;
        } else if c.is_ascii_alphabetic() {
            toks.push(Tok::Letter(c));
            i += 1;
        } else if c == '\\' {
            i += 1;
            let Some(&n) = chars.get(i) else { return Err(LatexError::End) };
            if n.is_ascii_alphabetic() {
                let start = i;
                while i < chars.len() && chars[i].is_ascii_alphabetic() {
                    i += 1;
                }
                let whole: String = chars[start..i].iter().collect();
                // The letters after the command are lexed again as letters.
                i = start + command_len(&whole);
                let name: String = chars[start..i].iter().collect();
                if IGNORED.contains(&name.as_str()) {
                    continue;
                }
                if TEXT_CMDS.contains(&name.as_str()) {
                    while i < chars.len() && chars[i].is_whitespace() {
                        i += 1;
                    }
                    if chars.get(i) != Some(&'{') {
                        return Err(LatexError::Unexpected(format!("\\{name} without braces")));
                    }
                    let close = matching_brace(&chars, i).ok_or(LatexError::Unbalanced)?;
                    toks.push(Tok::Text(chars[i + 1..close].iter().collect()));
                    i = close + 1;
                    continue;
                }
                match name.as_str() {
                    "lbrack" => toks.push(Tok::Ch('[')),
                    "rbrack" => toks.push(Tok::Ch(']')),
                    "vert" | "lvert" | "rvert" => toks.push(Tok::Ch('|')),
                    "lt" => toks.push(Tok::Ch('<')),
                    "gt" => toks.push(Tok::Ch('>')),
                    _ => toks.push(Tok::Cmd(name)),
                }
            } else {
                i += 1;
                match n {
                    ',' | ';' | ':' | '!' | ' ' | '$' | '>' => {}
                    '{' => toks.push(Tok::LSet),
                    '}' => toks.push(Tok::RSet),
                    '%' => toks.push(Tok::Ch('%')),
                    '\\' => toks.push(Tok::RowSep),
                    c => return Err(LatexError::Char(c)),
                }
            }
        } else {
            i += 1;
            match c {
                '+' | '-' | '*' | '/' | '^' | '_' | '(' | ')' | '[' | ']' | '{' | '}' | '|'
                | ',' | ';' | '=' | '<' | '>' | '!' | ':' | '%' | '&' => toks.push(Tok::Ch(c)),
                '−' => toks.push(Tok::Ch('-')),
                '×' => toks.push(Tok::Cmd("times".into())),
                '·' => toks.push(Tok::Cmd("cdot".into())),
                '÷' => toks.push(Tok::Cmd("div".into())),
                '≤' => toks.push(Tok::Cmd("le".into())),
                '≥' => toks.push(Tok::Cmd("ge".into())),
                '≠' => toks.push(Tok::Cmd("neq".into())),
                '±' => toks.push(Tok::Cmd("pm".into())),
                'π' => toks.push(Tok::Cmd("pi".into())),
                '∞' => toks.push(Tok::Cmd("infty".into())),
                c => return Err(LatexError::Char(c)),
            }
        }
    }
    Ok(drop_degrees(toks))
}

/// The names of matrix environments, read as plain words.
const ENV_WORDS: &[&str] = &["pmatrix", "bmatrix", "Bmatrix", "vmatrix", "matrix", "array"];

/// Operator names that the reference's lexer picks out of any run of letters (the `tr` in
/// `triangle`, the `ones` in `bones`, the `orth` in `north`); outside `\operatorname{...}` they
/// make the answer unreadable to it.
const OPERATOR_WORDS: &[&str] = &[
    "tr",
    "rank",
    "rref",
    "eye",
    "eig",
    "zeros",
    "ones",
    "cols",
    "rows",
    "diag",
    "norm",
    "nullspace",
    "svd",
    "gcd",
    "lcm",
    "floor",
    "ceil",
    "hstack",
    "vstack",
    // The lexer commits to `orthogonalize` from its fourth letter on.
    "orth",
    "arsinh",
    "arcsinh",
    "arcosh",
    "arccosh",
    "artanh",
    "arctanh",
];

fn starts_with(chars: &[char], i: usize, word: &str) -> bool {
    let n = word.chars().count();
    chars.len() >= i + n && chars[i..i + n].iter().copied().eq(word.chars())
}

/// `d` followed (after spaces) by a letter or a command name: the symbol `dx`, `dtheta`, ...,
/// and the index after it.
fn differential(chars: &[char], i: usize) -> Option<(String, usize)> {
    if chars[i] != 'd' {
        return None;
    }
    let mut j = i + 1;
    while chars.get(j).is_some_and(|c| c.is_whitespace()) {
        j += 1;
    }
    match chars.get(j)? {
        c if c.is_ascii_alphabetic() => Some((format!("d{c}"), j + 1)),
        '\\' => {
            let start = j + 1;
            let end = (start..chars.len())
                .find(|&k| !chars[k].is_ascii_alphabetic())
                .unwrap_or(chars.len());
            (end > start)
                .then(|| (format!("d{}", chars[start..end].iter().collect::<String>()), end))
        }
        _ => None,
    }
}

/// `^\circ` and `^{\circ}` mark degrees, which the reference ignores.
fn drop_degrees(toks: Vec<Tok>) -> Vec<Tok> {
    let is_deg = |t: &Tok| matches!(t, Tok::Cmd(c) if c == "circ" || c == "degree");
    let mut out = Vec::with_capacity(toks.len());
    let mut i = 0;
    while i < toks.len() {
        if toks[i] == Tok::Ch('^') {
            if toks.get(i + 1).is_some_and(is_deg) {
                i += 2;
                continue;
            }
            if toks.get(i + 1) == Some(&Tok::Ch('{'))
                && toks.get(i + 2).is_some_and(is_deg)
                && toks.get(i + 3) == Some(&Tok::Ch('}'))
            {
                i += 4;
                continue;
            }
        }
        out.push(toks[i].clone());
        i += 1;
    }
    out
}

/// Index of the `}` closing the `{` at `open`.
fn matching_brace(chars: &[char], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (k, &c) in chars.iter().enumerate().skip(open) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(k);
                }
            }
            _ => {}
        }
    }
    None
}

/// A whole answer that is one number with thousands separators (`1,000`): the reference reads
/// it as that number, not as the set {1, 0}.
static COMMA_NUMBER: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(r"^\s*-?\d{1,3}(,\d{3})+(\.\d+)?\s*$").expect("valid regex")
});

/// Parses a normalised LaTeX answer.
pub fn parse(s: &str) -> Res<Value> {
    if COMMA_NUMBER.is_match(s) {
        let digits: String =
            s.chars().filter(|c| !matches!(c, ',' | ' ') && !c.is_whitespace()).collect();
        return Ok(Value::Expr(Expr::Num(number(&digits)?)));
    }
    let toks = tokenize(s)?;
    let mut p = Parser { toks, pos: 0, abs_depth: 0, in_func_arg: 0, depth: 0 };
    let mut v = p.math()?;
    if p.pos < p.toks.len() {
        return Err(LatexError::Unexpected(p.toks[p.pos].describe()));
    }
    if LOOKS_COMPLEX.is_match(s) {
        v.mark_complex();
    }
    Ok(v)
}

/// What makes the reference read an answer's symbols as complex: a standalone `i` and a few
/// complex-number and matrix commands.
static LOOKS_COMPLEX: LazyLock<regex::Regex> = LazyLock::new(|| {
    let signs = [
        r"\\mathbb\{C\}",
        r"\\i\b",
        r"\bi\b",
        r"\\text\{i\}",
        r"\\mathrm\{i\}",
        r"\\imath\b",
        r"\\det",
        r"\\operatorname\{tr\}",
        r"\\operatorname\{rank\}",
        r"\\text\{rank\}",
        r"\\arg\{",
        r"\\Re\{",
        r"\\Im\{",
        r"\\operatorname\{Re\}",
        r"\\operatorname\{Im\}",
        r"\\text\{Re\}",
        r"\\text\{Im\}",
    ];
    regex::Regex::new(&signs.join("|")).expect("valid regex")
});

/// A number literal: an integer when it has no decimal point, else a float.
fn number(text: &str) -> Res<Num> {
    let t = text.replace(',', "");
    if t.contains(['.', 'E']) {
        return t.parse::<f64>().map(Num::Float).map_err(|_| LatexError::Range(t.clone()));
    }
    let digits = t.trim_start_matches('-');
    match digits.parse::<i128>() {
        Ok(n) => Ok(Num::Int(if t.starts_with('-') { -n } else { n })),
        // Too long for an exact integer: keep its magnitude.
        Err(_) => t.parse::<f64>().map(Num::Float).map_err(|_| LatexError::Range(t.clone())),
    }
}

fn relop(t: &Tok) -> Option<&'static str> {
    Some(match t {
        Tok::Ch('=') => "=",
        Tok::Ch('<') => "<",
        Tok::Ch('>') => ">",
        Tok::Cmd(c) => match c.as_str() {
            "le" | "leq" | "leqslant" => "<=",
            "ge" | "geq" | "geqslant" => ">=",
            "neq" | "ne" => "!=",
            "in" => "in",
            "approx" => "~",
            _ => return None,
        },
        _ => return None,
    })
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
    abs_depth: usize,
    /// Inside an unparenthesised function argument, where another function ends the argument
    /// (`\sin x \cos x` is sin(x)·cos(x)).
    in_func_arg: usize,
    /// Nesting of sub-expressions, bounded so that degenerate input cannot exhaust the stack.
    depth: usize,
}

/// Deeper nesting than any answer needs; beyond it the text does not parse.
const MAX_DEPTH: usize = 64;

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }
    fn peek_at(&self, k: usize) -> Option<&Tok> {
        self.toks.get(self.pos + k)
    }
    fn next(&mut self) -> Res<Tok> {
        let t = self.toks.get(self.pos).cloned().ok_or(LatexError::End)?;
        self.pos += 1;
        Ok(t)
    }
    fn eat(&mut self, t: &Tok) -> bool {
        if self.peek() == Some(t) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, t: &Tok) -> Res<()> {
        if self.eat(t) {
            Ok(())
        } else {
            Err(self
                .peek()
                .map(|t| LatexError::Unexpected(t.describe()))
                .unwrap_or(LatexError::End))
        }
    }
    fn peek_cmd(&self, names: &[&str]) -> bool {
        matches!(self.peek(), Some(Tok::Cmd(c)) if names.contains(&c.as_str()))
    }

    /// The whole answer: one element, or a list of them (a set).
    fn math(&mut self) -> Res<Value> {
        let start = self.pos;
        if let Some(v) = self.try_assignment_list()? {
            return Ok(v);
        }
        self.pos = start;
        let groups = self.element_groups(true)?;
        Ok(groups_to_value(groups))
    }

    /// `x = 1, 2` and `x \in \{1, 2\}`: a symbol set equal to the rest of the list, read as one
    /// equation with a set on the right, as the reference does.
    fn try_assignment_list(&mut self) -> Res<Option<Value>> {
        let Some(lhs) = self.atom_list() else { return Ok(None) };
        if !(self.eat(&Tok::Ch('=')) || self.eat(&Tok::Cmd("in".into()))) {
            return Ok(None);
        }
        if self.toks[self.pos..].iter().any(|t| relop(t).is_some()) {
            return Ok(None);
        }
        let groups = self.element_groups(false)?;
        if self.pos < self.toks.len() {
            return Ok(None);
        }
        let rhs = groups_to_value(groups);
        Ok(Some(Value::Rel(vec![Rel { lhs, op: RelOp::Eq, rhs }])))
    }

    /// A symbol such as `x` or `a_n`, or a parenthesised list of them.
    fn atom_list(&mut self) -> Option<Value> {
        let single = |p: &mut Parser| -> Option<Expr> {
            match p.peek()? {
                Tok::Letter(_) | Tok::Text(_) | Tok::Diff(_) => {}
                Tok::Cmd(c) if is_symbol_cmd(c) => {}
                _ => return None,
            }
            let e = p.atom().ok()?;
            matches!(e, Expr::Sym(_)).then_some(e)
        };
        if self.eat(&Tok::Ch('(')) {
            let mut items = vec![Value::Expr(single(self)?)];
            while self.eat(&Tok::Ch(',')) {
                items.push(Value::Expr(single(self)?));
            }
            self.eat(&Tok::Ch(')')).then_some(Value::Tuple(items))
        } else {
            single(self).map(Value::Expr)
        }
    }

    /// Elements separated by `,` (inner lists) and `;` (outer lists).
    fn element_groups(&mut self, relations: bool) -> Res<Vec<Vec<Value>>> {
        if self.depth >= MAX_DEPTH {
            return Err(LatexError::TooDeep);
        }
        self.depth += 1;
        let groups = self.element_groups_inner(relations);
        self.depth -= 1;
        groups
    }

    fn element_groups_inner(&mut self, relations: bool) -> Res<Vec<Vec<Value>>> {
        let mut groups = vec![self.element(relations)?];
        loop {
            if self.eat(&Tok::Ch(',')) {
                let more = self.element(relations)?;
                groups.last_mut().expect("one group").extend(more);
            } else if self.eat(&Tok::Ch(';')) {
                groups.push(self.element(relations)?);
            } else {
                return Ok(groups);
            }
        }
    }

    /// One list element; `a \pm b` gives two.
    fn element(&mut self, relations: bool) -> Res<Vec<Value>> {
        if self.eat(&Tok::Cmd("pm".into())) {
            let e = self.expr()?;
            return Ok(vec![Value::Expr(e.clone().neg()), Value::Expr(e)]);
        }
        let v = if relations { self.relation()? } else { self.set_expr()? };
        if let (Value::Expr(a), true) = (&v, self.peek_cmd(&["pm"])) {
            self.pos += 1;
            let b = self.expr()?;
            return Ok(vec![
                Value::Expr(add_flat(a.clone(), b.clone())),
                Value::Expr(add_flat(a.clone(), b.neg())),
            ]);
        }
        Ok(vec![v])
    }

    /// A chain of relations, or a single operand.
    fn relation(&mut self) -> Res<Value> {
        let mut cur = self.set_expr()?;
        let mut chain: Vec<Rel> = Vec::new();
        while let Some(op) = self.peek().and_then(relop) {
            self.pos += 1;
            // `<=` and `>=` written with two characters.
            let op = match (op, self.peek()) {
                ("<", Some(Tok::Ch('='))) => {
                    self.pos += 1;
                    "<="
                }
                (">", Some(Tok::Ch('='))) => {
                    self.pos += 1;
                    ">="
                }
                (op, _) => op,
            };
            let rhs = self.set_expr()?;
            if op == "~" {
                // An approximation keeps the exact side: the value a symbol is said to have,
                // else the left side.
                if chain.is_empty() {
                    if !only_symbols_value(&cur) {
                        continue;
                    }
                    cur = rhs;
                }
                continue;
            }
            let op = match op {
                "=" | "in" => RelOp::Eq,
                "<" => RelOp::Lt,
                ">" => RelOp::Gt,
                "<=" => RelOp::Le,
                ">=" => RelOp::Ge,
                _ => RelOp::Ne,
            };
            let lhs = chain.last().map(|r| r.rhs.clone()).unwrap_or(cur.clone());
            chain.push(Rel { lhs, op, rhs: rhs.clone() });
            cur = rhs;
        }
        Ok(if chain.is_empty() { cur } else { Value::Rel(chain) })
    }

    /// Set operands joined by `\cup` or `\setminus`.
    fn set_expr(&mut self) -> Res<Value> {
        let mut left = self.set_inter()?;
        loop {
            if self.eat(&Tok::Cmd("setminus".into())) {
                let right = self.set_inter()?;
                left =
                    set_minus(left, right).ok_or_else(|| LatexError::Command("setminus".into()))?;
                continue;
            }
            if !self.eat(&Tok::Cmd("cup".into())) {
                break;
            }
            let right = self.set_inter()?;
            let mut parts = Vec::new();
            for v in [left, right] {
                match v {
                    Value::Union(p) => parts.extend(p),
                    Value::Tuple(items) => parts.push(Value::Set(items)),
                    v => parts.push(v),
                }
            }
            left = Value::Union(parts);
        }
        Ok(left)
    }

    /// Set operands joined by `\cap`, which binds tighter than `\cup`. The reference leaves an
    /// intersection unevaluated, equal only to the same intersection, so its operands are kept
    /// in a fixed order rather than intersected.
    fn set_inter(&mut self) -> Res<Value> {
        let first = self.set_term()?;
        let mut parts = vec![first];
        while self.eat(&Tok::Cmd("cap".into())) {
            parts.push(self.set_term()?);
        }
        if parts.len() == 1 {
            return Ok(parts.pop().expect("one operand"));
        }
        parts.sort_by_cached_key(|p| format!("{p:?}"));
        Ok(Value::Intersection(parts))
    }

    fn set_term(&mut self) -> Res<Value> {
        match self.peek() {
            Some(Tok::LSet) => {
                self.pos += 1;
                if self.eat(&Tok::RSet) {
                    return Ok(Value::Empty);
                }
                let groups = self.element_groups(true)?;
                self.expect(&Tok::RSet)?;
                Ok(Value::Set(groups.into_iter().flatten().collect()))
            }
            Some(Tok::Cmd(c)) if c == "emptyset" => {
                self.pos += 1;
                Ok(Value::Empty)
            }
            Some(Tok::Cmd(c)) if c == "mathbb" => {
                self.pos += 1;
                self.expect(&Tok::Ch('{'))?;
                let Tok::Letter(l) = self.next()? else {
                    return Err(LatexError::Unexpected("\\mathbb".into()));
                };
                self.expect(&Tok::Ch('}'))?;
                Ok(Value::Named(l.to_string()))
            }
            Some(Tok::Ch('(' | '[')) if self.bracket_has_comma() => self.interval_or_tuple(),
            Some(Tok::Cmd(c)) if c == "begin" => self.matrix(),
            // `\left( \begin{array} ... \end{array} \right)`: parentheses around a matrix.
            Some(Tok::Ch('(')) if matches!(self.peek_at(1), Some(Tok::Cmd(c)) if c == "begin") => {
                self.pos += 1;
                let m = self.matrix()?;
                self.expect(&Tok::Ch(')'))?;
                Ok(m)
            }
            Some(Tok::Ch('{')) if self.brace_is_set() => {
                self.pos += 1;
                let groups = self.element_groups(true)?;
                self.expect(&Tok::Ch('}'))?;
                Ok(Value::Set(groups.into_iter().flatten().collect()))
            }
            _ => Ok(Value::Expr(self.expr()?)),
        }
    }

    /// `\begin{pmatrix} a & b \\ c & d \end{pmatrix}` (also `bmatrix`, `matrix`, `array`).
    fn matrix(&mut self) -> Res<Value> {
        self.pos += 1;
        let name = self.env_name()?;
        if !matches!(name.as_str(), "matrix" | "pmatrix" | "bmatrix" | "Bmatrix" | "array") {
            return Err(LatexError::Command(format!("begin{{{name}}}")));
        }
        if name == "array" {
            // The column spec, `{cc}`.
            self.env_name()?;
        }
        let mut rows: Vec<Vec<Expr>> = vec![Vec::new()];
        loop {
            if self.eat(&Tok::Cmd("end".into())) {
                self.env_name()?;
                break;
            }
            let row = rows.last_mut().expect("one row");
            row.push(self.expr()?);
            if self.eat(&Tok::Ch('&')) {
                continue;
            }
            if self.eat(&Tok::RowSep) && self.peek() != Some(&Tok::Cmd("end".into())) {
                rows.push(Vec::new());
            }
        }
        if rows.iter().any(|r| r.len() != rows[0].len() || r.is_empty()) {
            return Err(LatexError::Unexpected("ragged matrix".into()));
        }
        Ok(Value::Matrix(rows))
    }

    /// `{name}` after `\begin` / `\end`.
    fn env_name(&mut self) -> Res<String> {
        self.expect(&Tok::Ch('{'))?;
        let mut name = String::new();
        while let Some(Tok::Letter(c)) = self.peek() {
            name.push(*c);
            self.pos += 1;
        }
        self.expect(&Tok::Ch('}'))?;
        Ok(name)
    }

    /// The index of the token closing the bracket at `self.pos`, and whether a comma sits
    /// directly inside it.
    fn bracket_scan(&self) -> Option<(usize, bool)> {
        let mut depth = 0usize;
        let mut comma = false;
        for (k, t) in self.toks.iter().enumerate().skip(self.pos) {
            match t {
                Tok::Ch('(' | '[' | '{') | Tok::LSet => depth += 1,
                Tok::Ch(')' | ']' | '}') | Tok::RSet => {
                    depth -= 1;
                    if depth == 0 {
                        return Some((k, comma));
                    }
                }
                Tok::Ch(',' | ';') if depth == 1 => comma = true,
                _ => {}
            }
        }
        None
    }

    fn bracket_has_comma(&self) -> bool {
        self.bracket_scan().is_some_and(|(_, comma)| comma)
    }

    /// Braces standing alone as a list element are a set (`{3}`); followed by more of an
    /// expression they only group.
    fn brace_is_set(&self) -> bool {
        let Some((close, _)) = self.bracket_scan() else { return false };
        match self.toks.get(close + 1) {
            None | Some(Tok::Ch(',' | ';' | '}')) | Some(Tok::RSet) => true,
            Some(t) => relop(t).is_some() || matches!(t, Tok::Cmd(c) if c == "cup"),
        }
    }

    /// `(a, b)`, `[a, b)`, ...: an interval when it has two ends in increasing order, else a
    /// tuple.
    fn interval_or_tuple(&mut self) -> Res<Value> {
        let open = self.next()?;
        let mut items = vec![self.expr()?];
        let mut semicolon = false;
        loop {
            if self.eat(&Tok::Ch(';')) {
                semicolon = true;
            } else if !self.eat(&Tok::Ch(',')) {
                break;
            }
            items.push(self.expr()?);
        }
        let close = self.next()?;
        if !matches!(close, Tok::Ch(')' | ']')) {
            return Err(LatexError::Unexpected(close.describe()));
        }
        // `(1; 2)` is always a tuple.
        if items.len() != 2 || semicolon {
            return Ok(Value::Tuple(items.into_iter().map(Value::Expr).collect()));
        }
        let mut lo_open = open == Tok::Ch('(');
        let mut hi_open = close == Tok::Ch(')');
        let (lo, hi) = (items[0].clone(), items[1].clone());
        if let (Some(a), Some(b)) = (end_value(&lo), end_value(&hi)) {
            if (lo_open && hi_open && b <= a) || (!lo_open && !hi_open && b < a) {
                return Ok(Value::Tuple(items.into_iter().map(Value::Expr).collect()));
            }
        }
        // Infinite ends are always open, and (-∞, ∞) is the real line (as in sympy).
        lo_open |= lo == Expr::Const(Const::NegInf);
        hi_open |= hi == Expr::Const(Const::Inf);
        // `[a, a]` is the single point, as sympy builds it.
        if !lo_open && !hi_open && end_value(&lo).is_some_and(|a| end_value(&hi) == Some(a)) {
            return Ok(Value::Set(vec![Value::Expr(lo)]));
        }
        if lo == Expr::Const(Const::NegInf) && hi == Expr::Const(Const::Inf) {
            return Ok(Value::Named("R".into()));
        }
        Ok(Value::Interval { lo, hi, lo_open, hi_open })
    }

    fn expr(&mut self) -> Res<Expr> {
        if self.depth >= MAX_DEPTH {
            return Err(LatexError::TooDeep);
        }
        self.depth += 1;
        let e = self.additive();
        self.depth -= 1;
        e
    }

    fn additive(&mut self) -> Res<Expr> {
        let mut lh = self.mp()?;
        loop {
            if self.eat(&Tok::Ch('+')) {
                let rh = self.mp()?;
                lh = add_flat(lh, rh);
            } else if self.eat(&Tok::Ch('-')) {
                let rh = self.mp()?;
                lh = add_flat(lh, rh.neg());
            } else {
                return Ok(lh);
            }
        }
    }

    /// Explicit products and quotients.
    fn mp(&mut self) -> Res<Expr> {
        let mut lh = self.unary()?;
        loop {
            if self.eat(&Tok::Ch('*'))
                || self.peek_cmd(&["cdot", "times", "ast"]) && self.next().is_ok()
            {
                let rh = self.unary()?;
                lh = mul_flat(lh, rh);
            } else if self.eat(&Tok::Ch('/'))
                || self.eat(&Tok::Ch(':'))
                || self.peek_cmd(&["div"]) && self.next().is_ok()
            {
                let rh = self.unary()?;
                lh = divide(lh, rh);
            } else if self.peek_cmd(&["bmod", "mod"]) {
                self.pos += 1;
                let rh = self.unary()?;
                lh = Expr::Func(Func::Mod, vec![lh, rh]);
            } else {
                return Ok(lh);
            }
        }
    }

    fn unary(&mut self) -> Res<Expr> {
        if matches!(self.peek(), Some(Tok::Ch('+' | '-'))) {
            if self.depth >= MAX_DEPTH {
                return Err(LatexError::TooDeep);
            }
            self.depth += 1;
            let negate = self.next()? == Tok::Ch('-');
            let e = self.unary();
            self.depth -= 1;
            return if negate { Ok(e?.neg()) } else { e };
        }
        let mut items = vec![self.postfix()?];
        while self.starts_operand() {
            items.push(self.postfix()?);
        }
        // Implicit products fold from the right; an integer before a positive fraction or
        // integer makes a mixed number.
        let mut acc = items.pop().expect("one item");
        while let Some(left) = items.pop() {
            acc = implicit_product(left, acc);
        }
        Ok(acc)
    }

    fn starts_operand(&self) -> bool {
        match self.peek() {
            Some(Tok::Num(_) | Tok::Letter(_) | Tok::Text(_) | Tok::Diff(_)) => true,
            Some(Tok::Ch('(' | '{')) => true,
            Some(Tok::Ch('|')) => self.abs_depth == 0,
            Some(Tok::Cmd(c)) => {
                let c = c.as_str();
                matches!(
                    c,
                    "frac"
                        | "dfrac"
                        | "tfrac"
                        | "cfrac"
                        | "sqrt"
                        | "pi"
                        | "infty"
                        | "binom"
                        | "dbinom"
                        | "tbinom"
                        | "lfloor"
                        | "lceil"
                        | "exp"
                ) && !(self.in_func_arg > 0 && c == "exp")
                    || FUNCS.contains(&c) && self.in_func_arg == 0
                    || is_symbol_cmd(c)
            }
            _ => false,
        }
    }

    fn postfix(&mut self) -> Res<Expr> {
        let mut e = self.power()?;
        while self.eat(&Tok::Ch('!')) {
            e = Expr::Func(Func::Factorial, vec![e]);
        }
        Ok(e)
    }

    fn power(&mut self) -> Res<Expr> {
        let mut base = self.comp()?;
        let mut chain = 0;
        while self.eat(&Tok::Ch('^')) {
            chain += 1;
            if chain > MAX_DEPTH {
                return Err(LatexError::TooDeep);
            }
            let exp = self.sup()?;
            base = Expr::Pow(Box::new(base), Box::new(exp));
        }
        Ok(base)
    }

    /// A superscript: a braced expression or a single atom.
    fn sup(&mut self) -> Res<Expr> {
        if self.eat(&Tok::Ch('{')) {
            let e = self.expr()?;
            self.expect(&Tok::Ch('}'))?;
            return Ok(e);
        }
        self.atom()
    }

    fn brace_arg(&mut self) -> Res<Expr> {
        if self.eat(&Tok::Ch('{')) {
            let e = self.expr()?;
            self.expect(&Tok::Ch('}'))?;
            return Ok(e);
        }
        Err(self.peek().map(|t| LatexError::Unexpected(t.describe())).unwrap_or(LatexError::End))
    }

    fn comp(&mut self) -> Res<Expr> {
        let Some(t) = self.peek().cloned() else { return Err(LatexError::End) };
        match t {
            Tok::Ch('(') => {
                self.pos += 1;
                let e = self.expr()?;
                self.expect(&Tok::Ch(')'))?;
                Ok(e)
            }
            Tok::Ch('{') => self.brace_arg(),
            Tok::Ch('[') => {
                self.pos += 1;
                let e = self.expr()?;
                self.expect(&Tok::Ch(']'))?;
                Ok(e)
            }
            Tok::Ch('|') => {
                self.pos += 1;
                self.abs_depth += 1;
                let e = self.expr();
                self.abs_depth -= 1;
                let e = e?;
                self.expect(&Tok::Ch('|'))?;
                Ok(Expr::Func(Func::Abs, vec![e]))
            }
            Tok::Cmd(c) => match c.as_str() {
                "frac" | "dfrac" | "tfrac" | "cfrac" => {
                    self.pos += 1;
                    let num = self.brace_arg()?;
                    let den = self.brace_arg()?;
                    Ok(divide(num, den))
                }
                "binom" | "dbinom" | "tbinom" => {
                    self.pos += 1;
                    let n = self.brace_arg()?;
                    let k = self.brace_arg()?;
                    binomial(&n, &k).ok_or_else(|| LatexError::Command(c.clone()))
                }
                "sqrt" => {
                    self.pos += 1;
                    let root = if self.eat(&Tok::Ch('[')) {
                        let r = self.expr()?;
                        self.expect(&Tok::Ch(']'))?;
                        Some(r)
                    } else {
                        None
                    };
                    let base = self.brace_arg()?;
                    let exp = match root {
                        None => Expr::Num(Num::Rat(1, 2)),
                        Some(r) => divide(Expr::int(1), r),
                    };
                    Ok(Expr::Pow(Box::new(base), Box::new(exp)))
                }
                "lfloor" | "lceil" => {
                    self.pos += 1;
                    let e = self.expr()?;
                    let (close, f) =
                        if c == "lfloor" { ("rfloor", Func::Floor) } else { ("rceil", Func::Ceil) };
                    self.expect(&Tok::Cmd(close.into()))?;
                    Ok(Expr::Func(f, vec![e]))
                }
                name if FUNCS.contains(&name) => self.function(),
                _ => self.atom(),
            },
            _ => self.atom(),
        }
    }

    /// `\sin x`, `\log_2 8`, `\sin^2(x)`, `\max(1, 2)`.
    fn function(&mut self) -> Res<Expr> {
        let Tok::Cmd(name) = self.next()? else { unreachable!("called on a command") };
        if matches!(name.as_str(), "max" | "min" | "gcd" | "lcm") {
            self.expect(&Tok::Ch('('))?;
            let mut args = vec![self.expr()?];
            while self.eat(&Tok::Ch(',')) {
                args.push(self.expr()?);
            }
            self.expect(&Tok::Ch(')'))?;
            return match name.as_str() {
                "max" => Ok(Expr::Func(Func::Max, args)),
                "min" => Ok(Expr::Func(Func::Min, args)),
                _ => gcd_lcm(&name, &args).ok_or(LatexError::Command(name)),
            };
        }
        let mut base = None;
        if self.eat(&Tok::Ch('_')) {
            base = Some(self.sup()?);
        }
        let mut power = None;
        if self.eat(&Tok::Ch('^')) {
            power = Some(self.sup()?);
        }
        let arg = if self.peek() == Some(&Tok::Ch('(')) {
            self.pos += 1;
            let e = self.expr()?;
            self.expect(&Tok::Ch(')'))?;
            e
        } else {
            self.in_func_arg += 1;
            let arg = self.mp();
            self.in_func_arg -= 1;
            arg?
        };
        let inverse = power.as_ref().is_some_and(|p| *p == Expr::int(-1));
        let f = |plain: Func, inv: Func| if inverse { inv } else { plain };
        let e = match name.as_str() {
            "sin" => Expr::Func(f(Func::Sin, Func::Asin), vec![arg]),
            "cos" => Expr::Func(f(Func::Cos, Func::Acos), vec![arg]),
            "tan" => Expr::Func(f(Func::Tan, Func::Atan), vec![arg]),
            "csc" => Expr::Func(Func::Csc, vec![arg]),
            "sec" => Expr::Func(Func::Sec, vec![arg]),
            "cot" => Expr::Func(Func::Cot, vec![arg]),
            "arcsin" => Expr::Func(Func::Asin, vec![arg]),
            "arccos" => Expr::Func(Func::Acos, vec![arg]),
            "arctan" => Expr::Func(Func::Atan, vec![arg]),
            "sinh" => Expr::Func(Func::Sinh, vec![arg]),
            "cosh" => Expr::Func(Func::Cosh, vec![arg]),
            "tanh" => Expr::Func(Func::Tanh, vec![arg]),
            "exp" => Expr::Func(Func::Exp, vec![arg]),
            "ln" => Expr::Func(Func::Log, vec![arg, base.unwrap_or(Expr::Const(Const::E))]),
            "log" => Expr::Func(Func::Log, vec![arg, base.unwrap_or(Expr::int(10))]),
            _ => return Err(LatexError::Command(name)),
        };
        let trig_inverse = inverse && matches!(name.as_str(), "sin" | "cos" | "tan");
        Ok(match power {
            Some(p) if !trig_inverse => Expr::Pow(Box::new(e), Box::new(p)),
            _ => e,
        })
    }

    /// A number, a letter (with a subscript), a named constant, a Greek letter or a text.
    fn atom(&mut self) -> Res<Expr> {
        let t = self.next()?;
        match t {
            Tok::Num(n) => {
                let num = Expr::Num(number(&n)?);
                if self.eat(&Tok::Ch('%')) {
                    return Ok(num.percent());
                }
                Ok(num)
            }
            Tok::Letter(l) => {
                let sub = self.subscript()?;
                let raw = format!("{l}{sub}");
                if let Some(args) = self.call_args() {
                    return Ok(Expr::Undef(raw, args));
                }
                Ok(match (l, sub.is_empty()) {
                    ('e', true) => Expr::Const(Const::E),
                    ('I', true) => Expr::Const(Const::ImagUnit),
                    _ => Expr::Sym(raw.to_lowercase()),
                })
            }
            Tok::Diff(name) => Ok(Expr::Sym(name)),
            Tok::Text(text) => {
                let name: String =
                    text.chars().filter(|c| !c.is_whitespace() && *c != '(' && *c != ')').collect();
                let sub = self.subscript()?;
                if let Some(args) = self.call_args() {
                    return Ok(Expr::Undef(format!("\\text{{{text}}}{sub}"), args));
                }
                Ok(Expr::Sym(format!("{name}{sub}").to_lowercase()))
            }
            Tok::Cmd(c) => match c.as_str() {
                "pi" => Ok(Expr::Const(Const::Pi)),
                "infty" | "infinity" => Ok(Expr::Const(Const::Inf)),
                g if is_symbol_cmd(g) => {
                    let sub = self.subscript()?;
                    Ok(Expr::Sym(format!("{}{sub}", g.to_lowercase())))
                }
                _ => Err(LatexError::Command(c)),
            },
            t => Err(LatexError::Unexpected(t.describe())),
        }
    }

    /// `_n` or `_{10}`, as text for a symbol name.
    fn subscript(&mut self) -> Res<String> {
        if !self.eat(&Tok::Ch('_')) {
            return Ok(String::new());
        }
        if self.eat(&Tok::Ch('{')) {
            let mut depth = 1;
            let mut text = String::new();
            loop {
                let t = self.next()?;
                match t {
                    Tok::Ch('{') => depth += 1,
                    Tok::Ch('}') => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                text.push_str(&t.describe());
            }
            return Ok(if text.chars().count() > 1 {
                format!("_{{{text}}}")
            } else {
                format!("_{text}")
            });
        }
        Ok(format!("_{}", self.next()?.describe()))
    }

    /// `(2)` or `(x, y)` right after a name: the arguments of an undefined function. Only plain
    /// numbers and letters qualify, as in the reference (`f(x+1)` is a product).
    fn call_args(&mut self) -> Option<Vec<Expr>> {
        if self.peek() != Some(&Tok::Ch('(')) {
            return None;
        }
        let mut k = 1;
        let mut args = Vec::new();
        loop {
            match self.peek_at(k)? {
                Tok::Num(n) => args.push(Expr::Num(number(n).ok()?)),
                Tok::Letter(l) => args.push(Expr::Sym(l.to_lowercase().to_string())),
                _ => return None,
            }
            k += 1;
            match self.peek_at(k)? {
                Tok::Ch(',') => k += 1,
                Tok::Ch(')') => break,
                _ => return None,
            }
        }
        self.pos += k + 1;
        Some(args)
    }
}

/// The value of a list of element groups: one value, a set, or a set of tuples.
fn groups_to_value(groups: Vec<Vec<Value>>) -> Value {
    if groups.len() == 1 {
        let mut items = groups.into_iter().next().expect("one group");
        if items.len() == 1 {
            return items.pop().expect("one item");
        }
        return Value::Set(items);
    }
    if groups.iter().all(|g| g.len() == 1) {
        return Value::Set(groups.into_iter().flatten().collect());
    }
    Value::Set(groups.into_iter().map(Value::Tuple).collect())
}

/// `A \setminus B` where it can be written out: the real line or a finite set without finitely
/// many numbers.
fn set_minus(a: Value, b: Value) -> Option<Value> {
    let Value::Set(removed) = b else { return None };
    let mut points = Vec::new();
    for v in &removed {
        let e = v.as_expr()?;
        points.push((end_value(e)?, e.clone()));
    }
    match a {
        Value::Named(n) if n == "R" => {
            points.sort_by(|x, y| x.0.total_cmp(&y.0));
            points.dedup_by(|x, y| x.0 == y.0);
            let mut parts = Vec::new();
            let mut lo = Expr::Const(Const::NegInf);
            for (_, p) in points {
                parts.push(Value::Interval { lo, hi: p.clone(), lo_open: true, hi_open: true });
                lo = p;
            }
            parts.push(Value::Interval {
                lo,
                hi: Expr::Const(Const::Inf),
                lo_open: true,
                hi_open: true,
            });
            Some(if parts.len() == 1 { Value::Named(n) } else { Value::Union(parts) })
        }
        Value::Set(items) => {
            let mut kept = Vec::new();
            for v in items {
                let x = end_value(v.as_expr()?)?;
                if !points.iter().any(|p| p.0 == x) {
                    kept.push(v);
                }
            }
            Some(if kept.is_empty() { Value::Empty } else { Value::Set(kept) })
        }
        _ => None,
    }
}

/// `a / b`: an exact fraction of two integers, else a product with a reciprocal.
fn divide(a: Expr, b: Expr) -> Expr {
    if let (Expr::Num(Num::Int(p)), Expr::Num(Num::Int(q))) = (&a, &b) {
        return match Num::rat(*p, *q) {
            Some(n) => Expr::Num(n),
            None if *q == 0 => Expr::Const(Const::ComplexInf),
            None => Expr::Num(Num::Float(*p as f64 / *q as f64)),
        };
    }
    Expr::Mul(vec![a, Expr::Pow(Box::new(b), Box::new(Expr::int(-1)))])
}

/// Two juxtaposed factors. An integer followed by a positive exact number is a mixed number
/// (`2\frac{1}{2}` = 5/2, and also `2 3` = 5, as in the reference).
fn implicit_product(left: Expr, right: Expr) -> Expr {
    if let (Expr::Num(Num::Int(n)), Expr::Num(r)) = (&left, &right) {
        if let Some((p, q)) = r.ratio() {
            if p > 0 {
                let whole = n.checked_mul(q);
                let num =
                    whole.and_then(|w| if *n < 0 { w.checked_sub(p) } else { w.checked_add(p) });
                if let Some(v) = num.and_then(|num| Num::rat(num, q)) {
                    return Expr::Num(v);
                }
            }
        }
    }
    mul_flat(left, right)
}

fn only_symbols(e: &Expr) -> bool {
    match e {
        Expr::Sym(_) => true,
        Expr::Add(a) | Expr::Mul(a) | Expr::Undef(_, a) | Expr::Func(_, a) => {
            !a.is_empty() && a.iter().all(only_symbols)
        }
        Expr::Pow(b, e) => {
            **e == Expr::int(-1) && only_symbols(b) || only_symbols(b) && only_symbols(e)
        }
        Expr::Num(_) | Expr::Const(_) => false,
    }
}

/// Whether an expression is built from symbols only (`x`, `ab`, `a/b`): the left side of an
/// assignment.
pub fn only_symbols_value(v: &Value) -> bool {
    match v {
        Value::Expr(e) => only_symbols(e),
        Value::Tuple(items) => !items.is_empty() && items.iter().all(only_symbols_value),
        _ => false,
    }
}

/// An interval end as a real number, with ±∞ allowed.
fn end_value(e: &Expr) -> Option<f64> {
    match e {
        Expr::Const(Const::Inf) => Some(f64::INFINITY),
        Expr::Const(Const::NegInf) => Some(f64::NEG_INFINITY),
        e => e.value().filter(|v| v.is_real()).map(|v| v.re),
    }
}

fn binomial(n: &Expr, k: &Expr) -> Option<Expr> {
    let (Expr::Num(Num::Int(n)), Expr::Num(Num::Int(k))) = (n, k) else { return None };
    if *k < 0 || *n < 0 {
        return Some(Expr::int(0));
    }
    if k > n {
        return Some(Expr::int(0));
    }
    let k = (*k).min(n - k);
    let mut acc: i128 = 1;
    for i in 0..k {
        acc = acc.checked_mul(n - i)? / (i + 1);
    }
    Some(Expr::int(acc))
}

fn gcd_lcm(name: &str, args: &[Expr]) -> Option<Expr> {
    let mut ints = Vec::new();
    for a in args {
        let Expr::Num(Num::Int(n)) = a else { return None };
        ints.push(n.abs());
    }
    let g = |mut a: i128, mut b: i128| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    let out = if name == "gcd" {
        ints.into_iter().reduce(g)?
    } else {
        ints.into_iter().try_fold(1i128, |acc, n| {
            if n == 0 {
                Some(0)
            } else {
                (acc / g(acc, n).max(1)).checked_mul(n)
            }
        })?
    };
    Some(Expr::int(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn num(v: &Value) -> f64 {
        v.as_expr().and_then(Expr::value).expect("a number").re
    }

    #[test]
    fn numbers_fractions_and_mixed_numbers() {
        assert_eq!(parse("\\frac{4}{8}").unwrap(), Value::Expr(Expr::Num(Num::Rat(1, 2))));
        assert_eq!(parse("2\\frac{1}{2}").unwrap(), Value::Expr(Expr::Num(Num::Rat(5, 2))));
        assert_eq!(parse("-2\\frac{1}{2}").unwrap(), Value::Expr(Expr::Num(Num::Rat(-5, 2))));
        // Two integers side by side add, as in the reference (`3\,600` is 603).
        assert_eq!(parse("3 600").unwrap(), Value::Expr(Expr::int(603)));
        assert_eq!(parse("1,000").unwrap(), Value::Expr(Expr::int(1000)));
        assert!(matches!(parse("0.5").unwrap(), Value::Expr(Expr::Num(Num::Float(_)))));
        assert!((num(&parse("1.5\\times 10^{3}").unwrap()) - 1500.0).abs() < 1e-9);
        assert!((num(&parse("2\\sqrt{3}").unwrap()) - 2.0 * 3f64.sqrt()).abs() < 1e-12);
        assert!(parse("12.").is_err());
    }

    #[test]
    fn sets_intervals_tuples_relations() {
        assert!(matches!(
            parse("(1,2]").unwrap(),
            Value::Interval { lo_open: true, hi_open: false, .. }
        ));
        assert!(matches!(parse("(2,-1)").unwrap(), Value::Tuple(_)));
        assert!(matches!(parse("(3,4,5)").unwrap(), Value::Tuple(_)));
        assert!(matches!(parse("\\{1,2\\}").unwrap(), Value::Set(ref s) if s.len() == 2));
        assert!(matches!(parse("{7}").unwrap(), Value::Set(ref s) if s.len() == 1));
        assert!(matches!(parse("1, 2").unwrap(), Value::Set(ref s) if s.len() == 2));
        assert!(matches!(parse("\\pm 3").unwrap(), Value::Set(ref s) if s.len() == 2));
        assert!(matches!(parse("x = 5").unwrap(), Value::Rel(ref r) if r.len() == 1));
        assert!(
            matches!(parse("x = -3, 3").unwrap(), Value::Rel(ref r) if matches!(r[0].rhs, Value::Set(_)))
        );
        assert!(matches!(parse("a = 2, b = 3").unwrap(), Value::Set(ref s) if s.len() == 2));
        assert!(matches!(parse("1 < x < 2").unwrap(), Value::Rel(ref r) if r.len() == 2));
        assert!(
            matches!(parse("(-\\infty, 3) \\cup (5, \\infty)").unwrap(), Value::Union(ref u) if u.len() == 2)
        );
    }

    #[test]
    fn symbols_differentials_and_operator_words() {
        let sym = |n: &str| Expr::Sym(n.to_string());
        assert_eq!(
            parse("\\angle 60^\\circ").unwrap(),
            Value::Expr(Expr::Mul(vec![sym("angle"), Expr::int(60)]))
        );
        // `d` and the letter after it make one symbol, case kept; `D` is only a letter.
        assert_eq!(parse("rdq").unwrap(), Value::Expr(Expr::Mul(vec![sym("r"), sym("dq")])));
        assert_eq!(parse("d X").unwrap(), Value::Expr(sym("dX")));
        assert_eq!(parse("D x").unwrap(), Value::Expr(Expr::Mul(vec![sym("d"), sym("x")])));
        assert!(parse("triangle").is_err());
        assert!(parse("north").is_err());
        // A command runs into the letters after it: the lexer takes the longest command it knows.
        assert_eq!(parse("\\angleRQB").unwrap(), parse("\\angle RQB").unwrap());
        assert_eq!(parse("2\\cdotx").unwrap(), parse("2 \\cdot x").unwrap());
        assert_eq!(parse("\\pix").unwrap(), parse("\\pi x").unwrap());
        assert_eq!(parse("\\triangleright").unwrap(), parse("\\triangle right").unwrap());
        assert!(parse("\\foo").is_err());
        assert!(parse("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}").is_ok());
        assert!(
            matches!(parse("[1,3) \\cap [2,5]").unwrap(), Value::Intersection(ref p) if p.len() == 2)
        );
        assert_eq!(parse("[4, 4]").unwrap(), Value::Set(vec![Value::Expr(Expr::int(4))]));
        let marked = format!("i{}", super::super::value::COMPLEX_MARK);
        assert_eq!(
            parse("2 \\cdot i").unwrap(),
            Value::Expr(Expr::Mul(vec![Expr::int(2), sym(&marked)]))
        );
        assert_eq!(parse("2i").unwrap(), Value::Expr(Expr::Mul(vec![Expr::int(2), sym("i")])));
    }
}
