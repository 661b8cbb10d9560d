//! Converters from the row layouts that benchmarks are published in (their Hugging Face JSON,
//! JSONL and parquet files) to the benchmark record of spec §7.2. Pure: one row, as a JSON
//! object, in; one record out. Reading the files is the caller's business (`comas convert-bench`).
//!
//! Every query ends with its format instruction (spec §7.2): a `\boxed{}` request (a decimal for
//! SciBench, a letter A–D for GPQA, MMLU and MedQA) or, for MBPP, a request for one ```` ```python ````
//! block after the listed asserts.
use crate::error::json_kind as kind_of;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt;
use std::str::FromStr;

/// A published benchmark layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Gsm8k,
    Math500,
    Mbpp,
    Gpqa,
    Mmlu,
    Medqa,
    Scibench,
}

impl Format {
    pub const ALL: [Format; 7] = [Format::Gsm8k, Format::Math500, Format::Mbpp, Format::Gpqa, Format::Mmlu, Format::Medqa, Format::Scibench];

    /// The name on the command line, also the records' `tag` and `source` (`parse_bench` picks
    /// the grader from it).
    pub fn name(self) -> &'static str {
        match self {
            Format::Gsm8k => "gsm8k",
            Format::Math500 => "math500",
            Format::Mbpp => "mbpp",
            Format::Gpqa => "gpqa",
            Format::Mmlu => "mmlu",
            Format::Medqa => "medqa",
            Format::Scibench => "scibench",
        }
    }

    /// The columns a row must have. Each entry lists interchangeable names: MATH files carry an
    /// `answer` or only a `solution`; MBPP's full config calls the task `text`, its sanitized
    /// config `prompt`.
    pub fn required_columns(self) -> &'static [&'static [&'static str]] {
        match self {
            Format::Gsm8k => &[&["question"], &["answer"]],
            Format::Math500 => &[&["problem"], &["answer", "solution"]],
            Format::Mbpp => &[&["text", "prompt"], &["test_list"]],
            Format::Gpqa => &[&["Question"], &["Correct Answer"], &["Incorrect Answer 1"], &["Incorrect Answer 2"], &["Incorrect Answer 3"]],
            Format::Mmlu => &[&["question"], &["choices"], &["answer"]],
            Format::Medqa => &[&["question"], &["options"], &["answer_idx"]],
            Format::Scibench => &[&["problem_text"], &["answer_number"], &["unit"]],
        }
    }

    /// Columns read when present (ids, MMLU's subject, MBPP's test imports).
    pub fn optional_columns(self) -> &'static [&'static str] {
        match self {
            Format::Gsm8k => &[],
            Format::Math500 => &["unique_id"],
            Format::Mbpp => &["task_id", "test_setup_code", "test_imports"],
            Format::Gpqa => &["Record ID"],
            Format::Mmlu => &["subject"],
            Format::Medqa => &["id", "meta_info"],
            Format::Scibench => &["source", "problemid"],
        }
    }

    /// Every column a converter reads (to project a parquet file onto).
    pub fn columns(self) -> impl Iterator<Item = &'static str> {
        self.required_columns().iter().flat_map(|alts| alts.iter().copied()).chain(self.optional_columns().iter().copied())
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown benchmark format `{0}`: use gsm8k, math500, mbpp, gpqa, mmlu, medqa or scibench")]
pub struct UnknownFormat(String);

impl FromStr for Format {
    type Err = UnknownFormat;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Format::ALL.into_iter().find(|f| f.name().eq_ignore_ascii_case(s)).ok_or_else(|| UnknownFormat(s.to_string()))
    }
}

/// Why a file or a row cannot be converted. The caller adds the file and the row number.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConvertError {
    #[error("no column {column} for {format}; the columns there are: {}", present.join(", "))]
    MissingColumn { format: Format, column: String, present: Vec<String> },
    #[error("column {0} is null")]
    NullColumn(String),
    #[error("a row must be a JSON object, got {0}")]
    NotAnObject(String),
    #[error("the row does not fit the {format} layout: {message}")]
    Layout { format: Format, message: String },
    #[error("the answer has no final `#### <number>` line")]
    NoFinalAnswer,
    #[error("the `answer` column is empty and the solution has no \\boxed{{}}")]
    NoBoxedAnswer,
    #[error("{0} choices; the choice grader takes exactly 4 (A–D)")]
    ChoiceCount(usize),
    #[error("answer {0} is not one of 0–3 or A–D")]
    BadChoiceAnswer(String),
    #[error("answer_number `{0}` is not a number")]
    NotANumber(String),
    #[error("test_list is empty")]
    NoTests,
}

/// The record's ground truth: text, or MBPP's list of checker lines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Gt {
    Text(String),
    Asserts(Vec<String>),
}

