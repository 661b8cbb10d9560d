//! The products of one decode step on SmolLM2's shapes (q/o 576×576, k/v 192×576, gate/up
//! 1536×576, down 576×1536, the tied head 49152×576; random weights), at 1 to 64 rows: aten's
//! `linear` against the few-row f32 kernel on its packed weights, and in bf16 against oneDNN's packed inner product.
//! Prints ms per pass over the five shapes and the weight bytes read per second.
//!
//!   cargo bench -p comas-model --bench linears                        # f32
//!   COMAS_BENCH_DTYPE=bfloat16 cargo bench -p comas-model --bench linears
//! Knobs: COMAS_BENCH_THREADS (2), COMAS_BENCH_REPEATS (30 passes, best of 3).
comas_model::process_setup!();

mod common;
use common::env_or;

use comas_model::{onednn, rows_linear};
use std::time::Instant;
use tch::{Device, Kind, Tensor};

const SHAPES: [(i64, i64); 5] = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)];

fn main() {
    tch::set_num_threads(env_or("COMAS_BENCH_THREADS", 2));
    let repeats: usize = env_or("COMAS_BENCH_REPEATS", 30);
    let dtype = std::env::var("COMAS_BENCH_DTYPE").unwrap_or_else(|_| "float32".into());
    let kind = comas_model::dtype::parse_kind(&dtype).expect("COMAS_BENCH_DTYPE");
    let _g = tch::no_grad_guard();
    let ws: Vec<Tensor> = SHAPES
        .iter()
        .map(|&(o, i)| (Tensor::randn([o, i], (Kind::Float, Device::Cpu)) * 0.05).to_kind(kind))
        .collect();
    let bytes: i64 = SHAPES.iter().map(|&(o, i)| o * i * kind.elt_size_in_bytes() as i64).sum();
    // The fast path of this dtype: the few-row kernel in f32, and in bf16 where the CPU has
    // AVX512-BF16 (else oneDNN's packed weights; COMAS_BENCH_ONEDNN=1 picks them anyway).
    let onednn_bf16 = kind == Kind::BFloat16
        && (!rows_linear::bf16_available() || std::env::var("COMAS_BENCH_ONEDNN").is_ok());
    let (fast_name, packed): (&str, Vec<Tensor>) = match kind {
        Kind::Float | Kind::BFloat16 if !onednn_bf16 => {
            ("few-row packed", ws.iter().map(|w| rows_linear::pack(w).expect("pack")).collect())
        }
        Kind::BFloat16 => {
            ("oneDNN packed", ws.iter().map(|w| onednn::pack(w).expect("pack")).collect())
        }
        other => panic!("COMAS_BENCH_DTYPE: float32 or bfloat16, not {other:?}"),
    };
    println!("linears benchmark: SmolLM2's decode products, {dtype}, {} threads, {:.1} MB of weights per pass", tch::get_num_threads(), bytes as f64 / 1e6);
    println!(
        "{:>5} {:>14} {:>14} {:>18} {:>18} {:>8}",
        "rows",
        "aten ms",
        "aten GB/s",
        format!("{fast_name} ms"),
        format!("{fast_name} GB/s"),
        "ratio"
    );
    for rows in [1i64, 2, 4, 8, 16, 32, 64] {
        let xs: Vec<Tensor> = SHAPES
            .iter()
            .map(|&(_, i)| Tensor::randn([rows, i], (Kind::Float, Device::Cpu)).to_kind(kind))
            .collect();
        let time = |fast: bool| {
            (0..3)
                .map(|_| {
                    let t = Instant::now();
                    for _ in 0..repeats {
                        for (n, (w, x)) in ws.iter().zip(&xs).enumerate() {
                            let _y = match (fast, onednn_bf16) {
                                (false, _) => x.linear::<Tensor>(w, None),
                                (true, false) => {
                                    rows_linear::packed_linear(x, &packed[n], None, w.size()[0])
                                        .expect("few-row linear")
                                }
                                (true, true) => onednn::linear(x, &packed[n], None, w.size()[0])
                                    .expect("oneDNN linear"),
                            };
                        }
                    }
                    t.elapsed().as_secs_f64() / repeats as f64
                })
                .fold(f64::INFINITY, f64::min)
        };
        let (aten, fast) = (time(false), time(true));
        let gbs = |t: f64| bytes as f64 / t / 1e9;
        println!(
            "{rows:>5} {:>14.3} {:>14.1} {:>18.3} {:>18.1} {:>7.2}x",
            aten * 1e3,
            gbs(aten),
            fast * 1e3,
            gbs(fast),
            aten / fast
        );
    }
}
