//! Equivalence of two parsed answers, following the reference grader's `verify` rules:
//! an equation answer is reduced to its right side when the reference is a bare value (`x = 5`
//! against `5`); sets compare element by element after sorting, tuples in order; an open
//! interval matches a two-element list; a lone symbol compares by name. Numbers compare exactly,
//! except that when either side is a decimal literal both are rounded to 6 decimals (so 0.333333
//! matches 1/3 but 0.3333 does not). Where the reference simplifies symbolically, this port
//! evaluates both sides at a few sample points instead.
use super::extract::Extracted;
use super::latex::only_symbols_value;
use super::value::{symbol_name, Const, Expr, Num, Rel, RelOp, Value, C};
use std::cmp::Ordering;

/// `verify(gold, pred)`: the parsed values match, or the first extracted texts are the same
/// string.
pub fn verify(gold: &Extracted, pred: &Extracted) -> bool {
    if let (Some(g), Some(p)) = (&gold.value, &pred.value) {
        if values_eq(g, p) {
            return true;
        }
    }
    match (&gold.text, &pred.text) {
        (Some(g), Some(p)) => {
            let (g, p) = (g.trim(), p.trim());
            !g.is_empty() && g == p
        }
        _ => false,
    }
}

/// An equation chain whose first left side is made of symbols: `x = 5`, `a_n = 3n - 2`.
fn is_assignment(v: &Value) -> bool {
    match v {
        Value::Rel(chain) => {
            !chain.is_empty()
                && chain.iter().all(|r| r.op == RelOp::Eq)
                && only_symbols_value(&chain[0].lhs)
        }
        _ => false,
    }
}

/// `a = b = c` → `a = c`.
fn first_to_last(v: Value) -> Value {
    match v {
        Value::Rel(chain) if chain.len() > 1 => {
            let lhs = chain[0].lhs.clone();
            let rhs = chain[chain.len() - 1].rhs.clone();
            Value::Rel(vec![Rel { lhs, op: RelOp::Eq, rhs }])
        }
        v => v,
    }
}

fn last_rhs(v: Value) -> Value {
    match v {
        Value::Rel(mut chain) if !chain.is_empty() => chain.pop().expect("non-empty").rhs,
        v => v,
    }
}

/// Whether two answers are equivalent (`sympy_expr_eq` in the reference).
pub fn values_eq(gold: &Value, pred: &Value) -> bool {
    let gold_assign = is_assignment(gold);
    let pred_assign = is_assignment(pred);
    let gold_eqn = gold.is_equation();
    let pred_eqn = pred.is_equation();
    let mut gold = gold.clone();
    let mut pred = pred.clone();
    if gold_assign {
        gold = first_to_last(gold);
    }
    if pred_assign {
        pred = first_to_last(pred);
    }
    // The reference's format decides: `x = 5` answers `5`, and `x = 5` as the reference
    // accepts a bare `5`.
    if pred_eqn && !gold_eqn {
        pred = last_rhs(pred);
    } else if gold_assign && !pred_eqn {
        gold = last_rhs(gold);
    }
    if gold.is_relation() && pred.is_set() {
        if let Some(s) = relation_as_set(&gold) {
            gold = s;
        }
    }
    if matches!(gold, Value::Expr(Expr::Const(Const::ComplexInf))) {
        // The reference refuses to compare an undefined reference value.
        return false;
    }
    if gold == pred {
        return true;
    }
    if gold.is_relation() && pred.is_relation() {
        return relations_eq(&gold, &pred);
    }
    let set_like = |v: &Value| v.is_set() || matches!(v, Value::Tuple(_));
    if set_like(&gold) || set_like(&pred) {
        return sets_eq(&gold, &pred);
    }
    match (&gold, &pred) {
        (Value::Matrix(g), Value::Matrix(p)) => {
            g.len() == p.len()
                && g.iter().zip(p).all(|(a, b)| {
                    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| exprs_eq(x, y))
                })
        }
        (Value::Expr(g), Value::Expr(p)) => {
            if matches!(g, Expr::Sym(_)) || matches!(p, Expr::Sym(_)) {
                return symbols_eq(g, p);
            }
            exprs_eq(g, p)
        }
        _ => false,
    }
}

