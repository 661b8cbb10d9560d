//! The scheduler actor with fake connections: each registered worker's messages are kept here
//! instead of going to a gRPC stream, and the test plays the worker's side (prepared, results,
//! lost) by sending the actor the commands a connection task would.
use super::*;
use comas_workflow::grpo::{Answer, Grader, GrpoConfig, GrpoRecord};
use comas_workflow::task::{TaskKind, TaskRecord};
use comas_workflow::turn::{FinishReason, Sampled};
use std::sync::Mutex;

/// The messages each fake connection got, by worker id (the newest connection's).
type Inbox = Arc<Mutex<HashMap<String, mpsc::UnboundedReceiver<WorkerMsg>>>>;

fn settings() -> SchedulerSettings {
    SchedulerSettings {
        heartbeat_timeout: Duration::from_secs(3600),
        episode_timeout: Duration::from_secs(3600),
        worker_wait: Duration::from_secs(3600),
        relay_fanout: 1,
    }
}

fn actor() -> (State, Inbox) {
    let inbox: Inbox = Arc::default();
    let keep = Arc::clone(&inbox);
    let connect: Connect = Arc::new(move |id, _conn, _address, rx, _me| {
        keep.lock().unwrap().insert(id, rx);
    });
    let (me, _) = mpsc::unbounded_channel();
    (State::new(settings(), Metrics::new(), me, connect), inbox)
}

/// What worker `id` has been sent since the last look: leased episode ids, prepared
/// generations and cancelled episode ids.
fn sent(inbox: &Inbox, id: &str) -> (Vec<String>, Vec<u64>, Vec<String>) {
    let mut inbox = inbox.lock().unwrap();
    let rx = inbox.get_mut(id).expect("a registered worker");
    let (mut leases, mut prepares, mut cancels) = (Vec::new(), Vec::new(), Vec::new());
    while let Ok(m) = rx.try_recv() {
        match m {
            WorkerMsg::Lease(spec) => leases.push(spec.episode_id),
            WorkerMsg::Prepare(t, _) => prepares.push(t.generation),
            WorkerMsg::Cancel(ids) => cancels.extend(ids),
        }
    }
    (leases, prepares, cancels)
}

/// Registers worker `id` (at `http://<id>`, first incarnation) with `capacity` slots.
fn register(s: &mut State, id: &str, capacity: u32) {
    let address = format!("http://{id}");
    s.apply(Cmd::Register { id: id.into(), address, capacity, incarnation: 1 });
}

fn conn_of(s: &State, id: &str) -> u64 {
    s.workers[id].conn
}

fn target(generation: u64) -> Cmd {
    let t = PolicyTarget {
        job_id: "job".into(),
        generation,
        load: pb::LoadPoliciesRequest::default(),
        versions: vec![(0, generation, "http://learner".into())],
        source_patience: Duration::from_secs(1),
    };
    Cmd::SetTarget { target: Arc::new(t) }
}

fn prepared(s: &State, id: &str, generation: u64) -> Cmd {
    Cmd::Prepared {
        id: id.into(),
        conn: conn_of(s, id),
        generation,
        result: Ok(vec![Pull { agent: 0, bytes: 10, seconds: 0.5, relayed: false }]),
    }
}

/// An actor with a target (generation 1) and two workers `w1`, `w2` of `capacity` slots each,
/// both ready for it.
fn two_ready_workers(capacity: u32) -> (State, Inbox) {
    let (mut s, inbox) = actor();
    s.apply(target(1));
    for id in ["w1", "w2"] {
        register(&mut s, id, capacity);
        s.apply(prepared(&s, id, 1));
    }
    (s, inbox)
}

/// A GRPO record of one agent's answer: what a worker sends back for an episode.
fn record_json() -> String {
    let task = TaskRecord {
        prompt: "1 + 1?".into(),
        answer: "2".into(),
        task: TaskKind::Math,
        id: "q".into(),
        source: None,
        files: Default::default(),
    };
    let sampled = Sampled {
        prompt_ids: vec![1],
        completion_ids: vec![2, 3],
        logprobs: vec![-0.5, -0.5],
        constrained: Vec::new(),
        finish_reason: FinishReason::Stop,
        policy_version: 1,
    };
    let answer = Answer {
        turn_index: 0,
        agent: 0,
        sampled,
        text: "\\boxed{2}".into(),
        passed: None,
        test_failure: None,
    };
    serde_json::to_string(&GrpoRecord {
        task,
        instance: 0,
        grader: Grader::Math,
        answers: vec![answer],
    })
    .unwrap()
}

