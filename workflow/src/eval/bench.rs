//! Benchmark items: the record format of spec §7.2, which grader each one takes, the built-in
//! arithmetic benchmark and the HumanEval query.
use crate::code;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How an item's final output is graded (spec §8.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum GraderKind {
    /// Symbolic equivalence with the ground truth (GSM8K, MATH-500, AMC, AIME, arithmetic).
    Math,
    /// The last `\boxed{A-D}` (GPQA, MMLU, MedQA).
    Choice,
    /// A number within 5 % (SciBench).
    Numeric,
    /// Python run against `checker` in the sandbox (HumanEval, MBPP).
    Code { checker: String },
}

impl GraderKind {
    pub fn name(&self) -> &'static str {
        match self {
            GraderKind::Math => "math",
            GraderKind::Choice => "choice",
            GraderKind::Numeric => "numeric",
            GraderKind::Code { .. } => "code",
        }
    }
}

/// One question to evaluate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BenchItem {
    pub id: String,
    pub query: String,
    /// The ground truth as text (for code: the checker is in `grader`).
    pub answer: String,
    pub grader: GraderKind,
    /// The record's `tag` (benchmark name), used to group results.
    pub tag: String,
}

/// A record of spec §7.2: `{query, gt, tag, source}`; `id` is optional (the line number
/// otherwise).
#[derive(Debug, Deserialize)]
struct Record {
    query: String,
    gt: Value,
    #[serde(default)]
    tag: String,
    #[serde(default)]
    source: String,
    #[serde(default)]
    id: Option<Value>,
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("line {line}: {message}")]
    Line { line: usize, message: String },
    #[error("the benchmark file holds no records")]
    Empty,
}

/// The grader a record's benchmark takes, from its tag (else its source).
fn grader_for(tag: &str, gt: &Value) -> Result<GraderKind, String> {
    let t = tag.to_ascii_lowercase();
    let has = |names: &[&str]| names.iter().any(|n| t.contains(n));
    if has(&["humaneval", "mbpp", "code", "kodcode"]) {
        return code::checker_from_gt(gt).map(|checker| GraderKind::Code { checker }).map_err(|e| e.to_string());
    }
    Ok(if has(&["gpqa", "mmlu", "medqa", "choice"]) {
        GraderKind::Choice
    } else if has(&["scibench", "numeric", "science"]) {
        GraderKind::Numeric
    } else {
        GraderKind::Math
    })
}

fn gt_text(gt: &Value) -> String {
    match gt {
        Value::String(s) => s.clone(),
        Value::Array(items) => items.first().map(gt_text).unwrap_or_default(),
        other => other.to_string(),
    }
}

/// Reads a JSONL file of spec §7.2 records.
pub fn parse_bench(text: &str) -> Result<Vec<BenchItem>, BenchError> {
    let mut items = Vec::new();
    // The line of each id: a resumed run tells questions apart by id, so two records with one
    // id would be graded as one.
    let mut lines: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let err = |message: String| BenchError::Line { line: i + 1, message };
        let r: Record = serde_json::from_str(line).map_err(|e| err(format!("not a benchmark record {{query, gt, tag, source}}: {e}")))?;
        let tag = if r.tag.is_empty() { r.source.clone() } else { r.tag.clone() };
        let grader = grader_for(&tag, &r.gt).map_err(err)?;
        let given = r.id.is_some();
        let id = match r.id {
            Some(Value::String(s)) => s,
            Some(v) => v.to_string(),
            None => format!("{}-{}", if tag.is_empty() { "item" } else { tag.as_str() }, items.len()),
        };
        if let Some(first) = lines.insert(id.clone(), i + 1) {
            let whose = if given { format!("id `{id}` is") } else { format!("the record has no `id` and gets `{id}`, which is") };
            return Err(err(format!("{whose} also the id of line {first}; give every question its own `id` (a resumed run tells questions apart by id)")));
        }
        items.push(BenchItem { id, query: r.query, answer: gt_text(&r.gt), grader, tag });
    }
    if items.is_empty() {
        return Err(BenchError::Empty);
    }
    Ok(items)
}

