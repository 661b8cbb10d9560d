use super::*;
use crate::mappa::reward::{action_rewards, MappaMetrics};
use crate::task::TaskKind;
use crate::turn::FinishReason;

fn question() -> TaskRecord {
    TaskRecord {
        prompt: "What is 2+2?".into(),
        answer: "4".into(),
        task: TaskKind::Math,
        id: "q1".into(),
        source: None,
        files: Default::default(),
    }
}

fn reply(r: &Request, text: &str) -> Reply {
    let Request::Turn(t) = r else { panic!("expected a turn, got {r:?}") };
    Reply::Turn(TurnOutput {
        turn_index: t.turn_index,
        text: text.into(),
        raw_text: text.into(),
        prompt_ids: vec![1, 2, 3],
        completion_ids: vec![7; text.len().min(5)],
        logprobs: vec![-0.5; text.len().min(5)],
        finish_reason: FinishReason::Stop,
        policy_version: 0,
        constrained: Vec::new(),
    })
}

fn tool(r: &Request, stdout: &str, failure: Option<&str>) -> Reply {
    let Request::Tool(t) = r else { panic!("expected a tool call, got {r:?}") };
    Reply::Tool(ToolResult {
        call_index: t.call_index,
        failure: failure.map(str::to_string),
        detail: failure.unwrap_or("").into(),
        stdout: stdout.into(),
        stderr: String::new(),
        files: Vec::new(),
    })
}

fn turn(r: &Request) -> &TurnRequest {
    match r {
        Request::Turn(t) => t,
        Request::Tool(_) => panic!("expected a turn"),
    }
}

#[test]
fn a_mathchat_chain_runs_tools_grows_contexts_and_is_coached() {
    let config = MappaConfig::default();
    let mut e = Episode::new(&config, &question(), 0, 9).unwrap();
    // Problem Solver: one action, no tools.
    let p = e.pending().to_vec();
    assert_eq!((p.len(), turn(&p[0]).role, turn(&p[0]).agent), (1, Role::ProblemSolver, 0));
    e.submit(vec![reply(&p[0], "2+2 is 4.")]).unwrap();
    // Code Executor, action 0: its prompt quotes the solution; its code becomes a tool call.
    let p = e.pending().to_vec();
    let first = turn(&p[0]).clone();
    assert_eq!((first.role, first.agent, first.messages.len()), (Role::CodeExecutor, 1, 1));
    assert!(first.messages[0].content.contains("2+2 is 4."));
    e.submit(vec![reply(&p[0], "Check:\n```python\nprint(2+2)\n```")]).unwrap();
    let p = e.pending().to_vec();
    assert_eq!(
        p,
        vec![Request::Tool(ToolRequest {
            call_index: 0,
            code: "print(2+2)\n".into(),
            timeout_secs: 30.0,
            files: Vec::new(),
            fetch: Vec::new()
        })]
    );
    e.submit(vec![tool(&p[0], "4\n", None)]).unwrap();
    // Action 1 continues the same context, grown by exactly the action and its observation.
    let p = e.pending().to_vec();
    let second = turn(&p[0]).clone();
    assert_eq!(second.round, 1);
    assert_eq!(second.messages[..1], first.messages[..]);
    assert_eq!(
        second.messages[1..],
        [
            ChatMessage {
                role: "assistant".into(),
                content: "Check:\n```python\nprint(2+2)\n```".into()
            },
            ChatMessage::user("<tool_response>\n4\n\n</tool_response>")
        ]
    );
    e.submit(vec![reply(&p[0], "The program prints 4.")]).unwrap();
    // Verifier: the hand-off is the final action and the last observation.
    let p = e.pending().to_vec();
    assert_eq!(turn(&p[0]).role, Role::Verifier);
    assert!(turn(&p[0]).messages[0]
        .content
        .contains("The program prints 4.\n\n<tool_response>\n4\n"));
    e.submit(vec![reply(&p[0], "**\\boxed{4}**")]).unwrap();
    // The coach scores all four actions at once; only the Verifier's coach sees the answer.
    let p = e.pending().to_vec();
    assert_eq!(p.len(), 4);
    assert!(p.iter().all(|r| turn(r).agent == config.coach_agent
        && turn(r).role == Role::Coach
        && turn(r).sampling.temperature == 0.0));
    assert!(
        turn(&p[3]).messages[0].content.contains("## Reference answer\n4")
            && turn(&p[3]).messages[0].content.contains("ANSWER_CORRECT")
    );
    assert!(turn(&p[0]).messages[0].content.contains("## Reference answer\nN/A"));
    assert!(turn(&p[1]).messages[0].content.contains("## Tool output\n<tool_response>\n4\n"));
    let replies = vec![
        reply(&p[0], "Fine. PROCESS_SCORE: 7"),
        reply(&p[1], "I like it."),
        reply(&p[2], "PROCESS_SCORE: 9"),
        reply(&p[3], "PROCESS_SCORE: 8\nANSWER_CORRECT: 1"),
    ];
    e.submit(replies).unwrap();
    // One retry, for the reply without a score, quoting it.
    let p = e.pending().to_vec();
    assert_eq!(p.len(), 1);
    let retry = turn(&p[0]);
    assert_eq!(
        (retry.slot, retry.messages.len(), retry.messages[1].content.as_str()),
        (1, 3, "I like it.")
    );
    e.submit(vec![reply(&p[0], "Still no number.")]).unwrap();
    assert!(e.is_done() && e.pending().is_empty());
    let t = e.into_trajectory().unwrap();
    assert_eq!(t.actions.len(), 4);
    assert_eq!(t.outcome_correct, Some(true));
    assert_eq!(t.actions[1].tool_runs, vec![None]);
    assert!(t.actions[1].coach.retry_attempted && !t.actions[1].coach.fallback_used);
    let rewards: Vec<Option<f64>> = action_rewards(&config, &t)
        .into_iter()
        .map(|r| r.reward.map(|v| (v * 1e9).round() / 1e9))
        .collect();
    // Worked example: R = 1 · 0.1 · score + 0 · outcome; the unscored action gets none.
    assert_eq!(rewards, vec![Some(0.7), None, Some(0.9), Some(0.8)]);
    let m = MappaMetrics::of(&config, &[&t]);
    assert_eq!(
        (m.samples, m.samples_dropped, m.tool_calls, m.coach_retries, m.coach_fallbacks),
        (3, 1, 1, 1, 0)
    );
    assert_eq!(m.coach_score["code_executor"].mean, Some(9.0));
    assert_eq!(m.actions["code_executor"].mean, Some(2.0));
    assert_eq!((m.outcome_accuracy.mean, m.coach_agreement.mean), (Some(1.0), Some(1.0)));
}