fn ok(s: &State, id: &str, episode: &str) -> Cmd {
    let result = pb::EpisodeResult {
        episode_id: episode.into(),
        trajectory_json: record_json(),
        ..Default::default()
    };
    Cmd::Result { id: id.into(), conn: conn_of(s, id), result }
}

fn failed(s: &State, id: &str, episode: &str) -> Cmd {
    let result = pb::EpisodeResult {
        episode_id: episode.into(),
        error: "decode failed".into(),
        ..Default::default()
    };
    Cmd::Result { id: id.into(), conn: conn_of(s, id), result }
}

/// A batch of `n` episodes `e0..`; returns what the job receives.
fn submit(s: &mut State, n: usize, limits: BatchLimits) -> mpsc::UnboundedReceiver<Delivery> {
    let (tx, rx) = mpsc::unbounded_channel();
    let specs = (0..n)
        .map(|i| pb::EpisodeSpec {
            episode_id: format!("e{i}"),
            method: "grpo".into(),
            ..Default::default()
        })
        .collect();
    let batch = BatchSpec {
        tag: "step-0".into(),
        first: false,
        specs,
        method: MethodConfig::Grpo(GrpoConfig::default()),
        limits,
        versions: None,
    };
    s.apply(Cmd::Submit { job_id: "job".into(), batch, results: tx });
    rx
}

fn limits() -> BatchLimits {
    BatchLimits { max_attempts: 3, episode_timeout: None, worker_wait: None }
}

/// What the job has been told so far: (done episode ids, failed ones, stalled reasons).
fn told(rx: &mut mpsc::UnboundedReceiver<Delivery>) -> (Vec<String>, Vec<String>, Vec<String>) {
    let (mut done, mut failed, mut stalled) = (Vec::new(), Vec::new(), Vec::new());
    while let Ok(d) = rx.try_recv() {
        match d {
            Delivery::Done { episode_id, .. } => done.push(episode_id),
            Delivery::Failed { episode_id, .. } => failed.push(episode_id),
            Delivery::Stalled { reason } => stalled.push(reason),
        }
    }
    (done, failed, stalled)
}

#[test]
fn episodes_go_to_ready_workers_by_free_slots_and_each_result_counts_once() {
    let (mut s, inbox) = actor();
    register(&mut s, "w1", 2);
    register(&mut s, "w2", 1);
    let mut job = submit(&mut s, 4, limits());
    // No target yet: nobody is ready, nothing is leased.
    assert_eq!((sent(&inbox, "w1").0.len(), s.queue.len()), (0, 4));
    s.apply(target(1));
    assert_eq!(sent(&inbox, "w1"), (vec![], vec![1], vec![]));
    assert_eq!(sent(&inbox, "w2"), (vec![], vec![1], vec![]));
    s.apply(prepared(&s, "w1", 1));
    // The ready worker takes what fits; the other is still pulling.
    assert_eq!(sent(&inbox, "w1").0, ["e0", "e1"]);
    s.apply(prepared(&s, "w2", 1));
    assert_eq!(sent(&inbox, "w2").0, ["e2"]);
    s.apply(ok(&s, "w1", "e0"));
    // The freed slot takes the next episode; the same result again is ignored.
    assert_eq!(sent(&inbox, "w1").0, ["e3"]);
    s.apply(ok(&s, "w1", "e0"));
    for (w, e) in [("w1", "e1"), ("w2", "e2"), ("w1", "e3")] {
        s.apply(ok(&s, w, e));
    }
    let (done, failed, stalled) = told(&mut job);
    assert_eq!(
        (done, failed.len(), stalled.len()),
        (vec!["e0".to_string(), "e1".into(), "e2".into(), "e3".into()], 0, 0)
    );
    assert_eq!((s.metrics.episodes_completed.get(), s.metrics.duplicate_results.get()), (4, 1));
    assert_eq!((s.queue.len(), s.leased), (0, 0));
}

