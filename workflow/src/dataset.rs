//! Data sets as users have them: JSON lines (read a line at a time), a JSON array, a parquet
//! file, or a folder of parquet shards (what `datasets`' `to_parquet` and the Hub's
//! `data/train-0000N-of-0000M.parquet` layout give), with their own column names mapped onto
//! the task record (verl's `prompt_key`, OpenRLHF's `input_key`/`label_key`).
//!
//! Rows are read one at a time, so a large file is never held twice (its text and its records);
//! a parquet file decodes only the columns the mapping reads.
use crate::task::{DatasetError, Location, TaskRecord};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::schema::types::Type;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Which column holds each field of a task record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Columns {
    pub prompt: String,
    pub answer: String,
    /// `None`: the `id` column if there is one, else `row-N` (N from 1, in file order).
    pub id: Option<String>,
    pub task_column: String,
    /// The task of rows without a task column (`None`: the column is required).
    pub task: Option<String>,
    /// A column of chat messages (`[{role, content}, ...]`): the prompt is its last user
    /// message, in place of `prompt`.
    pub messages: Option<String>,
}

impl Default for Columns {
    fn default() -> Self {
        Columns {
            prompt: "prompt".into(),
            answer: "answer".into(),
            id: None,
            task_column: "task".into(),
            task: None,
            messages: None,
        }
    }
}

impl Columns {
    /// The columns a row is read from (and a parquet file is projected onto).
    fn read(&self) -> Vec<&str> {
        let mut v = vec![self.answer.as_str(), self.task_column.as_str(), "source", "files"];
        v.push(self.messages.as_deref().unwrap_or(self.prompt.as_str()));
        v.push(self.id.as_deref().unwrap_or("id"));
        v
    }

    /// Row `row` (1-based) as a task record's JSON object, or what is wrong with it.
    fn project(&self, row: Value, n: usize) -> Result<Value, String> {
        let Value::Object(mut o) = row else {
            return Err("a row must be an object of columns".into());
        };
        let mut take = |key: &str| o.remove(key).filter(|v| !v.is_null());
        let mut out = Map::new();
        let prompt = match &self.messages {
            Some(key) => last_user_message(take(key), key)?,
            None => take(&self.prompt).ok_or_else(|| missing(&self.prompt, "prompt_key"))?,
        };
        let prompt = text(prompt, &self.prompt)?;
        if prompt.as_str().is_some_and(|p| p.trim().is_empty()) {
            let from = match &self.messages {
                Some(key) => format!("the last user message of column `{key}`"),
                None => format!("column `{}`", self.prompt),
            };
            return Err(format!("{from} is empty; every row needs a prompt to ask"));
        }
        out.insert("prompt".into(), prompt);
        let answer = take(&self.answer).ok_or_else(|| missing(&self.answer, "answer_key"))?;
        out.insert("answer".into(), text(answer, &self.answer)?);
        let task = match (take(&self.task_column), &self.task) {
            (Some(t), _) => t,
            (None, Some(t)) => Value::String(t.clone()),
            (None, None) => {
                return Err(format!(
                    "missing field `{}`; set data.task = \"math\" (or coding, science) for a data set without a task column",
                    self.task_column
                ))
            }
        };
        out.insert("task".into(), task);
        let id = match &self.id {
            Some(key) => text(take(key).ok_or_else(|| missing(key, "id_key"))?, key)?,
            None => match take("id") {
                Some(v) => text(v, "id")?,
                None => Value::String(format!("row-{n}")),
            },
        };
        out.insert("id".into(), id);
        for key in ["source", "files"] {
            if let Some(v) = take(key) {
                out.insert(key.into(), v);
            }
        }
        Ok(Value::Object(out))
    }
}

fn missing(key: &str, setting: &str) -> String {
    format!("missing field `{key}` (set data.{setting} to the column that holds it)")
}

/// A string column, or a number written as text (an integer answer or id column).
fn text(v: Value, key: &str) -> Result<Value, String> {
    match v {
        Value::String(_) => Ok(v),
        Value::Number(n) => Ok(Value::String(n.to_string())),
        other => Err(format!("column `{key}` holds {other}, not text")),
    }
}

