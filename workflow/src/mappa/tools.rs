//! Tool calls in an action (spec 6): `<tool_call>` JSON blocks if the action has any, else every
//! fenced Python block; and the observation turn that carries the results back.
use crate::tool::ToolResult;
use regex::Regex;
use serde::Deserialize;
use std::sync::LazyLock;

static PYTHON_BLOCK: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(?s)```python\s*(.*?)```").expect("constant pattern compiles"));
const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
/// Separates the results of several calls of one action.
pub const RESULT_SEPARATOR: &str = "\n------\n";

/// What an action asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Calls {
    /// No call: the agent's slot ends with this action.
    None,
    /// Python programs, run in order, each in a fresh sandbox.
    Code(Vec<String>),
    /// The action tried to call a tool but the call cannot be read; this text is its observation.
    Malformed(String),
}

#[derive(Deserialize)]
struct ToolCall {
    name: String,
    #[serde(default)]
    arguments: serde_json::Value,
}

/// The calls of one action. Tool-call blocks are read as strict JSON (the reference reads JSON5:
/// a call with trailing commas or single quotes is refused here, with a message saying so).
pub fn parse_calls(action: &str) -> Calls {
    if action.contains(OPEN) || action.contains(CLOSE) {
        return parse_tagged(action);
    }
    let blocks: Vec<String> = PYTHON_BLOCK.captures_iter(action).map(|c| c[1].to_string()).filter(|b| !b.trim().is_empty()).collect();
    if blocks.is_empty() {
        Calls::None
    } else {
        Calls::Code(blocks)
    }
}

fn parse_tagged(action: &str) -> Calls {
    let mut code = Vec::new();
    let mut rest = action;
    while let Some(start) = rest.find(OPEN) {
        let after = &rest[start + OPEN.len()..];
        let Some(end) = after.find(CLOSE) else {
            return Calls::Malformed(format!("Error: a {OPEN} has no matching {CLOSE}."));
        };
        let body = after[..end].trim();
        let call: ToolCall = match serde_json::from_str(body) {
            Ok(c) => c,
            Err(e) => {
                return Calls::Malformed(format!(
                    "Error: the tool call is not valid JSON ({e}); write {{\"name\": \"code_interpreter\", \"arguments\": {{\"code\": \"...\"}}}}."
                ))
            }
        };
        if call.name != "code_interpreter" && call.name != "python" {
            return Calls::Malformed(format!("Error: unknown tool {:?}; the only tool is code_interpreter.", call.name));
        }
        match call.arguments.get("code").and_then(serde_json::Value::as_str) {
            Some(c) => code.push(c.to_string()),
            None => return Calls::Malformed("Error: the code_interpreter call needs a string argument \"code\".".into()),
        }
        rest = &after[end + CLOSE.len()..];
    }
    if rest.contains(CLOSE) || code.is_empty() {
        return Calls::Malformed(format!("Error: a {CLOSE} has no matching {OPEN}."));
    }
    Calls::Code(code)
}

/// The text of an observation turn: every result in order, each clipped to `max_chars`,
/// wrapped as a tool response.
pub fn tool_response(results: &[ToolResult], max_chars: usize) -> String {
    let joined: Vec<String> = results.iter().map(|r| clip(&r.observation(), max_chars)).collect();
    wrap(&joined.join(RESULT_SEPARATOR))
}

/// At most about `n` characters of `text`: its head and its tail (where a traceback ends) around
/// a marker that says how much was left out.
pub fn clip(text: &str, n: usize) -> String {
    let total = text.chars().count();
    if total <= n {
        return text.to_string();
    }
    let head: String = text.chars().take(n / 2).collect();
    let tail: String = text.chars().skip(total - (n - n / 2)).collect();
    format!("{head}\n[... {} characters left out ...]\n{tail}", total - n)
}

/// Wraps observation text (also a malformed call's error) as a tool response.
pub fn wrap(text: &str) -> String {
    format!("<tool_response>\n{text}\n</tool_response>")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenced_blocks_are_calls_in_order() {
        let a = "Let me check.\n```python\nprint(1+1)\n```\nand\n```python\nprint(2)\n```";
        assert_eq!(parse_calls(a), Calls::Code(vec!["print(1+1)\n".into(), "print(2)\n".into()]));
        assert_eq!(parse_calls("The answer is 4."), Calls::None);
        assert_eq!(parse_calls("```python\n\n```"), Calls::None);
    }

    #[test]
    fn tagged_calls_take_precedence_and_bad_ones_say_why() {
        let a = "<tool_call>{\"name\": \"code_interpreter\", \"arguments\": {\"code\": \"print(3)\"}}</tool_call>\n```python\nprint(9)\n```";
        assert_eq!(parse_calls(a), Calls::Code(vec!["print(3)".into()]));
        assert!(matches!(parse_calls("<tool_call>{\"name\": \"x\"}"), Calls::Malformed(m) if m.contains("no matching")));
        assert!(matches!(parse_calls("<tool_call>{'name': 1}</tool_call>"), Calls::Malformed(m) if m.contains("not valid JSON")));
        assert!(matches!(parse_calls("<tool_call>{\"name\": \"web\", \"arguments\": {}}</tool_call>"), Calls::Malformed(m) if m.contains("unknown tool")));
        assert!(matches!(parse_calls("done</tool_call>"), Calls::Malformed(_)));
    }

    #[test]
    fn a_response_joins_results() {
        let r = |out: &str| ToolResult { call_index: 0, failure: None, detail: String::new(), stdout: out.into(), stderr: String::new(), files: Vec::new() };
        assert_eq!(tool_response(&[r("2"), r("3")], 100), "<tool_response>\n2\n------\n3\n</tool_response>");
        assert_eq!(tool_response(&[r("abcdefghij")], 4), "<tool_response>\nab\n[... 6 characters left out ...]\nij\n</tool_response>");
        assert_eq!(clip("héllo", 5), "héllo");
    }
}