#[test]
fn a_lost_workers_episodes_go_back_to_the_front_in_lease_order() {
    let (mut s, inbox) = actor();
    s.apply(target(1));
    register(&mut s, "w1", 2);
    register(&mut s, "w2", 1);
    s.apply(prepared(&s, "w1", 1));
    let mut job = submit(&mut s, 4, limits());
    assert_eq!(sent(&inbox, "w1").0, ["e0", "e1"]);
    let lost =
        Cmd::Lost { id: "w1".into(), conn: conn_of(&s, "w1"), reason: "stream broke".into() };
    s.apply(lost);
    let mut queue: Vec<&str> = s.queue.iter().map(|l| l.spec.episode_id.as_str()).collect();
    // The two leased together may share a timestamp; either way they lead the queue.
    queue[..2].sort_unstable();
    assert_eq!(queue, ["e0", "e1", "e2", "e3"]);
    // A late joiner is ready once it has pulled; it takes the front of the queue.
    s.apply(prepared(&s, "w2", 1));
    let front = sent(&inbox, "w2").0;
    assert!(front == ["e0"] || front == ["e1"], "{front:?}");
    // A result from the lost connection counts for nothing.
    let stale = pb::EpisodeResult {
        episode_id: "e1".into(),
        trajectory_json: record_json(),
        ..Default::default()
    };
    s.apply(Cmd::Result { id: "w1".into(), conn: 1, result: stale });
    assert!(told(&mut job).0.is_empty());
    assert_eq!(s.metrics.requeued_episodes.get(), 2);
}

#[test]
fn a_failing_episode_is_retried_until_its_attempts_run_out_and_a_malformed_record_is_a_failure() {
    let (mut s, inbox) = actor();
    s.apply(target(1));
    register(&mut s, "w1", 1);
    s.apply(prepared(&s, "w1", 1));
    let mut job = submit(&mut s, 1, BatchLimits { max_attempts: 2, ..limits() });
    assert_eq!(sent(&inbox, "w1").0, ["e0"]);
    s.apply(failed(&s, "w1", "e0"));
    assert_eq!(sent(&inbox, "w1").0, ["e0"], "retried");
    // The second attempt returns a record its method refuses: the last attempt is used up.
    let bad = pb::EpisodeResult {
        episode_id: "e0".into(),
        trajectory_json: "{\"answers\": 3}".into(),
        ..Default::default()
    };
    s.apply(Cmd::Result { id: "w1".into(), conn: conn_of(&s, "w1"), result: bad });
    let (done, failed, _) = told(&mut job);
    assert_eq!((done.len(), failed), (0, vec!["e0".to_string()]));
    assert_eq!(s.metrics.malformed_trajectories.get(), 1);
}

#[test]
fn a_timed_out_lease_is_copied_to_another_worker_and_the_first_result_counts() {
    let (mut s, inbox) = two_ready_workers(1);
    let mut job = submit(
        &mut s,
        1,
        BatchLimits { episode_timeout: Some(Duration::from_millis(1)), ..limits() },
    );
    let first = if sent(&inbox, "w1").0.is_empty() { "w2" } else { "w1" };
    let other = if first == "w1" { "w2" } else { "w1" };
    std::thread::sleep(Duration::from_millis(5));
    s.apply(Cmd::Tick);
    // The copy goes to the other worker, never to the one already running it.
    assert_eq!(sent(&inbox, other).0, ["e0"]);
    s.apply(ok(&s, other, "e0"));
    // The first copy, still running, is cancelled, and its slot is free at once.
    assert_eq!(sent(&inbox, first).2, ["e0"]);
    assert_eq!((s.workers[first].free(), s.metrics.cancelled_leases.get()), (1, 1));
    assert!(sent(&inbox, other).2.is_empty(), "the accepted copy is not cancelled");
    // A result that overtook the cancel counts once, as a duplicate.
    s.apply(ok(&s, first, "e0"));
    assert_eq!(told(&mut job).0, ["e0"]);
    assert_eq!((s.metrics.episodes_completed.get(), s.metrics.duplicate_results.get()), (1, 1));
}

