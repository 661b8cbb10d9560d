//! Bytes received so far of each agent's newest weight pull, so the coordinator can show a
//! broadcast's progress while it runs (`Info`), not only its total after it.
use comas_proto::v1 as pb;
use std::collections::BTreeMap;
use std::sync::Mutex;

#[derive(Debug, Clone, Copy, PartialEq)]
struct Pull {
    version: u64,
    bytes: u64,
    done: bool,
}

/// One entry per agent: its newest pull.
#[derive(Default)]
pub struct PullMeter {
    pulls: Mutex<BTreeMap<u32, Pull>>,
}

impl PullMeter {
    /// A pull of `version` starts (again, after a failed source): its count restarts at zero.
    pub fn begin(&self, agent: u32, version: u64) {
        self.lock().insert(agent, Pull { version, bytes: 0, done: false });
    }

    pub fn add(&self, agent: u32, version: u64, bytes: u64) {
        if let Some(p) = self.lock().get_mut(&agent).filter(|p| p.version == version) {
            p.bytes += bytes;
        }
    }

    /// The version arrived whole and was swapped in.
    pub fn finish(&self, agent: u32, version: u64) {
        if let Some(p) = self.lock().get_mut(&agent).filter(|p| p.version == version) {
            p.done = true;
        }
    }

    pub fn report(&self) -> Vec<pb::WeightPull> {
        self.lock()
            .iter()
            .map(|(&agent_id, p)| pb::WeightPull {
                agent_id,
                version: p.version,
                bytes_received: p.bytes,
                done: p.done,
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, Pull>> {
        self.pulls.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pull_counts_its_own_version_and_restarts_after_a_failed_source() {
        let m = PullMeter::default();
        m.begin(0, 3);
        m.add(0, 3, 100);
        m.add(0, 2, 7); // a late chunk of an older pull is not counted
        m.begin(1, 3);
        m.add(1, 3, 5);
        assert_eq!(
            m.report(),
            vec![
                pb::WeightPull { agent_id: 0, version: 3, bytes_received: 100, done: false },
                pb::WeightPull { agent_id: 1, version: 3, bytes_received: 5, done: false },
            ]
        );
        m.begin(0, 3); // the relay peer failed: pulled again from the learner
        m.add(0, 3, 40);
        m.finish(0, 3);
        assert_eq!(
            m.report()[0],
            pb::WeightPull { agent_id: 0, version: 3, bytes_received: 40, done: true }
        );
    }
}
