//! Code grading as pure text (spec 8.3): the fenced Python blocks of a response, the checker of a
//! benchmark record, and the program that runs one block against its checker. Running the program
//! needs a sandbox and lives in `comas-sandbox`; nothing here starts a process.
use regex::Regex;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::sync::LazyLock;
use thiserror::Error;

/// The reference rule, kept verbatim for parity: no newline is required after the fence, so
/// whatever follows `python` on the fence line (e.g. `3` of "```python3") is part of the block.
static PYTHON_BLOCK: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?s)```python(.*?)```").expect("constant block pattern compiles")
});

/// The line every program starts with: model code often uses `List`, `Dict`, ... without importing.
pub const PROGRAM_PRELUDE: &str = "from typing import *";

/// Wall-clock limit of a benchmark run (spec 8.3).
pub const EVAL_TIMEOUT_SECS: f64 = 3.0;
/// Wall-clock limit of the training-time `is_correct` check (logging only, spec 8.3).
pub const TRAINING_TIMEOUT_SECS: f64 = 1.0;

/// Which blocks of a response count (config key `code_grading`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CodeGrading {
    /// Correct if any block passes: the parity setting Table 1 was produced with.
    #[default]
    AnyBlock,
    /// Only the last block is run: stricter, since an aggregator that restates several programs
    /// no longer gets credit for the best of them.
    LastBlock,
}

impl CodeGrading {
    pub fn as_str(self) -> &'static str {
        match self {
            CodeGrading::AnyBlock => "any_block",
            CodeGrading::LastBlock => "last_block",
        }
    }
}

impl fmt::Display for CodeGrading {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown code_grading {0:?}: expected \"any_block\" or \"last_block\"")]
pub struct UnknownCodeGrading(pub String);

impl FromStr for CodeGrading {
    type Err = UnknownCodeGrading;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [CodeGrading::AnyBlock, CodeGrading::LastBlock]
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| UnknownCodeGrading(s.to_string()))
    }
}

/// Every ```` ```python ```` block of `text`, in order, with the fence text removed.
pub fn python_blocks(text: &str) -> Vec<&str> {
    PYTHON_BLOCK.captures_iter(text).map(|c| c.get(1).map_or("", |m| m.as_str())).collect()
}

/// The blocks `mode` runs, in the order they are tried: all of them, or only the last one.
/// Empty when the response holds no block (graded wrong).
pub fn candidate_blocks(text: &str, mode: CodeGrading) -> Vec<&str> {
    let mut blocks = python_blocks(text);
    if mode == CodeGrading::LastBlock && blocks.len() > 1 {
        blocks.drain(..blocks.len() - 1);
    }
    blocks
}

/// The program run for one block: the typing prelude, the block, then the checker.
pub fn program(block: &str, checker: &str) -> String {
    format!("{PROGRAM_PRELUDE}\n{block}\n{checker}")
}

/// The programs `mode` runs for a response, in order (one per candidate block).
pub fn programs(text: &str, checker: &str, mode: CodeGrading) -> Vec<String> {
    candidate_blocks(text, mode).into_iter().map(|b| program(b, checker)).collect()
}

/// HumanEval's checker: the record's test code, then a call of its `check` on the entry point.
pub fn humaneval_checker(test: &str, entry_point: &str) -> String {
    format!("{test}\ncheck({entry_point})")
}

