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

impl std::fmt::Display for Override {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.name(), self.value)
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

/// The job file `text` with `overrides` applied, in order, written out as TOML again. The
/// result is checked here, so that an error an override causes names that override; an error
/// of the file itself is reported with its lines in the file, not in the text written out.
pub fn apply(text: &str, overrides: &[Override]) -> Result<String, JobError> {
    let root: Table =
        toml::from_str(text).map_err(|e: toml::de::Error| JobError::Syntax(e.to_string()))?;
    let all: Vec<&Override> = overrides.iter().collect();
    let out = render(&root, &all)?;
    match JobSpec::parse(&out, false) {
        Ok(_) => Ok(out),
        Err(e) => Err(blame(e, text, &root, overrides)),
    }
}

/// `root` with `overrides` set, as TOML text.
fn render(root: &Table, overrides: &[&Override]) -> Result<String, JobError> {
    let mut root = root.clone();
    for o in overrides {
        set(&mut root, o)?;
    }
    toml::to_string(&root).map_err(|e| JobError::Syntax(e.to_string()))
}

/// Which override the error `e` of the file with every override applied comes from: a wrong
/// key set by one (named with the nearest key the job has); else the one without which the
/// job reads; else the file's own error (with its lines); else the first override after which
/// the job no longer reads.
fn blame(e: JobError, text: &str, root: &Table, overrides: &[Override]) -> JobError {
    let e = match &e {
        JobError::Syntax(message) => match explain(e.clone(), overrides) {
            JobError::Syntax(_) => message.clone(),
            named => return named,
        },
        other => other.to_string(),
    };
    // The message of the job with `some` of the overrides, or `None` when it reads.
    let error_with = |some: Vec<&Override>| match render(root, &some) {
        Ok(out) => JobSpec::parse(&out, false).err().map(|e| match e {
            JobError::Syntax(message) => message,
            other => other.to_string(),
        }),
        Err(e) => Some(e.to_string()),
    };
    let culprit =
        |o: &Override, message: String| JobError::Override { arg: o.to_string(), message };
    for (i, o) in overrides.iter().enumerate() {
        let others = overrides.iter().enumerate().filter(|&(j, _)| j != i).map(|(_, o)| o);
        if error_with(others.collect()).is_none() {
            return culprit(o, e);
        }
    }
    if let Err(own) = JobSpec::from_toml(text) {
        return own;
    }
    for i in 0..overrides.len() {
        if let Some(message) = error_with(overrides[..=i].iter().collect()) {
            return culprit(&overrides[i], message);
        }
    }
    let all: Vec<String> = overrides.iter().map(|o| format!("`{o}`")).collect();
    JobError::Syntax(format!("with the overrides {} applied: {e}", all.join(" ")))
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
        // An entry of a list the job does not have (no [[agents]] at all): creating the key
        // would make it a table, which the job then reads as a wrong type.
        let index = o.path[i + 1].parse::<usize>().ok();
        if index.is_some() && !table.contains_key(key) {
            return Err(invalid(o.name(), no_entries(&at(i), o, i)));
        }
        let next = table.entry(key.clone()).or_insert_with(|| Value::Table(Table::new()));
        table = match next {
            Value::Table(t) => t,
            Value::Array(items) if items.is_empty() && index.is_some() => {
                return Err(invalid(o.name(), no_entries(&at(i), o, i)));
            }
            Value::Array(items) => {
                let n: usize = index.ok_or_else(|| {
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

/// Why override `o` cannot set an entry of `list` (its key `o.path[i]`): the job has none.
fn no_entries(list: &str, o: &Override, i: usize) -> String {
    let has = if list == "agents" {
        "the job has 0 agents".to_string()
    } else {
        format!("the job has no `{list}` entries")
    };
    if i + 2 < o.path.len() {
        format!("{has}; `{}` needs an [[{list}]] table", o.name())
    } else {
        format!("{has}; give the whole list instead, e.g. {list}=[...]")
    }
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

    fn apply_to(text: &str, args: &[&str]) -> Result<String, JobError> {
        let o: Vec<Override> = args.iter().map(|a| Override::parse(a)).collect::<Result<_, _>>()?;
        apply(text, &o)
    }

    /// An override's wrong value is named as the override; the text written out with the
    /// overrides, whose lines are not the user's, is never cited.
    #[test]
    fn a_wrong_value_names_the_override_not_a_line() {
        let e = run(&["agents.0.model=x", "schedule.steps=abc"]).unwrap_err().to_string();
        assert_eq!(e, "override `schedule.steps=abc`: invalid type: string \"abc\", expected u64");
        let e = run(&["schedule.steps=-1", "name=n"]).unwrap_err().to_string();
        assert!(e.starts_with("override `schedule.steps=-1`: invalid value"), "{e}");
        assert!(!e.contains("line"), "{e}");
        // A file without `name`: an override that gives it is not blamed for another's value.
        let nameless = JOB.replacen("name = \"t\"\n", "", 1);
        let e = apply_to(&nameless, &["name=n", "schedule.steps=abc"]).unwrap_err().to_string();
        assert!(e.starts_with("override `schedule.steps=abc`:"), "{e}");
        // Two wrong overrides: the first is named.
        let e = run(&["schedule.steps=abc", "seed=xyz"]).unwrap_err().to_string();
        assert!(e.starts_with("override `schedule.steps=abc`:"), "{e}");
    }

    /// An error of the file itself keeps the file's own line, overrides or not.
    #[test]
    fn an_error_of_the_file_cites_the_files_line() {
        let text = JOB.replace("steps = 3", "steps = 3\nwarp = 9");
        let without = JobSpec::from_toml(&text).unwrap_err().to_string();
        let with = apply_to(&text, &["agents.0.model=x"]).unwrap_err().to_string();
        assert!(with.contains("line 8") && with.contains("warp"), "{with}");
        assert_eq!(with, without);
        let text = JOB.replacen("name = \"t\"\n", "name = \"t\"\nfoo = 1\n", 1);
        let e = apply_to(&text, &["schedule.steps=5"]).unwrap_err().to_string();
        assert!(e.contains("line 2: unknown field `foo`"), "{e}");
    }

    #[test]
    fn an_agent_entry_of_a_job_without_agents_says_so() {
        let (head, _) = JOB.split_once("[[agents]]").unwrap();
        let e = apply_to(head, &["agents.0.learner=http://h:1"]).unwrap_err().to_string();
        assert_eq!(
            e,
            "`agents.0.learner`: the job has 0 agents; `agents.0.learner` needs an [[agents]] table"
        );
        let e = apply_to(&format!("agents = []\n{head}"), &["agents.0.model=m"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("the job has 0 agents"), "{e}");
        let e = apply_to(head, &["frozen.0=x"]).unwrap_err().to_string();
        assert!(e.contains("no `frozen` entries; give the whole list"), "{e}");
    }
}