/// Numbers and expressions: rounded to 6 decimals when either side is a decimal literal, else
/// equal in value (identically, where symbols occur).
fn exprs_eq(a: &Expr, b: &Expr) -> bool {
    if (a.is_number_atom() || b.is_number_atom()) && (a.is_float_atom() || b.is_float_atom()) {
        // sympy rounds an exact integer to an integer and anything else to a float, and an
        // integer never equals a float: 0 against 0.0000001 is not rounded equal.
        if let (Some(x), Some(y)) = (a.value(), b.value()) {
            if !exact_integer(a, x) && !exact_integer(b, y) && rounded_eq(x, y) {
                return true;
            }
        }
    }
    if let Some(same) = exact_against_decimal_arithmetic(a, b) {
        return same;
    }
    identically_equal(a, b)
}

/// An exact number against arithmetic on decimals without symbols (`27/14` against the reply
/// `27/14.`): sympy works the decimal side out in binary floating point, one rounding per
/// operation, and compares exactly, so 27·(1/14.0) is not 27/14 while 17·(1/21.0) is 17/21.
/// The evaluation here rounds the same way; `None` where the rule does not apply.
fn exact_against_decimal_arithmetic(a: &Expr, b: &Expr) -> Option<bool> {
    let exact_atom = |e: &Expr| {
        let atom = |e: &Expr| matches!(e, Expr::Num(Num::Int(_) | Num::Rat(..)));
        atom(e) || e.percent_body().is_some_and(atom)
    };
    let applies = |x: &Expr, y: &Expr| exact_atom(x) && has_float(y) && !y.is_float_atom();
    if !(applies(a, b) || applies(b, a)) {
        return None;
    }
    let mut syms = Vec::new();
    a.symbols(&mut syms);
    b.symbols(&mut syms);
    if !syms.is_empty() {
        return None;
    }
    Some(matches!((a.value(), b.value()), (Some(x), Some(y)) if x == y))
}

fn has_float(e: &Expr) -> bool {
    match e {
        Expr::Num(Num::Float(_)) => true,
        Expr::Add(a) | Expr::Mul(a) | Expr::Func(_, a) | Expr::Undef(_, a) => {
            a.iter().any(has_float)
        }
        Expr::Pow(b, x) => has_float(b) || has_float(x),
        Expr::Num(_) | Expr::Sym(_) | Expr::Const(_) => false,
    }
}

/// An exact expression (no decimal literal) whose value is an integer.
fn exact_integer(e: &Expr, v: C) -> bool {
    !has_float(e) && v.is_real() && (v.re - v.re.round()).abs() <= 1e-12 * v.re.abs().max(1.0)
}

fn rounded_eq(x: C, y: C) -> bool {
    let round = |v: f64| {
        let s = v * 1e6;
        if s.abs() < 1e30 {
            Some(s.round() as i128)
        } else {
            None
        }
    };
    let part = |u: f64, v: f64| match (round(u), round(v)) {
        (Some(a), Some(b)) => a == b,
        _ => (u - v).abs() <= 1e-15 * u.abs().max(v.abs()),
    };
    part(x.re, y.re) && part(x.im, y.im)
}

fn close(x: C, y: C, rel: f64) -> bool {
    let d = (x - y).abs();
    d <= rel * x.abs().max(y.abs()) || d < 1e-13
}

/// Sample values for the i-th symbol at the j-th point: positive, irregular, distinct.
fn sample(i: usize, j: usize) -> f64 {
    0.371 + 0.613 * j as f64 + 0.247 * i as f64 + 0.0173 * ((i * 7 + j * 3) % 5) as f64
}