/// A spec §7.2 record, with an `id` that `comas eval` resumes by.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BenchRecord {
    pub query: String,
    pub gt: Gt,
    pub tag: String,
    pub source: String,
    pub id: String,
}

impl BenchRecord {
    fn new(format: Format, id: String, query: String, gt: Gt) -> Self {
        BenchRecord { query, gt, tag: format.name().into(), source: format.name().into(), id }
    }
}

/// Fails with [`ConvertError::MissingColumn`] unless every required column (or one of its
/// alternatives) is among `columns`.
pub fn check_columns<'a>(format: Format, columns: impl IntoIterator<Item = &'a str>) -> Result<(), ConvertError> {
    let mut present: Vec<String> = columns.into_iter().map(str::to_string).collect();
    present.sort();
    for alts in format.required_columns() {
        if !alts.iter().any(|a| present.iter().any(|p| p == a)) {
            let column = alts.iter().map(|a| format!("`{a}`")).collect::<Vec<_>>().join(" or ");
            return Err(ConvertError::MissingColumn { format, column, present });
        }
    }
    Ok(())
}

/// Converts one row. `index` (0-based, over all input files) names rows that carry no id of
/// their own; `seed` fixes GPQA's choice order.
pub fn convert_row(format: Format, row: Value, index: usize, seed: u64) -> Result<BenchRecord, ConvertError> {
    let Value::Object(map) = row else {
        return Err(ConvertError::NotAnObject(kind_of(&row).into()));
    };
    check_columns(format, map.keys().map(String::as_str))?;
    // A null in a column the row cannot do without (parquet nulls, `None` in exports) is named
    // here, as serde's message would not say which column it was.
    for alts in format.required_columns() {
        if alts.iter().all(|a| map.get(*a).is_none_or(Value::is_null)) {
            return Err(ConvertError::NullColumn(format!("`{}`", alts[0])));
        }
    }
    match format {
        Format::Gsm8k => gsm8k(typed(format, map)?, index),
        Format::Math500 => math(typed(format, map)?, index),
        Format::Mbpp => mbpp(typed(format, map)?, index),
        Format::Gpqa => gpqa(typed(format, map)?, index, seed),
        Format::Mmlu => mmlu(typed(format, map)?, index),
        Format::Medqa => medqa(typed(format, map)?, index),
        Format::Scibench => scibench(typed(format, map)?, index),
    }
}

fn typed<T: for<'de> Deserialize<'de>>(format: Format, map: Map<String, Value>) -> Result<T, ConvertError> {
    serde_json::from_value(Value::Object(map)).map_err(|e| ConvertError::Layout { format, message: e.to_string() })
}

/// Makes ids unique by suffixing repeats with `-2`, `-3`, … (`comas eval` resumes by id).
/// Returns (old id, new id) for each renamed record.
pub fn dedupe_ids(records: &mut [BenchRecord]) -> Vec<(String, String)> {
    let mut seen = std::collections::HashSet::new();
    let mut renamed = Vec::new();
    for r in records.iter_mut() {
        if !seen.insert(r.id.clone()) {
            let new = (2..).map(|k| format!("{}-{k}", r.id)).find(|c| !seen.contains(c)).expect("an unused suffix");
            seen.insert(new.clone());
            renamed.push((std::mem::replace(&mut r.id, new.clone()), new));
        }
    }
    renamed
}

const BOXED: &str = "Reason step by step, then put the final answer in \\boxed{}.";
const BOXED_DECIMAL: &str = "Reason step by step, then put the final answer in \\boxed{} as a decimal number, without the unit.";
const BOXED_LETTER: &str = "Reason step by step, then put only the letter of the correct option (A, B, C or D) in \\boxed{}.";
const PYTHON_BLOCK: &str = "Write the Python function and reply with the complete code in a single ```python code block.";

// --- GSM8K (openai/gsm8k): {question, answer}; the answer's reasoning ends with `#### 72`. ---

#[derive(Deserialize)]
struct Gsm8kRow {
    question: String,
    answer: String,
}

/// The number after GSM8K's last `####`, without thousands separators (`1,000` would read as a
/// tuple to the math grader).
pub fn gsm8k_final_answer(answer: &str) -> Option<String> {
    let (_, tail) = answer.rsplit_once("####")?;
    let n: String = tail.trim().chars().filter(|&c| c != ',').collect();
    (!n.is_empty()).then_some(n)
}

fn gsm8k(row: Gsm8kRow, index: usize) -> Result<BenchRecord, ConvertError> {
    let gt = gsm8k_final_answer(&row.answer).ok_or(ConvertError::NoFinalAnswer)?;
    let query = format!("{}\n\n{BOXED}", row.question.trim());
    Ok(BenchRecord::new(Format::Gsm8k, format!("gsm8k-{index}"), query, Gt::Text(gt)))
}

// --- MATH-500 (HuggingFaceH4/MATH-500): {problem, solution, answer, subject, level, unique_id};
// MATH itself (hendrycks) has no `answer`: the solution's last \boxed{} is. ---

