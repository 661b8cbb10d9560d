//! Task kinds and the training / in-training-eval data-set record (spec 7.1).
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use thiserror::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskKind {
    Math,
    Coding,
    Science,
    /// A tabular modelling task with data files (MAPPA's DSBench pipeline).
    DataScience,
}

impl TaskKind {
    pub const ALL: [TaskKind; 4] =
        [TaskKind::Math, TaskKind::Coding, TaskKind::Science, TaskKind::DataScience];

    pub fn as_str(self) -> &'static str {
        match self {
            TaskKind::Math => "math",
            TaskKind::Coding => "coding",
            TaskKind::Science => "science",
            TaskKind::DataScience => "data_science",
        }
    }
}

impl fmt::Display for TaskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown task {0:?}: expected one of \"math\", \"coding\", \"science\", \"data_science\"")]
pub struct UnknownTask(pub String);

impl FromStr for TaskKind {
    type Err = UnknownTask;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TaskKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownTask(s.to_string()))
    }
}

/// One question. `answer` is only used for logging correctness, never for rewards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawRecord")]
pub struct TaskRecord {
    pub prompt: String,
    pub answer: String,
    pub task: TaskKind,
    pub id: String,
    /// The data set the question came from (`math`, `kodcode`, `webinstruct`); informational.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Data files the task comes with, by name (a DSBench task's train.csv and test.csv); its
    /// programs find them in their working folder.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub files: std::collections::BTreeMap<String, String>,
}

/// The record as it is on disk; the task name is checked separately so an unknown task gets a
/// typed error instead of a generic serde message.
#[derive(Deserialize)]
struct RawRecord {
    prompt: String,
    answer: String,
    task: String,
    id: String,
    #[serde(default)]
    source: Option<String>,
    #[serde(default)]
    files: std::collections::BTreeMap<String, String>,
}

impl TryFrom<RawRecord> for TaskRecord {
    type Error = UnknownTask;
    fn try_from(raw: RawRecord) -> Result<Self, UnknownTask> {
        Ok(TaskRecord {
            prompt: raw.prompt,
            answer: raw.answer,
            task: raw.task.parse()?,
            id: raw.id,
            source: raw.source,
            files: raw.files,
        })
    }
}

/// Where in a data set a bad record sits: a line of a JSONL file or an element of a JSON array
/// (both 1-based, as an editor shows them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    Line(usize),
    Element(usize),
    /// A row of a parquet file.
    Row(usize),
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Line(n) => write!(f, "line {n}"),
            Location::Element(n) => write!(f, "element {n}"),
            Location::Row(n) => write!(f, "row {n}"),
        }
    }
}

#[derive(Debug, Error)]
pub enum DatasetError {
    #[error("cannot read data set {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("data set {path}: line {line} is not UTF-8 text")]
    NotUtf8 { path: PathBuf, line: usize },
    #[error("{at}: not a valid task record: {message}")]
    Json { at: Location, message: String },
    #[error("{at}: {err}")]
    Task { at: Location, err: UnknownTask },
    #[error("{at}: duplicate id {id:?} (first used at {first})")]
    DuplicateId { at: Location, id: String, first: String },
    #[error("not a JSON array of task records: {0}")]
    NotAnArray(String),
    #[error("{path}: {message}")]
    Parquet { path: PathBuf, message: String },
    #[error("{path}: {err}")]
    InFile { path: PathBuf, err: Box<DatasetError> },
}

/// serde_json positions are relative to the fragment it was given; the caller names the real
/// location, so drop serde's to avoid "line 3: ... at line 1 column 9".
pub(crate) fn without_position(err: &serde_json::Error) -> String {
    let text = err.to_string();
    match text.rsplit_once(" at line ") {
        Some((head, _)) => head.to_string(),
        None => text,
    }
}

/// One row, already an object of the record's fields, checked into a task record.
pub(crate) fn parse_value(
    value: serde_json::Value,
    at: Location,
) -> Result<TaskRecord, DatasetError> {
    let raw: RawRecord = serde_json::from_value(value)
        .map_err(|e| DatasetError::Json { at, message: without_position(&e) })?;
    TaskRecord::try_from(raw).map_err(|err| DatasetError::Task { at, err })
}

/// Where the record at `index` (0-based, as parsed) sits in `text`: its line in JSON Lines
/// (blank lines are skipped when parsing), its element in a JSON array.
pub fn location_of(text: &str, index: usize) -> Location {
    if text.trim_start().starts_with('[') {
        return Location::Element(index + 1);
    }
    let line = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .nth(index)
        .map_or(index + 1, |(i, _)| i + 1);
    Location::Line(line)
}

