//! Who evaluates and who scores each solution (spec 3.3), planned for a whole batch at once.
//!
//! For every round and judging role the planner hands out one judge per (instance, slot, judge
//! index), in that order. `Balanced` fills the list so that every agent appears equally often
//! (N_inst × n times) and shuffles it; `IidUniform` draws each judge on its own. With
//! `exclude_self` no agent judges the solution of its own slot (the solver of slot d is agent d).
use super::config::{Assignment, CoMasConfig};
use crate::error::WorkflowError;
use crate::seed::{rng_for, tag};
use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

pub use crate::seed::PlanSeed;

/// Judges of one round of one instance, indexed `[slot][judge_index]`. A role the variant does
/// not have is an empty list.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RoundAssignment {
    pub evaluators: Vec<Vec<u32>>,
    pub scorers: Vec<Vec<u32>>,
}

/// Judges of every round of one instance.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct InstancePlan {
    pub rounds: Vec<RoundAssignment>,
}

/// Plans of all instances of a batch, in instance order.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BatchPlan {
    pub instances: Vec<InstancePlan>,
}

impl InstancePlan {
    /// Checks that the plan has the shape the config implies and names only existing agents.
    pub fn check(&self, config: &CoMasConfig) -> Result<(), WorkflowError> {
        let bad = |m: String| Err(WorkflowError::PlanMismatch(m));
        if self.rounds.len() != config.num_rounds as usize {
            return bad(format!("{} rounds planned, num_rounds is {}", self.rounds.len(), config.num_rounds));
        }
        let l = config.num_agents as usize;
        let n = config.evals_per_solution as usize;
        for (r, round) in self.rounds.iter().enumerate() {
            let roles = [("evaluators", &round.evaluators, config.variant.has_evaluators()), ("scorers", &round.scorers, config.variant.has_scorers())];
            for (name, judges, present) in roles {
                let slots = if present { l } else { 0 };
                if judges.len() != slots {
                    return bad(format!("round {r}: {} slots of {name}, expected {slots}", judges.len()));
                }
                for (d, per_slot) in judges.iter().enumerate() {
                    if per_slot.len() != n {
                        return bad(format!("round {r} slot {d}: {} {name}, expected {n}", per_slot.len()));
                    }
                    if let Some(&a) = per_slot.iter().find(|&&a| a >= config.num_agents) {
                        return bad(format!("round {r} slot {d}: agent {a} among the {name} does not exist"));
                    }
                    if config.exclude_self && per_slot.contains(&(d as u32)) {
                        return bad(format!("round {r} slot {d}: agent {d} judges itself although exclude_self is set"));
                    }
                }
            }
        }
        Ok(())
    }
}

/// A bound far above any real batch (256 instances x 4 agents = 1024) that keeps a wrong instance
/// count from turning into a huge allocation.
pub const MAX_POSITIONS: usize = 1 << 24;

/// Plans a batch of `num_instances` instances. Same config and seed, same plan.
pub fn plan_batch(config: &CoMasConfig, num_instances: usize, seed: PlanSeed) -> Result<BatchPlan, WorkflowError> {
    config.validate()?;
    let l = config.num_agents as usize;
    let n = config.evals_per_solution as usize;
    let positions = num_instances.checked_mul(l).and_then(|x| x.checked_mul(n)).filter(|&p| p <= MAX_POSITIONS).ok_or_else(|| {
        WorkflowError::BatchTooLarge(format!("{num_instances} instances x {l} agents x {n} judges exceeds {MAX_POSITIONS} judge positions per round"))
    })?;
    let mut instances = vec![InstancePlan { rounds: Vec::with_capacity(config.num_rounds as usize) }; num_instances];
    for r in 0..config.num_rounds {
        let draw_role = |present: bool, role_tag: u64| -> Result<Vec<u32>, WorkflowError> {
            if !present {
                return Ok(Vec::new());
            }
            let mut rng = rng_for(&[seed.global, seed.step, seed.shard, u64::from(r), role_tag]);
            draw(config, positions, &mut rng)
        };
        let evaluators = draw_role(config.variant.has_evaluators(), tag::EVALUATOR_ASSIGNMENT)?;
        let scorers = draw_role(config.variant.has_scorers(), tag::SCORER_ASSIGNMENT)?;
        let split = |flat: &[u32], i: usize| -> Vec<Vec<u32>> {
            if flat.is_empty() {
                return Vec::new();
            }
            (0..l).map(|d| flat[(i * l + d) * n..(i * l + d + 1) * n].to_vec()).collect()
        };
        for (i, plan) in instances.iter_mut().enumerate() {
            plan.rounds.push(RoundAssignment { evaluators: split(&evaluators, i), scorers: split(&scorers, i) });
        }
    }
    Ok(BatchPlan { instances })
}

