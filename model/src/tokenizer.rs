//! `tokenizer.json` through the `tokenizers` crate, the chat template from
//! `tokenizer_config.json` (or `chat_template.jinja`) rendered with minijinja, and the stop
//! tokens from `generation_config.json` / `config.json`.
use crate::config::TokenIds;
use crate::error::{read_json, ModelError, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;
use std::str::FromStr;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into() }
    }
}

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The same tokenizer with special-token matching off: text that spells a special token
    /// stays text.
    plain: tokenizers::Tokenizer,
    template: Option<ChatTemplate>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    pad_token: Option<String>,
    eos_token_ids: Vec<i64>,
    /// The file the stop tokens came from.
    eos_origin: &'static str,
    /// Looked up once: `tokenizers` rebuilds the whole vocabulary map to answer either.
    vocab_size: usize,
    special_texts: Vec<String>,
    /// Guided decoding state, built on first use (a token trie over the whole vocabulary).
    guidance: std::sync::OnceLock<std::result::Result<crate::guide::Guidance, String>>,
}

/// The text of ids given one at a time, in pieces whose concatenation is what
/// [`Tokenizer::decode`] gives for all of them: a piece comes once its bytes end on a whole
/// character, and is decoded with the ids before it, so that a token's leading space or a
/// character split over tokens comes out as it would in the whole text. Ids outside the
/// vocabulary are skipped, as `decode` skips them.
pub struct TextStream<'a> {
    vocab: usize,
    inner: tokenizers::DecodeStream<
        'a,
        tokenizers::models::ModelWrapper,
        tokenizers::normalizers::NormalizerWrapper,
        tokenizers::pre_tokenizers::PreTokenizerWrapper,
        tokenizers::processors::PostProcessorWrapper,
        tokenizers::decoders::DecoderWrapper,
    >,
}

impl TextStream<'_> {
    /// The text `id` adds, if a whole character is out.
    pub fn push(&mut self, id: i64) -> Result<Option<String>> {
        match u32::try_from(id) {
            Ok(i) if (i as usize) < self.vocab => {
                self.inner.step(i).map_err(|e| ModelError::Tokenizer(e.to_string()))
            }
            _ => Ok(None),
        }
    }
}

/// The model's chat template and the file it came from. One that does not compile is kept as
/// its error, so raw prompts still work and only chat prompts fail, naming the file.
struct ChatTemplate {
    origin: String,
    env: std::result::Result<minijinja::Environment<'static>, String>,
}

/// Special tokens in tokenizer_config.json are either strings or AddedToken objects.
fn token_string(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(String::from),
        _ => None,
    }
}

fn raise_exception(msg: String) -> std::result::Result<String, minijinja::Error> {
    Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
}

/// A Jinja environment configured like the one `transformers` renders chat templates in:
/// `trim_blocks` and `lstrip_blocks` on, Python string methods available.
fn template_env(source: String) -> std::result::Result<minijinja::Environment<'static>, String> {
    let mut env = minijinja::Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_template_owned("chat", source).map_err(|e| e.to_string())?;
    Ok(env)
}

#[derive(Deserialize)]
struct EosOnly {
    eos_token_id: Option<TokenIds>,
}

/// Reads `tokenizer.json`, telling a file that is not JSON from JSON that is not a tokenizer.
fn load_tokenizer_json(path: &Path) -> Result<tokenizers::Tokenizer> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
    if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&text) {
        return Err(ModelError::Tokenizer(format!(
            "{} is not valid JSON ({e}); the file is damaged or was cut short",
            path.display()
        )));
    }
    tokenizers::Tokenizer::from_str(&text).map_err(|e| {
        ModelError::Tokenizer(format!(
            "{} is JSON but not a tokenizer in the Hugging Face `tokenizers` format ({e}); it needs `model`, `normalizer`, `pre_tokenizer` and `added_tokens` as `tokenizer.save()` writes them",
            path.display()
        ))
    })
}