/// MBPP's checker: its asserts, one a line.
pub fn mbpp_checker<S: AsRef<str>>(asserts: &[S]) -> String {
    asserts.iter().map(AsRef::as_ref).collect::<Vec<_>>().join("\n")
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CheckerError {
    #[error("a code ground truth must be {{\"test\", \"entry_point\"}} (HumanEval), a list of asserts (MBPP) or test code, got {0}")]
    Shape(String),
}

/// The checker of a benchmark record's `gt` (spec 7.2): `{"test", "entry_point"}` for HumanEval,
/// a list of assert lines for MBPP, or a string of test code used as is (the training set's
/// coding `answer`).
pub fn checker_from_gt(gt: &serde_json::Value) -> Result<String, CheckerError> {
    use serde_json::Value;
    let shape = || CheckerError::Shape(truncate(&gt.to_string(), 120));
    match gt {
        Value::String(test) => Ok(test.clone()),
        Value::Array(items) => {
            let asserts: Option<Vec<&str>> = items.iter().map(Value::as_str).collect();
            asserts.map(|a| mbpp_checker(&a)).ok_or_else(shape)
        }
        Value::Object(map) => match (
            map.get("test").and_then(Value::as_str),
            map.get("entry_point").and_then(Value::as_str),
        ) {
            (Some(test), Some(entry_point)) => Ok(humaneval_checker(test, entry_point)),
            _ => Err(shape()),
        },
        _ => Err(shape()),
    }
}

fn truncate(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn blocks_follow_the_reference_regex() {
        let text = "Here:\n```python\ndef f():\n    return 1\n```\nand\n```python\ndef f():\n    return 2\n```";
        assert_eq!(
            python_blocks(text),
            vec!["\ndef f():\n    return 1\n", "\ndef f():\n    return 2\n"]
        );
        // No newline is needed after the fence, and the rest of the fence line stays in the block.
        assert_eq!(python_blocks("```pythonx = 1```"), vec!["x = 1"]);
        assert_eq!(python_blocks("```python3\nx = 1\n```"), vec!["3\nx = 1\n"]);
        // Other languages, unclosed fences and upper case do not count.
        assert!(python_blocks("```py\nx = 1\n```").is_empty());
        assert!(python_blocks("```Python\nx = 1\n```").is_empty());
        assert!(python_blocks("```python\nx = 1\n").is_empty());
        assert!(python_blocks("no code").is_empty());
        // Lazy match: a plain fence closes the block, and the next block starts after it.
        assert_eq!(
            python_blocks("```python\na\n```\n```\nplain\n```\n```python\nb\n```"),
            vec!["\na\n", "\nb\n"]
        );
        // An empty block is still a block.
        assert_eq!(python_blocks("``````python``````"), vec![""]);
    }

    #[test]
    fn modes_pick_all_or_the_last_block() {
        let text = "```python\nA\n``` then ```python\nB\n``` and ```python\nC\n```";
        assert_eq!(candidate_blocks(text, CodeGrading::AnyBlock), vec!["\nA\n", "\nB\n", "\nC\n"]);
        assert_eq!(candidate_blocks(text, CodeGrading::LastBlock), vec!["\nC\n"]);
        assert!(candidate_blocks("none", CodeGrading::LastBlock).is_empty());
        assert_eq!(candidate_blocks("```python\nA\n```", CodeGrading::LastBlock), vec!["\nA\n"]);
    }

    #[test]
    fn programs_are_prelude_block_checker() {
        assert_eq!(
            program("\ndef f(): return 1\n", "assert f() == 1"),
            "from typing import *\n\ndef f(): return 1\n\nassert f() == 1"
        );
        let checker =
            humaneval_checker("def check(candidate):\n    assert candidate() == 1\n", "f");
        assert_eq!(checker, "def check(candidate):\n    assert candidate() == 1\n\ncheck(f)");
        assert_eq!(
            mbpp_checker(&["assert f(1) == 2", "assert f(2) == 3"]),
            "assert f(1) == 2\nassert f(2) == 3"
        );
        assert_eq!(mbpp_checker::<&str>(&[]), "");
        let text = "```python\nA\n```\n```python\nB\n```";
        assert_eq!(
            programs(text, "C", CodeGrading::AnyBlock),
            vec!["from typing import *\n\nA\n\nC", "from typing import *\n\nB\n\nC"]
        );
        assert_eq!(
            programs(text, "C", CodeGrading::LastBlock),
            vec!["from typing import *\n\nB\n\nC"]
        );
    }

    #[test]
    fn checkers_come_from_every_gt_shape() {
        let he = json!({"test": "def check(c):\n    assert c(1) == 2\n", "entry_point": "inc"});
        assert_eq!(
            checker_from_gt(&he).unwrap(),
            "def check(c):\n    assert c(1) == 2\n\ncheck(inc)"
        );
        assert_eq!(
            checker_from_gt(&json!(["assert inc(1) == 2", "assert inc(2) == 3"])).unwrap(),
            "assert inc(1) == 2\nassert inc(2) == 3"
        );
        assert_eq!(
            checker_from_gt(&json!("def test_a():\n    pass\ntest_a()")).unwrap(),
            "def test_a():\n    pass\ntest_a()"
        );
        for bad in [
            json!(3),
            json!(null),
            json!({"test": "x"}),
            json!([1, 2]),
            json!({"entry_point": "f"}),
        ] {
            assert!(matches!(checker_from_gt(&bad), Err(CheckerError::Shape(_))), "{bad}");
        }
    }

    #[test]
    fn grading_mode_parses_and_serialises_as_config_strings() {
        assert_eq!("any_block".parse::<CodeGrading>().unwrap(), CodeGrading::AnyBlock);
        assert_eq!("last_block".parse::<CodeGrading>().unwrap(), CodeGrading::LastBlock);
        assert!("last".parse::<CodeGrading>().is_err());
        assert_eq!(CodeGrading::default(), CodeGrading::AnyBlock);
        assert_eq!(serde_json::to_string(&CodeGrading::LastBlock).unwrap(), "\"last_block\"");
        assert_eq!(
            serde_json::from_str::<CodeGrading>("\"any_block\"").unwrap(),
            CodeGrading::AnyBlock
        );
        assert_eq!(CodeGrading::LastBlock.to_string(), "last_block");
    }
}
