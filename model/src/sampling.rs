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

/// Samples one token per row of `logits` [B, V]. `suppress[b]` lists token ids row b may not
/// produce this step (stop tokens before `min_new_tokens`); `allow[b]`, when set, lists the
/// only ids row b may produce (a guided tail). `logprob` is what a learner recomputes: over the
/// whole vocabulary, or renormalised over the allowed set of a guided token; suppression only
/// shapes what is drawn (and `sampling_logprob`).
pub fn sample<R: rand::RngCore>(
    logits: &Tensor,
    params: &[&SamplingParams],
    rngs: &mut [R],
    suppress: &[&[i64]],
    allow: &[Option<&[i64]>],
) -> Vec<Sampled> {
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
    rows.extend(rngs.iter_mut().zip(&greedy).map(|(r, &g)| {
        if g || !any_drawn {
            0.0
        } else {
            r.gen::<f32>()
        }
    }));
    rows.extend(greedy.iter().map(|&g| if g { 1f32 } else { 0.0 }));
    let rows = Tensor::from_slice(&rows).view([3, b, 1]).to_device(device);
    let (temps, u, greedy_t) = (rows.get(0), rows.get(1), rows.get(2).squeeze_dim(-1).gt(0.5));
    // The learner's quantity, before suppression.
    let logp = (&logits / &temps).log_softmax(-1, Kind::Float);
    if suppress.iter().any(|s| !s.is_empty()) {
        let m = marks(b, v, device, |row| suppress[row]);
        logits = logits.masked_fill(&m, f64::NEG_INFINITY);
    }
    let scaled = logits / temps;
    let argmax = scaled.argmax(-1, false);

    // A row with top-k or top-p keeps the tokens at or above its cut and draws among them in
    // vocabulary order, like every other row; the cut is found without sorting the vocabulary.
    // The choice is per row, so a row's token does not depend on the rows beside it.
    let (tokens, sampling_lp) = if !any_drawn {
        (argmax, Tensor::zeros([b], (Kind::Float, device)))
    } else {
        let truncating =
            |p: &SamplingParams| (p.top_k > 0 && (p.top_k as i64) < v) || p.top_p < 1.0;
        let scaled = if params.iter().zip(&greedy).any(|(p, &g)| !g && truncating(p)) {
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
        let (tokens, slp) = draw_full(&scaled, &u);
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
        .map(|i| Sampled {
            token: host[i] as i64,
            logprob: host[n + i] as f32,
            sampling_logprob: host[2 * n + i] as f32,
        })
        .collect()
}

/// A [B, V] boolean mask on `device`, true at each id that `ids(row)` lists.
fn marks<'a>(b: i64, v: i64, device: Device, ids: impl Fn(usize) -> &'a [i64]) -> Tensor {
    let pairs = (0..b as usize).flat_map(|row| ids(row).iter().map(move |&id| (row as i64, id)));
    crate::mask::from_pairs(b, v, pairs, device)
}

/// Inverse-CDF draws over the whole (masked) vocabulary: tokens [B] and their log-probs [B].
fn draw_full(scaled: &Tensor, u: &Tensor) -> (Tensor, Tensor) {
    let v = scaled.size()[1];
    let final_lp = scaled.log_softmax(-1, Kind::Float);
    let cdf = final_lp.exp().cumsum(-1, Kind::Float);
    // The last token with any mass, in case rounding leaves the CDF below u.
    let positions = Tensor::arange(v, (Kind::Int64, scaled.device())).view([1, v]);
    let last =
        positions.masked_fill(&final_lp.isfinite().logical_not(), -1).amax([-1].as_slice(), false);
    let pick = cdf.lt_tensor(u).sum_dim_intlist(-1, false, Kind::Int64).minimum(&last);
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
mod tests {
    use super::*;

    fn logits(rows: &[&[f32]]) -> Tensor {
        let v = rows[0].len() as i64;
        let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        Tensor::from_slice(&flat).view([rows.len() as i64, v])
    }

    #[test]
    fn greedy_picks_argmax_with_full_logprob() {
        let p = SamplingParams::greedy(4);
        let out = sample(&logits(&[&[0.0, 2.0, 1.0]]), &[&p], &mut [p.rng()], &[&[]], &[None]);
        assert_eq!(out[0].token, 1);
        let z = (0f32.exp() + 2f32.exp() + 1f32.exp()).ln();
        assert!((out[0].logprob - (2.0 - z)).abs() < 1e-6);
        assert_eq!(out[0].sampling_logprob, 0.0);
    }

    #[test]
    fn suppression_blocks_tokens() {
        let p = SamplingParams::greedy(4);
        let out = sample(&logits(&[&[0.0, 2.0, 1.0]]), &[&p], &mut [p.rng()], &[&[1]], &[None]);
        assert_eq!(out[0].token, 2);
        // The recorded log-prob is over the whole vocabulary, as the learner computes it: the
        // suppressed token still counts in the normaliser.
        let z = (0f32.exp() + 2f32.exp() + 1f32.exp()).ln();
        assert!((out[0].logprob - (1.0 - z)).abs() < 1e-6, "{}", out[0].logprob);
    }

    #[test]
    fn top_k_one_is_greedy_and_top_p_restricts_support() {
        let row: &[f32] = &[3.0, 2.9, -5.0, -6.0];
        let p = SamplingParams { top_p: 0.5, seed: 7, ..Default::default() };
        let mut rng = p.rng();
        for _ in 0..50 {
            let s =
                sample(&logits(&[row]), &[&p], std::slice::from_mut(&mut rng), &[&[]], &[None])[0];
            // mass of token 0 alone is ~0.52 >= 0.5, so only token 0 survives
            assert_eq!(s.token, 0);
            assert!(s.sampling_logprob.abs() < 1e-6);
        }
        let p = SamplingParams { top_k: 2, seed: 3, ..Default::default() };
        let mut rng = p.rng();
        let mut seen = [0usize; 4];
        for _ in 0..200 {
            let s =
                sample(&logits(&[row]), &[&p], std::slice::from_mut(&mut rng), &[&[]], &[None])[0];
            seen[s.token as usize] += 1;
            // renormalised over two tokens
            let z = (3f32.exp() + 2.9f32.exp()).ln();
            let want = if s.token == 0 { 3.0 - z } else { 2.9 - z };
            assert!((s.sampling_logprob - want).abs() < 1e-5);
        }
        assert!(seen[0] > 60 && seen[1] > 60 && seen[2] == 0 && seen[3] == 0, "{seen:?}");
    }

    #[test]
    fn temperature_scales_logprob_and_frequencies_follow_distribution() {
        let row: &[f32] = &[1.0, 0.0];
        let p = SamplingParams { temperature: 0.5, seed: 11, ..Default::default() };
        let mut rng = p.rng();
        let n = 4000;
        let mut zeros = 0;
        for _ in 0..n {
            let s =
                sample(&logits(&[row]), &[&p], std::slice::from_mut(&mut rng), &[&[]], &[None])[0];
            let z = (2f32.exp() + 1.0).ln();
            let want = if s.token == 0 { 2.0 - z } else { -z };
            assert!((s.logprob - want).abs() < 1e-5);
            assert!((s.sampling_logprob - want).abs() < 1e-5);
            zeros += (s.token == 0) as usize;
        }
        let p0 = 2f64.exp() / (2f64.exp() + 1.0); // 0.8808
        let freq = zeros as f64 / n as f64;
        assert!((freq - p0).abs() < 0.02, "freq {freq} vs {p0}");
    }

    #[test]
    fn rows_are_independent_of_batch_company() {
        let a = SamplingParams { seed: 5, ..Default::default() };
        let b = SamplingParams { seed: 9, temperature: 0.7, top_p: 0.9, ..Default::default() };
        let row_a: &[f32] = &[0.1, 0.2, 0.3, 0.4, 0.5];
        let row_b: &[f32] = &[0.5, 0.1, 0.9, 0.0, 0.2];
        let mut alone = a.rng();
        let mut ra = a.rng();
        let mut rb = b.rng();
        for _ in 0..20 {
            let x =
                sample(&logits(&[row_a]), &[&a], std::slice::from_mut(&mut alone), &[&[]], &[None])
                    [0];
            let mut pair = [ra, rb];
            let y =
                sample(&logits(&[row_a, row_b]), &[&a, &b], &mut pair, &[&[], &[]], &[None, None]);
            [ra, rb] = pair;
            assert_eq!(x.token, y[0].token);
        }
    }

    #[test]
    fn an_allow_list_restricts_and_renormalises() {
        let row: &[f32] = &[0.5, 3.0, 1.0, 2.0];
        let p = SamplingParams { seed: 2, ..Default::default() };
        let mut rng = p.rng();
        let allowed: &[i64] = &[0, 2];
        let z = (0.5f32.exp() + 1f32.exp()).ln();
        let mut seen = [0usize; 4];
        for _ in 0..400 {
            let s = sample(
                &logits(&[row]),
                &[&p],
                std::slice::from_mut(&mut rng),
                &[&[]],
                &[Some(allowed)],
            )[0];
            seen[s.token as usize] += 1;
            let want = row[s.token as usize] - z;
            assert!((s.logprob - want).abs() < 1e-5 && (s.sampling_logprob - want).abs() < 1e-5);
        }
        assert!(seen[1] == 0 && seen[3] == 0 && seen[0] > 60 && seen[2] > 160, "{seen:?}");
        // A single allowed id is forced, with log-prob 0 under the restricted distribution.
        let s = sample(
            &logits(&[row]),
            &[&p],
            std::slice::from_mut(&mut rng),
            &[&[]],
            &[Some(&[3][..])],
        )[0];
        assert_eq!((s.token, s.logprob), (3, 0.0));
    }

    /// The cut as a full sort finds it: sorted descending, keep a token while the mass before it
    /// is below top_p of the top-k's mass; the cut is the last kept probability.
    fn sorted_cut(probs: &[f32], k: usize, top_p: Option<f64>) -> f32 {
        let mut s = probs.to_vec();
        s.sort_by(|a, b| b.total_cmp(a));
        s.truncate(k);
        let Some(top_p) = top_p else { return s[k - 1] };
        let target = top_p * s.iter().map(|&p| p as f64).sum::<f64>();
        let mut before = 0f64;
        let mut last = s[0];
        for &p in &s {
            if before >= target {
                break;
            }
            last = p;
            before += p as f64;
        }
        last
    }

    fn softmax_rows(rows: &Tensor, temperature: f64) -> Vec<Vec<f32>> {
        let probs = (rows / temperature).softmax(-1, Kind::Float);
        (0..rows.size()[0]).map(|i| Vec::<f32>::try_from(&probs.get(i)).unwrap()).collect()
    }

    #[test]
    fn the_selected_cut_equals_the_sorted_one() {
        tch::manual_seed(17);
        let v = 5000;
        // Peaked and flat rows, and a row of many exact ties (quantised logits).
        let mut rows = Vec::new();
        for t in [0.3, 0.5, 1.0, 2.0] {
            rows.extend(softmax_rows(
                &(Tensor::randn([6, v], (Kind::Float, Device::Cpu)) * 4.0),
                t,
            ));
        }
        rows.extend(softmax_rows(
            &(Tensor::randn([4, v], (Kind::Float, Device::Cpu)) * 2.0).round(),
            1.0,
        ));
        let mut scratch = Vec::new();
        for (i, row) in rows.iter().enumerate() {
            for (k, top_p) in [
                (v as usize, Some(0.95)),
                (v as usize, Some(0.5)),
                (v as usize, Some(0.999)),
                (40, None),
                (40, Some(0.9)),
                (1, Some(0.9)),
                (v as usize, Some(1e-6)),
            ] {
                let got = nucleus_cut(row, k, top_p, &mut scratch);
                assert_eq!(got, sorted_cut(row, k, top_p), "row {i}, k {k}, p {top_p:?}");
            }
        }
    }

    #[test]
    fn the_sorted_cuts_equal_the_selected_ones_per_row() {
        tch::manual_seed(3);
        let probs =
            (Tensor::randn([5, 300], (Kind::Float, Device::Cpu)) * 3.0).softmax(-1, Kind::Float);
        let ps = [
            SamplingParams { top_p: 0.9, ..Default::default() },
            SamplingParams { top_k: 7, ..Default::default() },
            SamplingParams { top_k: 50, top_p: 0.6, ..Default::default() },
            SamplingParams::default(),
            SamplingParams { top_p: 0.3, temperature: 0.0, ..Default::default() },
        ];
        let params: Vec<&SamplingParams> = ps.iter().collect();
        let greedy: Vec<bool> = ps.iter().map(SamplingParams::is_greedy).collect();
        let a =
            Vec::<f32>::try_from(&cuts_by_selection(&probs, &params, &greedy).view([-1])).unwrap();
        let b = Vec::<f32>::try_from(&cuts_by_sort(&probs, &params, &greedy).view([-1])).unwrap();
        for row in [0, 1, 2] {
            assert!((a[row] - b[row]).abs() <= 1e-7, "row {row}: {} vs {}", a[row], b[row]);
        }
        // Rows without a cut keep everything.
        let min = Vec::<f32>::try_from(&probs.amin([-1].as_slice(), false)).unwrap();
        assert_eq!(a[3], f32::NEG_INFINITY);
        assert_eq!(b[3], min[3]);
        assert_eq!(a[4], f32::NEG_INFINITY);
    }

    #[test]
    fn the_windowed_cuts_equal_the_sorted_ones() {
        tch::manual_seed(4);
        // Flat rows (temperature 3) put the nucleus far past a narrow first window.
        let probs =
            (Tensor::randn([6, 500], (Kind::Float, Device::Cpu)) * 0.3).softmax(-1, Kind::Float);
        let ps = [
            SamplingParams { top_p: 0.9, ..Default::default() },
            SamplingParams { top_k: 7, ..Default::default() },
            SamplingParams { top_k: 300, top_p: 0.6, ..Default::default() },
            SamplingParams::default(),
            SamplingParams { top_p: 0.3, temperature: 0.0, ..Default::default() },
            SamplingParams { top_p: 0.05, ..Default::default() },
        ];
        let params: Vec<&SamplingParams> = ps.iter().collect();
        let greedy: Vec<bool> = ps.iter().map(SamplingParams::is_greedy).collect();
        let sorted =
            Vec::<f32>::try_from(&cuts_by_sort(&probs, &params, &greedy).view([-1])).unwrap();
        for first in [2, 4, 64, 500] {
            let w = cuts_in_window(&probs, &params, &greedy, first);
            let w = Vec::<f32>::try_from(&w.view([-1])).unwrap();
            for row in [0, 1, 2, 5] {
                assert_eq!(w[row], sorted[row], "first window {first}, row {row}");
            }
            // Rows without a cut (none asked, or greedy) keep everything.
            assert_eq!((w[3], w[4]), (f32::NEG_INFINITY, f32::NEG_INFINITY), "first {first}");
        }
    }

    #[test]
    fn top_p_draws_follow_the_renormalised_nucleus() {
        // Probabilities 0.5, 0.25, 0.125, 0.125. top_p 0.7 keeps two (0.75 comes before the
        // third), 0.4 one, and 0.8 three plus the fourth, tied with the third.
        let probs = [0.5f32, 0.25, 0.125, 0.125];
        let row: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        for (top_p, kept) in [(0.7, 2usize), (0.8, 4), (0.4, 1)] {
            let p = SamplingParams { top_p, seed: 21, ..Default::default() };
            let mut rng = p.rng();
            let mut seen = [0usize; 4];
            let n = 2000;
            for _ in 0..n {
                let s = sample(
                    &logits(&[&row]),
                    &[&p],
                    std::slice::from_mut(&mut rng),
                    &[&[]],
                    &[None],
                )[0];
                seen[s.token as usize] += 1;
            }
            let mass: f32 = probs[..kept].iter().sum();
            for (t, &c) in seen.iter().enumerate() {
                let want = if t < kept { probs[t] / mass } else { 0.0 };
                assert!((c as f32 / n as f32 - want).abs() < 0.03, "top_p {top_p}: {seen:?}");
            }
        }
    }

    #[test]
    fn invalid_params_are_rejected() {
        assert!(SamplingParams { top_p: 0.0, ..Default::default() }.validate().is_err());
        assert!(SamplingParams { temperature: f64::NAN, ..Default::default() }.validate().is_err());
        assert!(SamplingParams { min_new_tokens: 5, max_new_tokens: 2, ..Default::default() }
            .validate()
            .is_err());
    }
}
