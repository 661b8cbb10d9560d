use super::*;

fn logits(rows: &[&[f32]]) -> Tensor {
    let v = rows[0].len() as i64;
    let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    Tensor::from_slice(&flat).view([rows.len() as i64, v])
}

#[test]
fn greedy_picks_argmax_with_full_logprob() {
    let p = SamplingParams::greedy(4);
    let out = sample(&logits(&[&[0.0, 2.0, 1.0]]), &[&p], &mut [p.rng()], &[&[]], &[None]).unwrap();
    assert_eq!(out[0].token, 1);
    let z = (0f32.exp() + 2f32.exp() + 1f32.exp()).ln();
    assert!((out[0].logprob - (2.0 - z)).abs() < 1e-6);
    assert_eq!(out[0].sampling_logprob, 0.0);
}

#[test]
fn suppression_blocks_tokens() {
    let p = SamplingParams::greedy(4);
    let out =
        sample(&logits(&[&[0.0, 2.0, 1.0]]), &[&p], &mut [p.rng()], &[&[1]], &[None]).unwrap();
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
        let s = sample(&logits(&[row]), &[&p], std::slice::from_mut(&mut rng), &[&[]], &[None])
            .unwrap()[0];
        // mass of token 0 alone is ~0.52 >= 0.5, so only token 0 survives
        assert_eq!(s.token, 0);
        assert!(s.sampling_logprob.abs() < 1e-6);
    }
    let p = SamplingParams { top_k: 2, seed: 3, ..Default::default() };
    let mut rng = p.rng();
    let mut seen = [0usize; 4];
    for _ in 0..200 {
        let s = sample(&logits(&[row]), &[&p], std::slice::from_mut(&mut rng), &[&[]], &[None])
            .unwrap()[0];
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
        let s = sample(&logits(&[row]), &[&p], std::slice::from_mut(&mut rng), &[&[]], &[None])
            .unwrap()[0];
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
        let x = sample(&logits(&[row_a]), &[&a], std::slice::from_mut(&mut alone), &[&[]], &[None])
            .unwrap()[0];
        let mut pair = [ra, rb];
        let y = sample(&logits(&[row_a, row_b]), &[&a, &b], &mut pair, &[&[], &[]], &[None, None])
            .unwrap();
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
        )
        .unwrap()[0];
        seen[s.token as usize] += 1;
        let want = row[s.token as usize] - z;
        assert!((s.logprob - want).abs() < 1e-5 && (s.sampling_logprob - want).abs() < 1e-5);
    }
    assert!(seen[1] == 0 && seen[3] == 0 && seen[0] > 60 && seen[2] > 160, "{seen:?}");
    // A single allowed id is forced, with log-prob 0 under the restricted distribution.
    let s =
        sample(&logits(&[row]), &[&p], std::slice::from_mut(&mut rng), &[&[]], &[Some(&[3][..])])
            .unwrap()[0];
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
        rows.extend(softmax_rows(&(Tensor::randn([6, v], (Kind::Float, Device::Cpu)) * 4.0), t));
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
    let a = Vec::<f32>::try_from(&cuts_by_selection(&probs, &params, &greedy).view([-1])).unwrap();
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
    let sorted = Vec::<f32>::try_from(&cuts_by_sort(&probs, &params, &greedy).view([-1])).unwrap();
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
            let s =
                sample(&logits(&[&row]), &[&p], std::slice::from_mut(&mut rng), &[&[]], &[None])
                    .unwrap()[0];
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

#[test]
fn non_finite_logits_fail_the_step_instead_of_panicking() {
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    let broken: [&[f32]; 4] =
        [&[nan, nan, nan, nan], &[1.0, nan, 2.0, 0.0], &[1.0, inf, 0.0, 0.0], &[-inf; 4]];
    let fine: &[f32] = &[0.5, 3.0, 1.0, 2.0];
    let settings = [
        SamplingParams::greedy(4),
        SamplingParams { seed: 1, ..Default::default() },
        SamplingParams { seed: 2, temperature: 0.7, ..Default::default() },
        SamplingParams { seed: 3, top_p: 0.9, ..Default::default() },
        SamplingParams { seed: 4, top_k: 2, ..Default::default() },
    ];
    for p in &settings {
        for row in broken {
            // Alone, and behind a healthy row: the broken row is named.
            let got = sample(&logits(&[row]), &[p], &mut [p.rng()], &[&[]], &[None]);
            assert_eq!(got, Err(Undrawable::NonFinite { row: 0 }), "{row:?} with {p:?}");
            let got = sample(
                &logits(&[fine, row]),
                &[p, p],
                &mut [p.rng(), p.rng()],
                &[&[], &[]],
                &[None, None],
            );
            assert_eq!(got, Err(Undrawable::NonFinite { row: 1 }), "{row:?} with {p:?}");
            // A guided row too.
            let got = sample(&logits(&[row]), &[p], &mut [p.rng()], &[&[]], &[Some(&[1, 2][..])]);
            assert_eq!(got, Err(Undrawable::NonFinite { row: 0 }), "{row:?} with {p:?}, guided");
        }
    }
    let e = Undrawable::NonFinite { row: 1 }.error(7, 2).to_string();
    assert!(e.contains("logits are not finite") && e.contains("token 3 of sequence 7"), "{e}");
}

#[test]
fn a_row_with_every_token_blocked_fails_the_step() {
    let p = SamplingParams { seed: 5, ..Default::default() };
    let row: &[f32] = &[0.5, 3.0, 1.0];
    let got = sample(&logits(&[row]), &[&p], &mut [p.rng()], &[&[0, 1, 2]], &[None]);
    assert_eq!(got, Err(Undrawable::Blocked { row: 0 }));
    let got = sample(&logits(&[row]), &[&p], &mut [p.rng()], &[&[1]], &[Some(&[1][..])]);
    assert_eq!(got, Err(Undrawable::Blocked { row: 0 }));
    let e = Undrawable::Blocked { row: 0 }.error(4, 0).to_string();
    assert!(e.contains("sequence 4") && e.contains("no token can be drawn at token 1"), "{e}");
}