fn last_user_message(v: Option<Value>, key: &str) -> Result<Value, String> {
    let bad = || format!("column `{key}` must be a list of chat messages with a user message");
    let messages = v.and_then(|v| v.as_array().cloned()).ok_or_else(bad)?;
    messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .and_then(|m| m.get("content").cloned())
        .ok_or_else(bad)
}

/// Reads the data set at `path` into task records, ids unique.
pub fn load_records(path: &Path, columns: &Columns) -> Result<Vec<TaskRecord>, DatasetError> {
    let mut records = Vec::new();
    let mut seen: HashMap<String, (usize, Location)> = HashMap::new();
    let files = files_of(path)?;
    for (f, file) in files.iter().enumerate() {
        let in_file = |err: DatasetError| {
            if files.len() > 1 || file != path {
                DatasetError::InFile { path: file.clone(), err: Box::new(err) }
            } else {
                err
            }
        };
        let mut n = records.len();
        read_rows(file, Some(&columns.read()), |at, row| {
            n += 1;
            let value =
                columns.project(row, n).map_err(|message| DatasetError::Json { at, message })?;
            let record = crate::task::parse_value(value, at)?;
            if let Some((g, first)) = seen.insert(record.id.clone(), (f, at)) {
                let first = if g == f {
                    first.to_string()
                } else {
                    format!("{first} of {}", files[g].display())
                };
                return Err(DatasetError::DuplicateId { at, id: record.id, first });
            }
            records.push(record);
            Ok(())
        })
        .map_err(in_file)?;
    }
    Ok(records)
}

/// The files of a data set: the path itself, or a folder's `.parquet` files in name order.
fn files_of(path: &Path) -> Result<Vec<PathBuf>, DatasetError> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let io = |err| DatasetError::Io { path: path.to_path_buf(), err };
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(io)?
        .map(|e| e.map(|e| e.path()).map_err(io))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(DatasetError::Io {
            path: path.to_path_buf(),
            err: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "a folder data set holds .parquet shards, and this one has none (name a .jsonl, .json or .parquet file, or the folder of the shards)",
            ),
        });
    }
    Ok(files)
}

/// Calls `visit` with each row of the file at `path` and where it is: JSON lines (`.jsonl`, and
/// any other name whose text does not start with `[`), a JSON array, or parquet (`.parquet`,
/// projected onto `columns` where given).
pub fn read_rows(
    path: &Path,
    columns: Option<&[&str]>,
    mut visit: impl FnMut(Location, Value) -> Result<(), DatasetError>,
) -> Result<(), DatasetError> {
    let io = |err| DatasetError::Io { path: path.to_path_buf(), err };
    if path.extension().is_some_and(|x| x == "parquet") {
        for (i, row) in parquet_rows(path, columns)?.enumerate() {
            let at = Location::Row(i + 1);
            visit(at, row.map_err(|message| DatasetError::Json { at, message })?)?;
        }
        return Ok(());
    }
    let mut reader = std::io::BufReader::new(std::fs::File::open(path).map_err(io)?);
    // A UTF-8 byte order mark (some Windows editors write one) is not part of the text.
    if reader.fill_buf().map_err(io)?.starts_with(b"\xEF\xBB\xBF") {
        reader.consume(3);
    }
    let starts_array = loop {
        let buf = reader.fill_buf().map_err(io)?;
        match buf.iter().position(|b| !b.is_ascii_whitespace()) {
            Some(i) => break buf[i] == b'[',
            None if buf.is_empty() => break false,
            None => {
                let len = buf.len();
                reader.consume(len);
            }
        }
    };
    if starts_array {
        let values: Vec<Value> =
            serde_json::from_reader(reader).map_err(|e| DatasetError::NotAnArray(e.to_string()))?;
        for (i, v) in values.into_iter().enumerate() {
            visit(Location::Element(i + 1), v)?;
        }
        return Ok(());
    }
    let mut line = String::new();
    let mut n = 0;
    loop {
        line.clear();
        n += 1;
        match reader.read_line(&mut line) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                return Err(DatasetError::NotUtf8 { path: path.to_path_buf(), line: n })
            }
            Err(e) => return Err(io(e)),
        }
        if line.trim().is_empty() {
            continue;
        }
        let at = Location::Line(n);
        let value: Value = serde_json::from_str(&line)
            .map_err(|e| DatasetError::Json { at, message: crate::task::without_position(&e) })?;
        visit(at, value)?;
    }
}