/// `a - b` is zero: exactly for numbers (to float precision), and at every sample point when
/// symbols occur.
fn identically_equal(a: &Expr, b: &Expr) -> bool {
    let mut syms = Vec::new();
    a.symbols(&mut syms);
    b.symbols(&mut syms);
    if syms.is_empty() {
        // sympy decides exactly, or at float precision where decimals are involved: only
        // rounding noise of the evaluation is forgiven.
        return match (a.value(), b.value()) {
            (Some(x), Some(y)) => {
                let d = (x - y).abs();
                d <= 1e-13 * x.abs().max(y.abs()) || d < 1e-14
            }
            _ => false,
        };
    }
    let mut agreed = 0;
    for j in 0..6 {
        let env = |name: &str| syms.iter().position(|s| s == name).map(|i| C::real(sample(i, j)));
        match (a.eval(&env), b.eval(&env)) {
            (Some(x), Some(y)) => {
                if !close(x, y, 1e-9) {
                    return false;
                }
                agreed += 1;
            }
            (None, None) => {}
            _ => return false,
        }
    }
    agreed >= 3
}

/// A lone symbol against something else: `e` is Euler's number, `abc` matches the product
/// `a·b·c`, and otherwise the printed forms must agree (`\text{5}` matches 5).
fn symbols_eq(g: &Expr, p: &Expr) -> bool {
    let name_of = |e: &Expr| match e {
        Expr::Sym(s) => Some(symbol_name(s).to_string()),
        Expr::Const(Const::E) => Some("e".to_string()),
        _ => None,
    };
    match (g, p) {
        (Expr::Sym(s), Expr::Const(Const::E)) | (Expr::Const(Const::E), Expr::Sym(s))
            if symbol_name(s).to_lowercase() == "e" =>
        {
            return true
        }
        (Expr::Sym(s), Expr::Mul(args)) | (Expr::Mul(args), Expr::Sym(s))
            if args.iter().all(|a| name_of(a).is_some()) =>
        {
            let joined: String = args.iter().filter_map(name_of).collect();
            return symbol_name(s).to_lowercase() == joined.to_lowercase();
        }
        (Expr::Sym(a), Expr::Sym(b)) => {
            let norm = |s: &str| {
                let s = symbol_name(s);
                if s.chars().count() > 1 {
                    s.to_lowercase()
                } else {
                    s.to_string()
                }
            };
            return norm(a) == norm(b);
        }
        _ => {}
    }
    match (printed(g), printed(p)) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

fn printed(e: &Expr) -> Option<String> {
    match e {
        Expr::Sym(s) => Some(symbol_name(s).to_string()),
        Expr::Num(n) => Some(n.to_string()),
        _ => None,
    }
}

fn diff(r: &Rel) -> Option<Expr> {
    Some(r.lhs.as_expr()?.clone().sub(r.rhs.as_expr()?.clone()))
}

/// Equations and inequalities: the same relation of the same difference, the mirrored relation,
/// or (standing in for the reference's solving) equations in several symbols whose differences
/// are constant multiples.
fn relations_eq(g: &Value, p: &Value) -> bool {
    let (Value::Rel(gc), Value::Rel(pc)) = (g, p) else { return false };
    if gc.len() > 1 && pc.len() > 1 {
        return gc.len() == pc.len()
            && gc.iter().zip(pc).all(|(a, b)| {
                relations_eq(&Value::Rel(vec![a.clone()]), &Value::Rel(vec![b.clone()]))
            });
    }
    if gc.len() != 1 || pc.len() != 1 {
        return false;
    }
    let (gr, pr) = (&gc[0], &pc[0]);
    let (Some(gd), Some(pd)) = (diff(gr), diff(pr)) else { return false };
    if gr.op == pr.op && values_eq(&Value::Expr(gd.clone()), &Value::Expr(pd.clone())) {
        return true;
    }
    if gr.op == RelOp::Ne {
        return false;
    }
    if pr.op == gr.op.flipped()
        && values_eq(&Value::Expr(gd.clone()), &Value::Expr(pd.clone().neg()))
    {
        return true;
    }
    // The reference then solves both equations for their symbols, which only yields
    // comparable solutions with two or more symbols; equations with the same solutions then
    // have proportional differences.
    if gr.op != RelOp::Eq || pr.op != RelOp::Eq {
        return false;
    }
    let mut syms = Vec::new();
    gd.symbols(&mut syms);
    syms.len() >= 2 && constant_ratio(&gd, &pd).is_some_and(|k| k != 0.0)
}

/// `a / b` when it is the same real constant at every sample point.
fn constant_ratio(a: &Expr, b: &Expr) -> Option<f64> {
    let mut syms = Vec::new();
    a.symbols(&mut syms);
    b.symbols(&mut syms);
    if syms.is_empty() {
        return None;
    }
    let mut ratio: Option<f64> = None;
    for j in 0..6 {
        let env = |name: &str| syms.iter().position(|s| s == name).map(|i| C::real(sample(i, j)));
        let (x, y) = (a.eval(&env)?, b.eval(&env)?);
        if y.abs() < 1e-12 || !x.is_real() || !y.is_real() {
            return None;
        }
        let k = x.re / y.re;
        match ratio {
            None => ratio = Some(k),
            Some(r) if (r - k).abs() <= 1e-9 * r.abs().max(1e-12) => {}
            Some(_) => return None,
        }
    }
    ratio
}

/// `x > 3` as `(3, ∞)`, `1 < x < 2` as `(1, 2)`, `x = 5` as `{5}`.
fn relation_as_set(v: &Value) -> Option<Value> {
    let Value::Rel(chain) = v else { return None };
    let bound = |r: &Rel| -> Option<(String, RelOp, Expr)> {
        match (r.lhs.as_expr()?, r.rhs.as_expr()?) {
            (Expr::Sym(s), c) if c.value().is_some() => Some((s.clone(), r.op, c.clone())),
            (c, Expr::Sym(s)) if c.value().is_some() => {
                Some((s.clone(), r.op.flipped(), c.clone()))
            }
            _ => None,
        }
    };
    let mut lo = (Expr::Const(Const::NegInf), true);
    let mut hi = (Expr::Const(Const::Inf), true);
    let mut var: Option<String> = None;
    for r in chain {
        let (s, op, c) = bound(r)?;
        if var.as_ref().is_some_and(|v| *v != s) {
            return None;
        }
        var = Some(s);
        match op {
            RelOp::Gt => lo = (c, true),
            RelOp::Ge => lo = (c, false),
            RelOp::Lt => hi = (c, true),
            RelOp::Le => hi = (c, false),
            RelOp::Eq if chain.len() == 1 => return Some(Value::Set(vec![Value::Expr(c)])),
            _ => return None,
        }
    }
    Some(Value::Interval { lo: lo.0, hi: hi.0, lo_open: lo.1, hi_open: hi.1 })
}

/// Sets, intervals and tuples (`sympy_compare_sets`).
fn sets_eq(gold: &Value, pred: &Value) -> bool {
    let wrap = |v: &Value| {
        if v.is_set() || matches!(v, Value::Tuple(_)) {
            v.clone()
        } else {
            Value::Set(vec![v.clone()])
        }
    };
    let (a, b) = (wrap(gold), wrap(pred));
    if let (Value::Interval { .. }, Value::Interval { .. }) = (&a, &b) {
        return intervals_eq(&a, &b);
    }
    if same_set(&a, &b) {
        return true;
    }
    let listy = |v: &Value| matches!(v, Value::Set(_) | Value::Tuple(_));
    if listy(&a) && listy(&b) {
        return elements_eq(&a, &b);
    }
    // `(1, 2)` reads as an open interval; it still matches the pair `1, 2`.
    if let (Value::Interval { lo, hi, lo_open: true, hi_open: true }, true) = (&a, listy(&b)) {
        if len(&b) == 2 {
            return elements_eq(
                &Value::Tuple(vec![Value::Expr(lo.clone()), Value::Expr(hi.clone())]),
                &b,
            );
        }
    }
    if let (Value::Interval { lo, hi, lo_open: true, hi_open: true }, true) = (&b, listy(&a)) {
        if len(&a) == 2 {
            return elements_eq(
                &a,
                &Value::Tuple(vec![Value::Expr(lo.clone()), Value::Expr(hi.clone())]),
            );
        }
    }
    false
}

fn intervals_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (
            Value::Interval { lo: l1, hi: h1, lo_open: lo1, hi_open: ho1 },
            Value::Interval { lo: l2, hi: h2, lo_open: lo2, hi_open: ho2 },
        ) => {
            lo1 == lo2
                && ho1 == ho2
                && values_eq(&Value::Expr(l1.clone()), &Value::Expr(l2.clone()))
                && values_eq(&Value::Expr(h1.clone()), &Value::Expr(h2.clone()))
        }
        _ => false,
    }
}

