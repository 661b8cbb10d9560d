//! Math answers (GSM8K, MATH-500, AMC, AIME; spec §8.3): a port of the reference grader,
//! `math_verify` 0.8.0, called as `verify(parse(reference_text(gt)), parse(response))`.
//!
//! A reference answer is LaTeX written without math delimiters (MATH-500's `answer`, the training
//! data's `answer`). The reference grader searches a raw string the way it searches a reply, so
//! raw LaTeX often reads as nothing (`\sqrt{2}`) or as its first bare number (`2\sqrt{3}` reads as
//! 2); inside `$...$` it reads as meant. [`reference_text`] therefore wraps a reference that has no
//! delimiters and no box; the corpora in tests/fixtures/grade/ are labelled the same way
//! (reference_answer.py mirrors it) and measure the agreement.
use super::equiv;
use super::extract::{extract, Extracted};
use super::Failure;
use std::borrow::Cow;

/// What `math_verify.parse` gives for a text.
pub fn parse(text: &str) -> Extracted {
    extract(text)
}

/// The text parsed for a reference answer: the reference as written when it marks its math
/// itself (delimiters or a box) or is blank; otherwise trimmed and inside `$...$`, with line
/// breaks as spaces because an inline `$...$` span ends at a line break.
pub fn reference_text(gt: &str) -> Cow<'_, str> {
    let body = gt.trim_matches([' ', '\t', '\r', '\n']);
    if body.is_empty() || has_delimiters(gt) {
        return Cow::Borrowed(gt);
    }
    Cow::Owned(format!("${}$", body.replace('\n', " ")))
}

/// Whether a text marks its math: an unescaped `$` (or `$$`), `\(` or `\[`, or a `\boxed`. A bare
/// ` [a, b] ` does not count, although the reference grader reads one in a reply: in a reference
/// it is an interval, often one of several.
fn has_delimiters(text: &str) -> bool {
    let bytes = text.as_bytes();
    // The reference grader opens no span at a delimiter that follows a backslash.
    let escaped = |i: usize| i > 0 && bytes[i - 1] == b'\\';
    text.contains("\\boxed")
        || bytes.iter().enumerate().any(|(i, &b)| match b {
            b'$' => !escaped(i),
            b'(' | b'[' => escaped(i) && !escaped(i - 1),
            _ => false,
        })
}

/// What the reference grader reads in a reference answer (see [`reference_text`]).
pub fn parse_reference(gt: &str) -> Extracted {
    parse(&reference_text(gt))
}

/// `verify(parse(reference_text(gt)), parse(response))`.
pub fn is_equivalent(response: &str, gt: &str) -> bool {
    equiv::verify(&parse_reference(gt), &parse(response))
}

