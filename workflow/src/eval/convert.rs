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
mod tests;