/// A worker's CANCELLED answer to a cancel is expected: neither a failure nor a duplicate.
/// Cancelling a job stops its leases on every worker, frees their slots, and leaves another
/// job's leases alone.
#[test]
fn a_cancelled_job_stops_its_leases_on_every_worker_and_their_answers_are_ignored() {
    let (mut s, inbox) = two_ready_workers(2);
    let mut job = submit(&mut s, 3, limits());
    let (on1, on2) = (sent(&inbox, "w1").0, sent(&inbox, "w2").0);
    assert_eq!(on1.len() + on2.len(), 3);
    // Another job's episode, on whichever worker has room.
    let (tx, _other) = mpsc::unbounded_channel();
    let spec = pb::EpisodeSpec { episode_id: "x0".into(), ..Default::default() };
    let batch = BatchSpec {
        tag: "step-0".into(),
        first: false,
        specs: vec![spec],
        method: MethodConfig::Grpo(GrpoConfig::default()),
        limits: limits(),
        versions: None,
    };
    s.apply(Cmd::Submit { job_id: "other".into(), batch, results: tx });
    let holder = if sent(&inbox, "w1").0 == ["x0"] { "w1" } else { "w2" };
    s.apply(Cmd::CancelJob { job_id: "job".into() });
    let (mut c1, mut c2) = (sent(&inbox, "w1").2, sent(&inbox, "w2").2);
    c1.sort();
    c2.sort();
    assert_eq!((c1, c2), (on1.clone(), on2.clone()));
    assert_eq!(s.metrics.cancelled_leases.get(), 3);
    assert_eq!(s.leased, 1, "the other job's lease stays");
    assert!(s.workers[holder].leased.contains_key("x0"));
    // The workers answer CANCELLED: nothing is retried, failed or counted twice.
    for (w, ids) in [("w1", &on1), ("w2", &on2)] {
        for e in ids {
            let result = pb::EpisodeResult {
                episode_id: e.clone(),
                error: "cancelled by the coordinator".into(),
                error_kind: pb::EpisodeErrorKind::Cancelled as i32,
                ..Default::default()
            };
            s.apply(Cmd::Result { id: w.into(), conn: conn_of(&s, w), result });
        }
    }
    assert_eq!(told(&mut job), (vec![], vec![], vec![]));
    assert_eq!((s.metrics.duplicate_results.get(), s.metrics.requeued_episodes.get()), (0, 0));
    assert!(s.queue.is_empty());
    s.apply(Cmd::Cancelled { stopped: 2, tokens: 40 });
    assert_eq!((s.metrics.cancels_stopped.get(), s.metrics.cancelled_tokens.get()), (2, 40));
}

#[test]
fn queued_episodes_stall_after_their_wait_without_a_ready_worker() {
    let (mut s, _inbox) = actor();
    s.apply(target(1));
    register(&mut s, "w1", 1);
    let failure = Cmd::Prepared {
        id: "w1".into(),
        conn: conn_of(&s, "w1"),
        generation: 1,
        result: Err("LoadPolicies: no such model".into()),
    };
    s.apply(failure);
    let mut job =
        submit(&mut s, 2, BatchLimits { worker_wait: Some(Duration::from_millis(1)), ..limits() });
    std::thread::sleep(Duration::from_millis(5));
    s.apply(Cmd::Tick);
    let (_, _, stalled) = told(&mut job);
    assert_eq!(stalled.len(), 1);
    assert!(
        stalled[0].contains("2 episodes waited")
            && stalled[0].contains("w1 at http://w1: LoadPolicies: no such model"),
        "{stalled:?}"
    );
    assert!(s.queue.is_empty());
}

#[test]
fn a_broadcast_waits_for_every_live_worker_and_fails_when_none_can_take_the_weights() {
    let (mut s, _inbox) = actor();
    for id in ["w1", "w2"] {
        register(&mut s, id, 1);
    }
    s.apply(target(1));
    let (tx, mut rx) = oneshot::channel();
    s.apply(Cmd::WaitPrepared { generation: 1, reply: tx });
    s.apply(prepared(&s, "w1", 1));
    assert!(rx.try_recv().is_err(), "w2 is still pulling");
    s.apply(prepared(&s, "w2", 1));
    let stats = rx.try_recv().unwrap().unwrap();
    assert_eq!(stats.per_agent[&0], AgentSync { bytes: 20, learner_bytes: 20, seconds: 0.5 });
    // Generation 2: both workers fail to pull, so the wait ends with their errors.
    s.apply(target(2));
    let (tx, mut rx) = oneshot::channel();
    s.apply(Cmd::WaitPrepared { generation: 2, reply: tx });
    for id in ["w1", "w2"] {
        s.apply(Cmd::Prepared {
            id: id.into(),
            conn: conn_of(&s, id),
            generation: 2,
            result: Err("UpdateWeights: unreachable".into()),
        });
    }
    let err = rx.try_recv().unwrap().unwrap_err().to_string();
    assert!(
        err.starts_with("no worker could take the new weights")
            && err.contains("http://w1: UpdateWeights: unreachable"),
        "{err}"
    );
}

