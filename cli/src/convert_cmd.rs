//! `comas convert-bench`: turns a benchmark as users download it (its Hugging Face JSON, JSONL or
//! parquet files, or a CSV such as GPQA's own release) into the JSONL of spec §7.2 records that `comas eval --bench FILE` reads. The
//! row → record rules are pure code in `comas_workflow::eval::convert`; this file reads the files.
use anyhow::{bail, Context, Result};
use comas_workflow::dataset;
use comas_workflow::eval::convert::{self, BenchRecord, ConvertError, Format};
use serde_json::Value;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// The benchmark's layout: gsm8k, math500, mbpp, gpqa, mmlu, medqa or scibench.
    #[arg(long)]
    format: Format,
    /// A file of its rows: .parquet, .jsonl, .json (an array, or JSON lines as `datasets`
    /// writes them) or .csv (a header row, then one row per record; cells are text). Repeat for several files; their rows are concatenated in order.
    #[arg(long = "input", required = true)]
    inputs: Vec<PathBuf>,
    /// Where to write the records (JSONL).
    #[arg(long)]
    out: PathBuf,
    /// Seed of GPQA's choice shuffle (the same seed gives the same letters).
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// One input row and where it sits ("row 3", "line 3"), for error messages.
struct Row {
    at: String,
    value: Value,
}

pub fn run(a: Args) -> Result<()> {
    let inputs: Vec<&Path> = a.inputs.iter().map(PathBuf::as_path).collect();
    crate::out_path::not_an_input("--out", &a.out, &inputs)?;
    let mut records: Vec<BenchRecord> = Vec::new();
    for path in &a.inputs {
        let rows = read_rows(path, a.format)?;
        for row in rows {
            let record =
                convert::convert_row(a.format, row.value, records.len(), a.seed).map_err(|e| {
                    match e {
                        e @ ConvertError::MissingColumn { .. } => {
                            anyhow::anyhow!("{} {}: {e}", path.display(), row.at)
                        }
                        e => anyhow::anyhow!(
                            "{} {}: cannot convert to a {} record: {e}",
                            path.display(),
                            row.at,
                            a.format
                        ),
                    }
                })?;
            records.push(record);
        }
    }
    if records.is_empty() {
        bail!(
            "no rows in {}",
            a.inputs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        );
    }
    // `comas eval` resumes by id, so two records must not share one.
    for (old, new) in convert::dedupe_ids(&mut records) {
        tracing::warn!("id {old} appears more than once; a later one is written as {new}");
    }
    let mut text = String::new();
    for r in &records {
        text.push_str(&serde_json::to_string(r)?);
        text.push('\n');
    }
    // Read the output back as `comas eval` will, so a record it would reject never gets written.
    comas_workflow::eval::parse_bench(&text)
        .context("the converted records do not read back as benchmark records")?;
    std::fs::write(&a.out, text).with_context(|| format!("writing {}", a.out.display()))?;
    println!(
        "{} {} records from {} file(s) written to {}",
        records.len(),
        a.format,
        a.inputs.len(),
        a.out.display()
    );
    Ok(())
}

fn read_rows(path: &Path, format: Format) -> Result<Vec<Row>> {
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("parquet") => parquet_rows(path, format),
        Some("jsonl") => json_lines(path, &read_text(path)?),
        Some("csv") => csv_rows(path),
        Some("json") => {
            let text = read_text(path)?;
            // `datasets`' `to_json` writes JSON lines even under a .json name.
            if text.trim_start().starts_with('[') {
                json_array(path, &text)
            } else {
                json_lines(path, &text)
            }
        }
        _ => bail!(
            "{}: unknown file type; use a .parquet, .jsonl, .json or .csv file",
            path.display()
        ),
    }
}

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn json_array(path: &Path, text: &str) -> Result<Vec<Row>> {
    let rows: Vec<Value> = serde_json::from_str(text)
        .with_context(|| format!("{}: not a JSON array of rows", path.display()))?;
    Ok(rows
        .into_iter()
        .enumerate()
        .map(|(i, value)| Row { at: format!("row {}", i + 1), value })
        .collect())
}

/// A CSV with a header row: each record becomes an object of its columns' text (an empty cell
/// is an empty string). Quoted cells may span lines, as GPQA's do.
fn csv_rows(path: &Path) -> Result<Vec<Row>> {
    let mut reader = csv::ReaderBuilder::new()
        .flexible(false)
        .from_path(path)
        .with_context(|| format!("reading {}", path.display()))?;
    let header =
        reader.headers().with_context(|| format!("{}: no header row", path.display()))?.clone();
    let mut rows = Vec::new();
    for (i, record) in reader.records().enumerate() {
        // Line numbers from the reader's position: a quoted cell may span several lines.
        let record = record
            .with_context(|| format!("{}: record {} is not valid CSV", path.display(), i + 1))?;
        let line = record.position().map_or(0, |p| p.line());
        let object = header
            .iter()
            .zip(record.iter())
            .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
            .collect();
        rows.push(Row { at: format!("line {line}"), value: Value::Object(object) });
    }
    Ok(rows)
}

fn json_lines(path: &Path, text: &str) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let value = serde_json::from_str(line)
            .with_context(|| format!("{} line {}: not JSON", path.display(), i + 1))?;
        rows.push(Row { at: format!("line {}", i + 1), value });
    }
    Ok(rows)
}

fn parquet_rows(path: &Path, format: Format) -> Result<Vec<Row>> {
    let present = dataset::parquet_columns(path)?;
    convert::check_columns(format, present.iter().map(String::as_str))
        .with_context(|| path.display().to_string())?;
    // Decode only the columns the converter reads: the others may be large (MBPP's code, GPQA's
    // explanations) or of types the record API does not read.
    let wanted: Vec<&str> = format.columns().collect();
    dataset::parquet_rows(path, Some(&wanted))?
        .enumerate()
        .map(|(i, row)| {
            let value =
                row.map_err(|e| anyhow::anyhow!("{} row {}: {e}", path.display(), i + 1))?;
            Ok(Row { at: format!("row {}", i + 1), value })
        })
        .collect()
}
