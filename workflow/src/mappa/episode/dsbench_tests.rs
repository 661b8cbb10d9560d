use super::*;
use crate::task::TaskKind;
use crate::turn::FinishReason;

fn task() -> TaskRecord {
    let files = [
        ("train.csv".to_string(), "id,x,y\n1,0.1,0\n2,0.9,1\n".to_string()),
        ("test.csv".to_string(), "id,x\n3,0.2\n4,0.8\n".to_string()),
    ];
    TaskRecord {
        prompt: "Predict y. Submissions are evaluated on accuracy.".into(),
        answer: "id,y\n3,0\n4,1\n".into(),
        task: TaskKind::DataScience,
        id: "toy".into(),
        source: None,
        files: files.into_iter().collect(),
    }
}

fn act(e: &mut Episode, text: &str) -> TurnRequest {
    let p = e.pending().to_vec();
    let Request::Turn(t) = &p[0] else { panic!("expected a turn, got {p:?}") };
    let out = TurnOutput {
        turn_index: t.turn_index,
        text: text.into(),
        raw_text: text.into(),
        prompt_ids: vec![1, 2],
        completion_ids: vec![7, 8],
        logprobs: vec![-0.5, -0.5],
        finish_reason: FinishReason::Stop,
        policy_version: 0,
        constrained: Vec::new(),
    };
    e.submit(vec![Reply::Turn(out)]).unwrap();
    t.clone()
}

/// Answers the pending run with `stdout` and the files it "saved"; returns the request.
fn run(e: &mut Episode, stdout: &str, saved: &[(&str, &str)]) -> ToolRequest {
    let p = e.pending().to_vec();
    let Request::Tool(t) = &p[0] else { panic!("expected a tool call, got {p:?}") };
    let files = saved
        .iter()
        .map(|(n, b)| WorkspaceFile { name: n.to_string(), bytes: b.as_bytes().to_vec() })
        .collect();
    let r = ToolResult {
        call_index: t.call_index,
        failure: None,
        detail: String::new(),
        stdout: stdout.into(),
        stderr: String::new(),
        files,
    };
    e.submit(vec![Reply::Tool(r)]).unwrap();
    t.clone()
}

fn names(r: &ToolRequest) -> Vec<&str> {
    r.files.iter().map(|f| f.name.as_str()).collect()
}

#[test]
fn the_workspace_travels_down_the_chain_and_the_analysts_coach_sees_the_metrics() {
    let config = MappaConfig {
        pipeline: Pipeline::DsBench,
        max_turns: vec![2, 1, 1],
        tool_timeout_secs: 60.0,
        ..MappaConfig::default()
    };
    let mut e = Episode::new(&config, &task(), 0, 5).unwrap();
    // Data Engineer: the task's files are there; its run saves the features.
    let t = act(&mut e, "<think>plan</think>```python\nprint('prep')\n```");
    assert_eq!(t.role, Role::DataEngineer);
    assert!(t.messages[0].content.contains("  - test.csv\n  - train.csv"));
    let r = run(
        &mut e,
        "---PREPROCESSING_SUMMARY---\n2 rows, 1 feature\n---END_SUMMARY---\n",
        &[("X_train.pkl", "a"), ("y_train.pkl", "b"), ("X_test.pkl", "c")],
    );
    assert_eq!(
        (names(&r), r.fetch.clone(), r.timeout_secs),
        (
            vec!["test.csv", "train.csv"],
            vec!["*.pkl".to_string(), "*.joblib".into(), "*.npy".into(), "*.npz".into()],
            60.0
        )
    );
    act(&mut e, "<think>ok</think>Saved the features.");
    // Modeler: the features and the summary reach it, and the hand-off without its thinking.
    let t = act(&mut e, "```python\nprint('fit')\n```");
    assert_eq!(t.role, Role::Modeler);
    let prompt = &t.messages[0].content;
    assert!(
        prompt.contains("  - X_test.pkl")
            && prompt.contains("2 rows, 1 feature")
            && prompt.contains("last message\nSaved the features."),
        "{prompt}"
    );
    let r = run(
        &mut e,
        "---MODEL_SUMMARY---\nlogistic, cv 0.9\n---END_SUMMARY---",
        &[("model.pkl", "m")],
    );
    assert_eq!(
        names(&r),
        vec!["X_test.pkl", "X_train.pkl", "test.csv", "train.csv", "y_train.pkl"]
    );
    // Analyst: both files there (no warning); it writes the submission.
    let t = act(&mut e, "```python\nprint('predict')\n```");
    assert!(
        !t.messages[0].content.contains("WARNING")
            && t.messages[0].content.contains("logistic, cv 0.9")
    );
    let r = run(&mut e, "2 predictions", &[("submission.csv", "id,y\n3,0\n4,0\n")]);
    assert_eq!(r.fetch, vec!["submission.csv".to_string(), "predictions.csv".into()]);
    // The coach scores all four actions; only the Analyst's coach reads the metrics.
    let p = e.pending().to_vec();
    assert_eq!(p.len(), 4);
    let coach_prompt = |i: usize| match &p[i] {
        Request::Turn(t) => t.messages[0].content.clone(),
        Request::Tool(_) => panic!("coach turns only"),
    };
    let analyst = coach_prompt(3);
    assert!(
        analyst.contains("Score one action of the analyst")
            && analyst.contains("  - Accuracy: 0.5000"),
        "{analyst}"
    );
    assert!(analyst.contains("## Files saved by earlier agents\n  - X_test.pkl"), "{analyst}");
    assert!(coach_prompt(0).contains("## Computed metrics\nN/A"));
    let replies = p.iter().map(|r| match r {
        Request::Turn(t) => Reply::Turn(TurnOutput {
            turn_index: t.turn_index,
            text: "PROCESS_SCORE: 7".into(),
            raw_text: String::new(),
            prompt_ids: vec![1],
            completion_ids: vec![2],
            logprobs: vec![-0.1],
            finish_reason: FinishReason::Stop,
            policy_version: 0,
            constrained: Vec::new(),
        }),
        Request::Tool(_) => unreachable!(),
    });
    e.submit(replies.collect()).unwrap();
    let t = e.into_trajectory().unwrap();
    let o = t.ds_outcome.as_ref().unwrap();
    assert!(
        o.success && o.metrics["accuracy"] == 0.5 && o.task_metric.as_deref() == Some("accuracy")
    );
    assert_eq!(
        t.actions.iter().map(|a| a.role).collect::<Vec<_>>(),
        vec![Role::DataEngineer, Role::DataEngineer, Role::Modeler, Role::Analyst]
    );
    assert_eq!(t.actions[3].workspace.len(), 6);
    assert!(t.actions.iter().all(|a| a.coach.process_score == Some(7.0)));
    let m = crate::mappa::MappaMetrics::of(&config, &[&t]);
    assert_eq!((m.ds_success_rate.mean, m.ds_metrics["accuracy"].mean), (Some(1.0), Some(0.5)));
    assert_eq!(m.coach_score_by_task_type["classification/data_engineer"].count, 2);
    assert_eq!(m.coach_score_by_task_type["classification/analyst"].mean, Some(7.0));
}