impl Tokenizer {
    /// Loads the tokenizer files of a Hugging Face model folder.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(ModelError::Folder {
                folder: dir.into(),
                what: "tokenizer.json is missing".into(),
            });
        }
        let inner = load_tokenizer_json(&path)?;
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: Value = if cfg_path.is_file() { read_json(&cfg_path)? } else { Value::Null };
        // transformers 5 writes the template to its own file; older versions keep it in the config.
        let jinja_path = dir.join("chat_template.jinja");
        let source = if jinja_path.is_file() {
            Some((
                jinja_path.display().to_string(),
                std::fs::read_to_string(&jinja_path).map_err(|e| ModelError::io(&jinja_path, e))?,
            ))
        } else {
            let origin = format!("the chat_template of {}", cfg_path.display());
            match cfg.get("chat_template") {
                Some(Value::String(s)) => Some((origin, s.clone())),
                // A list of named templates: use the default one.
                Some(Value::Array(list)) => list
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                    .and_then(|t| t.get("template").and_then(Value::as_str))
                    .map(|t| (origin, t.to_string())),
                _ => None,
            }
        };
        let template =
            source.map(|(origin, text)| ChatTemplate { origin, env: template_env(text) });
        let mut plain = inner.clone();
        plain.set_encode_special_tokens(true);
        let vocab_size = inner.get_vocab_size(true);
        let special_texts = inner
            .get_added_tokens_decoder()
            .into_values()
            .filter(|t| t.special)
            .map(|t| t.content)
            .collect();
        let mut tok = Self {
            inner,
            plain,
            template,
            bos_token: token_string(cfg.get("bos_token")),
            eos_token: token_string(cfg.get("eos_token")),
            pad_token: token_string(cfg.get("pad_token")),
            eos_token_ids: Vec::new(),
            eos_origin: "tokenizer_config.json",
            vocab_size,
            special_texts,
            guidance: std::sync::OnceLock::new(),
        };
        (tok.eos_token_ids, tok.eos_origin) = tok.resolve_eos(dir)?;
        Ok(tok)
    }

    /// Stop tokens as generation uses them: generation_config.json first (what `generate`
    /// reads), then config.json, then the tokenizer's eos token; and the file they came from.
    fn resolve_eos(&self, dir: &Path) -> Result<(Vec<i64>, &'static str)> {
        for file in ["generation_config.json", "config.json"] {
            let p = dir.join(file);
            if p.is_file() {
                let e: EosOnly = read_json(&p)?;
                if let Some(ids) = e.eos_token_id {
                    return Ok((ids.to_vec(), file));
                }
            }
        }
        let ids = self.eos_token.as_deref().and_then(|t| self.token_to_id(t)).into_iter().collect();
        Ok((ids, "tokenizer_config.json"))
    }

    /// The guided-decoding tables of this tokenizer.
    pub fn guidance(&self) -> Result<&crate::guide::Guidance> {
        let g = self.guidance.get_or_init(|| {
            crate::guide::Guidance::new(&self.inner, self.eos_token_ids.first().copied())
                .map_err(|e| e.to_string())
        });
        g.as_ref().map_err(|e| ModelError::Tokenizer(e.clone()))
    }

    pub fn eos_token_ids(&self) -> &[i64] {
        &self.eos_token_ids
    }

    pub fn pad_token_id(&self) -> Option<i64> {
        self.pad_token.as_deref().and_then(|t| self.token_to_id(t))
    }

    pub fn token_to_id(&self, token: &str) -> Option<i64> {
        self.inner.token_to_id(token).map(i64::from)
    }

    /// Number of entries including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Errors when the tokenizer can produce ids the model has no embedding for (the tokenizer
    /// and the weights do not belong together), or a stop token is outside the vocabulary.
    pub fn check_fits(&self, cfg: &crate::config::Config) -> Result<()> {
        if self.vocab_size() as i64 > cfg.vocab_size {
            return Err(ModelError::Tokenizer(format!(
                "tokenizer has {} entries but the model's vocab_size is {}; tokenizer.json does not belong to these weights",
                self.vocab_size(),
                cfg.vocab_size
            )));
        }
        // A stop token the model cannot produce would never stop a reply.
        if let Some(bad) = self.eos_token_ids.iter().find(|&&id| !(0..cfg.vocab_size).contains(&id))
        {
            return Err(ModelError::Tokenizer(format!(
                "`eos_token_id` {bad} in {} is outside the model's vocabulary (0 to {}, vocab_size {})",
                self.eos_origin,
                cfg.vocab_size - 1,
                cfg.vocab_size
            )));
        }
        Ok(())
    }

    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// Why chat prompts cannot be rendered: no template, or one that does not compile.
    pub fn check_chat_template(&self) -> Result<()> {
        self.chat_env().map(|_| ())
    }

    /// The compiled chat template and the file it came from.
    fn chat_env(&self) -> Result<(&str, &minijinja::Environment<'static>)> {
        match &self.template {
            None => Err(ModelError::ChatTemplate(
                "this model has no chat template (tokenizer_config.json has no chat_template)"
                    .into(),
            )),
            Some(ChatTemplate { origin, env: Err(e) }) => Err(ModelError::ChatTemplate(format!(
                "{origin} does not compile: {e}; fix it, or give raw prompts"
            ))),
            Some(ChatTemplate { origin, env: Ok(env) }) => Ok((origin, env)),
        }
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<i64>> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().iter().map(|&i| i64::from(i)).collect())
    }

    /// Decodes ids; ids outside the tokenizer's vocabulary (padded embedding rows) are skipped.
    pub fn decode(&self, ids: &[i64], skip_special_tokens: bool) -> Result<String> {
        let vocab = self.vocab_size;
        let ids: Vec<u32> = ids
            .iter()
            .filter_map(|&i| u32::try_from(i).ok())
            .filter(|&i| (i as usize) < vocab)
            .collect();
        self.inner
            .decode(&ids, skip_special_tokens)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))
    }

    /// The text of a growing list of ids, piece by piece (a streamed answer).
    pub fn text_stream(&self, skip_special_tokens: bool) -> TextStream<'_> {
        TextStream { vocab: self.vocab_size, inner: self.inner.decode_stream(skip_special_tokens) }
    }

    /// Renders `messages` with the model's chat template.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let (origin, env) = self.chat_env()?;
        let tmpl = env
            .get_template("chat")
            .map_err(|e| ModelError::ChatTemplate(format!("{origin}: {e}")))?;
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone().unwrap_or_default(),
            eos_token => self.eos_token.clone().unwrap_or_default(),
            pad_token => self.pad_token.clone().unwrap_or_default(),
            tools => minijinja::Value::from(()),
        };
        tmpl.render(ctx)
            .map_err(|e| ModelError::ChatTemplate(format!("{origin} failed to render: {e}")))
    }

    /// Encodes text with special-token strings treated as ordinary text.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<i64>> {
        let enc =
            self.plain.encode(text, false).map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().iter().map(|&i| i64::from(i)).collect())
    }

    /// Renders and tokenizes a chat prompt. The template already carries any BOS text, so no
    /// special tokens are added on top (as `apply_chat_template(tokenize=True)` does).
    ///
    /// Message content is never turned into control tokens: when a message spells a special
    /// token (a quoted completion may), the template's own text and the contents are encoded
    /// separately, the contents as plain text. Other prompts are encoded whole, exactly as
    /// `transformers` does.
    pub fn encode_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<i64>> {
        let text = self.apply_chat_template(messages, add_generation_prompt)?;
        let spells_special = messages
            .iter()
            .any(|m| self.special_texts.iter().any(|s| m.content.contains(s.as_str())));
        if !spells_special {
            return self.encode(&text, false);
        }
        let markers: Vec<String> =
            (0..messages.len()).map(|i| format!("\u{1}comas-content-{i}\u{1}")).collect();
        let masked: Vec<ChatMessage> = messages
            .iter()
            .zip(&markers)
            .map(|(m, k)| ChatMessage::new(m.role.clone(), k.clone()))
            .collect();
        let skeleton = self.apply_chat_template(&masked, add_generation_prompt)?;
        let mut rebuilt = skeleton.clone();
        for (m, k) in messages.iter().zip(&markers) {
            rebuilt = rebuilt.replacen(k.as_str(), &m.content, 1);
        }
        if rebuilt != text {
            return Err(ModelError::ChatTemplate(
                "a message spells a special token and this template rewrites message content, so it cannot be kept as plain text; strip the special-token text from the message".into(),
            ));
        }
        let mut out = Vec::new();
        let mut rest = skeleton.as_str();
        for (m, k) in messages.iter().zip(&markers) {
            let Some(pos) = rest.find(k.as_str()) else {
                return Err(ModelError::ChatTemplate(
                    "the template dropped or reordered a message".into(),
                ));
            };
            out.extend(self.encode(&rest[..pos], false)?);
            out.extend(self.encode_plain(&m.content)?);
            rest = &rest[pos + k.len()..];
        }
        out.extend(self.encode(rest, false)?);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pieces of ids pushed one by one, joined, against decoding them all at once: the fixture
    /// tokenizers are byte-level, so random ids split characters over tokens.
    #[test]
    fn streamed_text_joins_to_the_whole_decode() {
        use rand::{Rng, SeedableRng};
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tokenizers");
        for name in ["chatml", "llama3"] {
            let tok = Tokenizer::from_dir(&root.join(name)).unwrap();
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
            let mut split_characters = 0;
            for skip in [true, false] {
                for _ in 0..50 {
                    let n = tok.vocab_size() as i64;
                    // Now and then an id past the vocabulary (a padded embedding row).
                    let ids: Vec<i64> = (0..40).map(|_| rng.gen_range(0..n + 3)).collect();
                    let mut stream = tok.text_stream(skip);
                    let mut joined = String::new();
                    for &id in &ids {
                        match stream.push(id).unwrap() {
                            Some(piece) => joined.push_str(&piece),
                            None => split_characters += 1,
                        }
                    }
                    let whole = tok.decode(&ids, skip).unwrap();
                    // What is still held back is an unfinished character at the end.
                    let held = whole.strip_prefix(joined.as_str()).unwrap_or_else(|| {
                        panic!("{name}: {joined:?} is not a prefix of {whole:?}")
                    });
                    assert!(held.chars().all(|c| c == '\u{FFFD}'), "{name}: held {held:?}");
                }
            }
            assert!(split_characters > 0, "{name}: no id was held back, the test shows nothing");
        }
    }
}
