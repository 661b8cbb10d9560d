//! `comas score`: log-probabilities of given completions, batched, one JSON line per input line.
use crate::model_args::ModelArgs;
use anyhow::{bail, Context, Result};
use comas_model::{mask, CausalLm, ChatMessage, LoraAdapter, LoraBatch, Tokenizer};
use serde::Deserialize;
use std::io::{BufRead, Write};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// JSONL: each line has a prompt (`prompt` text, `prompt_ids`, or chat `messages`) and a
    /// completion (`completion` text or `completion_ids`).
    #[arg(long)]
    input: PathBuf,
    /// Where to write the JSONL result (default: stdout). Written atomically.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Logits are divided by this before the softmax, as the sampler did.
    #[arg(long, default_value_t = 1.0)]
    temperature: f64,
    #[arg(long, default_value_t = 8)]
    batch_size: usize,
    #[arg(long)]
    adapter: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    prompt: Option<String>,
    prompt_ids: Option<Vec<i64>>,
    messages: Option<Vec<ChatMessage>>,
    completion: Option<String>,
    completion_ids: Option<Vec<i64>>,
    /// Free-form id echoed back.
    id: Option<serde_json::Value>,
}

struct Item {
    /// Line of the input file.
    line: usize,
    id: Option<serde_json::Value>,
    prompt: Vec<i64>,
    completion: Vec<i64>,
}

fn parse_line(n: usize, text: &str, tok: &Tokenizer, vocab: i64) -> Result<Item> {
    let l: Line =
        serde_json::from_str(text).with_context(|| format!("line {n}: not a valid record"))?;
    let prompt = match (l.prompt, l.prompt_ids, l.messages) {
        (Some(p), None, None) => tok.encode(&p, true)?,
        (None, Some(ids), None) => ids,
        (None, None, Some(m)) => tok.encode_chat(&m, true)?,
        _ => bail!("line {n}: give exactly one of `prompt`, `prompt_ids`, `messages`"),
    };
    let completion = match (l.completion, l.completion_ids) {
        (Some(c), None) => tok.encode(&c, false)?,
        (None, Some(ids)) => ids,
        _ => bail!("line {n}: give exactly one of `completion`, `completion_ids`"),
    };
    if prompt.is_empty() {
        bail!("line {n}: empty prompt");
    }
    if completion.is_empty() {
        bail!("line {n}: empty completion");
    }
    if let Some(bad) = prompt.iter().chain(&completion).find(|&&t| t < 0 || t >= vocab) {
        bail!("line {n}: token id {bad} is outside the model's vocabulary (size {vocab})");
    }
    Ok(Item { line: n, id: l.id, prompt, completion })
}

pub fn run(a: Args) -> Result<()> {
    if a.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    if let Some(out) = &a.output {
        crate::out_path::not_an_input("--output", out, &[&a.input])?;
    }
    let (config, kind, device) = a.model.resolve()?;
    let dir = &a.model.model;
    let tok = Tokenizer::from_dir(dir)?;
    tok.check_fits(&config)?;
    // Read and check every line before loading weights, so bad input fails fast and whole.
    let file =
        std::fs::File::open(&a.input).with_context(|| format!("opening {}", a.input.display()))?;
    let mut items = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| {
            format!("reading {} line {}: is it UTF-8 text?", a.input.display(), i + 1)
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let item = parse_line(i + 1, &line, &tok, config.vocab_size)?;
        let len = item.prompt.len() + item.completion.len();
        if len as i64 > config.max_position_embeddings {
            bail!(
                "line {}: prompt and completion are {len} tokens, over the model's context of {} (max_position_embeddings)",
                i + 1,
                config.max_position_embeddings
            );
        }
        items.push(item);
    }
    let model = CausalLm::load(dir, kind, device)?;
    let adapter = a
        .adapter
        .as_ref()
        .map(|d| LoraAdapter::load(d, model.config(), kind, device))
        .transpose()?;
    let lora = adapter.as_ref().map(LoraBatch::uniform);
    let pad = tok.pad_token_id().unwrap_or(0);
    let mut out = Vec::new();
    let _guard = tch::no_grad_guard();
    for chunk in items.chunks(a.batch_size) {
        let seqs: Vec<Vec<i64>> =
            chunk.iter().map(|it| [it.prompt.as_slice(), &it.completion].concat()).collect();
        let (ids, valid) = mask::right_pad(&seqs, pad, device);
        // libtorch panics where an allocation fails; say which records and what to lower.
        let lp = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| model.token_logprobs(&ids, Some(&valid), a.temperature, lora.as_ref())))
            .map_err(|p| {
                let (first, last) = (chunk[0].line, chunk[chunk.len() - 1].line);
                anyhow::anyhow!(
                    "libtorch failed scoring lines {first}..={last} ({} sequences of up to {} tokens): {}; lower --batch-size",
                    seqs.len(),
                    seqs.iter().map(Vec::len).max().unwrap_or(0),
                    comas_service::panic_message(p.as_ref())
                )
            })??
            .to_device(tch::Device::Cpu);
        for (row, it) in chunk.iter().enumerate() {
            let start = it.prompt.len() as i64 - 1;
            let vals = Vec::<f32>::try_from(&lp.get(row as i64).narrow(
                0,
                start,
                it.completion.len() as i64,
            ))?;
            let sum: f64 = vals.iter().map(|&v| v as f64).sum();
            if !sum.is_finite() {
                bail!("non-finite log-probability for record {:?}; check the model weights", it.id);
            }
            let rec = serde_json::json!({
                "id": it.id,
                "prompt_ids": it.prompt,
                "completion_ids": it.completion,
                "logprobs": vals,
                "sum_logprob": sum,
                "mean_logprob": sum / it.completion.len() as f64,
            });
            out.push(rec.to_string());
        }
    }
    let mut text = out.join("\n");
    text.push('\n');
    match &a.output {
        Some(path) => {
            comas_model::safetensors::write_atomic(path, |w| w.write_all(text.as_bytes()))?
        }
        None => std::io::stdout().write_all(text.as_bytes())?,
    }
    Ok(())
}
