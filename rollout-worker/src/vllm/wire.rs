//! The part of vLLM's HTTP API a worker speaks: `/v1/completions` with token ids in and out,
//! the run-time LoRA calls, and the dev-mode `collective_rpc` that reloads full weights.
use serde::{Deserialize, Serialize};

/// A `POST /v1/completions` body: the prompt as token ids, the completion back as token ids
/// with the log-probability of each sampled token (`logprobs: 0`, `return_token_ids`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompletionRequest {
    /// The base's served name, or a loaded adapter's.
    pub model: String,
    pub prompt: Vec<i64>,
    pub max_tokens: u32,
    pub min_tokens: u32,
    /// 0 is greedy in vLLM, as in comas.
    pub temperature: f64,
    pub top_p: f64,
    /// vLLM reads 0 and -1 as off; sent only when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// Not sent to a server on the CPU (see `calls::Generation::seeded`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    pub stop_token_ids: Vec<i64>,
    /// The sampled token's log-probability only.
    pub logprobs: u32,
    pub return_token_ids: bool,
    /// The guided tail, compiled by the server's structured-output backend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub structured_outputs: Option<StructuredOutputs>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StructuredOutputs {
    pub regex: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CompletionResponse {
    pub choices: Vec<CompletionChoice>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CompletionChoice {
    /// "stop" or "length" (also "abort" when the server dropped the request).
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Present with `return_token_ids`; a server that ignores the field leaves it out.
    #[serde(default)]
    pub token_ids: Option<Vec<i64>>,
    #[serde(default)]
    pub logprobs: Option<ChoiceLogprobs>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ChoiceLogprobs {
    /// One per completion token; `null` where the server had none.
    pub token_logprobs: Vec<Option<f64>>,
}

/// `POST /v1/load_lora_adapter`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoadAdapter {
    pub lora_name: String,
    pub lora_path: String,
}

/// `POST /v1/unload_lora_adapter`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UnloadAdapter {
    pub lora_name: String,
}

/// `POST /collective_rpc` (served with `VLLM_SERVER_DEV_MODE=1`): a method every model worker
/// of the server runs, here `reload_weights` from a folder of safetensors.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CollectiveRpc {
    pub method: String,
    pub kwargs: serde_json::Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_carries_token_ids_and_asks_for_token_ids_and_sampled_logprobs() {
        let r = CompletionRequest {
            model: "a1-v3".into(),
            prompt: vec![1, 2, 3],
            max_tokens: 8,
            min_tokens: 2,
            temperature: 0.7,
            top_p: 1.0,
            top_k: None,
            seed: Some(9),
            stop_token_ids: vec![2],
            logprobs: 0,
            return_token_ids: true,
            structured_outputs: None,
        };
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            serde_json::json!({"model": "a1-v3", "prompt": [1, 2, 3], "max_tokens": 8,
                "min_tokens": 2, "temperature": 0.7, "top_p": 1.0, "seed": 9,
                "stop_token_ids": [2], "logprobs": 0, "return_token_ids": true})
        );
    }

    /// A reply as vLLM 0.32 writes it (fields comas does not read included).
    #[test]
    fn a_reply_gives_token_ids_and_their_logprobs() {
        let text = r#"{"id":"cmpl-1","object":"text_completion","created":1,"model":"base",
            "choices":[{"index":0,"text":"<score>2</score>","logprobs":{"text_offset":[0,1],
            "token_logprobs":[0.0,-0.108],"tokens":["<","2"],"top_logprobs":[{"<":0.0},{"2":-0.108}]},
            "finish_reason":"stop","stop_reason":null,"token_ids":[44,34],"prompt_logprobs":null,
            "prompt_token_ids":[1,2]}],"usage":{"prompt_tokens":2,"total_tokens":4,"completion_tokens":2}}"#;
        let r: CompletionResponse = serde_json::from_str(text).unwrap();
        let c = &r.choices[0];
        assert_eq!(c.token_ids.as_deref(), Some(&[44i64, 34][..]));
        assert_eq!(c.logprobs.as_ref().unwrap().token_logprobs, vec![Some(0.0), Some(-0.108)]);
        assert_eq!(c.finish_reason.as_deref(), Some("stop"));
    }
}