/// Reads a data set with the standard column names (see [`crate::dataset`] for the formats).
pub fn load_dataset(path: impl AsRef<Path>) -> Result<Vec<TaskRecord>, DatasetError> {
    crate::dataset::load_records(path.as_ref(), &crate::dataset::Columns::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The data set `text` as a file, read as the coordinator reads it.
    fn parse_dataset(text: &str) -> Result<Vec<TaskRecord>, DatasetError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data.jsonl");
        std::fs::write(&path, text).unwrap();
        load_dataset(&path)
    }

    const GOOD: &str = r#"{"prompt": "1+1?", "answer": "2", "task": "math", "source": "math", "id": "math-math-00001"}"#;

    #[test]
    fn parses_jsonl_and_skips_blank_lines() {
        let text = format!(
            "{GOOD}\n\n{}\n",
            r#"{"prompt":"p","answer":"1.4e+24","task":"science","id":"s-1"}"#
        );
        let recs = parse_dataset(&text).unwrap();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].task, TaskKind::Math);
        assert_eq!(recs[0].source.as_deref(), Some("math"));
        assert_eq!(recs[1].task, TaskKind::Science);
        assert_eq!(recs[1].answer, "1.4e+24");
        assert_eq!(recs[1].source, None);
    }

    #[test]
    fn a_record_is_located_by_its_line_or_element() {
        let text = format!("\n{GOOD}\n\n{}\n", GOOD.replace("00001", "00002"));
        assert_eq!(location_of(&text, 0), Location::Line(2));
        assert_eq!(location_of(&text, 1), Location::Line(4));
        assert_eq!(location_of(&format!("[{GOOD}, {GOOD}]"), 1), Location::Element(2));
    }

    #[test]
    fn unknown_task_names_the_line() {
        let text =
            format!("{GOOD}\n{}\n", r#"{"prompt":"p","answer":"a","task":"poetry","id":"x"}"#);
        let err = parse_dataset(&text).unwrap_err();
        assert!(
            matches!(&err, DatasetError::Task { at: Location::Line(2), err } if err.0 == "poetry")
        );
        assert_eq!(err.to_string(), "line 2: unknown task \"poetry\": expected one of \"math\", \"coding\", \"science\", \"data_science\"");
    }

    #[test]
    fn missing_field_and_bad_json_name_the_line() {
        let text = format!("{GOOD}\n\n{}\n", r#"{"prompt":"p","task":"math","id":"x"}"#);
        let err = parse_dataset(&text).unwrap_err();
        assert_eq!(err.to_string(), "line 3: not a valid task record: missing field `answer` (set data.answer_key to the column that holds it)");
        let err = parse_dataset("{oops\n").unwrap_err();
        assert!(matches!(err, DatasetError::Json { at: Location::Line(1), .. }), "{err}");
    }

    #[test]
    fn duplicate_ids_are_rejected() {
        let err = parse_dataset(&format!("{GOOD}\n{GOOD}\n")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "line 2: duplicate id \"math-math-00001\" (first used at line 1)"
        );
    }

    #[test]
    fn json_array_layout_and_autodetect() {
        let text =
            format!("  [{GOOD}, {}]", r#"{"prompt":"p","answer":"a","task":"coding","id":"c"}"#);
        let recs = parse_dataset(&text).unwrap();
        assert_eq!(
            recs.iter().map(|r| r.task).collect::<Vec<_>>(),
            vec![TaskKind::Math, TaskKind::Coding]
        );
        let bad = format!("[{GOOD}, {}]", r#"{"prompt":"p","answer":"a","task":"art","id":"c"}"#);
        assert_eq!(
            parse_dataset(&bad).unwrap_err().to_string(),
            "element 2: unknown task \"art\": expected one of \"math\", \"coding\", \"science\", \"data_science\""
        );
    }

    #[test]
    fn record_round_trips_through_serde() {
        let rec: TaskRecord = serde_json::from_str(GOOD).unwrap();
        let back: TaskRecord = serde_json::from_str(&serde_json::to_string(&rec).unwrap()).unwrap();
        assert_eq!(rec, back);
        assert!(serde_json::from_str::<TaskRecord>(
            r#"{"prompt":"p","answer":"a","task":"Math","id":"x"}"#
        )
        .is_err());
    }

    #[test]
    fn missing_file_is_an_io_error() {
        let err = load_dataset("/nonexistent/comas/data.jsonl").unwrap_err();
        assert!(matches!(err, DatasetError::Io { .. }));
    }

    #[test]
    fn bytes_that_are_not_utf8_are_named_by_line() {
        let path = std::env::temp_dir().join(format!("comas-utf8-{}.jsonl", std::process::id()));
        std::fs::write(&path, [GOOD.as_bytes(), b"\n\n{\"prompt\": \"\xff\"}\n"].concat()).unwrap();
        let err = load_dataset(&path).unwrap_err().to_string();
        let _ = std::fs::remove_file(&path);
        assert!(err.ends_with("line 3 is not UTF-8 text"), "{err}");
    }
}
