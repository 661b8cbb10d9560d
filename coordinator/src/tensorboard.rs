//! TensorBoard event files next to `metrics.jsonl`: one scalar per numeric leaf of every metrics
//! record, named by its path (`reward/solver/mean`, `agent0/train/loss`, `eval/greedy/accuracy/
//! last_round`), at the step the record belongs to.
//!
//! The file is a sequence of TFRecords (length, masked CRC32C of the length, an `Event`
//! protobuf, masked CRC32C of the event) as TensorBoard's `event.proto` and `summary.proto`
//! define them; only the fields comas writes are declared here. The bytes follow from the
//! records alone (wall time is the record's own `unix_time`), so rewriting the log after a
//! restart gives the same prefix and the writer only appends what is new: a TensorBoard that
//! is reading the file keeps its place.
use serde_json::{Map, Value};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The folder under `output.dir` that holds the event file.
pub const DIR: &str = "tb";

/// Record keys that identify a record rather than measure anything.
const NOT_METRICS: &[&str] =
    &["kind", "job_id", "step", "after_steps", "unix_time", "agent", "policy_versions"];

#[derive(Clone, PartialEq, prost::Message)]
struct Event {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(oneof = "What", tags = "3, 5")]
    what: Option<What>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum What {
    #[prost(string, tag = "3")]
    FileVersion(String),
    #[prost(message, tag = "5")]
    Summary(Summary),
}

#[derive(Clone, PartialEq, prost::Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<SummaryValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SummaryValue {
    #[prost(string, tag = "1")]
    tag: String,
    // In a oneof, as in summary.proto, so that a value of 0.0 is still written.
    #[prost(oneof = "Scalar", tags = "2")]
    value: Option<Scalar>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Scalar {
    #[prost(float, tag = "2")]
    SimpleValue(f32),
}

/// One record's scalars: its global step, wall time and (tag, value) pairs.
#[derive(Debug, Clone, PartialEq)]
pub struct Scalars {
    pub step: i64,
    pub wall_time: f64,
    pub values: Vec<(String, f64)>,
}

/// The scalars of one metrics record (a line of `metrics.jsonl`): every finite number under its
/// path, evaluation records under `eval/`, per-agent entries under `agent{K}/`. A record that is
/// not a step or evaluation record gives `None`.
pub fn scalars_of(record: &Value) -> Option<Scalars> {
    let o = record.as_object()?;
    let (prefix, step_key) = match o.get("kind")?.as_str()? {
        "step" => ("", "step"),
        "eval" => ("eval/", "after_steps"),
        _ => return None,
    };
    let step = o.get(step_key).or_else(|| o.get("step"))?.as_i64()?;
    let wall_time = o.get("unix_time").and_then(Value::as_f64).unwrap_or(0.0);
    let mut values = Vec::new();
    leaves(o, prefix, &mut values);
    Some(Scalars { step, wall_time, values })
}

fn leaves(o: &Map<String, Value>, prefix: &str, out: &mut Vec<(String, f64)>) {
    for (k, v) in o {
        if NOT_METRICS.contains(&k.as_str()) {
            continue;
        }
        match v {
            Value::Number(n) => {
                if let Some(x) = n.as_f64().filter(|x| x.is_finite()) {
                    out.push((format!("{prefix}{k}"), x));
                }
            }
            Value::Object(inner) => leaves(inner, &format!("{prefix}{k}/"), out),
            Value::Array(items) if k == "agents" => {
                for (i, item) in items.iter().enumerate() {
                    if let Some(inner) = item.as_object() {
                        let agent = inner.get("agent").and_then(Value::as_u64).unwrap_or(i as u64);
                        leaves(inner, &format!("{prefix}agent{agent}/"), out);
                    }
                }
            }
            _ => {}
        }
    }
}

/// TFRecord framing: TensorBoard checks both checksums.
fn frame(data: &[u8], out: &mut Vec<u8>) {
    let len = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
}

/// CRC32C, rotated and offset as TFRecord files store it.
pub fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// The whole event file for these metrics log lines: a version event, then one event per step
/// or evaluation record. Lines that are not such records are left out.
pub fn encode(lines: &[String]) -> Result<Vec<u8>, serde_json::Error> {
    let mut records = Vec::with_capacity(lines.len());
    for l in lines {
        if let Some(s) = scalars_of(&serde_json::from_str::<Value>(l)?) {
            records.push(s);
        }
    }
    let mut out = Vec::new();
    version_event(records.first().map_or(0.0, |r| r.wall_time), &mut out);
    for r in records {
        record_event(r, &mut out);
    }
    Ok(out)
}

