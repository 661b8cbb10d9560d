//! The tokenizer files of an imported model, rebuilt from `tokenizer.ggml.*`: a byte-level BPE
//! `tokenizer.json` (built and saved by the `tokenizers` crate itself, so it loads wherever
//! Hugging Face tokenizers do), `tokenizer_config.json` with the chat template, and
//! `generation_config.json` with the stop tokens.
use crate::error::{GgufError, Result};
use crate::reader::{GgufFile, Value};
use serde::Serialize;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

/// llama.cpp's token types (`llama_token_type`).
const TOKEN_CONTROL: u64 = 3;
const TOKEN_USER_DEFINED: u64 = 4;

/// The split regex of Qwen2's tokenizer (digits one by one).
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The split regex of Llama 3's tokenizer (digits in groups of up to three).
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How text is split before BPE, by `tokenizer.ggml.pre`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PreTokenizer {
    /// GPT-2's regex (inside ByteLevel).
    Gpt2,
    /// Every digit alone, then GPT-2's regex: SmolLM, StarCoder.
    DigitsThenGpt2,
    Qwen2,
    Llama3,
}

impl PreTokenizer {
    fn from_pre(pre: &str) -> Result<Self> {
        Ok(match pre {
            "gpt2" | "gpt-2" => Self::Gpt2,
            "smollm" | "starcoder" | "refact" => Self::DigitsThenGpt2,
            "qwen2" | "deepseek-r1-qwen" => Self::Qwen2,
            "llama-bpe" | "llama3" | "llama-v3" => Self::Llama3,
            other => {
                return Err(GgufError::Tokenizer(format!(
                    "tokenizer.ggml.pre `{other}` is not supported; supported: smollm, starcoder, refact, qwen2, llama-bpe, gpt2"
                )))
            }
        })
    }

    fn build(self) -> Result<PreTokenizerWrapper> {
        let split = |re: &str| -> Result<PreTokenizerWrapper> {
            let s =
                Split::new(SplitPattern::Regex(re.into()), SplitDelimiterBehavior::Isolated, false)
                    .map_err(|e| GgufError::Tokenizer(format!("split regex: {e}")))?;
            Ok(s.into())
        };
        Ok(match self {
            Self::Gpt2 => ByteLevel::new(false, true, true).into(),
            Self::DigitsThenGpt2 => Sequence::new(vec![
                Digits::new(true).into(),
                ByteLevel::new(false, true, true).into(),
            ])
            .into(),
            Self::Qwen2 => {
                Sequence::new(vec![split(QWEN2_REGEX)?, ByteLevel::new(false, false, false).into()])
                    .into()
            }
            Self::Llama3 => {
                Sequence::new(vec![split(LLAMA3_REGEX)?, ByteLevel::new(false, true, false).into()])
                    .into()
            }
        })
    }
}

/// The vocabulary as stored in the file.
pub struct Vocab {
    pub tokens: Vec<String>,
    pub types: Vec<u64>,
    pub merges: Vec<(String, String)>,
    pre: PreTokenizer,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub pad: Option<u32>,
    pub unk: Option<u32>,
    /// End-of-turn / end-of-message tokens that also stop generation.
    pub extra_stops: Vec<u32>,
    pub add_bos: bool,
    pub chat_template: Option<String>,
}

fn strings(g: &GgufFile, key: &str) -> Result<Vec<String>> {
    let arr = g.get(key).ok_or_else(|| GgufError::meta(key, "is missing"))?;
    let arr = arr.as_array().ok_or_else(|| GgufError::meta(key, "expected an array of strings"))?;
    arr.iter()
        .map(|v| {
            v.as_str()
                .map(String::from)
                .ok_or_else(|| GgufError::meta(key, "expected an array of strings"))
        })
        .collect()
}

