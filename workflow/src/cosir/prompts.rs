//! What a seat is told (spec §3.3), in our own words: who it is, the goal, the options and the
//! weighted criteria, its own view of the table with `?` for what it does not know, the
//! discussion so far, and the tag grammar.
use super::table::Table;

/// A seat's label in transcripts and tags: seat 0 is `agent_1`.
pub fn label(seat: u32) -> String {
    format!("agent_{}", seat + 1)
}

/// The seat's initial view as a markdown table (rows: options; columns: criteria with weights).
pub fn view_table(table: &Table, seat: u32) -> String {
    let view = &table.views[seat as usize];
    let mut out = String::from("| option |");
    for (name, w) in table.criteria.iter().zip(&table.weights) {
        out.push_str(&format!(" {name} (w={w}) |"));
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(table.criteria.len()));
    for (o, label) in table.options.iter().enumerate() {
        out.push_str(&format!("\n| {label} |"));
        for c in 0..table.criteria.len() {
            match view.binary_search(&(o, c)) {
                Ok(_) => out.push_str(&format!(" {} |", table.scores[o][c])),
                Err(_) => out.push_str(" ? |"),
            }
        }
    }
    out
}

fn preamble(table: &Table, seat: u32) -> String {
    let n = table.views.len();
    let k = table.prior.len() - 1;
    let criteria: Vec<String> = table.criteria.iter().zip(&table.weights).map(|(c, w)| format!("{c} (weight {w})")).collect();
    format!(
        "You are {me}, one of {n} teammates ({all}). Together you must pick the option with the highest weighted total: \
         the sum over criteria of weight times score. Scores run from 0 to {k}.\n\
         Options: {options}.\nCriteria: {criteria}.\n\n\
         Each teammate sees only part of the score table. What you see (? = unknown to you):\n{view}",
        me = label(seat),
        all = (0..n as u32).map(label).collect::<Vec<_>>().join(", "),
        options = table.options.join(", "),
        criteria = criteria.join(", "),
        view = view_table(table, seat),
    )
}

fn transcript_block(transcript: &[(u32, String)]) -> String {
    if transcript.is_empty() {
        return "Discussion so far: nothing yet.".into();
    }
    let lines: Vec<String> = transcript.iter().map(|(s, m)| format!("[{}] {m}", label(*s))).collect();
    format!("Discussion so far:\n{}", lines.join("\n"))
}

/// A discussion turn: round `round` (1-based) of `rounds`.
pub fn discussion_prompt(table: &Table, seat: u32, transcript: &[(u32, String)], round: u32, rounds: u32, max_shares: u32, max_requests: u32) -> String {
    let c0 = &table.criteria[0];
    format!(
        "{pre}\n\n{talk}\n\nRound {round} of {rounds}. Write one short public message to the team. \
         To pass on a score you know, put a line `SHARE(<option>, <criterion>, <score>)`, e.g. `SHARE(A, {c0}, 4)`; \
         to ask for one you lack, a line `REQUEST(<option>, <criterion>)` or `REQUEST(agent_2, <option>, <criterion>)`. \
         One tag per line, at most {max_shares} SHARE and {max_requests} REQUEST lines. Only tags count as information, \
         and only true scores that you actually know. Do not give a final answer yet. Be concise.",
        pre = preamble(table, seat),
        talk = transcript_block(transcript),
    )
}

/// The private final turn.
pub fn final_prompt(table: &Table, seat: u32, transcript: &[(u32, String)]) -> String {
    format!(
        "{pre}\n\n{talk}\n\nThe discussion is over. Decide privately which option has the highest weighted total, \
         using what you know and what your teammates shared. End with exactly one line `FINAL(<option>)`, e.g. `FINAL({first})`.",
        pre = preamble(table, seat),
        talk = transcript_block(transcript),
        first = table.options[0],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cosir::table::tests::fixture;

    #[test]
    fn a_seat_sees_its_own_cells_and_question_marks() {
        let t = fixture();
        assert_eq!(
            view_table(&t, 1),
            "| option | c1 (w=2) | c2 (w=1) | c3 (w=1) |\n|---|---|---|---|\n| A | 1 | ? | 3 |\n| B | 3 | ? | 1 |\n| C | 2 | ? | 2 |"
        );
        let p = discussion_prompt(&t, 0, &[(1, "SHARE(A, c3, 3)".into())], 2, 3, 4, 2);
        assert!(p.starts_with("You are agent_1, one of 2 teammates (agent_1, agent_2)."), "{p}");
        assert!(p.contains("[agent_2] SHARE(A, c3, 3)") && p.contains("Round 2 of 3.") && p.contains("at most 4 SHARE and 2 REQUEST lines"), "{p}");
        let f = final_prompt(&t, 0, &[]);
        assert!(f.contains("Discussion so far: nothing yet.") && f.ends_with("e.g. `FINAL(A)`."), "{f}");
    }
}
