use super::*;

#[test]
fn agents_reward_means_pool_by_samples_when_no_role_has_a_reward() {
    let rec = serde_json::json!({"agents": [{"reward_mean": 0.5, "samples": 4}, {"reward_mean": 0.0, "samples": 12}, {"reward_mean": null, "samples": 0}]});
    assert_eq!(
        team_rewards(&rec).into_iter().collect::<Vec<_>>(),
        vec![("all".to_string(), (0.125, 16.0))]
    );
    assert_eq!(team_mean(&rec), Some(0.125));
    // A record with rewards by role keeps them.
    let roles = serde_json::json!({"reward": {"solver": {"mean": 1.0, "count": 2}}, "agents": [{"reward_mean": 0.5, "samples": 4}]});
    assert_eq!(team_rewards(&roles).into_keys().collect::<Vec<_>>(), vec!["solver".to_string()]);
}