#[derive(Deserialize)]
struct MathRow {
    problem: String,
    #[serde(default)]
    answer: Option<String>,
    #[serde(default)]
    solution: Option<String>,
    #[serde(default)]
    unique_id: Option<String>,
}

/// The content of the last `\boxed{…}` (or `\fbox{…}`, or `\boxed 5`) in `text`, braces matched.
pub fn last_boxed(text: &str) -> Option<&str> {
    let (at, macro_len) = match (text.rfind("\\boxed"), text.rfind("\\fbox")) {
        (Some(b), Some(f)) if f > b => (f, "\\fbox".len()),
        (Some(b), _) => (b, "\\boxed".len()),
        (None, Some(f)) => (f, "\\fbox".len()),
        (None, None) => return None,
    };
    let rest = &text[at + macro_len..];
    if let Some(inner) = rest.strip_prefix('{') {
        let mut depth = 1usize;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(inner[..i].trim());
                    }
                }
                _ => {}
            }
        }
        None
    } else if let Some(arg) = rest.strip_prefix(' ') {
        // `\boxed 5$`: the argument runs to the closing `$`.
        let arg = arg.split('$').next().unwrap_or("").trim();
        (!arg.is_empty()).then_some(arg)
    } else {
        None
    }
}

fn math(row: MathRow, index: usize) -> Result<BenchRecord, ConvertError> {
    let gt = match row.answer.as_deref().map(str::trim).filter(|a| !a.is_empty()) {
        Some(a) => a.to_string(),
        None => row.solution.as_deref().and_then(last_boxed).ok_or(ConvertError::NoBoxedAnswer)?.to_string(),
    };
    let id = row.unique_id.filter(|u| !u.trim().is_empty()).unwrap_or_else(|| format!("math500-{index}"));
    let query = format!("{}\n\n{BOXED}", row.problem.trim());
    Ok(BenchRecord::new(Format::Math500, id, query, Gt::Text(gt)))
}

// --- MBPP (google-research-datasets/mbpp). full: {task_id, text, code, test_list,
// test_setup_code, challenge_test_list}; sanitized: {source_file, task_id, prompt, code,
// test_imports, test_list}. ---

#[derive(Deserialize)]
#[serde(untagged)]
enum TaskId {
    Number(i64),
    Text(String),
}

#[derive(Deserialize)]
struct MbppRow {
    #[serde(default)]
    task_id: Option<TaskId>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    prompt: Option<String>,
    test_list: Vec<String>,
    #[serde(default)]
    test_setup_code: Option<String>,
    #[serde(default)]
    test_imports: Option<Vec<String>>,
}

fn mbpp(row: MbppRow, index: usize) -> Result<BenchRecord, ConvertError> {
    let asserts: Vec<String> = row.test_list.iter().map(|t| t.trim().to_string()).filter(|t| !t.is_empty()).collect();
    if asserts.is_empty() {
        return Err(ConvertError::NoTests);
    }
    let task = row.text.filter(|t| !t.trim().is_empty()).or(row.prompt).unwrap_or_default();
    let query = format!("{}\nYour code should pass these tests:\n\n{}\n\n{PYTHON_BLOCK}", task.trim(), asserts.join("\n"));
    // The checker is the gt lines joined by newlines (spec §8.3), so the asserts' own imports and
    // setup go first: a solution that imports `math` inside its function must still pass.
    let setup = row.test_setup_code.into_iter().chain(row.test_imports.into_iter().flatten());
    let gt: Vec<String> = setup.map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).chain(asserts).collect();
    let id = match row.task_id {
        Some(TaskId::Number(n)) => format!("mbpp/{n}"),
        Some(TaskId::Text(t)) if !t.trim().is_empty() => t.trim().to_string(),
        _ => format!("mbpp-{index}"),
    };
    Ok(BenchRecord::new(Format::Mbpp, id, query, Gt::Asserts(gt)))
}

// --- Multiple choice: GPQA and MMLU. ---

const LETTERS: [char; 4] = ['A', 'B', 'C', 'D'];

fn choice_query(preamble: &str, question: &str, options: &[&str]) -> String {
    let listed: Vec<String> = LETTERS.iter().zip(options).map(|(l, o)| format!("{l}) {}", o.trim())).collect();
    format!("{preamble}{}\n\n{}\n\n{BOXED_LETTER}", question.trim(), listed.join("\n"))
}

// GPQA (Idavidrein/gpqa): {Question, Correct Answer, Incorrect Answer 1..3, Record ID, ...}.
#[derive(Deserialize)]
struct GpqaRow {
    #[serde(rename = "Question")]
    question: String,
    #[serde(rename = "Correct Answer")]
    correct: String,
    #[serde(rename = "Incorrect Answer 1")]
    incorrect1: String,
    #[serde(rename = "Incorrect Answer 2")]
    incorrect2: String,
    #[serde(rename = "Incorrect Answer 3")]
    incorrect3: String,
    #[serde(rename = "Record ID", default)]
    record_id: Option<String>,
}