/// The top-level column names of a parquet file.
pub fn parquet_columns(path: &Path) -> Result<Vec<String>, DatasetError> {
    let reader = open_parquet(path)?;
    let root = reader.metadata().file_metadata().schema_descr().root_schema().clone();
    Ok(root.get_fields().iter().map(|f| f.name().to_string()).collect())
}

fn open_parquet(path: &Path) -> Result<SerializedFileReader<std::fs::File>, DatasetError> {
    let file = std::fs::File::open(path)
        .map_err(|err| DatasetError::Io { path: path.to_path_buf(), err })?;
    SerializedFileReader::new(file).map_err(|e| DatasetError::Parquet {
        path: path.to_path_buf(),
        message: format!("not a readable parquet file: {e}"),
    })
}

/// The rows of a parquet file as JSON objects, decoding only `columns` (those the file has)
/// where given: other columns may be large or of types the record API cannot read.
pub fn parquet_rows(
    path: &Path,
    columns: Option<&[&str]>,
) -> Result<impl Iterator<Item = Result<Value, String>>, DatasetError> {
    let bad = |message: String| DatasetError::Parquet { path: path.to_path_buf(), message };
    let reader = open_parquet(path)?;
    let projection = match columns {
        None => None,
        Some(wanted) => {
            let root = reader.metadata().file_metadata().schema_descr().root_schema().clone();
            let fields: Vec<Arc<Type>> = root
                .get_fields()
                .iter()
                .filter(|f| wanted.contains(&f.name()))
                .map(Arc::clone)
                .collect();
            Some(
                Type::group_type_builder(root.name())
                    .with_fields(fields)
                    .build()
                    .map_err(|e| bad(format!("projecting the schema: {e}")))?,
            )
        }
    };
    let rows = parquet::record::reader::RowIter::from_file_into(Box::new(reader))
        .project(projection)
        .map_err(|e| bad(format!("projecting the schema: {e}")))?;
    Ok(rows.map(|r| r.map(|row| row.to_json_value()).map_err(|e| format!("cannot decode: {e}"))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::TaskKind;

    fn file(text: &str, name: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    fn columns(f: impl FnOnce(&mut Columns)) -> Columns {
        let mut c = Columns::default();
        f(&mut c);
        c
    }

    #[test]
    fn rows_with_their_own_column_names_become_task_records() {
        let text = "{\"question\":\"1+1?\",\"solution\":2,\"idx\":7}\n\n{\"question\":\"2+2?\",\"solution\":\"4\",\"idx\":8,\"task\":\"science\"}\n";
        let (_d, path) = file(text, "d.jsonl");
        let c = columns(|c| {
            c.prompt = "question".into();
            c.answer = "solution".into();
            c.id = Some("idx".into());
            c.task = Some("math".into());
        });
        let r = load_records(&path, &c).unwrap();
        let got: Vec<_> = r
            .iter()
            .map(|r| (r.prompt.as_str(), r.answer.as_str(), r.id.as_str(), r.task))
            .collect();
        assert_eq!(
            got,
            [("1+1?", "2", "7", TaskKind::Math), ("2+2?", "4", "8", TaskKind::Science)]
        );
    }

    #[test]
    fn rows_without_ids_are_numbered_and_chat_messages_give_the_last_user_turn() {
        let text = r#"[{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"3+4?"}],"answer":"7","task":"math"},
                       {"messages":[{"role":"user","content":"first"},{"role":"assistant","content":"x"},{"role":"user","content":"5+5?"}],"answer":"10","task":"math"}]"#;
        let (_d, path) = file(text, "d.json");
        let c = columns(|c| c.messages = Some("messages".into()));
        let r = load_records(&path, &c).unwrap();
        let got: Vec<_> = r.iter().map(|r| (r.prompt.as_str(), r.id.as_str())).collect();
        assert_eq!(got, [("3+4?", "row-1"), ("5+5?", "row-2")]);
    }

    #[test]
    fn a_missing_column_names_its_row_and_the_setting_to_change() {
        let (_d, path) = file("{\"prompt\":\"p\",\"answer\":\"a\",\"id\":\"x\"}\n", "d.jsonl");
        let err = load_records(&path, &Columns::default()).unwrap_err().to_string();
        assert_eq!(err, "line 1: not a valid task record: missing field `task`; set data.task = \"math\" (or coding, science) for a data set without a task column");
        let c = columns(|c| {
            c.answer = "solution".into();
            c.task = Some("math".into());
        });
        let err = load_records(&path, &c).unwrap_err().to_string();
        assert_eq!(err, "line 1: not a valid task record: missing field `solution` (set data.answer_key to the column that holds it)");
        let c = columns(|c| c.task = Some("poetry".into()));
        let err = load_records(&path, &c).unwrap_err().to_string();
        assert!(err.starts_with("line 1: unknown task \"poetry\""), "{err}");
    }

    #[test]
    fn a_folder_without_parquet_shards_and_a_file_that_is_not_parquet_are_named() {
        let (d, path) = file("not parquet", "x.parquet");
        let err = load_records(&path, &Columns::default()).unwrap_err().to_string();
        assert!(err.contains("x.parquet: not a readable parquet file"), "{err}");
        std::fs::remove_file(&path).unwrap();
        let err = load_records(d.path(), &Columns::default()).unwrap_err().to_string();
        assert!(err.contains("has none"), "{err}");
    }

    #[test]
    fn a_byte_order_mark_is_skipped() {
        let line = "{\"prompt\":\"p\",\"answer\":\"a\",\"task\":\"math\",\"id\":\"x\"}";
        let (_d, path) = file(&format!("\u{feff}{line}\n"), "d.jsonl");
        let r = load_records(&path, &Columns::default()).unwrap();
        assert_eq!((r.len(), r[0].prompt.as_str()), (1, "p"));
        let (_d, path) = file(&format!("\u{feff}[{line}]"), "d.json");
        assert_eq!(load_records(&path, &Columns::default()).unwrap().len(), 1);
    }

    #[test]
    fn an_empty_prompt_names_its_line() {
        let good = "{\"prompt\":\"2+2?\",\"answer\":\"4\",\"task\":\"math\",\"id\":\"a\"}";
        let empty = "{\"prompt\":\" \",\"answer\":\"4\",\"task\":\"math\",\"id\":\"b\"}";
        let (_d, path) = file(&format!("{good}\n{empty}\n"), "d.jsonl");
        let err = load_records(&path, &Columns::default()).unwrap_err().to_string();
        assert_eq!(
            err,
            "line 2: not a valid task record: column `prompt` is empty; every row needs a prompt to ask"
        );
        let text = r#"[{"messages":[{"role":"user","content":""}],"answer":"7","task":"math"}]"#;
        let (_d, path) = file(text, "d.json");
        let c = columns(|c| c.messages = Some("messages".into()));
        let err = load_records(&path, &c).unwrap_err().to_string();
        assert!(err.starts_with("element 1: not a valid task record: the last user message of column `messages` is empty"), "{err}");
    }

    #[test]
    fn a_duplicate_id_names_both_places() {
        let line = "{\"prompt\":\"p\",\"answer\":\"a\",\"task\":\"math\",\"id\":\"x\"}";
        let (_d, path) = file(&format!("{line}\n{line}\n"), "d.jsonl");
        let err = load_records(&path, &Columns::default()).unwrap_err().to_string();
        assert_eq!(err, "line 2: duplicate id \"x\" (first used at line 1)");
    }
}
