//! `key.path=value` overrides of a job file on the command line (`comas local JOB
//! schedule.steps=10 agents.1.train.lr=2e-6`), as Hydra and OmegaConf users write them: dotted
//! keys into the file's tables, a number picks an `[[agents]]` (or any array) entry, and the
//! value is a TOML value (`2e-6`, `true`, `["q_proj"]`, `"text"`), or plain text where it is
//! not one. A key the file already has keeps its type: a string stays a string
//! (`name=123` is the name "123"). The result is checked as any job file is; a key the job
//! does not have is an error that names the nearest one it has.
use super::{invalid, JobError, JobSpec};
use toml::{Table, Value};

/// One `key.path=value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    pub path: Vec<String>,
    pub value: String,
}

impl Override {
    /// Reads `key.path=value`; whatever is not of that form is refused with the form.
    pub fn parse(arg: &str) -> Result<Self, JobError> {
        let bad = |why: &str| {
            invalid(arg, format!("{why}; an override is key.path=value, e.g. schedule.steps=10"))
        };
        let (path, value) = arg.split_once('=').ok_or_else(|| bad("no `=`"))?;
        let path: Vec<String> = path.trim().split('.').map(str::to_string).collect();
        if path.iter().any(String::is_empty) {
            return Err(bad("an empty key"));
        }
        Ok(Self { path, value: value.to_string() })
    }

    fn name(&self) -> String {
        self.path.join(".")
    }
}

/// The value `text` stands for: a TOML value, else the text itself; a string where `like` is one.
fn typed(text: &str, like: Option<&Value>) -> Value {
    if matches!(like, Some(Value::String(_))) {
        return Value::String(text.to_string());
    }
    match toml::from_str::<Table>(&format!("v = {text}")) {
        Ok(mut t) => t.remove("v").unwrap_or_else(|| Value::String(text.to_string())),
        Err(_) => Value::String(text.to_string()),
    }
}

/// The job file `text` with `overrides` applied, in order, written out as TOML again.
pub fn apply(text: &str, overrides: &[Override]) -> Result<String, JobError> {
    let mut root: Table =
        toml::from_str(text).map_err(|e: toml::de::Error| JobError::Syntax(e.to_string()))?;
    for o in overrides {
        set(&mut root, o)?;
    }
    let out = toml::to_string(&root).map_err(|e| JobError::Syntax(e.to_string()))?;
    // Checked here, so that a wrong key is named as the override that set it.
    JobSpec::from_toml(&out).map_err(|e| explain(e, overrides))?;
    Ok(out)
}

fn set(root: &mut Table, o: &Override) -> Result<(), JobError> {
    let at = |i: usize| o.path[..=i].join(".");
    let mut table = root;
    for (i, key) in o.path.iter().enumerate() {
        let last = i + 1 == o.path.len();
        if last {
            let value = typed(&o.value, table.get(key));
            table.insert(key.clone(), value);
            return Ok(());
        }
        let next = table.entry(key.clone()).or_insert_with(|| Value::Table(Table::new()));
        table = match next {
            Value::Table(t) => t,
            Value::Array(items) => {
                let idx = &o.path[i + 1];
                let n: usize = idx.parse().map_err(|_| {
                    invalid(
                        o.name(),
                        format!("`{}` is a list: give an index after it, e.g. {}.0", at(i), at(i)),
                    )
                })?;
                let len = items.len();
                let item = items.get_mut(n).ok_or_else(|| {
                    invalid(
                        o.name(),
                        format!("`{}` has {len} entries (0 to {})", at(i), len.max(1) - 1),
                    )
                })?;
                if i + 2 == o.path.len() {
                    *item = typed(&o.value, Some(item));
                    return Ok(());
                }
                match item {
                    Value::Table(t) => {
                        // The index was used up here: skip it in the walk.
                        return set(
                            t,
                            &Override { path: o.path[i + 2..].to_vec(), value: o.value.clone() },
                        )
                        .map_err(|e| rename(e, &o.name()));
                    }
                    _ => return Err(invalid(o.name(), format!("`{}.{n}` is not a table", at(i)))),
                }
            }
            _ => {
                return Err(invalid(
                    o.name(),
                    format!("`{}` is a value, not a table of keys", at(i)),
                ))
            }
        };
    }
    Ok(())
}

/// An error about a tail of `name` reported under the whole override.
fn rename(e: JobError, name: &str) -> JobError {
    match e {
        JobError::Invalid { message, .. } => invalid(name, message),
        other => other,
    }
}

/// A wrong key from an override: which override, and the nearest key the job has there.
fn explain(e: JobError, overrides: &[Override]) -> JobError {
    let text = e.to_string();
    let Some(rest) = text.split("unknown field `").nth(1) else { return e };
    let Some((key, rest)) = rest.split_once('`') else { return e };
    let Some(o) = overrides.iter().find(|o| o.path.iter().any(|p| p == key)) else { return e };
    let expected: Vec<&str> = rest.split('`').skip(1).step_by(2).collect();
    let nearest = expected
        .iter()
        .min_by_key(|k| strsim::levenshtein(key, k))
        .map(|k| format!("; did you mean `{k}`?"))
        .unwrap_or_default();
    invalid(
        o.name(),
        format!(
            "the job has no key `{key}` there{nearest} (expected one of `{}`)",
            expected.join("`, `")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOB: &str = r#"name = "t"
method = "grpo"
[data]
train = "train.jsonl"
[schedule]
questions_per_step = 2
steps = 3
[output]
dir = "out"
[[agents]]
model = "m0"
[[agents]]
model = "m1"
[agents.train]
lr = 1e-4
"#;

    fn run(args: &[&str]) -> Result<JobSpec, JobError> {
        let o: Vec<Override> = args.iter().map(|a| Override::parse(a)).collect::<Result<_, _>>()?;
        JobSpec::from_toml(&apply(JOB, &o)?)
    }

    #[test]
    fn keys_tables_and_agent_entries_are_set_with_their_types() {
        let spec = run(&[
            "schedule.steps=10",
            "agents.1.train.lr=2e-6",
            "agents.0.model=other",
            "name=123",
            "rollout.dtype=bfloat16",
            "grpo.group_size=4",
        ])
        .unwrap();
        assert_eq!(spec.schedule.steps, Some(10));
        assert_eq!(spec.agents[0].model.to_str(), Some("other"));
        assert_eq!(spec.name, "123", "a string key stays a string");
        assert_eq!(spec.rollout.dtype, "bfloat16");
        assert_eq!(spec.agents[1].train.get("lr").and_then(|v| v.as_float()), Some(2e-6));
        assert_eq!(spec.settings.get("group_size").and_then(|v| v.as_integer()), Some(4));
    }

    #[test]
    fn a_wrong_key_names_the_override_and_the_nearest_key() {
        let e = run(&["schedule.stepz=10"]).unwrap_err().to_string();
        assert!(e.contains("`schedule.stepz`") && e.contains("did you mean `steps`?"), "{e}");
        let e = run(&["agents.2.train.lr=1"]).unwrap_err().to_string();
        assert!(e.contains("`agents` has 2 entries (0 to 1)"), "{e}");
        let e = run(&["agents.train.lr=1"]).unwrap_err().to_string();
        assert!(e.contains("`agents` is a list: give an index after it"), "{e}");
        let e = run(&["name.first=1"]).unwrap_err().to_string();
        assert!(e.contains("`name` is a value, not a table"), "{e}");
        let e = Override::parse("schedule.steps").unwrap_err().to_string();
        assert!(e.contains("key.path=value"), "{e}");
    }
}
