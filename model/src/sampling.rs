//! Token sampling for a batch of rows that may each use different settings. Every row has its
//! own seeded RNG and draws one uniform number per step, so a row's tokens do not depend on
//! which other rows share its batch.
use crate::error::{ModelError, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingParams {
    /// 0 means greedy decoding.
    pub temperature: f64,
    /// Keep only the k most likely tokens (and any tied with the k-th); 0 disables.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose mass reaches top_p (and any tied with
    /// the last of them); 1 disables.
    pub top_p: f64,
    pub seed: u64,
    pub max_new_tokens: usize,
    /// Stop tokens are suppressed until this many tokens have been generated.
    pub min_new_tokens: usize,
    pub stop_token_ids: Vec<i64>,
    pub stop_strings: Vec<String>,
    /// Guided tail (see `guide`): once the reply would stop, it must continue with text that
    /// matches this regex, e.g. `<score>[123]</score>`.
    pub guided_suffix: Option<String>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
            max_new_tokens: 256,
            min_new_tokens: 0,
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
            guided_suffix: None,
        }
    }
}

impl SamplingParams {
    pub fn greedy(max_new_tokens: usize) -> Self {
        Self { temperature: 0.0, max_new_tokens, ..Self::default() }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(ModelError::Input(format!("sampling: {m}")));
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad(format!("temperature must be >= 0 and finite, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if self.min_new_tokens > self.max_new_tokens {
            return bad(format!(
                "min_new_tokens ({}) exceeds max_new_tokens ({})",
                self.min_new_tokens, self.max_new_tokens
            ));
        }
        if self.stop_strings.iter().any(String::is_empty) {
            return bad("stop strings must not be empty".into());
        }
        if self.guided_suffix.as_deref() == Some("") {
            return bad("guided_suffix must not be empty".into());
        }
        if let Some(reserve) = self
            .guided_suffix
            .as_deref()
            .map(crate::guide::tail_reserve)
            .filter(|&r| self.max_new_tokens <= r)
        {
            return bad(format!(
                "a guided reply needs max_new_tokens above {reserve} (the tail's reserve), got {}",
                self.max_new_tokens
            ));
        }
        Ok(())
    }

    pub fn rng(&self) -> ChaCha8Rng {
        ChaCha8Rng::seed_from_u64(self.seed)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampled {
    pub token: i64,
    /// log p(token) under softmax(logits / T) over the whole vocabulary (T = 1 for greedy):
    /// the quantity a learner recomputes.
    pub logprob: f32,
    /// log p(token) under the distribution actually sampled from, after top-k/top-p
    /// renormalisation (0 for greedy, a point mass).
    pub sampling_logprob: f32,
}

/// A row of a sampling step that no token could be drawn for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undrawable {
    /// The row's logits hold NaN or infinity (a broken model), so its log-probabilities do too.
    NonFinite { row: usize },
    /// Every token of the row is blocked: the stop tokens it suppresses cover all it may produce
    /// (its guided tail's allow list, or the vocabulary).
    Blocked { row: usize },
}

impl Undrawable {
    /// The row of the batch `sample` was given.
    pub fn row(self) -> usize {
        match self {
            Undrawable::NonFinite { row } | Undrawable::Blocked { row } => row,
        }
    }

    /// The error for sequence `sequence` of that row, which had `generated` new tokens.
    pub fn error(self, sequence: u64, generated: usize) -> ModelError {
        let token = generated + 1;
        match self {
            Undrawable::NonFinite { .. } => ModelError::NonFiniteLogits { sequence, token },
            Undrawable::Blocked { .. } => ModelError::Input(format!(
                "sequence {sequence}: no token can be drawn at token {token}: the stop tokens it suppresses before min_new_tokens cover every token it may produce"
            )),
        }
    }
}

/// Samples one token per row of `logits` [B, V]. `suppress[b]` lists token ids row b may not
/// produce this step (stop tokens before `min_new_tokens`); `allow[b]`, when set, lists the
/// only ids row b may produce (a guided tail). `logprob` is what a learner recomputes: over the
/// whole vocabulary, or renormalised over the allowed set of a guided token; suppression only
/// shapes what is drawn (and `sampling_logprob`).
///
/// A row whose logits are not finite, or that has no token left to draw, fails the step: it is
/// found in what the step copies back anyway, so the check costs no extra synchronisation.
pub fn sample<R: rand::RngCore>(
    logits: &Tensor,
    params: &[&SamplingParams],
    rngs: &mut [R],
    suppress: &[&[i64]],
    allow: &[Option<&[i64]>],
) -> Result<Vec<Sampled>, Undrawable> {
    let (b, v) = (logits.size()[0], logits.size()[1]);
    assert_eq!(params.len() as i64, b, "one SamplingParams per row");
    assert_eq!(allow.len() as i64, b, "one allow list (or None) per row");
    let device = logits.device();
    let mut logits = logits.to_kind(Kind::Float);
    if allow.iter().any(Option::is_some) {
        // Blocked: every token of a row with an allow list, except the allowed ones.
        let allowed = marks(b, v, device, |row| allow[row].unwrap_or(&[]));
        let guided: Vec<bool> = allow.iter().map(Option::is_some).collect();
        let guided = Tensor::from_slice(&guided).view([b, 1]).to_device(device);
        logits = logits.masked_fill(&allowed.logical_not().logical_and(&guided), f64::NEG_INFINITY);
    }
    let greedy: Vec<bool> = params.iter().map(|p| p.is_greedy()).collect();
    let any_drawn = !greedy.iter().all(|&g| g);
    // Each row's temperature, uniform draw and greedy flag, in one copy to the device.
    let mut rows = Vec::with_capacity(3 * b as usize);
    rows.extend(
        params.iter().zip(&greedy).map(|(p, &g)| if g { 1.0 } else { p.temperature as f32 }),
    );
    // A draw is above 0, so it never lands on a leading token of no mass (see `draw_full`).
    rows.extend(rngs.iter_mut().zip(&greedy).map(|(r, &g)| {
        if g || !any_drawn {
            0.0
        } else {
            r.gen::<f32>().max(f32::from_bits(1))
        }
    }));
    rows.extend(greedy.iter().map(|&g| if g { 1f32 } else { 0.0 }));
    let rows = Tensor::from_slice(&rows).view([3, b, 1]).to_device(device);
    let (temps, u, greedy_t) = (rows.get(0), rows.get(1), rows.get(2).squeeze_dim(-1).gt(0.5));
    // Dividing by 1 changes no bit: where every row's temperature is 1 (greedy rows count as 1),
    // the two passes over [B, V] that would divide are skipped.
    let unit = params.iter().zip(&greedy).all(|(p, &g)| g || p.temperature == 1.0);
    let over_temps = |x: &Tensor| if unit { x.shallow_clone() } else { x / &temps };
    // The learner's quantity, before suppression.
    let logp = over_temps(&logits).log_softmax(-1, Kind::Float);
    let suppressing = suppress.iter().any(|s| !s.is_empty());
    if suppressing {
        let m = marks(b, v, device, |row| suppress[row]);
        logits = logits.masked_fill(&m, f64::NEG_INFINITY);
    }
    let scaled = over_temps(&logits);
    let argmax = scaled.argmax(-1, false);

    // A row with top-k or top-p keeps the tokens at or above its cut and draws among them in
    // vocabulary order, like every other row; the cut is found without sorting the vocabulary.
    // The choice is per row, so a row's token does not depend on the rows beside it.
    let (tokens, sampling_lp) = if !any_drawn {
        (argmax, Tensor::zeros([b], (Kind::Float, device)))
    } else {
        let truncating =
            |p: &SamplingParams| (p.top_k > 0 && (p.top_k as i64) < v) || p.top_p < 1.0;
        let truncated = params.iter().zip(&greedy).any(|(p, &g)| !g && truncating(p));
        let scaled = if truncated {
            let probs = scaled.softmax(-1, Kind::Float);
            let cuts = if device == Device::Cpu {
                cuts_by_selection(&probs, params, &greedy)
            } else {
                cuts_by_top(&probs, params, &greedy)
            };
            scaled.masked_fill(&probs.lt_tensor(&cuts), f64::NEG_INFINITY)
        } else {
            scaled
        };
        // Nothing suppressed or cut: the draw's log-softmax is the one above, same input.
        let same = (!suppressing && !truncated).then_some(&logp);
        let (tokens, slp) = draw_full(&scaled, &u, same);
        (argmax.where_self(&greedy_t, &tokens), slp.masked_fill(&greedy_t, 0.0))
    };
    let lp = logp.gather(-1, &tokens.unsqueeze(-1), false).squeeze_dim(-1);
    // One copy back per step: token ids are below 2^53 and f32 log-probs widen exactly.
    let packed = Tensor::stack(
        &[
            tokens.to_kind(Kind::Double),
            lp.to_kind(Kind::Double),
            sampling_lp.to_kind(Kind::Double),
        ],
        0,
    );
    let host = Vec::<f64>::try_from(&packed.to_device(Device::Cpu).contiguous().view([-1]))
        .expect("f64 vector");
    let n = b as usize;
    (0..n)
        .map(|i| {
            let (token, logprob, sampling_logprob) = (host[i], host[n + i], host[2 * n + i]);
            // A drawn or greedy token has a finite log-prob wherever the logits are finite: a
            // NaN or infinite logit makes every log-prob of its row NaN or -inf. The draw's
            // log-softmax is NaN also where every token was blocked (its token 0 then has -inf).
            let non_finite = Err(Undrawable::NonFinite { row: i });
            if logprob.is_nan() || logprob == f64::INFINITY || !(0.0..v as f64).contains(&token) {
                return non_finite;
            }
            if sampling_logprob.is_nan() {
                return Err(Undrawable::Blocked { row: i });
            }
            if logprob == f64::NEG_INFINITY {
                return non_finite;
            }
            Ok(Sampled {
                token: token as i64,
                logprob: logprob as f32,
                sampling_logprob: sampling_logprob as f32,
            })
        })
        .collect()
}

/// A [B, V] boolean mask on `device`, true at each id that `ids(row)` lists.
fn marks<'a>(b: i64, v: i64, device: Device, ids: impl Fn(usize) -> &'a [i64]) -> Tensor {
    let pairs = (0..b as usize).flat_map(|row| ids(row).iter().map(move |&id| (row as i64, id)));
    crate::mask::from_pairs(b, v, pairs, device)
}

/// Inverse-CDF draws over the whole (masked) vocabulary: tokens [B] and their log-probs [B].
/// `log_softmax` is `scaled`'s log-softmax where the caller has it already.
fn draw_full(scaled: &Tensor, u: &Tensor, log_softmax: Option<&Tensor>) -> (Tensor, Tensor) {
    let v = scaled.size()[1];
    let final_lp =
        log_softmax.map_or_else(|| scaled.log_softmax(-1, Kind::Float), Tensor::shallow_clone);
    let cdf = final_lp.exp().cumsum(-1, Kind::Float);
    // The last token with any mass, in case rounding leaves the CDF below u. A row with none
    // (non-finite logits, everything blocked) takes token 0, so the gather stays in range; its
    // NaN or -inf log-prob fails the step in `sample`.
    let positions = Tensor::arange(v, (Kind::Int64, scaled.device())).view([1, v]);
    let last =
        positions.masked_fill(&final_lp.isfinite().logical_not(), -1).amax([-1].as_slice(), false);
    let pick = cdf.lt_tensor(u).sum_dim_intlist(-1, false, Kind::Int64).minimum(&last).clamp_min(0);
    let lp = final_lp.gather(-1, &pick.unsqueeze(-1), false).squeeze_dim(-1);
    (pick, lp)
}

/// The k and p of a row's cut: k = V when it has no top-k, p = None when it has no top-p or
/// draws greedily (a greedy row's cut is never used).
fn cut_settings(p: &SamplingParams, greedy: bool, v: usize) -> (usize, Option<f64>) {
    if greedy {
        return (v, None);
    }
    let k = if p.top_k == 0 { v } else { p.top_k.min(v) };
    (k, (p.top_p < 1.0).then_some(p.top_p))
}

/// Each row's cut [B, 1] on CPU, by selection instead of a sort (see `nucleus_cut`).
fn cuts_by_selection(probs: &Tensor, params: &[&SamplingParams], greedy: &[bool]) -> Tensor {
    let v = probs.size()[1] as usize;
    let flat = Vec::<f32>::try_from(&probs.contiguous().view([-1])).expect("f32 probabilities");
    let mut scratch = Vec::with_capacity(v);
    let cuts: Vec<f32> = flat
        .chunks(v)
        .zip(params.iter().zip(greedy))
        .map(|(row, (p, &g))| {
            let (k, top_p) = cut_settings(p, g, v);
            nucleus_cut(row, k, top_p, &mut scratch)
        })
        .collect();
    Tensor::from_slice(&cuts).view([params.len() as i64, 1])
}

/// The first window of `cuts_by_top`: wide enough for most nuclei of a trained model's
/// distribution at the usual temperatures and top-p.
const TOP_WINDOW: i64 = 1024;

/// Each row's cut [B, 1] on an accelerator, where copying the probabilities out is slow and a
/// sort of the whole vocabulary is wasted work: the cut is looked for among each row's
/// largest probabilities (a top-k of a window's width), and only when some row's nucleus does
/// not close inside the window does the window grow (×8, up to the vocabulary). Equal to
/// `cuts_by_sort` up to the rounding of the mass the top-p share is taken of.
fn cuts_by_top(probs: &Tensor, params: &[&SamplingParams], greedy: &[bool]) -> Tensor {
    cuts_in_window(probs, params, greedy, TOP_WINDOW)
}

fn cuts_in_window(
    probs: &Tensor,
    params: &[&SamplingParams],
    greedy: &[bool],
    first: i64,
) -> Tensor {
    let (b, v) = (probs.size()[0], probs.size()[1]);
    let device = probs.device();
    let settings: Vec<(usize, Option<f64>)> =
        params.iter().zip(greedy).map(|(p, &g)| cut_settings(p, g, v as usize)).collect();
    // A row's k, and its share p (2 for none: no mass reaches it, so the row keeps its k).
    let mut host: Vec<f32> = settings.iter().map(|&(k, _)| k as f32).collect();
    host.extend(settings.iter().map(|&(_, p)| p.map_or(2.0, |p| p as f32)));
    let host = Tensor::from_slice(&host).view([2, b, 1]).to_device(device);
    let (ks, ps) = (host.get(0).to_kind(Kind::Int64), host.get(1));
    let free = ks.ge(v).logical_and(&ps.gt(1.0));
    let largest_k = settings.iter().map(|&(k, _)| k as i64).filter(|&k| k < v).max().unwrap_or(0);
    let mut width = first.max(largest_k).min(v);
    // The mass each row's share is taken of: its top-k tokens', or the whole row's.
    let whole = probs.sum_dim_intlist(-1, true, Kind::Float);
    loop {
        let (top, _) = probs.topk(width, -1, true, true);
        let ranks = Tensor::arange(width, (Kind::Int64, device)).view([1, width]);
        let in_k = ranks.lt_tensor(&ks);
        let top_k = top.masked_fill(&in_k.logical_not(), 0.0);
        let mass = top_k.sum_dim_intlist(-1, true, Kind::Float).where_self(&ks.lt(v), &whole);
        let before = top_k.cumsum(-1, Kind::Float) - &top_k;
        let kept = before
            .lt_tensor(&(mass * &ps))
            .logical_and(&in_k)
            .sum_dim_intlist(-1, true, Kind::Int64)
            .clamp_min(1);
        // The window holds a row's cut when the row's nucleus closed inside it or its top-k
        // fits in it; a row without a cut keeps everything wherever the window ends.
        let found = kept.lt(width).logical_or(&ks.le(width)).logical_or(&free);
        if width == v || found.all().int64_value(&[]) != 0 {
            return top.gather(-1, &(kept - 1), false).masked_fill(&free, f64::NEG_INFINITY);
        }
        width = (width * 8).min(v);
    }
}

/// Each row's cut [B, 1] from the sorted distribution: the definition `cuts_by_top` and
/// `cuts_by_selection` are tested against. Equal to `cuts_by_selection` up to rounding.
#[cfg(test)]
fn cuts_by_sort(probs: &Tensor, params: &[&SamplingParams], greedy: &[bool]) -> Tensor {
    let (b, v) = (probs.size()[0], probs.size()[1]);
    let device = probs.device();
    let settings: Vec<(usize, Option<f64>)> =
        params.iter().zip(greedy).map(|(p, &g)| cut_settings(p, g, v as usize)).collect();
    let (sorted, _) = probs.sort(-1, true);
    let ranks = Tensor::arange(v, (Kind::Int64, device)).view([1, v]);
    let ks = Tensor::from_slice(&settings.iter().map(|&(k, _)| k as i64).collect::<Vec<_>>())
        .view([b, 1])
        .to_device(device);
    let in_k = ranks.lt_tensor(&ks);
    let sorted_k = sorted.masked_fill(&in_k.logical_not(), 0.0);
    // Rows without top-p get a share no mass can reach, so they keep their k tokens.
    let ps = Tensor::from_slice(
        &settings.iter().map(|&(_, p)| p.map_or(2.0, |p| p as f32)).collect::<Vec<_>>(),
    )
    .view([b, 1])
    .to_device(device);
    let target = sorted_k.sum_dim_intlist(-1, true, Kind::Float) * ps;
    let before = sorted_k.cumsum(-1, Kind::Float) - &sorted_k;
    let kept = before
        .lt_tensor(&target)
        .logical_and(&in_k)
        .sum_dim_intlist(-1, true, Kind::Int64)
        .clamp_min(1);
    sorted.gather(-1, &(kept - 1), false)
}

/// The smallest probability a row keeps: its top-k tokens (k = V for none), then among them the
/// smallest set of most likely tokens whose mass reaches `top_p` of theirs. Every token at or
/// above the cut is kept (so ties at the cut all are). Linear in V: only tokens of probability
/// at least (1 − top_p)·mass / V can be in the set, since all below it hold less than the
/// (1 − top_p) share left out; the rest is found by quickselect on that small set.
fn nucleus_cut(probs: &[f32], k: usize, top_p: Option<f64>, scratch: &mut Vec<f32>) -> f32 {
    let v = probs.len();
    let floor = if k < v {
        scratch.clear();
        scratch.extend_from_slice(probs);
        let (_, kth, _) = scratch.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
        *kth
    } else {
        f32::NEG_INFINITY
    };
    let Some(top_p) = top_p else { return floor };
    let mass: f64 = probs.iter().filter(|&&p| p >= floor).map(|&p| p as f64).sum();
    let target = top_p * mass;
    let least = (((mass - target) / v as f64) as f32).max(floor);
    scratch.clear();
    scratch.extend(probs.iter().copied().filter(|&p| p >= least));
    if scratch.is_empty() {
        // Only with non-finite probabilities; the draw then keeps what the floor keeps.
        return floor;
    }
    let mut c = &mut scratch[..];
    // Mass of the tokens known to rank above every token still in `c`; always below target.
    let mut above = 0f64;
    loop {
        let n = c.len();
        let pivot = median3(c[0], c[n / 2], c[n - 1]);
        let (greater, equal) = partition3(c, pivot);
        let mass_greater: f64 = c[..greater].iter().map(|&p| p as f64).sum();
        if above + mass_greater >= target {
            c = &mut c[..greater];
            continue;
        }
        // The pivot's ties follow less than the target, so they are kept.
        above += mass_greater + pivot as f64 * equal as f64;
        if above >= target || greater + equal == n {
            return pivot;
        }
        c = &mut c[greater + equal..];
    }
}

fn median3(a: f32, b: f32, c: f32) -> f32 {
    a.max(b).min(a.min(b).max(c))
}

/// Reorders `c` into [greater than pivot | equal | less] and returns the first two counts.
fn partition3(c: &mut [f32], pivot: f32) -> (usize, usize) {
    let (mut lt, mut i, mut gt) = (0, 0, c.len());
    while i < gt {
        if c[i] > pivot {
            c.swap(lt, i);
            lt += 1;
            i += 1;
        } else if c[i] < pivot {
            gt -= 1;
            c.swap(i, gt);
        } else {
            i += 1;
        }
    }
    (lt, gt - lt)
}

#[cfg(test)]
mod tests;