#[test]
fn failed_runs_and_the_legacy_fallback_are_recorded() {
    let config = MappaConfig {
        coach_fallback: CoachFallback::Legacy,
        max_turns: vec![1, 1, 1],
        ..MappaConfig::default()
    };
    let mut e = Episode::new(&config, &question(), 0, 1).unwrap();
    let p = e.pending().to_vec();
    e.submit(vec![reply(&p[0], "maybe 5")]).unwrap();
    let p = e.pending().to_vec();
    e.submit(vec![reply(
        &p[0],
        "```python\nwhile True: pass\n```\n```python\nimport os\nos.fork()\n```",
    )])
    .unwrap();
    let p = e.pending().to_vec();
    assert_eq!(p.len(), 2);
    // Replies may come in any order; a partial group is refused and changes nothing.
    assert!(
        matches!(e.submit(vec![tool(&p[1], "", Some("process_limit"))]), Err(WorkflowError::MissingTurns(m)) if m == vec![0])
    );
    e.submit(vec![tool(&p[1], "", Some("process_limit")), tool(&p[0], "", Some("timeout"))])
        .unwrap();
    // max_turns 1: the Executor's slot ends after the tools ran; the Verifier is next.
    let p = e.pending().to_vec();
    assert_eq!(turn(&p[0]).role, Role::Verifier);
    assert!(turn(&p[0]).messages[0]
        .content
        .contains("[Execution failed: timeout]\n------\n[Execution failed: process_limit]"));
    e.submit(vec![reply(&p[0], "\\boxed{5}")]).unwrap();
    let p = e.pending().to_vec();
    e.submit(p.iter().map(|r| reply(r, "no verdict")).collect()).unwrap();
    let p = e.pending().to_vec();
    e.submit(p.iter().map(|r| reply(r, "hmm, 6 maybe")).collect()).unwrap();
    let t = e.into_trajectory().unwrap();
    assert_eq!(t.outcome_correct, Some(false));
    assert!(t.actions.iter().all(|a| a.coach.fallback_used && a.coach.process_score == Some(6.0)));
    let m = MappaMetrics::of(&config, &[&t]);
    assert_eq!(
        m.sandbox_failures,
        [("process_limit".to_string(), 1), ("timeout".to_string(), 1)].into_iter().collect()
    );
    assert_eq!((m.tool_success_rate.mean, m.coach_fallbacks, m.samples), (Some(0.0), 3, 3));
}
