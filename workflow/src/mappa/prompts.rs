//! Prompts of the MathChat chain and its coach, in our own words (spec 3.1 and 4 list what they
//! must contain). Each agent gets one user message; the coach too.
use crate::turn::Role;

/// The role's name as the agents and the coach read it (spec 4's role strings).
pub fn role_name(role: Role) -> &'static str {
    match role {
        Role::ProblemSolver => "Problem Solver",
        Role::CodeExecutor => "Code Executor",
        Role::Verifier => "Verifier",
        other => other.as_str(),
    }
}

const TEAM: &str = "You are one of three agents working on a math problem in a fixed order: the Problem Solver writes a solution, the Code Executor checks and computes it with Python, and the Verifier states the final answer. The team succeeds only if the Verifier's final answer is correct.";
const LIMIT: &str = "Your reply may be at most 4096 tokens, thinking included; stay well under it.";

/// The first message of an agent's slot. `upstream` is the previous agent's hand-off (none for
/// the first agent).
pub fn agent_prompt(role: Role, problem: &str, upstream: &str) -> String {
    let position = match role {
        Role::ProblemSolver => "first",
        Role::CodeExecutor => "second",
        _ => "third and last",
    };
    let job = match role {
        Role::ProblemSolver => "Work out a complete solution to the problem, step by step, and end with the result you arrive at.",
        Role::CodeExecutor => "Check the solution below by computing it with Python. Put code in ```python fenced blocks: they will be run for you and the output returned, so you can fix errors and run again. When the output settles the question, say what it shows without another code block.",
        _ => "Read the problem and the work of the agents before you, check it, and give the final answer. End your reply with the answer in bold inside a box: **\\boxed{your answer}**.",
    };
    let mut p = format!("You are the {}, the {position} agent. {TEAM}\n\n{job}\n{LIMIT}\n\n## Problem\n{problem}\n", role_name(role));
    match role {
        Role::CodeExecutor => p.push_str(&format!("\n## Solution from the Problem Solver\n{upstream}\n")),
        Role::Verifier => p.push_str(&format!("\n## Execution results from the Code Executor\n{upstream}\n")),
        _ => {}
    }
    p
}

/// What the coach is told about one action.
pub struct CoachView<'a> {
    pub problem: &'a str,
    pub role: Role,
    /// The full context the agent saw (its prompt, earlier actions and observations).
    pub agent_input: &'a str,
    pub agent_output: &'a str,
    /// This action's tool observation, already cut to the coach's limit; `None`: no tool used.
    pub tool_observation: Option<&'a str>,
    /// Shown only for the last agent (spec 4); `None` elsewhere.
    pub ground_truth: Option<&'a str>,
}

pub fn coach_prompt(v: &CoachView<'_>) -> String {
    let name = role_name(v.role);
    let observation = v.tool_observation.unwrap_or("(no tool was used in this action)");
    let truth = v.ground_truth.unwrap_or("N/A");
    let criteria = match v.role {
        Role::CodeExecutor => "Judge whether the code is well formed and correct, whether it actually checks or computes what the solution needs, and whether the agent read the output correctly.",
        Role::Verifier => "Judge whether the agent combined the earlier work correctly and whether its final boxed answer is right.",
        _ => "Judge whether the solution is correct and clear enough for the agents after it to build on.",
    };
    let mut p = format!(
        "You coach a team of three agents that solve math problems in order: a Problem Solver drafts a solution, a Code Executor checks it with Python, and a Verifier gives the final answer. The team succeeds only if the Verifier's answer is correct. Every agent sees the problem and may write at most 4096 tokens.\n\n\
         Score one action of the {name} on how much it helps the team succeed, given its role and what it was given. {criteria}\n\n\
         ## Problem\n{}\n\n## Role\n{name}\n\n## What the agent was given\n{}\n\n## The agent's action\n{}\n\n## Tool output\n{observation}\n\n## Reference answer\n{truth}\n\n\
         Use a scale from 0 (useless or harmful) to 10 (flawless and decisive). Explain briefly, then end with the line\nPROCESS_SCORE: <0-10>\n",
        v.problem, v.agent_input, v.agent_output
    );
    if wants_outcome(v.role, v.ground_truth) {
        p.push_str("Since this is the final agent and the reference answer is given, also say whether its final answer matches the reference, on one more line:\nANSWER_CORRECT: <0 or 1>\n");
    }
    p
}

/// Whether the coach must give a correctness verdict: the last agent, with a reference answer.
pub fn wants_outcome(role: Role, ground_truth: Option<&str>) -> bool {
    role == Role::Verifier && ground_truth.is_some()
}

/// The follow-up after a reply without the required lines: it names what was missing and asks
/// for nothing else.
pub fn coach_retry_prompt(wants_outcome: bool) -> String {
    let mut p = String::from("Your reply did not end with the required line. Answer with nothing but the line\nPROCESS_SCORE: [0.0 to 10.0]\n");
    if wants_outcome {
        p = String::from(
            "Your reply did not end with the required lines. Answer with nothing but these two lines\nPROCESS_SCORE: [0.0 to 10.0]\nANSWER_CORRECT: [0 or 1]\n",
        );
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_carry_the_sections_each_role_needs() {
        let p = agent_prompt(Role::CodeExecutor, "What is 2+2?", "It is 4.");
        assert!(p.contains("Code Executor") && p.contains("```python") && p.contains("## Problem\nWhat is 2+2?") && p.contains("It is 4."));
        assert!(agent_prompt(Role::Verifier, "q", "out").contains("\\boxed{"));
        assert!(!agent_prompt(Role::ProblemSolver, "q", "").contains("## Solution"));
        let view = CoachView { problem: "q", role: Role::Verifier, agent_input: "in", agent_output: "out", tool_observation: None, ground_truth: Some("4") };
        let c = coach_prompt(&view);
        assert!(c.contains("PROCESS_SCORE: <0-10>") && c.contains("ANSWER_CORRECT") && c.contains("## Reference answer\n4"));
        let c = coach_prompt(&CoachView { role: Role::ProblemSolver, ground_truth: None, ..view });
        assert!(!c.contains("ANSWER_CORRECT") && c.contains("## Reference answer\nN/A") && c.contains("no tool was used"));
        assert!(coach_retry_prompt(true).contains("ANSWER_CORRECT: [0 or 1]"));
    }
}
