//! The coordinator's side of experience making: a worker's record checked by its method, and a
//! method's experiences turned into the wire messages the learners take. The rewards and the
//! step's figures are the method's own (`comas_workflow::method`); this module only converts.
use comas_proto::v1 as pb;
use comas_workflow::method::{check_turn_versions, Experience, RecordFault, StepOutput};
use comas_workflow::program::{MethodConfig, Record};
use comas_workflow::{ConstrainedToken, FinishReason};
use serde_json::Value;

/// A step's experiences per agent, as the learners take them, and the step's figures.
#[derive(Debug)]
pub struct StepBatch {
    /// Experiences per agent, in (episode id, turn) order.
    pub per_agent: Vec<Vec<pb::Experience>>,
    /// Step metrics (without timings and training reports).
    pub metrics: Value,
    /// Whiten every agent's advantages with return moments pooled over all agents (MAPPA's
    /// `global` scope) instead of each agent's own.
    pub pooled_whitening: bool,
}

impl From<StepOutput> for StepBatch {
    fn from(s: StepOutput) -> Self {
        StepBatch {
            per_agent: s
                .per_agent
                .into_iter()
                .map(|exps| exps.into_iter().map(experience_to_pb).collect())
                .collect(),
            metrics: s.metrics,
            pooled_whitening: s.pooled_whitening,
        }
    }
}

/// One experience on the wire.
pub fn experience_to_pb(e: Experience) -> pb::Experience {
    pb::Experience {
        prompt_ids: e.prompt_ids.into_iter().map(i64::from).collect(),
        completion_ids: e.completion_ids.into_iter().map(i64::from).collect(),
        reward: Some(e.reward),
        token_rewards: Vec::new(),
        finish_reason: finish_to_pb(e.finish_reason),
        group: e.group,
        temperature: e.temperature,
        sampling_logprobs: e.sampling_logprobs,
        episode_id: e.episode_id,
        turn_id: u64::from(e.turn_id),
        policy_version: e.policy_version,
        constrained: constrained_to_pb(&e.constrained),
        norm_group: e.norm_group,
    }
}

fn finish_to_pb(f: FinishReason) -> i32 {
    match f {
        FinishReason::Stop => pb::FinishReason::Stop as i32,
        FinishReason::Length => pb::FinishReason::Length as i32,
    }
}

/// Guided-tail positions as the learner takes them.
fn constrained_to_pb(c: &[ConstrainedToken]) -> Vec<pb::ConstrainedToken> {
    c.iter()
        .map(|c| pb::ConstrainedToken {
            position: c.position,
            allowed: c.allowed.iter().map(|&t| i64::from(t)).collect(),
        })
        .collect()
}

/// Why a worker's record was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RecordError {
    /// Not valid JSON, or its method's checks refused it.
    #[error("episode {episode}: {fault}")]
    Invalid { episode: String, fault: RecordFault },
    /// A trained turn was sampled with another policy version than the step uses (the message
    /// names the episode and the turn).
    #[error("{0}")]
    WrongVersion(String),
}

/// A worker's record, parsed and checked: the method's own checks, and in synchronous mode that
/// every trained turn was sampled with the version its agent is at (`versions[agent]`).
pub fn check_record(
    method: &MethodConfig,
    json: &str,
    episode: &str,
    versions: Option<&[u64]>,
) -> Result<Record, RecordError> {
    let r = method
        .parse_record(json)
        .map_err(|fault| RecordError::Invalid { episode: episode.to_string(), fault })?;
    if let Some(v) = versions {
        check_turn_versions(&r.policy_turns(), episode, v).map_err(RecordError::WrongVersion)?;
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use comas_workflow::comas::{start_batch, CoMasConfig};
    use comas_workflow::method::StepContext;
    use comas_workflow::seed::PlanSeed;
    use comas_workflow::{Role, TaskKind, TaskRecord, TurnOutput};

    /// A CoMAS game played with scripted texts at policy version 7; every turn is 3 tokens.
    fn played(cfg: &CoMasConfig) -> String {
        let q = TaskRecord {
            prompt: "1+1?".into(),
            answer: "2".into(),
            task: TaskKind::Math,
            id: "q1".into(),
            source: None,
            files: Default::default(),
        };
        let mut ep =
            start_batch(cfg, &[q], PlanSeed { global: 1, step: 0, shard: 0 }).unwrap().remove(0);
        while !ep.is_done() {
            let outs = ep
                .next_turns()
                .iter()
                .map(|r| {
                    let text =
                        if r.role == Role::Scorer { "<score>3</score>" } else { "\\boxed{2}" };
                    TurnOutput {
                        turn_index: r.turn_index,
                        text: text.into(),
                        raw_text: text.into(),
                        prompt_ids: vec![1, 2, r.turn_index],
                        completion_ids: vec![5, 6, 7],
                        logprobs: vec![-0.5; 3],
                        finish_reason: FinishReason::Length,
                        policy_version: 7,
                        constrained: vec![ConstrainedToken { position: 2, allowed: vec![7, 8] }],
                    }
                })
                .collect();
            ep.submit(outs).unwrap();
        }
        serde_json::to_string(&ep.into_trajectory().unwrap()).unwrap()
    }

    #[test]
    fn records_are_checked_by_their_method_and_versions_by_turn() {
        let cfg = CoMasConfig {
            num_agents: 2,
            num_rounds: 1,
            instances_per_question: 1,
            ..Default::default()
        };
        let method = MethodConfig::CoMas(cfg.clone());
        let json = played(&cfg);
        assert!(check_record(&method, &json, "e1", Some(&[7, 7])).is_ok());
        assert!(check_record(&method, &json, "e1", Some(&[7]))
            .unwrap_err()
            .to_string()
            .contains("turn 1 (solver of agent 1)"));
        assert!(check_record(&method, &json[..json.len() / 2], "e1", None)
            .unwrap_err()
            .to_string()
            .contains("episode e1: not valid JSON"));
        // A record of another method does not parse as this one's.
        let other = MethodConfig::Neuromas(Default::default());
        assert!(check_record(&other, &json, "e1", None).is_err());
    }

    #[test]
    fn experiences_go_on_the_wire_field_by_field() {
        let cfg = CoMasConfig {
            num_agents: 2,
            num_rounds: 1,
            instances_per_question: 1,
            ..Default::default()
        };
        let method = MethodConfig::CoMas(cfg.clone());
        let record = method.parse_record(&played(&cfg)).unwrap();
        let step = StepContext { agents: 2, data: &[], with_temperatures: true, step: Some(0) };
        let out = method.experience(vec![("e1".into(), record)], &step, Some(&[7, 7])).unwrap();
        let first = out.per_agent[0][0].clone();
        let batch = StepBatch::from(out);
        let e = &batch.per_agent[0][0];
        assert_eq!(
            (e.prompt_ids.clone(), e.completion_ids.clone(), e.reward),
            (vec![1, 2, 0], vec![5, 6, 7], Some(first.reward))
        );
        assert_eq!(
            (e.finish_reason, e.turn_id, e.policy_version, e.episode_id.as_str()),
            (pb::FinishReason::Length as i32, 0, 7, "e1")
        );
        assert_eq!(
            (e.group.as_str(), e.temperature, e.sampling_logprobs.clone()),
            (first.group.as_str(), first.temperature, vec![-0.5; 3])
        );
        assert_eq!(e.constrained, vec![pb::ConstrainedToken { position: 2, allowed: vec![7, 8] }]);
        assert_eq!(batch.metrics["method"], "comas");
    }
}