/// Distinct elements of a finite set, in written order.
fn distinct(items: &[Value]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for v in items {
        if !out.contains(v) {
            out.push(v.clone());
        }
    }
    out
}

fn len(v: &Value) -> usize {
    match v {
        Value::Set(items) => distinct(items).len(),
        Value::Tuple(items) => items.len(),
        _ => 0,
    }
}

/// Equal as sets: the same elements in any order, or the same union of intervals.
fn same_set(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Empty, Value::Empty) => true,
        (Value::Empty, Value::Set(s)) | (Value::Set(s), Value::Empty) => s.is_empty(),
        (Value::Set(x), Value::Set(y)) => {
            let (x, y) = (distinct(x), distinct(y));
            let within = |p: &[Value], q: &[Value]| {
                p.iter().all(|e| q.iter().any(|f| e == f || numbers_equal(e, f)))
            };
            x.len() == y.len() && within(&x, &y) && within(&y, &x)
        }
        (Value::Union(x), Value::Union(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|p| y.iter().any(|q| p == q || intervals_eq(p, q) || same_set(p, q)))
        }
        (Value::Named(x), Value::Named(y)) => x == y,
        (Value::Tuple(x), Value::Tuple(y)) => x == y,
        _ => false,
    }
}

/// Two constant numbers with the same value.
fn numbers_equal(a: &Value, b: &Value) -> bool {
    match (a.as_expr().and_then(Expr::value), b.as_expr().and_then(Expr::value)) {
        (Some(x), Some(y)) => close(x, y, 1e-12),
        _ => false,
    }
}

