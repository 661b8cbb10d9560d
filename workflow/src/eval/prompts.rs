//! The fixed wording of the evaluation setups (spec §8.2 gives the slots; the words are ours).

/// Closes a Consistency or Debate aggregation message.
pub const AGGREGATE: &str = "Read every solution above and reason about where they agree and where they differ. \
Then solve the task yourself, using them where they are right, and state your final answer at the end.";

/// Round 0 of a Debate: the query and a request for the answer at the end.
pub fn debate_opening(query: &str) -> String {
    format!("{query}\n\nSolve the problem step by step and state your final answer at the end of your reply.")
}

/// Round 1 of a Debate for one agent: the other agents' round-0 answers, and the problem again.
pub fn debate_rebuttal(query: &str, others: &[&str]) -> String {
    let mut text = String::from("Here are the solutions other agents gave to the same problem:\n\n");
    for answer in others {
        text.push_str("```\n");
        text.push_str(answer.trim());
        text.push_str("\n```\n\n");
    }
    text.push_str(
        "Treat them as advice: check their reasoning against yours, then give an updated answer and state your final answer at the end.\n\nThe original problem:\n",
    );
    text.push_str(query);
    text
}

/// `[Task]` and the numbered solutions of a Consistency aggregation.
pub fn consistency_aggregate(query: &str, solutions: &[&str]) -> String {
    aggregate(query, solutions, |label| format!("[{label}]:"))
}

/// `Task:` and the numbered final answers of a Debate aggregation.
pub fn debate_aggregate(query: &str, finals: &[&str]) -> String {
    aggregate(query, finals, |label| format!("{label}:"))
}

/// The task, each solution under its numbered heading, then the aggregation instruction; the two
/// setups differ only in how a heading is written (spec §8.2).
fn aggregate(query: &str, solutions: &[&str], heading: impl Fn(&str) -> String) -> String {
    let mut text = format!(
        "{}
{query}

",
        heading("Task")
    );
    for (i, s) in solutions.iter().enumerate() {
        text.push_str(&format!(
            "{}
{s}

",
            heading(&format!("Solution {}", i + 1))
        ));
    }
    text.push_str(AGGREGATE);
    text
}

/// The AutoGen assistant's system message.
pub fn autogen_assistant(terminator: &str) -> String {
    format!(
        "You are a helpful assistant. Solve the task with your language skills, without writing code to run. \
Work step by step; if no plan is given, state your plan first. Check your answer and show the evidence for it. \
End every reply with your current final answer in the format the task asks for. \
When everything is done, reply with {terminator}."
    )
}
