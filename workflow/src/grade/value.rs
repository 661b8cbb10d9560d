//! The values a math answer parses to: numbers, expressions, relations, sets, intervals and
//! tuples. They mirror the shapes the reference grader (`math_verify` on sympy) builds, closely
//! enough that its comparison rules can be applied to them, and are evaluated numerically
//! (complex `f64`) instead of simplified symbolically.
use std::fmt;
use std::ops::{Add, Div, Mul, Neg, Sub};

/// A complex number; evaluation works over complex values so that roots and logarithms of
/// negative numbers do not stop a comparison.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct C {
    pub re: f64,
    pub im: f64,
}

impl C {
    pub const fn real(re: f64) -> Self {
        C { re, im: 0.0 }
    }
    pub fn is_finite(self) -> bool {
        self.re.is_finite() && self.im.is_finite()
    }
    pub fn abs(self) -> f64 {
        self.re.hypot(self.im)
    }
    pub fn is_real(self) -> bool {
        self.im.abs() <= 1e-12 * self.re.abs().max(1.0)
    }
    fn exp(self) -> C {
        let m = self.re.exp();
        C { re: m * self.im.cos(), im: m * self.im.sin() }
    }
    fn ln(self) -> C {
        C { re: self.abs().ln(), im: self.im.atan2(self.re) }
    }
    fn sin(self) -> C {
        C { re: self.re.sin() * self.im.cosh(), im: self.re.cos() * self.im.sinh() }
    }
    fn cos(self) -> C {
        C { re: self.re.cos() * self.im.cosh(), im: -self.re.sin() * self.im.sinh() }
    }
    pub fn pow(self, e: C) -> C {
        if e.im == 0.0 && self.im == 0.0 {
            // Real powers stay real where they can: integer exponents of negatives, odd roots.
            if e.re.fract() == 0.0 && e.re.abs() < 1e9 {
                return C::real(self.re.powi(e.re as i32));
            }
            if self.re >= 0.0 {
                return C::real(self.re.powf(e.re));
            }
        }
        if self.re == 0.0 && self.im == 0.0 {
            return if e.re > 0.0 { C::real(0.0) } else { C::real(f64::NAN) };
        }
        (e * self.ln()).exp()
    }
}

impl Add for C {
    type Output = C;
    fn add(self, o: C) -> C {
        C { re: self.re + o.re, im: self.im + o.im }
    }
}
impl Sub for C {
    type Output = C;
    fn sub(self, o: C) -> C {
        C { re: self.re - o.re, im: self.im - o.im }
    }
}
impl Mul for C {
    type Output = C;
    fn mul(self, o: C) -> C {
        C { re: self.re * o.re - self.im * o.im, im: self.re * o.im + self.im * o.re }
    }
}
impl Div for C {
    type Output = C;
    fn div(self, o: C) -> C {
        if o.im == 0.0 {
            return C { re: self.re / o.re, im: self.im / o.re };
        }
        let d = o.re * o.re + o.im * o.im;
        C { re: (self.re * o.re + self.im * o.im) / d, im: (self.im * o.re - self.re * o.im) / d }
    }
}
impl Neg for C {
    type Output = C;
    fn neg(self) -> C {
        C { re: -self.re, im: -self.im }
    }
}

