//! Plain arithmetic found in prose (`4 * 25`, `1/6`, `2**10`), read with Python's expression
//! rules as the reference does (it hands such spans to sympy's `parse_expr`): `+ - * / **` and
//! parentheses over integer and decimal literals. Anything else (two numbers side by side, `×`,
//! an unbalanced parenthesis) does not parse.
use super::value::{add_flat, mul_flat, Expr, Num};

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Num(Num),
    Op(&'static str),
}

fn tokenize(s: &str) -> Option<Vec<Tok>> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit))
        {
            let start = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            let mut float = false;
            if i < b.len() && b[i] == b'.' {
                float = true;
                i += 1;
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
            }
            let text = &s[start..i];
            let n = if float {
                Num::Float(text.parse().ok()?)
            } else {
                match text.parse::<i128>() {
                    Ok(n) => Num::Int(n),
                    Err(_) => Num::Float(text.parse().ok()?),
                }
            };
            // A literal followed directly by another literal or a parenthesis is a syntax error.
            out.push(Tok::Num(n));
        } else {
            let op = match (c, b.get(i + 1)) {
                (b'*', Some(b'*')) => "**",
                (b'/', Some(b'/')) => return None,
                (b'+', _) => "+",
                (b'-', _) => "-",
                (b'*', _) => "*",
                (b'/', _) => "/",
                (b'(', _) => "(",
                (b')', _) => ")",
                _ => return None,
            };
            i += op.len();
            out.push(Tok::Op(op));
        }
    }
    Some(out)
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
    /// Nesting depth, bounded so that degenerate input cannot exhaust the stack.
    depth: usize,
}

impl Parser {
    fn peek_op(&self) -> Option<&'static str> {
        match self.toks.get(self.pos) {
            Some(Tok::Op(o)) => Some(o),
            _ => None,
        }
    }
    fn expr(&mut self) -> Option<Expr> {
        if self.depth >= 64 {
            return None;
        }
        self.depth += 1;
        let e = self.sum();
        self.depth -= 1;
        e
    }
    fn sum(&mut self) -> Option<Expr> {
        let mut lh = self.term()?;
        while let Some(op @ ("+" | "-")) = self.peek_op() {
            self.pos += 1;
            let rh = self.term()?;
            lh = if op == "+" { add_flat(lh, rh) } else { add_flat(lh, rh.neg()) };
        }
        Some(lh)
    }
    fn term(&mut self) -> Option<Expr> {
        let mut lh = self.factor()?;
        while let Some(op @ ("*" | "/")) = self.peek_op() {
            self.pos += 1;
            let rh = self.factor()?;
            lh = if op == "*" {
                mul_flat(lh, rh)
            } else {
                Expr::Mul(vec![lh, Expr::Pow(Box::new(rh), Box::new(Expr::int(-1)))])
            };
        }
        Some(lh)
    }
    fn factor(&mut self) -> Option<Expr> {
        if self.depth >= 64 {
            return None;
        }
        self.depth += 1;
        let e = self.signed();
        self.depth -= 1;
        e
    }
    fn signed(&mut self) -> Option<Expr> {
        match self.peek_op() {
            Some("+") => {
                self.pos += 1;
                self.factor()
            }
            Some("-") => {
                self.pos += 1;
                Some(self.factor()?.neg())
            }
            _ => self.power(),
        }
    }
    fn power(&mut self) -> Option<Expr> {
        let base = self.atom()?;
        if self.peek_op() == Some("**") {
            self.pos += 1;
            let exp = self.factor()?;
            return Some(Expr::Pow(Box::new(base), Box::new(exp)));
        }
        Some(base)
    }
    fn atom(&mut self) -> Option<Expr> {
        match self.toks.get(self.pos)?.clone() {
            Tok::Num(n) => {
                self.pos += 1;
                Some(Expr::Num(n))
            }
            Tok::Op("(") => {
                self.pos += 1;
                let e = self.expr()?;
                if self.peek_op() != Some(")") {
                    return None;
                }
                self.pos += 1;
                Some(e)
            }
            Tok::Op(_) => None,
        }
    }
}

/// Parses a Python arithmetic expression; `None` on a syntax error.
pub fn parse(s: &str) -> Option<Expr> {
    let toks = tokenize(s)?;
    let mut p = Parser { toks, pos: 0, depth: 0 };
    let e = p.expr()?;
    (p.pos == p.toks.len()).then_some(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn val(s: &str) -> Option<f64> {
        parse(s).and_then(|e| e.value()).map(|c| c.re)
    }

    #[test]
    fn python_arithmetic() {
        assert_eq!(val("4 * 25"), Some(100.0));
        assert_eq!(val("14 - 5"), Some(9.0));
        assert_eq!(val("2**3**2"), Some(512.0));
        assert_eq!(val("-(3 + 4)"), Some(-7.0));
        assert!((val("1/6.").unwrap() - 1.0 / 6.0).abs() < 1e-15);
        assert_eq!(val("2 3"), None);
        assert_eq!(val("(1"), None);
        assert_eq!(val("2(3)"), None);
        assert_eq!(val("45**"), None);
    }
}
