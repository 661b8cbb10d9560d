//! Guided decoding of a reply's tail with llguidance. A guided row first writes freely; when it
//! would stop (a stop token, a stop string, or its free budget) it must continue with text that
//! matches the guide's regex, e.g. `<score>[123]</score>`: tokens the regex forces are taken as
//! they are, and where it leaves a choice the row samples among the allowed tokens only. Each
//! such token records the allowed set, so a learner can renormalise its log-prob over the same
//! set (a forced token's set is itself, log-prob 0, no gradient).
use crate::error::{ModelError, Result};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Tokens kept free of the tail budget: a guided reply stops writing freely this many tokens
/// before `max_new_tokens`, so the guided tail fits.
pub const TAIL_RESERVE: usize = 16;
/// The tokens a guided reply keeps for its tail: [`TAIL_RESERVE`], or for a tail that is a fixed
/// text (a regex with no choice in it) as many as the text has bytes, since a token covers at
/// least one byte; so a fixed tail longer than the reserve is never cut by `max_new_tokens`.
pub fn tail_reserve(regex: &str) -> usize {
    let literal = regex_syntax::Parser::new().parse(regex).ok().and_then(|hir| match hir.kind() {
        regex_syntax::hir::HirKind::Literal(l) => Some(l.0.len()),
        _ => None,
    });
    literal.map_or(TAIL_RESERVE, |n| n.max(TAIL_RESERVE))
}

/// A guide that leaves more choices than this at one position is refused: guides are for
/// narrow tails, and each choice set travels with the turn to the learner.
pub const MAX_ALLOWED: usize = 1024;

/// One completion position whose token was drawn from a restricted set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Constrained {
    /// Index into the completion's tokens.
    pub position: usize,
    /// The token ids that were allowed there, ascending; one id means the token was forced.
    pub allowed: Vec<i64>,
}

/// The tokenizer as llguidance sees it: a trie of token bytes plus a way to tokenize text.
struct Env {
    trie: TokTrie,
    tokenizer: tokenizers::Tokenizer,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        let text = String::from_utf8_lossy(s);
        self.tokenizer
            .encode(text.as_ref(), false)
            .map(|e| e.get_ids().to_vec())
            .unwrap_or_default()
    }
}

/// Compiled guides of one tokenizer. Building the token trie takes a moment, so a tokenizer
/// builds this once, on first use.
pub struct Guidance {
    factory: ParserFactory,
    /// Compiled matchers by regex; each row gets a deep copy.
    compiled: Mutex<HashMap<String, Matcher>>,
}

impl Guidance {
    pub fn new(tokenizer: &tokenizers::Tokenizer, eos: Option<i64>) -> Result<Self> {
        let bad = |m: String| ModelError::Tokenizer(format!("guided decoding: {m}"));
        let json: serde_json::Value =
            serde_json::from_str(&tokenizer.to_string(false).map_err(|e| bad(e.to_string()))?)
                .map_err(|e| bad(e.to_string()))?;
        let words = llguidance::token_bytes_from_tokenizer_json(&json)
            .map_err(|e| bad(format!("reading token bytes: {e}")))?;
        let eos = eos.and_then(|e| u32::try_from(e).ok()).unwrap_or(0);
        let info = TokRxInfo::new(words.len() as u32, eos);
        let env = Env { trie: TokTrie::from(&info, &words), tokenizer: tokenizer.clone() };
        let env: llguidance::toktrie::TokEnv = Arc::new(env);
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| bad(e.to_string()))?;
        factory.quiet();
        Ok(Self { factory, compiled: Mutex::new(HashMap::new()) })
    }

    /// The bytes token `id` stands for (a special token: its text); empty for an id outside
    /// the vocabulary.
    pub fn token_bytes(&self, id: i64) -> Vec<u8> {
        let Ok(t) = u32::try_from(id) else { return Vec::new() };
        match self.factory.tok_env().tok_trie().token(t) {
            [TokTrie::SPECIAL_TOKEN_MARKER, text @ ..] => text.to_vec(),
            bytes => bytes.to_vec(),
        }
    }

    /// A fresh guide for one reply.
    pub fn start(&self, regex: &str) -> Result<Guide> {
        let mut compiled = self.compiled.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = compiled.get(regex) {
            return Ok(Guide { matcher: m.deep_clone(), regex: regex.to_string() });
        }
        let parser = self.factory.create_parser(TopLevelGrammar::from_regex(regex));
        let matcher = Matcher::new(parser);
        if let Some(e) = matcher.get_error() {
            return Err(ModelError::Input(format!(
                "guided suffix `{regex}` does not compile: {e}"
            )));
        }
        compiled.insert(regex.to_string(), matcher.deep_clone());
        Ok(Guide { matcher, regex: regex.to_string() })
    }
}

/// What the guide allows at the next position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allowed {
    /// These tokens (ascending); one means the token is forced.
    Tokens(Vec<i64>),
    /// The tail is complete.
    Done,
}

