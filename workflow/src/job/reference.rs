//! The job-file reference (`docs/job-file.md`), generated from the job types' schemas (their
//! serde attributes, defaults and doc comments), so it cannot drift from what the parser takes.
//! A test compares the page with [`markdown`]; `COMAS_WRITE_DOCS=1` rewrites it.
use super::spec::{
    AgentSpec, DataSpec, EvalSpec, FrozenSpec, OutputSpec, RolloutSpec, ScheduleSpec, TrackingSpec,
    DEFAULT_METHOD,
};
use crate::train_config::{LoraSettings, TrainConfig};
use serde_json::{Map, Value};

/// The reference page.
pub fn markdown() -> String {
    let mut out = String::from(
        "# Job file reference\n\n\
         Generated from the job types by `cargo test -p comas-workflow job_file_reference` \
         (`COMAS_WRITE_DOCS=1` rewrites this page); [running jobs](running-jobs.md) shows a whole \
         file. Unknown keys are errors. Relative paths are resolved against the job file's folder.\n\n\
         ## Top level\n\n| key | type | default | |\n|---|---|---|---|\n",
    );
    let methods = crate::registry::NAMES.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>();
    out.push_str(
        "| `name` | string | required | The job's name (learners keep checkpoints under it). |\n",
    );
    out.push_str(&format!(
        "| `seed` | integer | `{}` | The job's seed: each epoch's question order follows from it. |\n",
        super::spec::default_seed()
    ));
    out.push_str(&format!(
        "| `method` | string | `\"{DEFAULT_METHOD}\"` | One of {}; its settings are the table of the same name (`[comas]`, `[grpo]`, ...), described in [the methods' pages](README.md). |\n",
        methods.join(", ")
    ));
    let sections: [(&str, Value); 9] = [
        ("[data]", schema::<DataSpec>()),
        ("[schedule]", schema::<ScheduleSpec>()),
        ("[rollout]", schema::<RolloutSpec>()),
        ("[output]", schema::<OutputSpec>()),
        ("[eval]", schema::<EvalSpec>()),
        ("[tracking]", schema::<TrackingSpec>()),
        ("[[frozen]]", schema::<FrozenSpec>()),
        ("[[agents]]", schema::<AgentSpec>()),
        ("[agents.train]", schema::<TrainConfig>()),
    ];
    for (title, s) in &sections {
        out.push_str(&format!("\n## `{title}`\n\n"));
        if let Some(d) = s.get("description").and_then(Value::as_str) {
            out.push_str(&format!("{}\n\n", one_line(d)));
        }
        if *title == "[agents.train]" {
            out.push_str("Each agent's own training settings. The defaults below are the learner's; a method sets its own for some keys (GRPO's `estimator = \"group_norm\"`, for example; see its page), and `total_steps` and `temperature` are derived from the job where left out.\n\n");
        }
        table(&mut out, s);
    }
    out.push_str("\n## `[agents.train.lora]`\n\nTrain a LoRA adapter instead of all weights.\n\n");
    table(&mut out, &schema::<LoraSettings>());
    out
}

fn schema<T: schemars::JsonSchema>() -> Value {
    serde_json::to_value(schemars::schema_for!(T)).expect("a schema is JSON")
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|")
}

/// One row per property: key, type, default, description.
fn table(out: &mut String, s: &Value) {
    out.push_str("| key | type | default | |\n|---|---|---|---|\n");
    let empty = Map::new();
    let props = s.get("properties").and_then(Value::as_object).unwrap_or(&empty);
    let required: Vec<&str> = s
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let defs = s.get("$defs").and_then(Value::as_object).unwrap_or(&empty);
    for (key, p) in props {
        let default = match p.get("default") {
            _ if required.contains(&key.as_str()) => "required".to_string(),
            Some(Value::Null) | None => "none".to_string(),
            Some(v) => format!("`{}`", toml_text(v)),
        };
        let mut about =
            p.get("description").and_then(Value::as_str).map(one_line).unwrap_or_default();
        let kind = kind_of(p, defs, &mut about);
        out.push_str(&format!("| `{key}` | {kind} | {default} | {about} |\n"));
    }
}

/// A value as it would be written in the TOML file.
fn toml_text(v: &Value) -> String {
    match v {
        Value::String(s) => format!("\"{s}\""),
        other => other.to_string().replace(',', ", "),
    }
}

/// The property's type in words; an enum's variants are added to `about`.
fn kind_of(p: &Value, defs: &Map<String, Value>, about: &mut String) -> String {
    if let Some(r) = p.get("$ref").and_then(Value::as_str) {
        let name = r.rsplit('/').next().unwrap_or(r);
        let def = defs.get(name).cloned().unwrap_or(Value::Null);
        return kind_of(&def, defs, about);
    }
    if let Some(any) = p.get("anyOf").and_then(Value::as_array) {
        // `Option<T>` of a referenced type: T or nothing.
        let inner: Vec<String> = any
            .iter()
            .filter(|v| v.get("type") != Some(&Value::String("null".into())))
            .map(|v| kind_of(v, defs, about))
            .collect();
        return inner.join(" or ");
    }
    if let Some(variants) = p.get("oneOf").or_else(|| p.get("enum")).and_then(Value::as_array) {
        let mut names = Vec::new();
        for v in variants {
            // A documented variant is a `const`; undocumented ones come as one `enum` list.
            let listed = match (v.get("const"), v.get("enum")) {
                (Some(c), _) => vec![c.clone()],
                (None, Some(Value::Array(all))) => all.clone(),
                _ => vec![v.clone()],
            };
            for name in listed.iter().filter_map(Value::as_str) {
                names.push(format!("`\"{name}\"`"));
                if let Some(d) = v.get("description").and_then(Value::as_str) {
                    about.push_str(&format!(" `{name}`: {}", one_line(d)));
                }
            }
        }
        *about = about.trim().to_string();
        if about.is_empty() {
            if let Some(d) = p.get("description").and_then(Value::as_str) {
                about.push_str(&one_line(d));
            }
        }
        return format!("one of {}", names.join(", "));
    }
    let types: Vec<&str> = match p.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => {
            ts.iter().filter_map(Value::as_str).filter(|t| *t != "null").collect()
        }
        _ => Vec::new(),
    };
    match types.first().copied() {
        Some("array") => {
            let item = p.get("items").map(|i| kind_of(i, defs, about)).unwrap_or_default();
            format!("list of {item}")
        }
        Some("object") => "table".to_string(),
        Some("number") => "number".to_string(),
        Some(t) => t.to_string(),
        None => "table".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/job-file.md is this module's output; `COMAS_WRITE_DOCS=1` rewrites it.
    #[test]
    fn job_file_reference_is_generated_from_the_types() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/job-file.md");
        let want = markdown();
        if std::env::var_os("COMAS_WRITE_DOCS").is_some() {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "docs/job-file.md is not what the job types say; run `COMAS_WRITE_DOCS=1 cargo test -p comas-workflow job_file_reference` and commit it"
        );
    }

    #[test]
    fn every_key_of_a_table_has_a_row_and_required_keys_say_so() {
        let page = markdown();
        for key in ["`questions_per_step`", "`mlflow`", "`prompt_key`", "`lr`", "`target_modules`"]
        {
            assert!(page.contains(&format!("| {key} |")), "{key}");
        }
        assert!(page.contains("| `model` | string | required |"), "{page}");
        assert!(
            page.contains("| `sync` | one of `\"synchronous\"`, `\"async\"` | `\"synchronous\"` |"),
            "{page}"
        );
    }
}
