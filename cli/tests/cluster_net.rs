//! The emulated cluster (issue 45): the coordinator, each learner and each worker in a network
//! namespace of its own, joined by a bridge, every link shaped, mutual TLS on, services reaching
//! each other by their namespace addresses as pods do. A job ends exact across it, and network
//! faults (cut links, partitions, loss, a throttled link) change nothing in its result.
//! Needs root and iptables (`scripts/setup-netns.sh`).
mod harness;
use harness::netns::Shape;
use harness::*;
use std::time::{Duration, Instant};

const GIGABIT: Shape = Shape { rate_mbit: 1000.0 };

/// A job across namespaces behind 1 Gbit/s links: exact counts, and every broadcast crossed the
/// links as a chain does: each worker received all of it, each learner sent its agent's bytes
/// about once (not once per worker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_job_across_namespaces_ends_exact_and_each_byte_leaves_its_learner_once() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::build_on_net(
        dir.path(),
        2,
        8,
        STEPS,
        &["--max-episodes", "3"],
        &[],
        Some(GIGABIT),
    );
    let id = c.submit().await;
    c.finished(&id).await;
    c.check_complete_run().await;
    let net = c.net.as_ref().unwrap();
    let log = c.metrics_log();
    // `bytes`: pulled by all workers; `learner_bytes`: sent by the learner itself.
    let sum = |k: usize, key: &str| -> u64 {
        log.iter().map(|m| m["agents"][k]["weight_sync"][key].as_u64().unwrap()).sum()
    };
    let workers = 2;
    let one_copy = |k: usize| sum(k, "bytes") / workers;
    let figures: Vec<String> = net
        .hosts
        .iter()
        .map(|h| {
            let (tx, rx) = net.bytes(&h.name);
            format!("{} tx {tx} rx {rx}", h.name)
        })
        .collect();
    eprintln!("one copy {} + {} bytes; links: {figures:?}", one_copy(0), one_copy(1));
    for w in ["worker-0", "worker-1"] {
        let (_, rx) = net.bytes(w);
        let all = one_copy(0) + one_copy(1);
        assert!(rx >= all, "{w} received {rx} bytes, less than one copy ({all}): {figures:?}");
    }
    for k in 0..2 {
        let (tx, _) = net.bytes(&format!("learner-{k}"));
        assert_eq!(sum(k, "learner_bytes"), one_copy(k), "learner-{k} sent one copy by its count");
        // Two copies would be 2x; TLS, gRPC framing and the training replies are the rest.
        assert!(
            tx >= one_copy(k) && tx < one_copy(k) * 5 / 4,
            "learner-{k} sent {tx} bytes on its link for one copy of {}: {figures:?}",
            one_copy(k)
        );
    }
}

/// A delayed link holds every frame its delay each way, and `heal` takes the line out again: a
/// one-byte echo between two namespaces, before, during and after 300 ms on one side's link.
#[test]
fn a_delayed_link_adds_its_delay_each_way_and_heal_removes_it() {
    use harness::delay_line::in_namespace;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    let net = harness::netns::Net::new(&["a", "b"], None);
    let at = (net.ip("a").to_string(), 7000);
    let listener = in_namespace(net.ns_of("a").unwrap(), || TcpListener::bind(&at).unwrap());
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let mut byte = [0u8; 1];
            while s.read_exact(&mut byte).is_ok() && s.write_all(&byte).is_ok() {}
        }
    });
    // The median of five echoes on one connection (opened first, so no handshake counts).
    let echo = || {
        in_namespace(net.ns_of("b").unwrap(), || {
            let mut s = TcpStream::connect(&at).unwrap();
            s.set_nodelay(true).unwrap();
            let mut times: Vec<Duration> = (0..5)
                .map(|_| {
                    let t = Instant::now();
                    s.write_all(b"x").unwrap();
                    s.read_exact(&mut [0u8; 1]).unwrap();
                    t.elapsed()
                })
                .collect();
            times.sort();
            times[2]
        })
    };
    let before = echo();
    net.delay("a", Duration::from_millis(300));
    let during = echo();
    net.heal("a");
    let after = echo();
    eprintln!("echo before {before:?}, with 300 ms each way {during:?}, healed {after:?}");
    assert!(during >= Duration::from_millis(600), "{during:?}");
    // Healed, no frame waits on a line: far under one delay even on busy cores.
    assert!(before < Duration::from_millis(300) && after < Duration::from_millis(300));
}

