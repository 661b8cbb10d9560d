//! A job file as MLflow parameters: one per leaf of its TOML, named by its dotted path
//! (`schedule.steps`, `agents.0.train.lr`), the value as TOML writes it. Arrays of tables are
//! numbered; other arrays are one value (`["q_proj", "v_proj"]`).
use super::client::{KeyValue, MAX_PARAM_VALUE};

/// The parameters of job file `text` (already checked, so it parses), sorted by key.
pub fn params_of(text: &str) -> Vec<KeyValue> {
    let mut out = Vec::new();
    if let Ok(table) = text.parse::<toml::Table>() {
        leaves(&table, "", &mut out);
    }
    out
}

fn leaves(table: &toml::Table, prefix: &str, out: &mut Vec<KeyValue>) {
    for (k, v) in table {
        let key = format!("{prefix}{k}");
        match v {
            toml::Value::Table(t) => leaves(t, &format!("{key}."), out),
            toml::Value::Array(items)
                if !items.is_empty() && items.iter().all(|i| i.is_table()) =>
            {
                for (i, item) in items.iter().enumerate() {
                    if let toml::Value::Table(t) = item {
                        leaves(t, &format!("{key}.{i}."), out);
                    }
                }
            }
            toml::Value::String(s) => out.push(kv(key, s.clone())),
            other => out.push(kv(key, other.to_string())),
        }
    }
}

fn kv(key: String, mut value: String) -> KeyValue {
    if value.len() > MAX_PARAM_VALUE {
        let mut end = MAX_PARAM_VALUE - 20;
        while !value.is_char_boundary(end) {
            end -= 1;
        }
        value.truncate(end);
        value.push_str(" … (cut by comas)");
    }
    KeyValue { key, value }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_leaf_is_a_parameter_under_its_dotted_path() {
        let text = r#"
name = "x"
[schedule]
steps = 10
[[agents]]
model = "/m"
[agents.train]
lr = 2e-6
target_modules = ["q_proj", "v_proj"]
[[agents]]
model = "/n"
"#;
        let got: Vec<(String, String)> =
            params_of(text).into_iter().map(|p| (p.key, p.value)).collect();
        let want = [
            ("agents.0.model", "/m"),
            ("agents.0.train.lr", "0.000002"),
            ("agents.0.train.target_modules", r#"["q_proj", "v_proj"]"#),
            ("agents.1.model", "/n"),
            ("name", "x"),
            ("schedule.steps", "10"),
        ];
        let want: Vec<(String, String)> =
            want.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_value_longer_than_mlflow_keeps_is_cut_and_says_so() {
        let long = "a".repeat(MAX_PARAM_VALUE + 5);
        let p = params_of(&format!("note = \"{long}\""));
        assert!(p[0].value.len() <= MAX_PARAM_VALUE);
        assert!(p[0].value.ends_with("(cut by comas)"));
    }
}