/// Keeps GPQA's shuffle stream apart from other uses of the same seed.
const GPQA_SHUFFLE: u64 = 0x6770_7161_5f73_6875;

/// FNV-1a: a stable hash, so a question's choice order depends on the seed and its text only,
/// not on its position in the file (GPQA diamond and main then agree on shared questions).
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// GPQA's options in their shuffled order and the letter of the correct one.
pub fn gpqa_shuffle<'a>(question: &str, correct: &'a str, incorrect: [&'a str; 3], seed: u64) -> ([&'a str; 4], char) {
    use rand::seq::SliceRandom;
    let mut options = [(correct, true), (incorrect[0], false), (incorrect[1], false), (incorrect[2], false)];
    options.shuffle(&mut crate::seed::rng_for(&[seed, GPQA_SHUFFLE, fnv1a(question.trim())]));
    let at = options.iter().position(|(_, right)| *right).expect("the correct option is among them");
    (options.map(|(o, _)| o), LETTERS[at])
}

fn gpqa(row: GpqaRow, index: usize, seed: u64) -> Result<BenchRecord, ConvertError> {
    let (options, letter) = gpqa_shuffle(&row.question, &row.correct, [&row.incorrect1, &row.incorrect2, &row.incorrect3], seed);
    let query = choice_query("", &row.question, &options);
    let id = row.record_id.map(|r| r.trim().to_string()).filter(|r| !r.is_empty()).unwrap_or_else(|| format!("gpqa-{index}"));
    Ok(BenchRecord::new(Format::Gpqa, id, query, Gt::Text(letter.to_string())))
}

// MMLU (cais/mmlu): {question, subject, choices: [4 strings], answer: 0..3}. Some exports give
// the answer as a letter.
#[derive(Deserialize)]
#[serde(untagged)]
enum ChoiceAnswer {
    Index(u64),
    Letter(String),
}

#[derive(Deserialize)]
struct MmluRow {
    question: String,
    #[serde(default)]
    subject: Option<String>,
    choices: Vec<String>,
    answer: ChoiceAnswer,
}

fn mmlu(row: MmluRow, index: usize) -> Result<BenchRecord, ConvertError> {
    if row.choices.len() != 4 {
        return Err(ConvertError::ChoiceCount(row.choices.len()));
    }
    let letter = match &row.answer {
        ChoiceAnswer::Index(i) => LETTERS.get(*i as usize).copied(),
        ChoiceAnswer::Letter(s) => LETTERS.iter().copied().find(|l| s.trim().eq_ignore_ascii_case(&l.to_string())),
    };
    let letter = letter.ok_or_else(|| {
        ConvertError::BadChoiceAnswer(match row.answer {
            ChoiceAnswer::Index(i) => i.to_string(),
            ChoiceAnswer::Letter(s) => format!("`{s}`"),
        })
    })?;
    let preamble = match row.subject.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
        Some(s) => format!("The following is a multiple-choice question about {}.\n\n", s.replace('_', " ")),
        None => String::new(),
    };
    let options: Vec<&str> = row.choices.iter().map(String::as_str).collect();
    let query = choice_query(&preamble, &row.question, &options);
    Ok(BenchRecord::new(Format::Mmlu, format!("mmlu-{index}"), query, Gt::Text(letter.to_string())))
}

// MedQA (jind11/MedQA's US 4-option JSONL, GBaker/MedQA-USMLE-4-options): {question,
// options: {"A": .., "B": .., "C": .., "D": ..}, answer_idx: "A", answer, meta_info}.
#[derive(Deserialize)]
struct MedqaRow {
    question: String,
    options: std::collections::BTreeMap<String, String>,
    answer_idx: String,
    #[serde(default)]
    id: Option<Value>,
}

fn medqa(row: MedqaRow, index: usize) -> Result<BenchRecord, ConvertError> {
    let keys: Vec<&str> = row.options.keys().map(|k| k.trim()).collect();
    if keys != ["A", "B", "C", "D"] {
        return Err(ConvertError::ChoiceCount(row.options.len()));
    }
    let answer = row.answer_idx.trim().to_ascii_uppercase();
    if !row.options.contains_key(&answer) {
        return Err(ConvertError::BadChoiceAnswer(format!("`{}`", row.answer_idx)));
    }
    let options: Vec<&str> = row.options.values().map(String::as_str).collect();
    let query = choice_query("", &row.question, &options);
    let id = match row.id {
        Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_string(),
        Some(Value::Number(n)) => format!("medqa/{n}"),
        _ => format!("medqa-{index}"),
    };
    Ok(BenchRecord::new(Format::Medqa, id, query, Gt::Text(answer)))
}

