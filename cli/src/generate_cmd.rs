use crate::model_args::ModelArgs;
use anyhow::{bail, Context, Result};
use comas_model::{
    generate, CausalLm, ChatMessage, GenerationRequest, LoraAdapter, SamplingParams, Tokenizer,
};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Raw prompt text, tokenized as is (with the tokenizer's special-token template).
    #[arg(
        long,
        conflicts_with_all = ["chat", "prompt_ids"],
        required_unless_present_any = ["chat", "prompt_ids"]
    )]
    prompt: Option<String>,
    /// Prompt token ids separated by commas, used as they are (no template). Repeatable: each
    /// prompt is generated on its own (batch 1), one after the other, with one model load.
    #[arg(long, conflicts_with = "chat")]
    prompt_ids: Vec<String>,
    /// A user message, rendered with the model's chat template and the generation prompt.
    #[arg(long)]
    chat: Option<String>,
    /// Optional system message for --chat.
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// Greedy decoding (same as --temperature 0).
    #[arg(long)]
    greedy: bool,
    #[arg(long, default_value_t = 1.0)]
    temperature: f64,
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    /// 0 disables top-k.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    #[arg(long, default_value_t = 0)]
    min_new_tokens: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop when the generated text contains this string (repeatable).
    #[arg(long = "stop")]
    stop: Vec<String>,
    /// Do not stop at the model's end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Guided tail: once the reply would stop, continue it with text matching this regex
    /// (e.g. '<score>[123]</score>'); the model still picks where the regex leaves a choice.
    #[arg(long)]
    guided_suffix: Option<String>,
    /// PEFT LoRA adapter folder to apply.
    #[arg(long)]
    adapter: Option<PathBuf>,
    /// Print prompt ids, generated ids and their log-probabilities as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> Result<()> {
    if a.max_new_tokens == 0 {
        bail!("--max-new-tokens must be at least 1");
    }
    let (_, kind, device) = a.model.resolve()?;
    let dir = &a.model.model;
    let tokenizer = Tokenizer::from_dir(dir)?;
    let model =
        CausalLm::load(dir, kind, device).with_context(|| format!("loading {}", dir.display()))?;
    model.pack_for_decode();
    tokenizer.check_fits(model.config())?;
    let adapter = match &a.adapter {
        Some(dir) => Some(
            LoraAdapter::load(dir, model.config(), kind, device)
                .with_context(|| format!("loading adapter {}", dir.display()))?,
        ),
        None => None,
    };
    let vocab = model.config().vocab_size;
    let prompts: Vec<Vec<i64>> = match (&a.prompt, &a.chat) {
        _ if !a.prompt_ids.is_empty() => {
            a.prompt_ids.iter().map(|list| parse_ids(list, vocab)).collect::<Result<_>>()?
        }
        (Some(p), _) => vec![tokenizer.encode(p, true)?],
        (None, Some(c)) => {
            let mut msgs = Vec::new();
            if let Some(s) = &a.system {
                msgs.push(ChatMessage::new("system", s));
            }
            msgs.push(ChatMessage::new("user", c));
            vec![tokenizer.encode_chat(&msgs, true)?]
        }
        (None, None) => bail!("give --prompt, --prompt-ids or --chat"),
    };
    if prompts.iter().any(Vec::is_empty) {
        bail!("the prompt tokenized to nothing; give a non-empty --prompt");
    }
    let params = SamplingParams {
        temperature: if a.greedy { 0.0 } else { a.temperature },
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
        max_new_tokens: a.max_new_tokens,
        min_new_tokens: a.min_new_tokens,
        stop_token_ids: if a.ignore_eos { Vec::new() } else { tokenizer.eos_token_ids().to_vec() },
        stop_strings: a.stop.clone(),
        guided_suffix: a.guided_suffix.clone(),
    };
    for prompt_ids in prompts {
        let req = GenerationRequest {
            prompt_ids: prompt_ids.clone(),
            params: params.clone(),
            adapter: adapter.as_ref(),
        };
        let started = std::time::Instant::now();
        // libtorch panics where an allocation fails: an error that says what to lower instead.
        let c = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            generate(&model, std::slice::from_ref(&req), Some(&tokenizer))
        }))
        .map_err(|p| {
            anyhow::anyhow!(
                "libtorch failed generating: {}; lower --max-new-tokens or shorten the prompt",
                comas_service::panic_message(p.as_ref())
            )
        })??
        .remove(0);
        let secs = started.elapsed().as_secs_f64();
        let text = tokenizer.decode(&c.token_ids, true)?;
        if a.json {
            let out = serde_json::json!({
                "prompt_ids": prompt_ids,
                "generated_ids": c.token_ids,
                "logprobs": c.logprobs,
                "sampling_logprobs": c.sampling_logprobs,
                "finish_reason": c.finish_reason,
                "stop_string": c.stop_string,
                "constrained": c.constrained,
                "text": text,
            });
            println!("{out}");
        } else {
            println!("{text}");
            eprintln!(
                "[{} prompt tokens, {} generated in {:.2}s ({:.1} tok/s), finish: {:?}]",
                prompt_ids.len(),
                c.token_ids.len(),
                secs,
                c.token_ids.len() as f64 / secs.max(1e-9),
                c.finish_reason
            );
        }
    }
    Ok(())
}

/// One `--prompt-ids` list: token ids separated by commas, each inside the vocabulary.
fn parse_ids(list: &str, vocab: i64) -> Result<Vec<i64>> {
    list.split(',')
        .map(|t| {
            let id: i64 = t.trim().parse().with_context(|| {
                format!("--prompt-ids: `{t}` is not a token id (give ids separated by commas)")
            })?;
            if !(0..vocab).contains(&id) {
                bail!("--prompt-ids: token {id} is outside the model's vocabulary (0..{vocab})");
            }
            Ok(id)
        })
        .collect()
}