impl Vocab {
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let model = g.get_str("tokenizer.ggml.model")?.ok_or_else(|| {
            GgufError::meta("tokenizer.ggml.model", "is missing: the file has no tokenizer")
        })?;
        match model {
            "gpt2" => {}
            "llama" => {
                return Err(GgufError::Tokenizer(
                    "tokenizer.ggml.model `llama` (a SentencePiece vocabulary) is not supported yet; only `gpt2` byte-level BPE vocabularies can be imported"
                        .into(),
                ))
            }
            other => return Err(GgufError::Tokenizer(format!("tokenizer.ggml.model `{other}` is not supported; supported: gpt2"))),
        }
        let pre = match g.get_str("tokenizer.ggml.pre")? {
            Some(p) => PreTokenizer::from_pre(p)?,
            None => {
                return Err(GgufError::meta(
                    "tokenizer.ggml.pre",
                    "is missing; without it the text splitting of this vocabulary is unknown",
                ))
            }
        };
        let tokens = strings(g, "tokenizer.ggml.tokens")?;
        let types = match g.get("tokenizer.ggml.token_type") {
            None => vec![1; tokens.len()],
            Some(v) => v
                .as_array()
                .and_then(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<_>>>())
                .ok_or_else(|| {
                    GgufError::meta("tokenizer.ggml.token_type", "expected an array of integers")
                })?,
        };
        if types.len() != tokens.len() {
            return Err(GgufError::meta(
                "tokenizer.ggml.token_type",
                format!("has {} entries for {} tokens", types.len(), tokens.len()),
            ));
        }
        let merges = strings(g, "tokenizer.ggml.merges")?
            .into_iter()
            .enumerate()
            .map(|(i, m)| match m.split_once(' ') {
                Some((a, b)) if !a.is_empty() && !b.is_empty() => {
                    Ok((a.to_string(), b.to_string()))
                }
                _ => Err(GgufError::meta(
                    "tokenizer.ggml.merges",
                    format!("entry {i} `{m}` is not two tokens separated by one space"),
                )),
            })
            .collect::<Result<Vec<_>>>()?;
        let n = tokens.len() as u64;
        let id = |key: &str| -> Result<Option<u32>> {
            match g.get_u64(key)? {
                Some(v) if v < n => Ok(Some(v as u32)),
                Some(v) => Err(GgufError::meta(
                    key,
                    format!("token id {v} is outside the {n}-token vocabulary"),
                )),
                None => Ok(None),
            }
        };
        let eos = id("tokenizer.ggml.eos_token_id")?;
        let mut extra_stops = Vec::new();
        for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            if let Some(t) = id(key)? {
                if Some(t) != eos && !extra_stops.contains(&t) {
                    extra_stops.push(t);
                }
            }
        }
        Ok(Self {
            pre,
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos,
            pad: id("tokenizer.ggml.padding_token_id")?,
            unk: id("tokenizer.ggml.unknown_token_id")?,
            extra_stops,
            add_bos: g.get_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false),
            chat_template: g.get_str("tokenizer.chat_template")?.map(String::from),
            tokens,
            types,
            merges,
        })
    }

    fn token(&self, id: Option<u32>) -> Option<String> {
        id.map(|i| self.tokens[i as usize].clone())
    }

    /// The `tokenizers` tokenizer this vocabulary describes.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        let mut vocab = tokenizers::models::bpe::Vocab::with_capacity(self.tokens.len());
        for (i, t) in self.tokens.iter().enumerate() {
            // A duplicate token would silently shadow an id: refuse it.
            if vocab.insert(t.clone(), i as u32).is_some() {
                return Err(GgufError::Tokenizer(format!(
                    "token `{t}` appears twice in tokenizer.ggml.tokens (id {i})"
                )));
            }
        }
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, self.merges.clone())
            .ignore_merges(self.pre == PreTokenizer::Llama3)
            .build()
            .map_err(|e| {
                GgufError::Tokenizer(format!("BPE from tokenizer.ggml.tokens/merges: {e}"))
            })?;
        let mut tok = Tokenizer::new(bpe);
        if self.pre == PreTokenizer::Qwen2 {
            // Qwen2's own tokenizer.json composes text to NFC first; without it "e\u{301}" splits differently.
            tok.with_normalizer(Some(tokenizers::normalizers::NFC));
        }
        tok.with_pre_tokenizer(Some(self.pre.build()?));
        tok.with_decoder(Some(ByteLevelDecoder::default()));
        let post: PostProcessorWrapper = match (self.add_bos, self.token(self.bos)) {
            (true, Some(bos)) => {
                let bos_id = self.bos.expect("bos token exists");
                TemplateProcessing::builder()
                    .try_single(format!("{bos}:0 $A:0"))
                    .and_then(|b| b.try_pair(format!("{bos}:0 $A:0 {bos}:1 $B:1")))
                    .map_err(|e| GgufError::Tokenizer(format!("post-processor: {e}")))?
                    .special_tokens(vec![(bos.clone(), bos_id)])
                    .build()
                    .map_err(|e| GgufError::Tokenizer(format!("post-processor: {e}")))?
                    .into()
            }
            _ => ByteLevel::new(false, false, true).into(),
        };
        tok.with_post_processor(Some(post));
        let added: Vec<AddedToken> = self
            .tokens
            .iter()
            .zip(&self.types)
            .filter(|(_, &ty)| ty == TOKEN_CONTROL || ty == TOKEN_USER_DEFINED)
            .map(|(t, &ty)| AddedToken::from(t.clone(), ty == TOKEN_CONTROL).normalized(false))
            .collect();
        // Added tokens already in the vocabulary keep their ids.
        tok.add_special_tokens(&added);
        Ok(tok)
    }

    pub fn tokenizer_config(&self, model_max_length: u64) -> TokenizerConfig {
        TokenizerConfig {
            tokenizer_class: "PreTrainedTokenizerFast",
            bos_token: self.token(self.bos),
            eos_token: self.token(self.eos),
            pad_token: self.token(self.pad),
            unk_token: self.token(self.unk),
            add_bos_token: self.add_bos,
            add_eos_token: false,
            clean_up_tokenization_spaces: false,
            model_max_length,
            chat_template: self.chat_template.clone(),
        }
    }

    pub fn generation_config(&self) -> GenerationConfig {
        let mut eos: Vec<u32> = self.eos.into_iter().collect();
        eos.extend(&self.extra_stops);
        GenerationConfig { bos_token_id: self.bos, eos_token_id: eos, pad_token_id: self.pad }
    }
}

#[derive(Debug, Serialize)]
pub struct TokenizerConfig {
    pub tokenizer_class: &'static str,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub pad_token: Option<String>,
    pub unk_token: Option<String>,
    pub add_bos_token: bool,
    pub add_eos_token: bool,
    pub clean_up_tokenization_spaces: bool,
    pub model_max_length: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct GenerationConfig {
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Vec<u32>,
    pub pad_token_id: Option<u32>,
}