fn gcd(a: i128, b: i128) -> i128 {
    let (mut a, mut b) = (a.unsigned_abs(), b.unsigned_abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    i128::try_from(a).unwrap_or(1)
}

/// A number literal: exact integers and fractions, or a float written with a decimal point.
/// The distinction matters: the reference compares floats rounded to 6 decimals and exact
/// numbers exactly.
#[derive(Clone, Copy, Debug)]
pub enum Num {
    Int(i128),
    /// Reduced, denominator > 1.
    Rat(i128, i128),
    Float(f64),
}

impl Num {
    /// `p/q` reduced; an integer when `q` divides `p`; a float when it does not fit.
    pub fn rat(p: i128, q: i128) -> Option<Num> {
        if q == 0 {
            return None;
        }
        let g = gcd(p, q).max(1);
        let (mut p, mut q) = (p / g, q / g);
        if q < 0 {
            p = p.checked_neg()?;
            q = q.checked_neg()?;
        }
        Some(if q == 1 { Num::Int(p) } else { Num::Rat(p, q) })
    }
    pub fn value(self) -> f64 {
        match self {
            Num::Int(n) => n as f64,
            Num::Rat(p, q) => p as f64 / q as f64,
            Num::Float(f) => f,
        }
    }
    /// `(p, q)` for exact numbers.
    pub fn ratio(self) -> Option<(i128, i128)> {
        match self {
            Num::Int(n) => Some((n, 1)),
            Num::Rat(p, q) => Some((p, q)),
            Num::Float(_) => None,
        }
    }
    pub fn neg(self) -> Num {
        match self {
            Num::Int(n) => n.checked_neg().map(Num::Int).unwrap_or(Num::Float(-(n as f64))),
            Num::Rat(p, q) => Num::Rat(-p, q),
            Num::Float(f) => Num::Float(-f),
        }
    }
}

impl PartialEq for Num {
    fn eq(&self, o: &Num) -> bool {
        match (self.ratio(), o.ratio()) {
            (Some(a), Some(b)) => a == b,
            _ => self.value() == o.value(),
        }
    }
}

/// sympy's printed form of a number, used where the reference compares printed forms
/// (a symbol such as `\text{5}` against the number 5).
impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Num::Int(n) => write!(f, "{n}"),
            Num::Rat(p, q) => write!(f, "{p}/{q}"),
            Num::Float(x) => {
                // sympy prints 15 significant digits, trailing zeros kept.
                if x == 0.0 {
                    return write!(f, "0.0");
                }
                let exp = x.abs().log10().floor() as i32;
                if (-5..15).contains(&exp) {
                    let decimals = (14 - exp).max(0) as usize;
                    write!(f, "{x:.decimals$}")
                } else {
                    write!(f, "{x:.14e}")
                }
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Const {
    Pi,
    E,
    ImagUnit,
    Inf,
    NegInf,
    /// Division by zero.
    ComplexInf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Func {
    Sin,
    Cos,
    Tan,
    Csc,
    Sec,
    Cot,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Tanh,
    /// `Log(x, base)`.
    Log,
    Exp,
    Abs,
    Floor,
    Ceil,
    Factorial,
    Max,
    Min,
    Mod,
}

/// Appended to the name of a symbol read from an answer that looks complex (one with a
/// standalone `i`, `\mathbb{C}`, `\det`, ...). The reference declares the symbols of such an
/// answer not real, and sympy never equates symbols declared differently: `2\cdot i` (complex)
/// is not `2i` (real). Comparisons by name look through the mark ([`symbol_name`]).
pub const COMPLEX_MARK: char = '\u{e000}';

/// A symbol's name without its [`COMPLEX_MARK`].
pub fn symbol_name(s: &str) -> &str {
    s.strip_suffix(COMPLEX_MARK).unwrap_or(s)
}

/// A scalar expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    Num(Num),
    /// A symbol; names are lowercased as the reference's parser does.
    Sym(String),
    Const(Const),
    Add(Vec<Expr>),
    Mul(Vec<Expr>),
    Pow(Box<Expr>, Box<Expr>),
    Func(Func, Vec<Expr>),
    /// An undefined function applied to arguments, `f(2)`.
    Undef(String, Vec<Expr>),
}

impl Expr {
    pub fn int(n: i128) -> Expr {
        Expr::Num(Num::Int(n))
    }
    /// `x · 1/100`, the shape a percentage takes.
    pub fn percent(self) -> Expr {
        Expr::Mul(vec![self, Expr::Num(Num::Rat(1, 100))])
    }
    /// The body of a percentage `x · 1/100`, if this is one.
    pub fn percent_body(&self) -> Option<&Expr> {
        match self {
            Expr::Mul(args)
                if args.len() == 2 && matches!(args[1], Expr::Num(Num::Rat(1, 100))) =>
            {
                Some(&args[0])
            }
            _ => None,
        }
    }
    /// A number (or ±∞) standing alone or as a percentage: the reference compares such values
    /// without simplification.
    pub fn is_number_atom(&self) -> bool {
        let atom = |e: &Expr| {
            matches!(e, Expr::Num(_) | Expr::Const(Const::Inf | Const::NegInf | Const::ComplexInf))
        };
        atom(self) || self.percent_body().is_some_and(atom)
    }
    pub fn is_float_atom(&self) -> bool {
        let atom = |e: &Expr| matches!(e, Expr::Num(Num::Float(_)));
        atom(self) || self.percent_body().is_some_and(atom)
    }
    pub fn neg(self) -> Expr {
        match self {
            Expr::Num(n) => Expr::Num(n.neg()),
            Expr::Const(Const::Inf) => Expr::Const(Const::NegInf),
            Expr::Const(Const::NegInf) => Expr::Const(Const::Inf),
            e => mul_flat(Expr::int(-1), e),
        }
    }
    pub fn sub(self, o: Expr) -> Expr {
        add_flat(self, o.neg())
    }

    /// Marks every symbol as declared complex ([`COMPLEX_MARK`]).
    pub fn mark_complex(&mut self) {
        match self {
            Expr::Sym(s) if !s.ends_with(COMPLEX_MARK) => s.push(COMPLEX_MARK),
            Expr::Add(a) | Expr::Mul(a) | Expr::Func(_, a) | Expr::Undef(_, a) => {
                a.iter_mut().for_each(Expr::mark_complex)
            }
            Expr::Pow(b, e) => {
                b.mark_complex();
                e.mark_complex();
            }
            Expr::Sym(_) | Expr::Num(_) | Expr::Const(_) => {}
        }
    }

    /// Every symbol name in the expression, in first-seen order.
    pub fn symbols(&self, out: &mut Vec<String>) {
        match self {
            Expr::Sym(s) => {
                if !out.contains(s) {
                    out.push(s.clone())
                }
            }
            Expr::Add(a) | Expr::Mul(a) | Expr::Func(_, a) | Expr::Undef(_, a) => {
                a.iter().for_each(|e| e.symbols(out))
            }
            Expr::Pow(b, e) => {
                b.symbols(out);
                e.symbols(out)
            }
            Expr::Num(_) | Expr::Const(_) => {}
        }
    }

    /// Numeric value with symbols bound by `env`; `None` where it has none (an undefined
    /// function, infinity, a non-integer factorial).
    pub fn eval(&self, env: &dyn Fn(&str) -> Option<C>) -> Option<C> {
        let v = match self {
            Expr::Num(n) => C::real(n.value()),
            Expr::Sym(s) => env(s)?,
            Expr::Const(Const::Pi) => C::real(std::f64::consts::PI),
            Expr::Const(Const::E) => C::real(std::f64::consts::E),
            Expr::Const(Const::ImagUnit) => C { re: 0.0, im: 1.0 },
            Expr::Const(_) => return None,
            Expr::Add(a) => a.iter().try_fold(C::real(0.0), |acc, e| Some(acc + e.eval(env)?))?,
            Expr::Mul(a) => a.iter().try_fold(C::real(1.0), |acc, e| Some(acc * e.eval(env)?))?,
            Expr::Pow(b, e) => b.eval(env)?.pow(e.eval(env)?),
            Expr::Func(f, args) => {
                let x = args.first()?.eval(env)?;
                let real =
                    |g: fn(f64) -> f64| if x.is_real() { Some(C::real(g(x.re))) } else { None };
                match f {
                    Func::Sin => x.sin(),
                    Func::Cos => x.cos(),
                    Func::Tan => x.sin() / x.cos(),
                    Func::Csc => C::real(1.0) / x.sin(),
                    Func::Sec => C::real(1.0) / x.cos(),
                    Func::Cot => x.cos() / x.sin(),
                    Func::Asin => real(f64::asin)?,
                    Func::Acos => real(f64::acos)?,
                    Func::Atan => real(f64::atan)?,
                    Func::Sinh => real(f64::sinh)?,
                    Func::Cosh => real(f64::cosh)?,
                    Func::Tanh => real(f64::tanh)?,
                    Func::Log => {
                        let base = args.get(1)?.eval(env)?;
                        x.ln() / base.ln()
                    }
                    Func::Exp => x.exp(),
                    Func::Abs => C::real(x.abs()),
                    Func::Floor => real(f64::floor)?,
                    Func::Ceil => real(f64::ceil)?,
                    Func::Factorial => {
                        if !x.is_real() || x.re < 0.0 || x.re.fract() != 0.0 || x.re > 170.0 {
                            return None;
                        }
                        C::real((1..=x.re as u32).map(f64::from).product())
                    }
                    Func::Max | Func::Min => {
                        let mut vals = Vec::new();
                        for a in args {
                            let v = a.eval(env)?;
                            if !v.is_real() {
                                return None;
                            }
                            vals.push(v.re);
                        }
                        let pick = if *f == Func::Max { f64::max } else { f64::min };
                        C::real(vals.into_iter().reduce(pick)?)
                    }
                    Func::Mod => {
                        let m = args.get(1)?.eval(env)?;
                        if !x.is_real() || !m.is_real() || m.re == 0.0 {
                            return None;
                        }
                        C::real(x.re.rem_euclid(m.re))
                    }
                }
            }
            Expr::Undef(..) => return None,
        };
        v.is_finite().then_some(v)
    }

    /// The value of an expression without symbols.
    pub fn value(&self) -> Option<C> {
        self.eval(&|_| None)
    }
}

/// `a + b`, flattening nested sums as the reference's parser does.
pub fn add_flat(a: Expr, b: Expr) -> Expr {
    let mut args = Vec::new();
    for e in [a, b] {
        match e {
            Expr::Add(inner) => args.extend(inner),
            e => args.push(e),
        }
    }
    Expr::Add(args)
}

/// `a · b`, flattening nested products.
pub fn mul_flat(a: Expr, b: Expr) -> Expr {
    let mut args = Vec::new();
    for e in [a, b] {
        match e {
            Expr::Mul(inner) => args.extend(inner),
            e => args.push(e),
        }
    }
    Expr::Mul(args)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RelOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl RelOp {
    /// The relation read from the other side: `a < b` is `b > a`.
    pub fn flipped(self) -> RelOp {
        match self {
            RelOp::Lt => RelOp::Gt,
            RelOp::Gt => RelOp::Lt,
            RelOp::Le => RelOp::Ge,
            RelOp::Ge => RelOp::Le,
            op => op,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Rel {
    pub lhs: Value,
    pub op: RelOp,
    pub rhs: Value,
}

/// What an answer parses to.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Expr(Expr),
    /// One relation, or a chain such as `1 < x < 2` (each link shares its left side with the
    /// previous link's right side).
    Rel(Vec<Rel>),
    /// A finite set, in written order.
    Set(Vec<Value>),
    Tuple(Vec<Value>),
    Interval {
        lo: Expr,
        hi: Expr,
        lo_open: bool,
        hi_open: bool,
    },
    Union(Vec<Value>),
    /// `A \cap B`, unevaluated as the reference leaves it; operands in a canonical order.
    Intersection(Vec<Value>),
    Empty,
    /// ℝ, ℤ, ... by name.
    Named(String),
    /// Rows of a matrix or vector.
    Matrix(Vec<Vec<Expr>>),
}

impl Value {
    /// Marks every symbol in the value as declared complex ([`COMPLEX_MARK`]).
    pub fn mark_complex(&mut self) {
        match self {
            Value::Expr(e) => e.mark_complex(),
            Value::Rel(chain) => chain.iter_mut().for_each(|r| {
                r.lhs.mark_complex();
                r.rhs.mark_complex();
            }),
            Value::Set(items)
            | Value::Tuple(items)
            | Value::Union(items)
            | Value::Intersection(items) => items.iter_mut().for_each(Value::mark_complex),
            Value::Interval { lo, hi, .. } => {
                lo.mark_complex();
                hi.mark_complex();
            }
            Value::Matrix(rows) => rows.iter_mut().flatten().for_each(Expr::mark_complex),
            Value::Empty | Value::Named(_) => {}
        }
    }
    pub fn as_expr(&self) -> Option<&Expr> {
        match self {
            Value::Expr(e) => Some(e),
            _ => None,
        }
    }
    /// A set in the reference's sense (not a tuple).
    pub fn is_set(&self) -> bool {
        matches!(
            self,
            Value::Set(_)
                | Value::Interval { .. }
                | Value::Union(_)
                | Value::Intersection(_)
                | Value::Empty
                | Value::Named(_)
        )
    }
    pub fn is_relation(&self) -> bool {
        matches!(self, Value::Rel(r) if !r.is_empty())
    }
    pub fn is_equation(&self) -> bool {
        matches!(self, Value::Rel(r) if !r.is_empty() && r.iter().all(|r| r.op == RelOp::Eq))
    }
}
