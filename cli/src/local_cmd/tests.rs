use super::*;

#[test]
fn neuromas_adapters_share_learners_and_other_agents_get_their_own() {
    let job = |method: &str, second: &str| {
        format!("method = \"{method}\"\n[[agents]]\nmodel = \"m\"\n[agents.train.lora]\nr = 2\n[[agents]]\nmodel = \"m\"\n[agents.train.lora]\nr = 2\n[[agents]]\nmodel = \"{second}\"\n[agents.train.lora]\nr = 2\n")
    };
    assert_eq!(learner_groups(&job("neuromas", "m"), 1).unwrap(), vec![vec![0, 1, 2]]);
    assert_eq!(learner_groups(&job("neuromas", "m"), 2).unwrap(), vec![vec![0, 2], vec![1]]);
    assert_eq!(learner_groups(&job("neuromas", "m"), 9).unwrap(), vec![vec![0], vec![1], vec![2]]);
    // Another base, or another method: one learner per agent.
    assert_eq!(
        learner_groups(&job("neuromas", "other"), 1).unwrap(),
        vec![vec![0], vec![1], vec![2]]
    );
    assert_eq!(learner_groups(&job("comas", "m"), 1).unwrap(), vec![vec![0], vec![1], vec![2]]);
    let addresses: Vec<String> = ["a", "b", "a"].iter().map(|s| s.to_string()).collect();
    assert_eq!(groups_by_address(&addresses), vec![vec![0, 2], vec![1]]);
}

#[test]
fn patching_makes_paths_absolute_and_sets_learners() {
    let out = patch_job(
        examples::TINY_JOB,
        Path::new("/x"),
        &["http://127.0.0.1:1".into(), "http://127.0.0.1:2".into()],
    )
    .unwrap();
    let spec = comas_workflow::job::JobSpec::from_toml(&out).unwrap();
    assert!(spec.relative_paths().is_empty());
    assert_eq!(spec.agents[1].model, PathBuf::from("/x/model-b"));
    assert_eq!(spec.agents[1].learner.as_deref(), Some("http://127.0.0.1:2"));
    assert_eq!(spec.data.train, PathBuf::from("/x/train.jsonl"));
    assert_eq!(spec.eval.unwrap().data, PathBuf::from("/x/test.jsonl"));
}