/// The built-in benchmark: `n` two-step arithmetic word problems with their answers, the same
/// for a given seed. Needs no download.
pub fn arithmetic(n: usize, seed: u64) -> Vec<BenchItem> {
    const PEOPLE: [&str; 6] = ["Ava", "Noah", "Priya", "Tomas", "Keiko", "Samir"];
    const THINGS: [&str; 6] = ["apples", "pencils", "stamps", "shells", "cards", "beads"];
    let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
    let mut next = |m: u64| {
        // SplitMix64: a fixed, dependency-free sequence.
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % m
    };
    (0..n)
        .map(|i| {
            let who = PEOPLE[next(6) as usize];
            let what = THINGS[next(6) as usize];
            let (a, b) = (10 + next(40), 2 + next(20));
            let c = 1 + next(b.min(a + b - 1));
            let answer = a + b - c;
            let query = format!(
                "{who} has {a} {what}. A friend gives {who} {b} more, and then {who} gives away {c}. How many {what} does {who} have now? Put the final number in \\boxed{{}}."
            );
            BenchItem { id: format!("arith-{i:04}"), query, answer: answer.to_string(), grader: GraderKind::Math, tag: "arithmetic".into() }
        })
        .collect()
}

/// The query of a HumanEval problem: its prompt and the request for one Python block.
pub fn humaneval_query(prompt: &str) -> String {
    format!(
        "Complete the following Python function. Reply with the whole function, including its signature, in a single ```python code block.\n\n```python\n{}```",
        prompt
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_take_the_grader_of_their_benchmark() {
        let text = r#"{"query": "q1", "gt": "\\frac{1}{2}", "tag": "math500", "source": "math"}
{"query": "q2", "gt": "B", "tag": "gpqa", "source": "gpqa", "id": "g-1"}
{"query": "q3", "gt": "+1.4e+24", "tag": "scibench", "source": "scibench"}
{"query": "q4", "gt": {"test": "def check(c):\n    assert c(1) == 2\n", "entry_point": "inc"}, "tag": "humaneval", "source": "humaneval"}

{"query": "q5", "gt": ["assert f(1) == 1", "assert f(2) == 4"], "tag": "mbpp", "source": "mbpp"}
"#;
        let items = parse_bench(text).unwrap();
        assert_eq!(items.len(), 5);
        assert_eq!((items[0].grader.name(), items[0].answer.as_str(), items[0].id.as_str()), ("math", "\\frac{1}{2}", "math500-0"));
        assert_eq!((items[1].grader.name(), items[1].id.as_str()), ("choice", "g-1"));
        assert_eq!(items[2].grader, GraderKind::Numeric);
        assert_eq!(items[3].grader, GraderKind::Code { checker: "def check(c):\n    assert c(1) == 2\n\ncheck(inc)".into() });
        assert_eq!(items[4].grader, GraderKind::Code { checker: "assert f(1) == 1\nassert f(2) == 4".into() });
    }

    #[test]
    fn a_bad_record_names_its_line() {
        let err = parse_bench("{\"query\": \"q\", \"gt\": \"1\"}\n{\"gt\": 2}\n").unwrap_err().to_string();
        assert!(err.starts_with("line 2:"), "{err}");
        let err = parse_bench("{\"query\": \"q\", \"gt\": 5, \"tag\": \"humaneval\"}").unwrap_err().to_string();
        assert!(err.contains("line 1") && err.contains("entry_point"), "{err}");
        assert!(matches!(parse_bench("\n\n"), Err(BenchError::Empty)));
    }

    #[test]
    fn a_duplicate_id_names_both_lines() {
        let text = "{\"query\": \"1+1?\", \"gt\": \"2\", \"id\": \"q0\"}\n\n{\"query\": \"3+3?\", \"gt\": \"6\", \"id\": \"q2\"}\n{\"query\": \"5+5?\", \"gt\": \"10\", \"id\": \"q0\"}\n";
        let err = parse_bench(text).unwrap_err().to_string();
        assert!(err.starts_with("line 4: id `q0` is also the id of line 1;"), "{err}");
        // A generated id that an explicit one already took.
        let text = "{\"query\": \"a\", \"gt\": \"1\", \"tag\": \"t\", \"id\": \"t-1\"}\n{\"query\": \"b\", \"gt\": \"2\", \"tag\": \"t\"}\n";
        let err = parse_bench(text).unwrap_err().to_string();
        assert!(err.starts_with("line 2: the record has no `id` and gets `t-1`, which is also the id of line 1"), "{err}");
    }

    #[test]
    fn arithmetic_problems_are_fixed_by_the_seed_and_their_answers_are_right() {
        let a = arithmetic(50, 7);
        assert_eq!(a, arithmetic(50, 7));
        assert_ne!(a, arithmetic(50, 8));
        for item in &a {
            // "... has A things. A friend gives ... B more, and then ... gives away C."
            let nums: Vec<u64> = item.query.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect();
            assert_eq!(nums.len(), 3, "{}", item.query);
            assert_eq!(item.answer, (nums[0] + nums[1] - nums[2]).to_string());
            assert!(nums[2] >= 1 && nums[0] + nums[1] > nums[2]);
        }
    }
}