/// The sort order of set elements: by value where they have one.
fn sort_key(v: &Value) -> (u8, f64, String) {
    let unwrapped = match v {
        Value::Rel(_) if is_assignment(v) => last_rhs(v.clone()),
        v => v.clone(),
    };
    match unwrapped.as_expr().and_then(Expr::value) {
        Some(c) if c.is_real() => (0, c.re, String::new()),
        _ => (1, 0.0, format!("{unwrapped:?}")),
    }
}

fn sorted(items: &[Value]) -> Vec<Value> {
    let mut v = distinct(items);
    v.sort_by(|a, b| {
        let (ka, kb) = (sort_key(a), sort_key(b));
        ka.0.cmp(&kb.0)
            .then(ka.1.partial_cmp(&kb.1).unwrap_or(Ordering::Equal))
            .then(ka.2.cmp(&kb.2))
    });
    v
}

/// Element-wise comparison of sets and tuples: a set reference sorts both sides; a tuple
/// reference takes a set answer in written order.
fn elements_eq(gold: &Value, pred: &Value) -> bool {
    if len(gold) != len(pred) {
        return false;
    }
    let (g, p) = match (gold, pred) {
        (Value::Set(g), Value::Set(p) | Value::Tuple(p)) => (sorted(g), sorted(p)),
        (Value::Tuple(g), Value::Set(p)) => (g.clone(), distinct(p)),
        (Value::Tuple(g), Value::Tuple(p)) => (g.clone(), p.clone()),
        _ => return false,
    };
    g.iter().zip(&p).all(|(a, b)| values_eq(a, b))
}