/// Network faults during a 12-step job of two agents and three workers, each at a stage of the job
/// where it hurts: a worker cut off from everyone during a rollout, a worker cut off from the
/// coordinator only, a learner cut off during training and another during the broadcast, then for
/// 30 s a learner's link throttled to 1 Mbit/s with 5 % loss on a worker's and a learner's links,
/// and in that time a relay worker cut off in the middle of a broadcast, then 300 ms added each way
/// on a learner's and a worker's links through a training and a broadcast. The job completes with
/// the exact counts, every turn on its step's version, and final weights byte-identical to an
/// undisturbed run. (One episode per worker at a time, as in the kill test, so that no batch
/// differs between the runs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_faults_change_nothing_in_the_result() {
    const FAULT_STEPS: u64 = 12;
    let flags = ["--max-episodes", "1"];
    let calm_dir = tempfile::tempdir().unwrap();
    // Undisturbed, on the same network (this binary's clients all speak TLS).
    let calm =
        Cluster::build_on_net(calm_dir.path(), 3, 40, FAULT_STEPS, &flags, &[], Some(GIGABIT));
    let id = calm.submit().await;
    calm.finished(&id).await;
    calm.check_complete_run().await;
    drop(calm);

    let dir = tempfile::tempdir().unwrap();
    // Each result a second late, so that the job outlasts the faults (it changes when results
    // come, not what they hold).
    let slow = [("COMAS_WORKER_FAULT", "slow-result:1000")];
    let c = Cluster::build_on_net(dir.path(), 3, 40, FAULT_STEPS, &flags, &slow, Some(GIGABIT));
    let net = c.net.as_ref().unwrap();
    let id = c.submit().await;
    // Every worker holds the job's policies before the first fault, so that each cut hits one
    // the coordinator counts on.
    c.ready_workers(3).await;
    let started = Instant::now();
    let mut done = Vec::new();
    let mut log = |what: &str, step: u64| {
        done.push(format!("{what} in step {step} at {:.1}s", started.elapsed().as_secs_f64()))
    };
    // The next time the job enters `stage` (of whichever step).
    let next = |stage: &'static str| {
        let c = &c;
        let id = id.clone();
        async move {
            let seen_other = std::cell::Cell::new(false);
            let st = c
                .on_event(&id, 300, stage, move |s| {
                    seen_other.set(seen_other.get() || s.stage != stage);
                    seen_other.get() && s.stage == stage
                })
                .await;
            st.steps_done
        }
    };
    // Longer than the coordinator's heartbeat timeout (5 s in the harness).
    let hold = Duration::from_secs(7);

    let step = next("rollout").await;
    net.cut("worker-0");
    tokio::time::sleep(hold).await;
    net.heal("worker-0");
    log("worker-0 cut off from everyone during the rollout", step);

    let step = next("rollout").await;
    net.partition("worker-1", "coordinator");
    tokio::time::sleep(hold).await;
    net.heal("worker-1");
    log("worker-1 cut off from the coordinator during the rollout", step);

    let step = next("train").await;
    net.cut("learner-0");
    tokio::time::sleep(hold).await;
    net.heal("learner-0");
    log("learner-0 cut off during training", step);

    let step = next("broadcast").await;
    net.cut("learner-1");
    tokio::time::sleep(hold).await;
    net.heal("learner-1");
    log("learner-1 cut off during the broadcast", step);

    // A broadcast from learner-1 now takes seconds: worker-0 is cut off in the middle of it.
    let throttled = Instant::now();
    net.shape("learner-1", Shape { rate_mbit: 1.0 });
    net.lose("worker-2", 5.0);
    net.lose("learner-0", 5.0);
    let step = next("broadcast").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    net.cut("worker-0");
    tokio::time::sleep(hold).await;
    net.heal("worker-0");
    log("worker-0 cut off in the middle of a 1 Mbit/s broadcast", step);
    tokio::time::sleep(Duration::from_secs(30).saturating_sub(throttled.elapsed())).await;
    for name in ["worker-2", "learner-0", "learner-1"] {
        net.heal(name);
    }
    log(
        "30 s of 5 % loss and a 1 Mbit/s learner link ended",
        c.status(&id).await.unwrap().steps_done,
    );

    // 300 ms each way on a learner's and a worker's links, through a training and a broadcast.
    for name in ["learner-0", "worker-1"] {
        net.delay(name, Duration::from_millis(300));
    }
    next("train").await;
    let step = next("broadcast").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for name in ["learner-0", "worker-1"] {
        net.heal(name);
    }
    log(
        "300 ms each way on learner-0's and worker-1's links through a training and a broadcast",
        step,
    );

    eprintln!("faults: {done:?}");
    c.finished_within(&id, 600).await;
    c.check_complete_run().await;
    // The faults were felt: each cut-off worker was given up for its silence (with its episode
    // requeued, or idle) and registered again once its link came back.
    let coordinator = std::fs::read_to_string(dir.path().join("coordinator.log")).unwrap();
    let count = |pred: &dyn Fn(&str) -> bool| coordinator.lines().filter(|l| pred(l)).count();
    let silent =
        count(&|l| l.contains("no heartbeat") && (l.contains("lost") || l.contains("left")));
    let registered = count(&|l| l.contains("worker registered"));
    eprintln!("workers given up for silence: {silent}; registrations: {registered}");
    assert!(
        silent >= 3 && registered >= 3 + silent,
        "{silent} workers given up, {registered} registrations, for three cuts: {done:?}"
    );
    c.assert_final_weights_equal(calm_dir.path(), &done);
}
