//! One row's sampled token: it extends the completion, stops it (a stop token or string, the
//! length limit), or starts and walks the row's guided tail.
use super::{Completion, FinishReason, Row, RowState, Tail};
use crate::error::Result;
use crate::guide::{Allowed, Constrained};
use crate::sampling;
use crate::tokenizer::Tokenizer;
use tch::Tensor;

/// Token window decoded to look for stop strings: enough tokens to cover the longest stop
/// string (each token decodes to at least one byte) plus a few for split characters.
fn find_stop_string(tok: &Tokenizer, ids: &[i64], stops: &[String]) -> Result<Option<String>> {
    let window = stops.iter().map(String::len).max().unwrap_or(0) + 4;
    let text = tok.decode(&ids[ids.len().saturating_sub(window)..], false)?;
    Ok(stops.iter().find(|s| text.contains(s.as_str())).cloned())
}

fn push(out: &mut Completion, s: sampling::Sampled) {
    out.token_ids.push(s.token);
    out.logprobs.push(s.logprob);
    out.sampling_logprobs.push(s.sampling_logprob);
}

fn length_or_running(row: &Row) -> RowState {
    if row.out.token_ids.len() >= row.params.max_new_tokens {
        RowState::Finished(FinishReason::Length)
    } else {
        RowState::Running
    }
}

/// Stop token or stop string (once `min_new_tokens` are out), else length.
fn would_stop(tokenizer: Option<&Tokenizer>, row: &mut Row, token: i64) -> Result<bool> {
    let (c, p) = (&mut row.out, &row.params);
    if c.token_ids.len() < p.min_new_tokens {
        return Ok(false);
    }
    if p.stop_token_ids.contains(&token) {
        return Ok(true);
    }
    if let (false, Some(tok)) = (p.stop_strings.is_empty(), tokenizer) {
        if let Some(hit) = find_stop_string(tok, &c.token_ids, &p.stop_strings)? {
            c.stop_string = Some(hit);
            return Ok(true);
        }
    }
    Ok(false)
}

pub(super) fn row_unguided(
    tokenizer: Option<&Tokenizer>,
    row: &mut Row,
    s: sampling::Sampled,
) -> Result<RowState> {
    push(&mut row.out, s);
    if would_stop(tokenizer, row, s.token)? {
        return Ok(RowState::Finished(FinishReason::Stop));
    }
    Ok(length_or_running(row))
}

/// A guided row writing freely: when it would stop, or its free budget is spent, the tail
/// starts. A stop token is not kept: the tail's first token is drawn in its place, from the
/// same logits, among what the guide allows.
pub(super) fn row_free(
    tokenizer: Option<&Tokenizer>,
    row: &mut Row,
    s: sampling::Sampled,
    logits: &Tensor,
    b: usize,
) -> Result<RowState> {
    push(&mut row.out, s);
    let stop_token = row.out.token_ids.len() >= row.params.min_new_tokens
        && row.params.stop_token_ids.contains(&s.token);
    let stopped = would_stop(tokenizer, row, s.token)?;
    let budget_spent = row.out.token_ids.len() + row.tail_reserve >= row.params.max_new_tokens;
    if !stopped && !budget_spent {
        return Ok(RowState::Running);
    }
    row.out.stop_string = None;
    let Tail::Free(regex) = &row.tail else { unreachable!("row_free on a free row") };
    let tok = tokenizer.expect("checked in add: a guided row has a tokenizer");
    let mut guide = tok.guidance()?.start(regex)?;
    let next = match guide.allowed()? {
        Allowed::Done => return Ok(RowState::Finished(FinishReason::Stop)),
        Allowed::Tokens(ids) => ids,
    };
    if stop_token {
        row.out.token_ids.pop();
        row.out.logprobs.pop();
        row.out.sampling_logprobs.pop();
        let redraw = sampling::sample(
            &logits.narrow(0, b as i64, 1),
            &[&row.params],
            std::slice::from_mut(&mut row.rng),
            &[&[]],
            &[Some(&next)],
        )
        .map_err(|e| e.error(row.id, row.out.token_ids.len()))?[0];
        row.tail = Tail::Guided { guide, next };
        return row_guided(row, redraw);
    }
    row.tail = Tail::Guided { guide, next };
    Ok(length_or_running(row))
}

/// A row in its guided tail: the token was drawn from `next`; record that set, advance the guide.
pub(super) fn row_guided(row: &mut Row, s: sampling::Sampled) -> Result<RowState> {
    let Tail::Guided { guide, next } = &mut row.tail else {
        unreachable!("row_guided on a guided row")
    };
    row.out
        .constrained
        .push(Constrained { position: row.out.token_ids.len(), allowed: std::mem::take(next) });
    push(&mut row.out, s);
    guide.commit(s.token)?;
    match guide.allowed()? {
        Allowed::Done => Ok(RowState::Finished(FinishReason::Stop)),
        Allowed::Tokens(ids) => {
            *next = ids;
            Ok(length_or_running(row))
        }
    }
}
