//! The action grammar of spec §3.4: SHARE, REQUEST and FINAL tags, one per line, with names and
//! values that must exist, per-message limits, and the format violations a message can commit.
use super::evaluator::Cell;
use super::table::Table;
use regex::Regex;
use serde::{Deserialize, Serialize};
use std::sync::OnceLock;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    pub cell: Cell,
    pub value: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ask {
    /// The seat asked (`agent_k` is seat k - 1), or anyone.
    pub to: Option<u32>,
    pub cell: Cell,
}

/// The kinds of format violation (a message counts once however many it commits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Violation {
    /// A line that starts like a tag but does not match its grammar.
    Malformed,
    /// An option, criterion or seat that does not exist, or a value outside 0..=K.
    UnknownName,
    /// FINAL in a discussion message.
    FinalInDiscussion,
    /// Zero or several FINAL tags in a final turn.
    FinalCount,
    /// The message hit the token limit.
    Truncated,
    /// More SHARE or REQUEST tags than a message may carry (the extra ones are ignored).
    TooManyTags,
}

impl Violation {
    pub fn as_str(self) -> &'static str {
        match self {
            Violation::Malformed => "malformed",
            Violation::UnknownName => "unknown_name",
            Violation::FinalInDiscussion => "final_in_discussion",
            Violation::FinalCount => "final_count",
            Violation::Truncated => "truncated",
            Violation::TooManyTags => "too_many_tags",
        }
    }
}

/// What one message says in tags.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Tags {
    pub shares: Vec<Share>,
    pub requests: Vec<Ask>,
    /// The option of the message's one FINAL tag, when it has exactly one.
    pub final_choice: Option<usize>,
    /// Every kind committed, sorted, once each.
    pub violations: Vec<Violation>,
}

fn patterns() -> &'static [Regex; 3] {
    static P: OnceLock<[Regex; 3]> = OnceLock::new();
    P.get_or_init(|| {
        [
            Regex::new(r"^\s*SHARE\(\s*([A-Z])\s*,\s*([a-z][a-z0-9_]*)\s*,\s*(\d+)\s*\)\s*$").expect("valid"),
            Regex::new(r"^\s*REQUEST\(\s*(?:(agent_\d+)\s*,\s*)?([A-Z])\s*,\s*([a-z][a-z0-9_]*)\s*\)\s*$").expect("valid"),
            Regex::new(r"^\s*FINAL\(\s*([A-Z])\s*\)\s*$").expect("valid"),
        ]
    })
}

/// Reads a message's tags against `table`. `final_turn` says which turn it is; `truncated`
/// that it hit the token limit.
pub fn parse(text: &str, table: &Table, final_turn: bool, truncated: bool, max_shares: u32, max_requests: u32) -> Tags {
    let [share_re, request_re, final_re] = patterns();
    let mut t = Tags::default();
    let mut finals = Vec::new();
    let mut violations = Vec::new();
    let k = table.prior.len() as u32 - 1;
    let cell = |o: &str, c: &str| Some((table.option_index(o)?, table.criterion_index(c)?));
    for line in text.lines() {
        let head = line.trim_start();
        if let Some(m) = share_re.captures(line) {
            let value = m[3].parse::<u32>().ok().filter(|&v| v <= k);
            match (cell(&m[1], &m[2]), value) {
                (Some(cell), Some(value)) if t.shares.len() < max_shares as usize => t.shares.push(Share { cell, value }),
                (Some(_), Some(_)) => violations.push(Violation::TooManyTags),
                _ => violations.push(Violation::UnknownName),
            }
        } else if let Some(m) = request_re.captures(line) {
            let to = m.get(1).map(|a| a.as_str()["agent_".len()..].parse::<u32>().ok().filter(|&n| n >= 1 && n as usize <= table.views.len()).map(|n| n - 1));
            match (cell(&m[2], &m[3]), to) {
                (Some(_), Some(None)) | (None, _) => violations.push(Violation::UnknownName),
                (Some(cell), to) if t.requests.len() < max_requests as usize => t.requests.push(Ask { to: to.flatten(), cell }),
                (Some(_), _) => violations.push(Violation::TooManyTags),
            }
        } else if let Some(m) = final_re.captures(line) {
            match table.option_index(&m[1]) {
                Some(o) => finals.push(o),
                None => violations.push(Violation::UnknownName),
            }
        } else if ["SHARE", "REQUEST", "FINAL"].iter().any(|p| head.starts_with(p)) {
            violations.push(Violation::Malformed);
        }
    }
    if final_turn {
        match finals.as_slice() {
            [o] => t.final_choice = Some(*o),
            _ => violations.push(Violation::FinalCount),
        }
    } else if !finals.is_empty() {
        violations.push(Violation::FinalInDiscussion);
    }
    if truncated {
        violations.push(Violation::Truncated);
    }
    violations.sort_unstable();
    violations.dedup();
    t.violations = violations;
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cosir::table::tests::fixture;

    #[test]
    fn tags_are_read_against_the_table_and_violations_counted_by_kind() {
        let t = fixture();
        let text = "I know A's c2.\nSHARE(A, c2, 3)\n  SHARE( B , c2 , 0 )  \nREQUEST(agent_2, C, c3)\nREQUEST(A, c3)\nFINAL(A)";
        let tags = parse(text, &t, false, false, 4, 2);
        assert_eq!(tags.shares, vec![Share { cell: (0, 1), value: 3 }, Share { cell: (1, 1), value: 0 }]);
        assert_eq!(tags.requests, vec![Ask { to: Some(1), cell: (2, 2) }, Ask { to: None, cell: (0, 2) }]);
        assert_eq!((tags.final_choice, tags.violations.clone()), (None, vec![Violation::FinalInDiscussion]));
        // Unknown names, a value past K = 3, a broken line, too many tags, a bad seat.
        let bad = "SHARE(D, c1, 1)\nSHARE(A, c9, 1)\nSHARE(A, c1, 4)\nSHARE(A c1 1)\nREQUEST(agent_3, A, c1)\nSHARE(A, c1, 1)\nSHARE(A, c1, 1)";
        let tags = parse(bad, &t, false, false, 1, 2);
        assert_eq!(tags.shares.len(), 1);
        assert_eq!(tags.violations, vec![Violation::Malformed, Violation::UnknownName, Violation::TooManyTags]);
        // Final turns need exactly one FINAL.
        assert_eq!(parse("FINAL(B)", &t, true, false, 4, 2).final_choice, Some(1));
        assert_eq!(parse("FINAL(B)\nFINAL(A)", &t, true, false, 4, 2).violations, vec![Violation::FinalCount]);
        assert_eq!(parse("I pick B", &t, true, true, 4, 2).violations, vec![Violation::FinalCount, Violation::Truncated]);
        // Prose is never a tag, even when it spells one mid-line.
        assert_eq!(parse("we could SHARE(A, c2, 3) later", &t, false, false, 4, 2), Tags::default());
    }
}