/// The state of one guided tail.
pub struct Guide {
    matcher: Matcher,
    regex: String,
}

impl Guide {
    fn failed(&self, what: &str, e: impl std::fmt::Display) -> ModelError {
        ModelError::Input(format!("guided suffix `{}`: {what}: {e}", self.regex))
    }

    /// The tokens allowed next, or `Done` once the regex is matched in full.
    pub fn allowed(&mut self) -> Result<Allowed> {
        if self.matcher.is_stopped() {
            return match self.matcher.get_error() {
                Some(e) => Err(self.failed("stopped", e)),
                None => Ok(Allowed::Done),
            };
        }
        let forced = self.matcher.compute_ff_tokens();
        if let Some(&t) = forced.first() {
            return Ok(Allowed::Tokens(vec![i64::from(t)]));
        }
        let mask =
            self.matcher.compute_mask().map_err(|e| self.failed("computing the token mask", e))?;
        let eos = self.matcher.tok_env().map(|env| env.tok_trie().eos_token()).ok();
        let mut ids = Vec::new();
        mask.iter_set_entries(|i| {
            if Some(i as TokenId) != eos {
                ids.push(i as i64)
            }
        });
        if ids.is_empty() {
            // Only the end is allowed: the regex is matched.
            return Ok(Allowed::Done);
        }
        if ids.len() > MAX_ALLOWED {
            return Err(ModelError::Input(format!(
                "guided suffix `{}` allows {} tokens at one position (at most {MAX_ALLOWED}); guide only a narrow tail",
                self.regex,
                ids.len()
            )));
        }
        Ok(Allowed::Tokens(ids))
    }

    pub fn commit(&mut self, token: i64) -> Result<()> {
        let t = u32::try_from(token).map_err(|e| self.failed("token id", e))?;
        self.matcher
            .consume_token(t)
            .map_err(|e| self.failed(&format!("token {token} was not allowed"), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> tokenizers::Tokenizer {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/tokenizers/chatml/tokenizer.json");
        tokenizers::Tokenizer::from_file(path).unwrap()
    }

    #[test]
    fn only_a_fixed_tail_longer_than_the_reserve_widens_it() {
        assert_eq!(tail_reserve("<score>[123]</score>"), TAIL_RESERVE);
        assert_eq!(tail_reserve("ok"), TAIL_RESERVE);
        assert_eq!(tail_reserve(r"```python\nwhile 1:0\n```"), 23);
        assert_eq!(tail_reserve("(unclosed"), TAIL_RESERVE);
    }

    #[test]
    fn a_token_stands_for_its_bytes_and_a_special_token_for_its_text() {
        let tok = tokenizer();
        let g = Guidance::new(&tok, None).unwrap();
        let end = tok.token_to_id("<|im_end|>").unwrap();
        assert_eq!(g.token_bytes(end.into()), b"<|im_end|>");
        let ids = tok.encode(" caf\u{e9}", false).unwrap().get_ids().to_vec();
        let joined: Vec<u8> = ids.iter().flat_map(|&i| g.token_bytes(i.into())).collect();
        assert_eq!(joined, " caf\u{e9}".as_bytes());
        assert_eq!(g.token_bytes(-1), b"");
        assert_eq!(g.token_bytes(1 << 30), b"");
    }

    #[test]
    fn a_score_tail_forces_the_tags_and_leaves_the_digit_open() {
        let tok = tokenizer();
        let g = Guidance::new(&tok, tok.token_to_id("<|im_end|>").map(i64::from)).unwrap();
        let mut guide = g.start("<score>[123]</score>").unwrap();
        let mut text = String::new();
        let mut choices = Vec::new();
        loop {
            match guide.allowed().unwrap() {
                Allowed::Done => break,
                Allowed::Tokens(ids) => {
                    // Take the largest id, so the walk is deterministic and not always the first.
                    let pick = *ids.last().unwrap();
                    if ids.len() > 1 {
                        choices.push(
                            ids.iter()
                                .map(|&i| tok.decode(&[i as u32], false).unwrap())
                                .collect::<Vec<_>>(),
                        );
                    }
                    guide.commit(pick).unwrap();
                    text.push_str(&tok.decode(&[pick as u32], false).unwrap());
                }
            }
            assert!(text.len() < 64, "runaway guide: {text}");
        }
        assert!(regex_lite_match(&text), "{text}");
        assert_eq!(choices.len(), 1, "only the digit is a choice: {choices:?}");
        let mut digits = choices[0].clone();
        digits.retain(|d| d.len() == 1);
        digits.sort();
        assert_eq!(digits, ["1", "2", "3"]);
        assert!(g.start("<score>[").is_err(), "a bad regex is an input error");
        assert!(guide.commit(5).is_err(), "nothing is allowed after the end");
    }

    fn regex_lite_match(s: &str) -> bool {
        s.len() == 16
            && s.starts_with("<score>")
            && s.ends_with("</score>")
            && matches!(&s[7..8], "1" | "2" | "3")
    }
}