/// Grades a response against a ground truth; the failure says what was read.
pub fn grade(response: &str, gt: &str) -> Result<(), Failure> {
    let want = parse_reference(gt);
    let got = parse(response);
    if equiv::verify(&want, &got) {
        return Ok(());
    }
    if got.value.is_none() && got.text.is_none() {
        return Err(Failure::NoAnswer);
    }
    if want.value.is_none() && want.text.is_none() {
        return Err(Failure::UnreadableReference(gt.to_string()));
    }
    Err(Failure::NotEqual {
        got: got.text.unwrap_or_default(),
        want: want.text.unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_answer_forms() {
        let yes = [
            ("The answer is \\boxed{\\dfrac{1}{2}}.", "\\frac{1}{2}"),
            ("So the total is 1,000 dollars.", "1000"),
            ("\\boxed{0.5}", "\\frac{1}{2}"),
            ("\\boxed{x = 5}", "5"),
            ("\\boxed{(x+1)^2}", "$x^2+2x+1$"),
            ("\\boxed{2\\sqrt{3}}", "$\\sqrt{12}$"),
            ("\\boxed{\\{2, 1\\}}", "$\\{1,2\\}$"),
            ("\\boxed{(1, 2]}", "$(1,2]$"),
            ("\\boxed{0.333333}", "$\\frac{1}{3}$"),
            ("\\boxed{12 \\text{ cm}}", "12"),
        ];
        for (response, gt) in yes {
            assert!(is_equivalent(response, gt), "{response} vs {gt}");
        }
        let no = [
            ("\\boxed{0.333}", "$\\frac{1}{3}$"),
            ("\\boxed{25\\%}", "25"),
            ("\\boxed{[1, 2)}", "$(1,2]$"),
            ("\\boxed{x = 5}", "$y = 5$"),
            ("no number here", "4"),
        ];
        for (response, gt) in no {
            assert!(!is_equivalent(response, gt), "{response} vs {gt}");
        }
        assert_eq!(grade("nothing", "4"), Err(Failure::NoAnswer));
        assert_eq!(
            grade("\\boxed{3}", "\\text{}"),
            Err(Failure::UnreadableReference("\\text{}".into()))
        );
        assert_eq!(
            grade("\\boxed{3}", "\\sqrt{2}"),
            Err(Failure::NotEqual { got: "3".into(), want: "\\sqrt{2}".into() })
        );
        assert_eq!(
            grade("\\boxed{3}", "4"),
            Err(Failure::NotEqual { got: "3".into(), want: "4".into() })
        );
    }

    /// A reference is LaTeX: without delimiters it is read inside `$...$`, with them as written.
    #[test]
    fn references_are_read_as_latex() {
        let wrapped = [
            ("\\sqrt{7}", "$\\sqrt{7}$"),
            ("  (1, 2]\n", "$(1, 2]$"),
            ("\\$5", "$\\$5$"),
            ("a \\\\\nb", "$a \\\\ b$"),
            ("1 \\\\(2)", "$1 \\\\(2)$"),
        ];
        for (gt, read) in wrapped {
            assert_eq!(reference_text(gt), read, "{gt:?}");
        }
        for gt in
            ["$\\sqrt{7}$", "$$x$$", "\\(x\\)", "\\[x\\]", "\\boxed{7}", "costs $5", "", " \n"]
        {
            assert_eq!(reference_text(gt), gt, "{gt:?} is read as written");
        }
        // The reported misreadings: raw \sqrt{7} read as nothing, 2\sqrt{7} as 2, 50\% as 50, ...
        let yes = [
            ("\\boxed{\\sqrt{7}}", "\\sqrt{7}"),
            ("\\boxed{\\sqrt{28}}", "2\\sqrt{7}"),
            ("\\boxed{\\frac{1}{2}\\sqrt{3}}", "\\frac{\\sqrt{3}}{2}"),
            ("\\boxed{50\\%}", "50\\%"),
            ("\\boxed{(1,2]}", "(1, 2]"),
            ("\\boxed{[0,\\infty)}", "[0, \\infty)"),
            ("\\boxed{\\{2, 1\\}}", "\\{1, 2\\}"),
            ("\\boxed{(3,-1)}", "(3, -1)"),
            ("\\boxed{1 + x^2}", "x^2 + 1"),
            ("\\boxed{5}", "5 \\text{ cm}"),
            ("\\boxed{\\text{(B)}}", "\\text{(B)}"),
        ];
        for (response, gt) in yes {
            assert!(is_equivalent(response, gt), "{response} vs {gt}");
        }
        let no = [
            ("\\boxed{2}", "2\\sqrt{7}"),
            ("\\boxed{50}", "50\\%"),
            ("\\boxed{2}", "(1, 2]"),
            ("\\boxed{(-1, 3)}", "(3, -1)"),
            ("\\boxed{1}", "x^2 + 1"),
            ("\\boxed{\\text{(C)}}", "\\text{(B)}"),
        ];
        for (response, gt) in no {
            assert!(!is_equivalent(response, gt), "{response} vs {gt}");
        }
    }

    /// Forms the generated corpus (tests/fixtures/grade/math_pairs.jsonl) first found the port
    /// reading otherwise than the reference: symbol commands, intersections, differentials,
    /// operator names inside words, a standalone `i`, a matrix in parentheses.
    #[test]
    fn symbol_commands_intersections_and_complex_answers() {
        let yes = [
            (
                "\\boxed{\\left(\\begin{array}{cc} 1 & 2 \\\\ 3 & 4 \\end{array}\\right)}",
                "$\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}$",
            ),
            ("\\boxed{[1,3) \\cap [2,5]}", "$[2,5] \\cap [1,3)$"),
            ("\\boxed{\\angle 60^\\circ}", "$\\angle 60^\\circ$"),
            ("\\boxed{\\triangle ABC}", "$\\triangle ABC$"),
            ("\\boxed{2\\cdot i}", "$2 i$"),
            ("\\boxed{x + i}", "$x + i$"),
            ("\\boxed{r\\,dq}", "$rdq$"),
        ];
        for (response, gt) in yes {
            assert!(is_equivalent(response, gt), "{response} vs {gt}");
        }
        let no = [
            // `\angle` is a symbol: the product angle·60 is not 60.
            ("\\boxed{\\angle 60^\\circ}", "$60$"),
            // An intersection stays unevaluated: only the same intersection equals it.
            ("\\boxed{[1,3) \\cap [2,5]}", "$[2,3)$"),
            // A standalone `i` makes the symbols complex, and `2i` keeps them real.
            ("\\boxed{2\\cdot i}", "$2i$"),
            ("\\boxed{x + 1i}", "$x + i$"),
            // `dq` is one symbol (a differential); `D` is not a differential.
            ("\\boxed{rdq}", "$RDQ$"),
            // The `tr` in `triangle` is an operator name: the reference cannot read the word.
            ("\\boxed{\\text{triangle}}", "$triangle$"),
        ];
        for (response, gt) in no {
            assert!(!is_equivalent(response, gt), "{response} vs {gt}");
        }
    }

    /// Model output can be anything: no input may panic or take long.
    #[test]
    fn arbitrary_text_never_panics() {
        use rand::{Rng, SeedableRng};
        let pieces = [
            "\\boxed{",
            "}",
            "{",
            "$",
            "$$",
            "\\[",
            "\\]",
            "\\(",
            "\\)",
            "(",
            ")",
            "[",
            "]",
            "\\{",
            "\\}",
            ",",
            ";",
            "=",
            "<",
            "\\le",
            "+",
            "-",
            "*",
            "/",
            "^",
            "_",
            "!",
            "%",
            "\\%",
            "&",
            "\\\\",
            "1",
            "23",
            "0.5",
            ".7",
            "1,000",
            "x",
            "y",
            "e",
            "i",
            "\\pi",
            "\\infty",
            "\\frac",
            "\\sqrt",
            "\\text{cm}",
            "\\mbox{",
            "\\left(",
            "\\right)",
            "\\cup",
            "\\setminus",
            "\\pm",
            "\\in",
            "\\begin{pmatrix}",
            "\\end{pmatrix}",
            "\\sin",
            "\\log_",
            " ",
            "\n",
            "answer",
            "The final answer is",
            "I hope",
            "é",
            "−",
            "×",
            "\\",
            "\\approx",
            "|",
            "\\cap",
            "\\angle",
            "d",
            "dx",
            "tr",
            "\\cdot i",
            "\\left(\\begin{array}{cc}",
            "\\end{array}\\right)",
            "&",
        ];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        for _ in 0..3000 {
            let n = rng.gen_range(1..40);
            let text: String = (0..n).map(|_| pieces[rng.gen_range(0..pieces.len())]).collect();
            let gt: String =
                (0..rng.gen_range(1..8)).map(|_| pieces[rng.gen_range(0..pieces.len())]).collect();
            let _ = is_equivalent(&text, &gt);
            let _ = super::super::numeric::grade(&text, &gt);
        }
        // Deep nesting reads as nothing instead of overflowing the stack.
        let deep = format!("\\boxed{{{}1{}}}", "(".repeat(5000), ")".repeat(5000));
        assert!(!is_equivalent(&deep, "1"));
        let braces = format!("${}1{}$", "{".repeat(5000), "}".repeat(5000));
        let _ = is_equivalent(&braces, "1");
        let powers = format!("$2{}$", "^2".repeat(5000));
        let _ = is_equivalent(&powers, "1");
        let signs = format!("${}1$", "-".repeat(5000));
        let _ = is_equivalent(&signs, "1");
        let arithmetic = format!("The answer is {}1{}.", "(".repeat(5000), ")".repeat(5000));
        let _ = is_equivalent(&arithmetic, "1");
    }
}