#[test]
fn a_broadcast_goes_on_without_a_worker_that_failed_or_a_late_joiner_still_loading() {
    let (mut s, _inbox) = two_ready_workers(1);
    // Joins while a target is set: a late joiner, loading generation 1 (then 2).
    register(&mut s, "late", 1);
    s.apply(target(2));
    let (tx, mut rx) = oneshot::channel();
    s.apply(Cmd::WaitPrepared { generation: 2, reply: tx });
    s.apply(prepared(&s, "w1", 2));
    assert!(rx.try_recv().is_err(), "w2 is still pulling");
    // A heartbeat changes nothing of the answer.
    let (reply, _) = oneshot::channel();
    s.apply(Cmd::Heartbeat { id: "w2".into(), draining: false, reply });
    assert!(rx.try_recv().is_err(), "w2 is still pulling");
    s.apply(Cmd::Prepared {
        id: "w2".into(),
        conn: conn_of(&s, "w2"),
        generation: 2,
        result: Err("UpdateWeights: unreachable".into()),
    });
    // w1 has it, w2 failed, the late joiner still loads: the step goes on with w1.
    rx.try_recv().unwrap().unwrap();
    assert_eq!((s.ready, s.open.len()), (1, 1));

    // With nobody ready, a late joiner is waited for.
    let (mut s, _inbox) = actor();
    s.apply(target(1));
    register(&mut s, "late", 1);
    let (tx, mut rx) = oneshot::channel();
    s.apply(Cmd::WaitPrepared { generation: 1, reply: tx });
    assert!(rx.try_recv().is_err(), "the only worker is loading");
    s.apply(prepared(&s, "late", 1));
    rx.try_recv().unwrap().unwrap();
    assert_eq!((s.ready, s.open.len()), (1, 1));
}

#[test]
fn a_restarted_worker_is_a_new_connection_and_its_old_leases_are_requeued() {
    let (mut s, inbox) = actor();
    s.apply(target(1));
    register(&mut s, "w1", 1);
    s.apply(prepared(&s, "w1", 1));
    let _job = submit(&mut s, 1, limits());
    assert_eq!(sent(&inbox, "w1").0, ["e0"]);
    let old = conn_of(&s, "w1");
    s.apply(Cmd::Register {
        id: "w1".into(),
        address: "http://w1".into(),
        capacity: 1,
        incarnation: 2,
    });
    assert_ne!(conn_of(&s, "w1"), old);
    // The new process loads the policies first; the episode waits at the front of the queue.
    assert_eq!(sent(&inbox, "w1"), (vec![], vec![1], vec![]));
    assert_eq!(s.queue.front().map(|l| l.spec.episode_id.as_str()), Some("e0"));
    s.apply(prepared(&s, "w1", 1));
    assert_eq!(sent(&inbox, "w1").0, ["e0"]);
}

#[test]
fn relay_peers_form_a_chain_a_tree_or_nothing() {
    let w: Vec<String> = (0..6).map(|i| format!("w{i}")).collect();
    let names = |f: usize| {
        relay_peers(&w, f)
            .into_iter()
            .map(|p| p.unwrap_or_else(|| "learner".into()))
            .collect::<Vec<_>>()
    };
    assert_eq!(names(1), ["learner", "w0", "w1", "w2", "w3", "w4"]);
    assert_eq!(names(2), ["learner", "w0", "w0", "w1", "w1", "w2"]);
    assert_eq!(names(0), ["learner"; 6]);
    assert!(relay_peers(&[], 1).is_empty());
}

/// A worker that answers CANCELLED for an episode it holds the lease of (it had remembered an
/// older cancel of that id: a cancelled job's episode, leased again when the job resumed) costs
/// the episode no attempt: it is leased again, even with a single attempt allowed.
#[test]
fn a_cancelled_answer_to_a_live_lease_is_leased_again_without_an_attempt() {
    let (mut s, inbox) = two_ready_workers(1);
    let mut job = submit(&mut s, 1, BatchLimits { max_attempts: 1, ..limits() });
    let holder = if sent(&inbox, "w1").0 == ["e0"] { "w1" } else { "w2" };
    let result = pb::EpisodeResult {
        episode_id: "e0".into(),
        error: "cancelled by the coordinator".into(),
        error_kind: pb::EpisodeErrorKind::Cancelled as i32,
        ..Default::default()
    };
    s.apply(Cmd::Result { id: holder.into(), conn: conn_of(&s, holder), result });
    assert_eq!(told(&mut job), (vec![], vec![], vec![]), "not failed");
    assert_eq!((s.leased, s.metrics.requeued_episodes.get()), (1, 1), "leased again");
    s.apply(ok(&s, holder, "e0"));
    assert_eq!(told(&mut job).0, ["e0"]);
}