// --- SciBench (xw27/scibench, mandyyyyii/scibench dataset/*.json): {problem_text, answer_latex,
// answer_number, unit, source, problemid, comment, ...}; answer_number is text such as "+65.49".

#[derive(Deserialize)]
#[serde(untagged)]
enum NumberText {
    Number(serde_json::Number),
    Text(String),
}

#[derive(Deserialize)]
struct ScibenchRow {
    problem_text: String,
    answer_number: NumberText,
    #[serde(default)]
    unit: Option<String>,
    #[serde(default)]
    source: Option<String>,
    #[serde(default)]
    problemid: Option<String>,
}

fn scibench(row: ScibenchRow, index: usize) -> Result<BenchRecord, ConvertError> {
    let gt = match row.answer_number {
        NumberText::Number(n) => n.to_string(),
        NumberText::Text(t) => t.trim().to_string(),
    };
    // The grader strips a leading `+` and reads a float; one that would never parse is a bad row.
    if gt.strip_prefix('+').unwrap_or(&gt).parse::<f64>().is_err() {
        return Err(ConvertError::NotANumber(gt));
    }
    // Spec §7.1: the question ends with a sentence that states the unit (none when dimensionless).
    let unit = row.unit.as_deref().map(str::trim).unwrap_or("");
    let unit_sentence = if unit.is_empty() { String::new() } else { format!(" The unit of the answer is {unit}.") };
    let query = format!("{}{unit_sentence}\n\n{BOXED_DECIMAL}", row.problem_text.trim());
    let textbook = row.source.as_deref().map(str::trim).unwrap_or("");
    let id = match row.problemid.as_deref().map(str::trim) {
        Some(p) if !p.is_empty() && !textbook.is_empty() => format!("scibench/{textbook}/{p}"),
        _ => format!("scibench-{index}"),
    };
    Ok(BenchRecord::new(Format::Scibench, id, query, Gt::Text(gt)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::{parse_bench, GraderKind};
    use serde_json::json;

    fn one(format: Format, row: Value) -> BenchRecord {
        convert_row(format, row, 7, 0).unwrap()
    }

    /// The record as `comas eval` reads it back.
    fn read_back(r: &BenchRecord) -> crate::eval::BenchItem {
        parse_bench(&serde_json::to_string(r).unwrap()).unwrap().remove(0)
    }

    #[test]
    fn gsm8k_takes_the_number_after_the_hashes() {
        let row = json!({
            "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?",
            "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
        });
        let r = one(Format::Gsm8k, row);
        assert_eq!(r.gt, Gt::Text("72".into()));
        assert_eq!(r.id, "gsm8k-7");
        assert_eq!((r.tag.as_str(), r.source.as_str()), ("gsm8k", "gsm8k"));
        assert_eq!(
            r.query,
            "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?\n\nReason step by step, then put the final answer in \\boxed{}."
        );
        let item = read_back(&r);
        assert_eq!((item.grader, item.answer.as_str(), item.id.as_str()), (GraderKind::Math, "72", "gsm8k-7"));
        assert_eq!(gsm8k_final_answer("so 1,000 + 200 = 1200\n#### 1,200"), Some("1200".into()));
        assert_eq!(gsm8k_final_answer("#### -3.5 "), Some("-3.5".into()));
        assert_eq!(gsm8k_final_answer("72"), None);
        let err = convert_row(Format::Gsm8k, json!({"question": "q", "answer": "72"}), 0, 0).unwrap_err();
        assert_eq!(err, ConvertError::NoFinalAnswer);
    }

    #[test]
    fn math500_uses_its_answer_column_else_the_last_box_of_the_solution() {
        let row = json!({
            "problem": "Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.  Enter your answer in the form $(r,\\theta),$ where $r > 0$ and $0 \\le \\theta < 2 \\pi.$",
            "solution": "We have that $r = \\sqrt{0^2 + 3^2} = 3.$ ... Therefore, the polar coordinates are $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$",
            "answer": "\\left( 3, \\frac{\\pi}{2} \\right)",
            "subject": "Precalculus",
            "level": 2,
            "unique_id": "test/precalculus/807.json"
        });
        let r = one(Format::Math500, row);
        assert_eq!(r.gt, Gt::Text("\\left( 3, \\frac{\\pi}{2} \\right)".into()));
        assert_eq!(r.id, "test/precalculus/807.json");
        assert!(r.query.starts_with("Convert the point $(0,3)$"), "{}", r.query);
        assert!(r.query.ends_with("\n\nReason step by step, then put the final answer in \\boxed{}."), "{}", r.query);
        assert_eq!(read_back(&r).grader, GraderKind::Math);

        // MATH (hendrycks) rows: no answer column, nested braces in the box.
        let row = json!({
            "problem": "What is $\\frac{1}{2} + \\frac{1}{3}$?",
            "level": "Level 1",
            "type": "Prealgebra",
            "solution": "We get $\\boxed{3}$ first, no: $\\frac{1}{2}+\\frac{1}{3} = \\boxed{\\frac{5}{6}}$."
        });
        let r = one(Format::Math500, row);
        assert_eq!((r.gt, r.id.as_str()), (Gt::Text("\\frac{5}{6}".into()), "math500-7"));
        assert_eq!(last_boxed("so $\\boxed 5$."), Some("5"));
        assert_eq!(last_boxed("\\fbox{x^{2}} end"), Some("x^{2}"));
        assert_eq!(last_boxed("\\boxed{unclosed"), None);
        let err = convert_row(Format::Math500, json!({"problem": "p", "answer": "", "solution": "no box"}), 0, 0).unwrap_err();
        assert_eq!(err, ConvertError::NoBoxedAnswer);
    }

    #[test]
    fn mbpp_lists_its_asserts_and_grades_with_them() {
        let full = json!({
            "task_id": 11,
            "text": "Write a python function to remove first and last occurrence of a given character from the string.",
            "code": "def remove_Occ(s,ch): \r\n    return s",
            "test_list": ["assert remove_Occ(\"hello\",\"l\") == \"heo\"", "assert remove_Occ(\"abcda\",\"a\") == \"bcd\"", "assert remove_Occ(\"PHP\",\"P\") == \"H\""],
            "test_setup_code": "",
            "challenge_test_list": []
        });
        let r = one(Format::Mbpp, full);
        assert_eq!(r.id, "mbpp/11");
        assert_eq!(
            r.query,
            "Write a python function to remove first and last occurrence of a given character from the string.\nYour code should pass these tests:\n\nassert remove_Occ(\"hello\",\"l\") == \"heo\"\nassert remove_Occ(\"abcda\",\"a\") == \"bcd\"\nassert remove_Occ(\"PHP\",\"P\") == \"H\"\n\nWrite the Python function and reply with the complete code in a single ```python code block."
        );
        let item = read_back(&r);
        assert_eq!(
            item.grader,
            GraderKind::Code {
                checker:
                    "assert remove_Occ(\"hello\",\"l\") == \"heo\"\nassert remove_Occ(\"abcda\",\"a\") == \"bcd\"\nassert remove_Occ(\"PHP\",\"P\") == \"H\""
                        .into()
            }
        );

        // The sanitized config: `prompt` and `test_imports`; the imports lead the checker.
        let sanitized = json!({
            "source_file": "Benchmark Questions Verification V2.ipynb",
            "task_id": 17,
            "prompt": "Write a function that returns the perimeter of a square given its side length as input.",
            "code": "import math\ndef square_perimeter(a):\n  return 4*a",
            "test_imports": ["import math"],
            "test_list": ["assert math.isclose(square_perimeter(10), 40)", "assert square_perimeter(5)==20"]
        });
        let r = one(Format::Mbpp, sanitized);
        assert_eq!(
            r.gt,
            Gt::Asserts(vec!["import math".into(), "assert math.isclose(square_perimeter(10), 40)".into(), "assert square_perimeter(5)==20".into()])
        );
        assert!(r.query.starts_with("Write a function that returns the perimeter of a square given its side length as input.\nYour code should pass these tests:\n\nassert math.isclose"));
        assert!(!r.query.contains("import math"));
        let err = convert_row(Format::Mbpp, json!({"task_id": 1, "text": "t", "test_list": []}), 0, 0).unwrap_err();
        assert_eq!(err, ConvertError::NoTests);
    }

    fn gpqa_row(question: &str) -> Value {
        json!({
            "Pre-Revision Question": "old",
            "Question": question,
            "Correct Answer": "10^-4 eV\n",
            "Incorrect Answer 1": "10^-11 eV",
            "Incorrect Answer 2": "10^-8 eV\n",
            "Incorrect Answer 3": "10^-9 eV",
            "Explanation": "According to the uncertainty principle, ...",
            "Record ID": "recU0VJ2FQ0JmbrmS",
            "High-level domain": "Physics",
            "Subdomain": "Physics (general)"
        })
    }

    #[test]
    fn gpqa_shuffles_its_choices_by_seed_and_records_the_right_letter() {
        let q = "Two quantum states with energies E1 and E2 have a lifetime of 10^-9 sec and 10^-8 sec, respectively. We want to clearly distinguish these two energy levels. Which one of the following options could be their energy difference so that they can be clearly resolved?\n";
        let r = convert_row(Format::Gpqa, gpqa_row(q), 3, 0).unwrap();
        assert_eq!(r.id, "recU0VJ2FQ0JmbrmS");
        assert_eq!(r.gt, Gt::Text("B".into()));
        assert_eq!(
            r.query,
            "Two quantum states with energies E1 and E2 have a lifetime of 10^-9 sec and 10^-8 sec, respectively. We want to clearly distinguish these two energy levels. Which one of the following options could be their energy difference so that they can be clearly resolved?\n\nA) 10^-9 eV\nB) 10^-4 eV\nC) 10^-8 eV\nD) 10^-11 eV\n\nReason step by step, then put only the letter of the correct option (A, B, C or D) in \\boxed{}."
        );
        let item = read_back(&r);
        assert_eq!((item.grader, item.answer.as_str()), (GraderKind::Choice, "B"));
        // Same seed, same order (whatever the row's position); the letter always points at the
        // correct answer, and over many questions every letter is used.
        assert_eq!(convert_row(Format::Gpqa, gpqa_row(q), 99, 0).unwrap().query, r.query);
        let mut letters = std::collections::BTreeMap::new();
        for i in 0..200 {
            let (options, letter) = gpqa_shuffle(&format!("question {i}"), "right", ["w1", "w2", "w3"], 5);
            assert_eq!(options[LETTERS.iter().position(|&l| l == letter).unwrap()], "right");
            *letters.entry(letter).or_insert(0) += 1;
        }
        assert_eq!(letters.keys().copied().collect::<String>(), "ABCD");
        assert!(letters.values().all(|&n| n > 30), "{letters:?}");
        let moved =
            (0..20).filter(|i| gpqa_shuffle(&format!("q{i}"), "r", ["a", "b", "c"], 1).1 != gpqa_shuffle(&format!("q{i}"), "r", ["a", "b", "c"], 2).1).count();
        assert!(moved > 5, "another seed moves the answer: {moved} of 20");
    }

    #[test]
    fn medqa_lists_its_options_in_letter_order_and_takes_answer_idx() {
        let row = json!({
            "question": "A 23-year-old woman has burning on urination. Which drug is safest in pregnancy?",
            "answer": "Nitrofurantoin",
            "options": {"C": "Doxycycline", "A": "Ampicillin", "D": "Nitrofurantoin", "B": "Ceftriaxone"},
            "meta_info": "step2&3",
            "answer_idx": "d"
        });
        let r = one(Format::Medqa, row.clone());
        assert_eq!(r.gt, Gt::Text("D".into()));
        assert_eq!(r.id, "medqa-7");
        assert_eq!(
            r.query,
            "A 23-year-old woman has burning on urination. Which drug is safest in pregnancy?\n\nA) Ampicillin\nB) Ceftriaxone\nC) Doxycycline\nD) Nitrofurantoin\n\nReason step by step, then put only the letter of the correct option (A, B, C or D) in \\boxed{}."
        );
        let item = read_back(&r);
        assert_eq!((item.grader, item.answer.as_str()), (GraderKind::Choice, "D"));
        let mut five = row.clone();
        five["options"]["E"] = json!("Trimethoprim");
        assert_eq!(convert_row(Format::Medqa, five, 0, 0).unwrap_err(), ConvertError::ChoiceCount(5));
        let mut bad = row;
        bad["answer_idx"] = json!("F");
        assert_eq!(convert_row(Format::Medqa, bad, 0, 0).unwrap_err(), ConvertError::BadChoiceAnswer("`F`".into()));
    }

    #[test]
    fn mmlu_takes_its_answer_index_as_a_letter() {
        let row = json!({
            "question": "Find the degree for the given field extension Q(sqrt(2), sqrt(3), sqrt(18)) over Q.",
            "subject": "abstract_algebra",
            "choices": ["0", "4", "2", "6"],
            "answer": 1
        });
        let r = one(Format::Mmlu, row);
        assert_eq!((r.gt.clone(), r.id.as_str()), (Gt::Text("B".into()), "mmlu-7"));
        assert_eq!(
            r.query,
            "The following is a multiple-choice question about abstract algebra.\n\nFind the degree for the given field extension Q(sqrt(2), sqrt(3), sqrt(18)) over Q.\n\nA) 0\nB) 4\nC) 2\nD) 6\n\nReason step by step, then put only the letter of the correct option (A, B, C or D) in \\boxed{}."
        );
        assert_eq!(read_back(&r).grader, GraderKind::Choice);
        let letter = one(Format::Mmlu, json!({"question": "q", "choices": ["a", "b", "c", "d"], "answer": "d"}));
        assert_eq!(letter.gt, Gt::Text("D".into()));
        assert!(letter.query.starts_with("q\n\nA) a\n"));
        let err = convert_row(Format::Mmlu, json!({"question": "q", "choices": ["a", "b", "c", "d"], "answer": 4}), 0, 0).unwrap_err();
        assert_eq!(err, ConvertError::BadChoiceAnswer("4".into()));
        let err = convert_row(Format::Mmlu, json!({"question": "q", "choices": ["a", "b"], "answer": 0}), 0, 0).unwrap_err();
        assert_eq!(err, ConvertError::ChoiceCount(2));
    }

    #[test]
    fn scibench_states_the_unit_and_asks_for_a_decimal() {
        let row = json!({
            "problem_text": "Assume all gases are perfect unless stated otherwise. Unless otherwise stated, thermodynamic data are for 298.15 K. Calculate the standard enthalpy of solution of $\\mathrm{AgCl}(\\mathrm{s})$ in water from the enthalpies of formation of the solid and the aqueous ions.",
            "answer_latex": " +65.49",
            "answer_number": "+65.49",
            "unit": "$\\mathrm{kJ} \\mathrm{mol}^{-1}$",
            "source": "atkins",
            "problemid": "e2.21(a) ",
            "comment": " "
        });
        let r = one(Format::Scibench, row);
        assert_eq!((r.gt.clone(), r.id.as_str()), (Gt::Text("+65.49".into()), "scibench/atkins/e2.21(a)"));
        assert_eq!(
            r.query,
            "Assume all gases are perfect unless stated otherwise. Unless otherwise stated, thermodynamic data are for 298.15 K. Calculate the standard enthalpy of solution of $\\mathrm{AgCl}(\\mathrm{s})$ in water from the enthalpies of formation of the solid and the aqueous ions. The unit of the answer is $\\mathrm{kJ} \\mathrm{mol}^{-1}$.\n\nReason step by step, then put the final answer in \\boxed{} as a decimal number, without the unit."
        );
        let item = read_back(&r);
        assert_eq!((item.grader, item.answer.as_str()), (GraderKind::Numeric, "+65.49"));
        // Dimensionless (a blank unit) and a numeric answer_number.
        let r = one(Format::Scibench, json!({"problem_text": "Calculate $q$.", "answer_number": 0.5, "unit": " "}));
        assert_eq!((r.gt, r.id.as_str()), (Gt::Text("0.5".into()), "scibench-7"));
        assert!(r.query.starts_with("Calculate $q$.\n\nReason"), "{}", r.query);
        let err = convert_row(Format::Scibench, json!({"problem_text": "p", "answer_number": "1.2 \\times 10^3", "unit": "m"}), 0, 0).unwrap_err();
        assert_eq!(err, ConvertError::NotANumber("1.2 \\times 10^3".into()));
    }

    #[test]
    fn missing_and_null_columns_are_named() {
        let err = convert_row(Format::Gsm8k, json!({"problem": "p", "answer": "#### 1"}), 0, 0).unwrap_err();
        assert_eq!(err.to_string(), "no column `question` for gsm8k; the columns there are: answer, problem");
        let err = check_columns(Format::Mbpp, ["task_id", "code", "test_list"]).unwrap_err();
        assert_eq!(err.to_string(), "no column `text` or `prompt` for mbpp; the columns there are: code, task_id, test_list");
        assert_eq!(check_columns(Format::Math500, ["problem", "solution"]), Ok(()));
        let err = convert_row(Format::Gsm8k, json!({"question": null, "answer": "#### 1"}), 0, 0).unwrap_err();
        assert_eq!(err, ConvertError::NullColumn("`question`".into()));
        let err = convert_row(Format::Mmlu, json!({"question": "q", "choices": "abcd", "answer": 0}), 0, 0).unwrap_err();
        assert!(matches!(&err, ConvertError::Layout { format: Format::Mmlu, message } if message.contains("expected a sequence")), "{err}");
        assert_eq!(convert_row(Format::Gsm8k, json!([1]), 0, 0).unwrap_err(), ConvertError::NotAnObject("an array".into()));
    }

    #[test]
    fn formats_parse_by_name_and_ids_are_made_unique() {
        assert_eq!("MATH500".parse::<Format>(), Ok(Format::Math500));
        assert_eq!("scibench".parse::<Format>().unwrap().to_string(), "scibench");
        assert_eq!(
            "humaneval".parse::<Format>().unwrap_err().to_string(),
            "unknown benchmark format `humaneval`: use gsm8k, math500, mbpp, gpqa, mmlu, medqa or scibench"
        );
        let rec = |id: &str| BenchRecord::new(Format::Gsm8k, id.into(), "q".into(), Gt::Text("1".into()));
        let mut rs = vec![rec("a"), rec("a-2"), rec("a"), rec("b"), rec("a")];
        let renamed = dedupe_ids(&mut rs);
        assert_eq!(rs.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["a", "a-2", "a-3", "b", "a-4"]);
        assert_eq!(renamed, [("a".to_string(), "a-3".to_string()), ("a".to_string(), "a-4".to_string())]);
    }

    #[test]
    fn records_serialise_in_the_spec_field_order() {
        let r = BenchRecord::new(Format::Mbpp, "mbpp/2".into(), "q".into(), Gt::Asserts(vec!["assert f()".into()]));
        assert_eq!(serde_json::to_string(&r).unwrap(), r#"{"query":"q","gt":["assert f()"],"tag":"mbpp","source":"mbpp","id":"mbpp/2"}"#);
    }
}