/// One judge per position; position p belongs to slot `(p / n) % l`, whose solver is that agent.
fn draw(config: &CoMasConfig, positions: usize, rng: &mut ChaCha8Rng) -> Result<Vec<u32>, WorkflowError> {
    let l = config.num_agents as usize;
    let n = config.evals_per_solution as usize;
    let owner = |p: usize| ((p / n) % l) as u32;
    match config.assignment {
        Assignment::IidUniform => Ok((0..positions)
            .map(|p| {
                if config.exclude_self {
                    // Draw among the other l−1 agents and skip over the owner.
                    let a = rng.gen_range(0..config.num_agents - 1);
                    if a >= owner(p) {
                        a + 1
                    } else {
                        a
                    }
                } else {
                    rng.gen_range(0..config.num_agents)
                }
            })
            .collect()),
        Assignment::Balanced => {
            let per_agent = positions / l;
            let mut list: Vec<u32> = (0..config.num_agents).flat_map(|a| std::iter::repeat_n(a, per_agent)).collect();
            list.shuffle(rng);
            if config.exclude_self {
                repair_self_judging(&mut list, owner, rng)?;
            }
            Ok(list)
        }
    }
}

/// Moves every agent that landed on its own slot by swapping with a position j where neither side
/// becomes self-judging. Such a j always exists when every agent owns and fills the same number of
/// positions and l ≥ 2: if agent a filled no foreign-owned position, the a-owned positions would
/// have to hold all (l−1)·k foreign ids plus a itself, more than the k they have. A swap never
/// creates a new self-judging position, so one pass suffices and the counts stay balanced.
fn repair_self_judging(list: &mut [u32], owner: impl Fn(usize) -> u32, rng: &mut ChaCha8Rng) -> Result<(), WorkflowError> {
    let len = list.len();
    for i in 0..len {
        let a = list[i];
        if a != owner(i) {
            continue;
        }
        let fits = |j: usize, list: &[u32]| list[j] != a && owner(j) != a;
        // A few random probes almost always succeed; the scan keeps the worst case bounded.
        let mut pick = (0..64).map(|_| rng.gen_range(0..len)).find(|&j| fits(j, list));
        if pick.is_none() {
            let candidates: Vec<usize> = (0..len).filter(|&j| fits(j, list)).collect();
            pick = candidates.choose(rng).copied();
        }
        let j = pick.ok_or_else(|| WorkflowError::PlanMismatch(format!("no way to keep agent {a} from judging its own solution")))?;
        list.swap(i, j);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comas::config::Variant;

    fn counts(plan: &BatchPlan, l: u32, r: usize, evaluators: bool) -> Vec<usize> {
        let mut c = vec![0; l as usize];
        for inst in &plan.instances {
            let judges = if evaluators { &inst.rounds[r].evaluators } else { &inst.rounds[r].scorers };
            for a in judges.iter().flatten() {
                c[*a as usize] += 1;
            }
        }
        c
    }

    #[test]
    fn balanced_counts_per_round_and_role() {
        let cfg = CoMasConfig::default();
        let plan = plan_batch(&cfg, 12, PlanSeed { global: 1, step: 3, shard: 0 }).unwrap();
        assert_eq!(plan.instances.len(), 12);
        for r in 0..2 {
            assert_eq!(counts(&plan, 4, r, true), vec![12; 4]);
            assert_eq!(counts(&plan, 4, r, false), vec![12; 4]);
        }
        plan.instances.iter().for_each(|p| p.check(&cfg).unwrap());
    }

    #[test]
    fn balanced_with_several_judges_and_exclude_self() {
        let cfg = CoMasConfig { num_agents: 3, evals_per_solution: 2, exclude_self: true, ..Default::default() };
        for step in 0..20 {
            let plan = plan_batch(&cfg, 5, PlanSeed { global: 9, step, shard: 0 }).unwrap();
            for r in 0..2 {
                assert_eq!(counts(&plan, 3, r, true), vec![10; 3]);
                assert_eq!(counts(&plan, 3, r, false), vec![10; 3]);
            }
            for inst in &plan.instances {
                inst.check(&cfg).unwrap();
                for round in &inst.rounds {
                    for (d, judges) in round.evaluators.iter().chain(&round.scorers).enumerate() {
                        assert!(!judges.contains(&((d % 3) as u32)));
                    }
                }
            }
        }
    }

    #[test]
    fn two_agents_exclude_self_forces_the_other_agent() {
        let cfg = CoMasConfig { num_agents: 2, exclude_self: true, ..Default::default() };
        let plan = plan_batch(&cfg, 7, PlanSeed::default()).unwrap();
        for inst in &plan.instances {
            for round in &inst.rounds {
                assert_eq!(round.evaluators, vec![vec![1], vec![0]]);
                assert_eq!(round.scorers, vec![vec![1], vec![0]]);
            }
        }
    }

    #[test]
    fn iid_uniform_respects_exclude_self() {
        let cfg = CoMasConfig { assignment: Assignment::IidUniform, exclude_self: true, ..Default::default() };
        let plan = plan_batch(&cfg, 50, PlanSeed { global: 5, step: 0, shard: 0 }).unwrap();
        let mut seen = [false; 4];
        for inst in &plan.instances {
            inst.check(&cfg).unwrap();
            for round in &inst.rounds {
                for (d, judges) in round.evaluators.iter().enumerate() {
                    assert_ne!(judges[0], d as u32);
                    seen[judges[0] as usize] = true;
                }
            }
        }
        assert_eq!(seen, [true; 4]);
    }

    #[test]
    fn seeding_is_reproducible_and_sensitive() {
        let cfg = CoMasConfig::default();
        let s = PlanSeed { global: 42, step: 7, shard: 0 };
        let a = plan_batch(&cfg, 16, s).unwrap();
        assert_eq!(a, plan_batch(&cfg, 16, s).unwrap());
        assert_ne!(a, plan_batch(&cfg, 16, PlanSeed { step: 8, ..s }).unwrap());
        assert_ne!(a, plan_batch(&cfg, 16, PlanSeed { global: 43, ..s }).unwrap());
        assert_ne!(a, plan_batch(&cfg, 16, PlanSeed { shard: 1, ..s }).unwrap());
        // Round and role streams are independent draws, not copies of each other.
        let first = &a.instances;
        let ev0: Vec<_> = first.iter().map(|p| p.rounds[0].evaluators.clone()).collect();
        let ev1: Vec<_> = first.iter().map(|p| p.rounds[1].evaluators.clone()).collect();
        let sc0: Vec<_> = first.iter().map(|p| p.rounds[0].scorers.clone()).collect();
        assert_ne!(ev0, ev1);
        assert_ne!(ev0, sc0);
    }

    #[test]
    fn variants_plan_only_their_roles() {
        let cfg = CoMasConfig { variant: Variant::NoScoring, evals_per_solution: 2, ..Default::default() };
        let plan = plan_batch(&cfg, 2, PlanSeed::default()).unwrap();
        assert_eq!(plan.instances[0].rounds[0].evaluators.len(), 4);
        assert!(plan.instances[0].rounds[0].scorers.is_empty());
        let cfg = CoMasConfig { variant: Variant::NoEvaluation { judge_reward: Default::default() }, ..Default::default() };
        let plan = plan_batch(&cfg, 2, PlanSeed::default()).unwrap();
        assert!(plan.instances[0].rounds[0].evaluators.is_empty());
        assert_eq!(plan.instances[0].rounds[1].scorers.len(), 4);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let bad = CoMasConfig { num_agents: 0, ..Default::default() };
        assert!(matches!(plan_batch(&bad, 1, PlanSeed::default()), Err(WorkflowError::Config(_))));
        assert_eq!(plan_batch(&CoMasConfig::default(), 0, PlanSeed::default()).unwrap().instances.len(), 0);
        assert!(matches!(plan_batch(&CoMasConfig::default(), usize::MAX, PlanSeed::default()), Err(WorkflowError::BatchTooLarge(_))));
        let cfg = CoMasConfig::default();
        let mut plan = plan_batch(&cfg, 1, PlanSeed::default()).unwrap().instances.remove(0);
        plan.rounds[1].scorers[2] = vec![4];
        assert_eq!(
            plan.check(&cfg).unwrap_err().to_string(),
            "assignment plan does not fit the config: round 1 slot 2: agent 4 among the scorers does not exist"
        );
        plan.rounds.pop();
        assert!(matches!(plan.check(&cfg), Err(WorkflowError::PlanMismatch(_))));
    }
}