/// The bytes one more metrics log line adds to the event file at `path`: its event, after the
/// version event when the file has none yet; what `encode` of the whole log would end with.
pub fn encode_next(line: &str, path: &Path) -> Result<Vec<u8>, serde_json::Error> {
    let mut out = Vec::new();
    let Some(record) = scalars_of(&serde_json::from_str::<Value>(line)?) else { return Ok(out) };
    if std::fs::metadata(path).map_or(true, |m| m.len() == 0) {
        version_event(record.wall_time, &mut out);
    }
    record_event(record, &mut out);
    Ok(out)
}

/// The first event of a file: its format version, at the first record's time.
fn version_event(wall_time: f64, out: &mut Vec<u8>) {
    let version =
        Event { wall_time, step: 0, what: Some(What::FileVersion("brain.Event:2".into())) };
    frame(&prost::Message::encode_to_vec(&version), out);
}

fn record_event(r: Scalars, out: &mut Vec<u8>) {
    let value = r
        .values
        .into_iter()
        .map(|(tag, v)| SummaryValue { tag, value: Some(Scalar::SimpleValue(v as f32)) })
        .collect();
    let event = Event {
        wall_time: r.wall_time,
        step: r.step,
        what: Some(What::Summary(Summary { value })),
    };
    frame(&prost::Message::encode_to_vec(&event), out);
}

/// The event file of a job under `output_dir`; the name carries the job id, so the file is the
/// same one after a restart and no two jobs share it.
pub fn path(output_dir: &Path, job_id: &str) -> PathBuf {
    output_dir.join(DIR).join(format!("events.out.tfevents.{job_id}"))
}

/// Brings the event file at `path` up to `bytes`: appends the new tail when the file holds a
/// prefix of them (the usual case), and otherwise (a torn append, another version) replaces it
/// atomically.
pub fn sync(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().expect("the event file lies in a folder");
    std::fs::create_dir_all(dir)?;
    let old = match std::fs::read(path) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    match old {
        Some(old) if old.len() <= bytes.len() && bytes.starts_with(&old) => {
            if old.len() < bytes.len() {
                let mut f = std::fs::OpenOptions::new().append(true).open(path)?;
                f.write_all(&bytes[old.len()..])?;
                f.sync_all()?;
            }
            Ok(())
        }
        _ => crate::files::write_atomic(path, bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn leaves_are_named_by_their_path_and_agents_by_their_index() {
        let r = json!({"kind": "step", "job_id": "j", "step": 3, "unix_time": 10.5, "reward": {"solver": {"mean": 0.25, "count": 4}},
            "policy_versions": [3], "note": "text", "agents": [{"agent": 1, "train": {"loss": -0.5}}], "nan": null});
        let s = scalars_of(&r).unwrap();
        assert_eq!((s.step, s.wall_time), (3, 10.5));
        let want = [
            ("reward/solver/mean", 0.25),
            ("reward/solver/count", 4.0),
            ("agent1/train/loss", -0.5),
        ];
        let mut got = s.values.clone();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        let mut want: Vec<(String, f64)> = want.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        want.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(got, want);
    }

    #[test]
    fn evaluations_sit_under_eval_at_the_steps_they_followed() {
        let r = json!({"kind": "eval", "step": 4, "after_steps": 4, "accuracy": {"last_round": 0.5}, "greedy": {"accuracy": {"last_round": 0.75}}});
        let s = scalars_of(&r).unwrap();
        assert_eq!(s.step, 4);
        assert_eq!(
            s.values,
            vec![
                ("eval/accuracy/last_round".to_string(), 0.5),
                ("eval/greedy/accuracy/last_round".to_string(), 0.75)
            ]
        );
        assert_eq!(scalars_of(&json!({"kind": "job"})), None);
    }

    #[test]
    fn the_masked_crc_matches_tensorflows_for_a_known_input() {
        // CRC32C("123456789") = 0xE3069283 (the standard check value), then rotated and offset.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(
            masked_crc(b"123456789"),
            0xE306_9283u32.rotate_right(15).wrapping_add(0xa282_ead8)
        );
    }

    #[test]
    fn a_longer_log_appends_and_a_different_one_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let p = path(dir.path(), "job-1");
        let line = |step: u64| {
            json!({"kind": "step", "step": step, "unix_time": 1.0, "x": step}).to_string()
        };
        let one = encode(&[line(0)]).unwrap();
        let two = encode(&[line(0), line(1)]).unwrap();
        sync(&p, &one).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), one);
        sync(&p, &two).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), two);
        // A torn append is still a prefix, and is completed.
        std::fs::write(&p, &two[..two.len() - 3]).unwrap();
        let three = encode(&[line(0), line(1), line(2)]).unwrap();
        sync(&p, &three).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), three);
        // Anything else in its place is replaced as a whole.
        std::fs::write(&p, b"not an event file, and longer than one event").unwrap();
        sync(&p, &one).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), one);
        assert!(two.starts_with(&one) && three.starts_with(&two));
    }
}
