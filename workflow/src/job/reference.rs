//! The job-file reference (`docs/job-file.md`), generated from the job types' schemas (their
//! serde attributes, defaults and doc comments), so it cannot drift from what the parser takes.
//! A test compares the page with [`markdown`]; `COMAS_WRITE_DOCS=1` rewrites it.
use super::spec::{
    AgentSpec, DataSpec, EvalSpec, FrozenSpec, OutputSpec, RolloutSpec, ScheduleSpec, TrackingSpec,
    DEFAULT_METHOD,
};
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
    let sections: [(&str, Value); 8] = [
        ("data", schema::<DataSpec>()),
        ("schedule", schema::<ScheduleSpec>()),
        ("rollout", schema::<RolloutSpec>()),
        ("output", schema::<OutputSpec>()),
        ("eval", schema::<EvalSpec>()),
        ("tracking", schema::<TrackingSpec>()),
        ("[frozen]", schema::<FrozenSpec>()),
        ("[agents]", schema::<AgentSpec>()),
    ];
    for (path, s) in &sections {
        section(&mut out, path, s, s, "");
    }
    out.push_str("\n# Methods\n\nEach method's settings are the table named after it; [the methods' pages](README.md) say what they do.\n");
    for (name, table, s) in crate::registry::schemas() {
        section(&mut out, table, &s, &s, &format!("The settings of `method = \"{name}\"`."));
    }
    out
}

/// What a table's heading adds (the notes that are not any type's doc comment).
fn note(path: &str) -> &'static str {
    match path {
        "agents.train" => "Each agent's own training settings. The defaults below are the learner's; a method sets its own for some keys (GRPO's `estimator = \"group_norm\"`, for example; see its page), and `total_steps` and `temperature` are derived from the job where left out.",
        _ => "",
    }
}

/// The table at `path` (`[x]`, or `[[x]]` when written `[x]`), then a section for each of its
/// keys that is itself a table of known keys. `root` holds the schema's definitions.
fn section(out: &mut String, path: &str, s: &Value, root: &Value, intro: &str) {
    let heading = match path.strip_prefix('[').and_then(|p| p.strip_suffix(']')) {
        Some(array) => format!("[[{array}]]"),
        None => format!("[{path}]"),
    };
    let path = path.trim_start_matches('[').trim_end_matches(']');
    out.push_str(&format!("\n## `{heading}`\n\n"));
    for text in [intro, note(path)] {
        if !text.is_empty() {
            out.push_str(&format!("{text}\n\n"));
        }
    }
    if let Some(d) = s.get("description").and_then(Value::as_str) {
        out.push_str(&format!("{}\n\n", one_line(d)));
    }
    let nested = table(out, s, root);
    for (key, inner) in nested {
        section(out, &format!("{path}.{key}"), &inner, root, "");
    }
}

fn schema<T: schemars::JsonSchema>() -> Value {
    serde_json::to_value(schemars::schema_for!(T)).expect("a schema is JSON")
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|")
}

/// One row per property: key, type, default, description. Returns the properties that are
/// tables of known keys themselves (a struct, or an optional one), to be shown on their own.
fn table(out: &mut String, s: &Value, root: &Value) -> Vec<(String, Value)> {
    out.push_str("| key | type | default | |\n|---|---|---|---|\n");
    let empty = Map::new();
    let props = s.get("properties").and_then(Value::as_object).unwrap_or(&empty);
    let required: Vec<&str> = s
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let defs = root.get("$defs").and_then(Value::as_object).unwrap_or(&empty);
    let mut nested = Vec::new();
    for (key, p) in props {
        // A struct with `#[serde(default)]` carries its fields' defaults as one object.
        let own = p.get("default").or_else(|| s.pointer(&format!("/default/{key}")));
        let inner = struct_of(p, defs);
        let default = match own {
            _ if required.contains(&key.as_str()) => "required".to_string(),
            // Left out of the struct's default object: a `false` it skips when written.
            None if s.get("default").is_some() && p.get("type") == Some(&"boolean".into()) => {
                "`false`".to_string()
            }
            Some(Value::Null) | None => "none".to_string(),
            Some(v) if v.is_object() && inner.is_some() => "see below".to_string(),
            Some(v) => format!("`{}`", toml_text(v)),
        };
        let mut about =
            p.get("description").and_then(Value::as_str).map(one_line).unwrap_or_default();
        let kind = kind_of(p, defs, &mut about);
        if let Some(mut inner) = inner {
            if let (Some(d), Some(o)) = (own.filter(|d| d.is_object()), inner.as_object_mut()) {
                o.insert("default".into(), d.clone());
            }
            nested.push((key.clone(), inner));
        }
        out.push_str(&format!("| `{key}` | {kind} | {default} | {about} |\n"));
    }
    nested
}

/// The struct a property holds (directly, or as an `Option`), if it has keys of its own.
fn struct_of(p: &Value, defs: &Map<String, Value>) -> Option<Value> {
    let resolved = match p.get("$ref").and_then(Value::as_str) {
        Some(r) => defs.get(r.rsplit('/').next().unwrap_or(r))?.clone(),
        None => match p.get("anyOf").and_then(Value::as_array) {
            Some(any) => return any.iter().find_map(|v| struct_of(v, defs)),
            None => p.clone(),
        },
    };
    resolved.get("properties").is_some().then_some(resolved)
}

/// A value as it would be written in the TOML file.
fn toml_text(v: &Value) -> String {
    match v {
        Value::String(s) => format!("\"{s}\""),
        Value::Array(items) => {
            format!("[{}]", items.iter().map(toml_text).collect::<Vec<_>>().join(", "))
        }
        Value::Object(o) if o.is_empty() => "{}".to_string(),
        Value::Object(o) => format!(
            "{{ {} }}",
            o.iter().map(|(k, v)| format!("{k} = {}", toml_text(v))).collect::<Vec<_>>().join(", ")
        ),
        other => other.to_string(),
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
            // An internally tagged variant is a table whose `kind` is the name.
            let tag = v.pointer("/properties/kind/const");
            let listed = match (v.get("const").or(tag), v.get("enum")) {
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
