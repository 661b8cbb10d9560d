//! The coordinator under many workers. A real coordinator and a real learner (processes; one
//! tiny agent, a GRPO job of 1,024 episodes a step) and N fixed-token workers in this process
//! (`comas_rollout_worker::fixed`: the worker protocol in full, every turn a fixed completion
//! after 100 ms, 4 episodes at a time), for N = 10, 100 and 1,000 one after another in one run.
//! Per N: leases per second (a step's episodes over its rollout time, and the bound the workers'
//! slots put on it), the coordinator's own seconds per step (`seconds.coordinator`), its
//! scheduler task's busy time per lease, its CPU time and peak memory. Then, with 1,000: 990 of
//! them killed in the middle of a step's rollout and 990 new ones started; the job must end with
//! every episode and sample exact.
//!
//! cargo bench -p comas --bench fleet
//! COMAS_BENCH_FLEET=10,100 picks the sizes (the scale-down runs with the largest).
#[path = "../tests/harness/mod.rs"]
mod harness;

use comas_rollout_worker::fixed::{FixedStats, FixedWorker};
use harness::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

const QUESTIONS: u64 = 128;
const GROUP: u64 = 8;
const EPISODES: u64 = QUESTIONS * GROUP;
const STEPS: u64 = 4;
const SLOTS: u32 = 4;
const TURN: Duration = Duration::from_millis(100);
const SCALE_TURN: Duration = Duration::from_secs(2);
/// The workers' heartbeats as the coordinator's defaults have them (the tests' are faster).
const COORDINATOR: [&str; 4] = ["--heartbeat-ms", "2000", "--heartbeat-timeout-secs", "30"];

/// A process's CPU seconds (user + system) and its peak resident memory in MiB, from /proc.
fn cpu_and_peak(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let hwm_kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    // USER_HZ is 100 on Linux.
    (ticks / 100.0, hwm_kb / 1024.0)
}

struct Figures {
    workers: usize,
    leases_per_s: f64,
    slot_bound: f64,
    coordinator_s: f64,
    scheduler_us_per_lease: f64,
    cpu_s_per_step: f64,
    peak_mib: f64,
}

/// One run with `n` workers; with `scale_down`, most of them are replaced during step 2.
async fn run(n: usize, scale_down: bool) -> Figures {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    write_fleet_job(tmp.path(), port, QUESTIONS, GROUP, STEPS);
    let c = Cluster::launch(tmp.path(), vec![port], 0, &COORDINATOR, STEPS, &[]);
    // The scale-down must land inside a rollout: its turns take longer.
    let turn = if scale_down { SCALE_TURN } else { TURN };
    let settings = fixed_settings(c.coordinator_url(), SLOTS, turn);
    let stats = Arc::new(FixedStats::default());
    wait_until_listening(&c).await;
    let started = Instant::now();
    let mut workers: Vec<FixedWorker> = fleet(0, n, &settings, &stats).await;
    wait_for_workers(&c, n).await;
    eprintln!("{n} workers registered in {:.1} s", started.elapsed().as_secs_f64());
    let pid = c.coordinator.as_ref().unwrap().child.id();
    let (cpu0, _) = cpu_and_peak(pid);
    let sched0 = c.prometheus("comas_coordinator_scheduler_seconds_total");
    let id = c.submit().await;
    if scale_down {
        c.on_event(&id, 600, "step 2's rollout", |s| {
            s.steps_done == 2 && s.stage == "rollout" && s.episodes_total > 0
        })
        .await;
        let keep = 10.min(n);
        let killed = n - keep;
        for w in workers.drain(keep..) {
            w.kill();
        }
        eprintln!("killed {killed} workers in step 2's rollout");
        tokio::time::sleep(Duration::from_secs(2)).await;
        workers.extend(fleet(n, killed, &settings, &stats).await);
        eprintln!("started {killed} new ones");
        // The coordinator's view each second until the step is committed.
        let started = Instant::now();
        while c.status(&id).await.is_some_and(|st| st.steps_done == 2) {
            let g = |n: &str| c.prometheus(&format!("comas_coordinator_{n}"));
            eprintln!(
                "{:5.1} s: {} workers, {} ready, {} queued, {} leased, {} accepted",
                started.elapsed().as_secs_f64(),
                g("workers"),
                g("ready_workers"),
                g("pending_episodes"),
                g("leased_episodes"),
                g("episodes_completed_total")
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    c.finished_within(&id, 1800).await;
    let (cpu1, peak_mib) = cpu_and_peak(pid);
    let sched1 = c.prometheus("comas_coordinator_scheduler_seconds_total");
    let log = assert_fleet_run_exact(&c, STEPS, EPISODES);
    if scale_down {
        assert!(c.prometheus("comas_coordinator_requeued_episodes_total") >= 1.0);
        let rollout: Vec<String> = log
            .iter()
            .map(|m| format!("{:.2}", m["seconds"]["rollout"].as_f64().unwrap()))
            .collect();
        eprintln!("scale-down run: every step exact; rollout seconds by step {rollout:?}");
    }
    // Step 0 carries the first load of the policies; the rest are alike.
    let later = &log[1..];
    let mean = |f: &dyn Fn(&serde_json::Value) -> f64| {
        later.iter().map(f).sum::<f64>() / later.len() as f64
    };
    let rollout = mean(&|m| m["seconds"]["rollout"].as_f64().unwrap());
    drop(workers);
    Figures {
        workers: n,
        leases_per_s: EPISODES as f64 / rollout,
        slot_bound: (n as f64 * f64::from(SLOTS)) / turn.as_secs_f64(),
        coordinator_s: mean(&|m| m["seconds"]["coordinator"].as_f64().unwrap()),
        scheduler_us_per_lease: (sched1 - sched0) * 1e6 / (STEPS * EPISODES) as f64,
        cpu_s_per_step: (cpu1 - cpu0) / STEPS as f64,
        peak_mib,
    }
}

fn main() {
    let sizes: Vec<usize> = std::env::var("COMAS_BENCH_FLEET")
        .unwrap_or_else(|_| "10,100,1000".into())
        .split(',')
        .map(|v| v.trim().parse().unwrap_or_else(|_| panic!("COMAS_BENCH_FLEET: {v:?}")))
        .collect();
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let mut rows = Vec::new();
        for &n in &sizes {
            rows.push(run(n, false).await);
        }
        println!(
            "{EPISODES} episodes a step, {STEPS} steps, {SLOTS} slots a worker, {} ms a turn",
            TURN.as_millis()
        );
        println!("| workers | leases/s | slot bound | coordinator s/step | scheduler µs/lease | coordinator CPU s/step | peak MiB |");
        println!("|---:|---:|---:|---:|---:|---:|---:|");
        for f in &rows {
            println!(
                "| {} | {:.0} | {:.0} | {:.3} | {:.1} | {:.2} | {:.0} |",
                f.workers,
                f.leases_per_s,
                f.slot_bound,
                f.coordinator_s,
                f.scheduler_us_per_lease,
                f.cpu_s_per_step,
                f.peak_mib
            );
        }
        let most = *sizes.iter().max().unwrap();
        let f = run(most, true).await;
        println!(
            "scale-down {most} → {} → {most} in step 2's rollout: exact; {:.0} leases/s, peak {:.0} MiB",
            10.min(most),
            f.leases_per_s,
            f.peak_mib
        );
    });
}
