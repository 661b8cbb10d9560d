//! Weight relay: the chunks of the newest version this worker pulled for each agent, kept so
//! the next worker in the coordinator's chain (or tree) can pull them from here, forwarded as
//! they arrive. The learner then sends each byte once, whatever the number of workers.
//!
//! A relayed stream carries the chunks exactly as they arrived, CRCs included, so each hop
//! checks them again; a transfer that fails here fails the streams reading it, and those
//! workers pull from the learner instead.
use comas_proto::v1::WeightChunk;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::watch;
use tonic::Status;

/// How far a transfer has got.
#[derive(Debug, Clone, PartialEq)]
pub enum Progress {
    /// This many chunks are in, more to come.
    Receiving(usize),
    /// All chunks are in and passed this worker's checks.
    Complete(usize),
    Failed(String),
}

/// One version of one agent's weights as it arrives at this worker.
pub struct Transfer {
    pub version: u64,
    /// Kept for relaying; off, the chunks are not stored.
    record: bool,
    chunks: RwLock<Vec<WeightChunk>>,
    progress: watch::Sender<Progress>,
}

impl Transfer {
    fn new(version: u64, record: bool) -> Self {
        Self {
            version,
            record,
            chunks: RwLock::new(Vec::new()),
            progress: watch::channel(Progress::Receiving(0)).0,
        }
    }

    pub fn push(&self, chunk: WeightChunk) {
        if !self.record {
            return;
        }
        let mut chunks = self.chunks.write().expect("relay chunks lock");
        chunks.push(chunk);
        let n = chunks.len();
        self.progress.send_replace(Progress::Receiving(n));
    }

    pub fn complete(&self) {
        let n = self.chunks.read().expect("relay chunks lock").len();
        self.progress.send_replace(Progress::Complete(n));
    }

    pub fn fail(&self, why: &str) {
        self.progress.send_replace(Progress::Failed(why.to_string()));
    }

    fn failed(&self) -> bool {
        matches!(*self.progress.borrow(), Progress::Failed(_))
    }

    /// The chunks from `from` on as they become available: `Ok(None)` at the end of a complete
    /// transfer, an error when it failed here.
    pub async fn next_chunks(&self, from: usize) -> Result<Option<Vec<WeightChunk>>, Status> {
        let mut rx = self.progress.subscribe();
        loop {
            let progress = rx.borrow_and_update().clone();
            match progress {
                Progress::Failed(why) => {
                    return Err(Status::aborted(format!(
                        "the relay's own pull of version {} failed: {why}",
                        self.version
                    )))
                }
                Progress::Complete(n) if from >= n => return Ok(None),
                Progress::Receiving(n) | Progress::Complete(n) if from < n => {
                    return Ok(Some(
                        self.chunks.read().expect("relay chunks lock")[from..n].to_vec(),
                    ));
                }
                Progress::Receiving(_) => {
                    if rx.changed().await.is_err() {
                        return Err(Status::aborted("the relay dropped the transfer"));
                    }
                }
                Progress::Complete(_) => unreachable!("handled above"),
            }
        }
    }
}

/// The transfers this worker can relay, one per agent (the newest).
pub struct Relay {
    enabled: bool,
    /// How long a request waits for a transfer this worker has not started yet: the
    /// coordinator tells every worker of a chain at once, so a peer may ask first.
    wait: Duration,
    transfers: Mutex<HashMap<u32, Arc<Transfer>>>,
    /// Versions held by the engine (swapped in), per agent.
    held: Mutex<HashMap<u32, u64>>,
    started: watch::Sender<u64>,
}

impl Relay {
    pub fn new(enabled: bool, wait: Duration) -> Self {
        Self {
            enabled,
            wait,
            transfers: Mutex::default(),
            held: Mutex::default(),
            started: watch::channel(0).0,
        }
    }

    /// Starts recording a transfer; it replaces the agent's previous one (streams already
    /// reading that one keep it until they end).
    pub fn begin(&self, agent: u32, version: u64) -> Arc<Transfer> {
        let t = Arc::new(Transfer::new(version, self.enabled));
        if self.enabled {
            self.transfers.lock().expect("relay lock").insert(agent, Arc::clone(&t));
            self.started.send_modify(|n| *n += 1);
        }
        t
    }

    /// Records that the engine now holds `version` of `agent`.
    pub fn held(&self, agent: u32, version: u64) {
        self.held.lock().expect("relay lock").insert(agent, version);
    }

    /// The transfer of `version` of `agent`, waiting a while for one that has not started yet.
    pub async fn find(&self, agent: u32, version: u64) -> Result<Arc<Transfer>, Status> {
        if !self.enabled {
            return Err(Status::not_found(
                "this worker does not relay weights (started with --relay false)",
            ));
        }
        let mut started = self.started.subscribe();
        let deadline = tokio::time::Instant::now() + self.wait;
        loop {
            started.borrow_and_update();
            if let Some(t) = self
                .transfers
                .lock()
                .expect("relay lock")
                .get(&agent)
                .filter(|t| t.version == version && !t.failed())
            {
                return Ok(Arc::clone(t));
            }
            let holds = self.held.lock().expect("relay lock").get(&agent).copied();
            if holds.is_some_and(|h| h >= version) {
                return Err(Status::not_found(format!(
                    "this worker holds version {} of agent {agent} but has no transfer of version {version} to relay",
                    holds.unwrap_or(0)
                )));
            }
            if tokio::time::timeout_at(deadline, started.changed()).await.is_err() {
                return Err(Status::not_found(format!(
                    "this worker has not received version {version} of agent {agent} within {:?}",
                    self.wait
                )));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(i: u64) -> WeightChunk {
        WeightChunk { version: 3, offset: i, ..Default::default() }
    }

    async fn read_all(t: &Transfer) -> Result<Vec<u64>, Status> {
        let mut got = Vec::new();
        while let Some(cs) = t.next_chunks(got.len()).await? {
            got.extend(cs.iter().map(|c| c.offset));
        }
        Ok(got)
    }

    #[tokio::test]
    async fn a_reader_gets_the_chunks_as_they_arrive_and_ends_with_the_transfer() {
        let relay = Arc::new(Relay::new(true, Duration::from_secs(5)));
        let r = Arc::clone(&relay);
        // The reader asks before the transfer has begun.
        let reader = tokio::spawn(async move { read_all(&*r.find(0, 3).await?).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let t = relay.begin(0, 3);
        for i in 0..5 {
            t.push(chunk(i));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        t.complete();
        assert_eq!(reader.await.unwrap().unwrap(), vec![0, 1, 2, 3, 4]);
        // A late reader gets the whole transfer at once.
        assert_eq!(read_all(&*relay.find(0, 3).await.unwrap()).await.unwrap(), vec![0, 1, 2, 3, 4]);
    }

    #[tokio::test]
    async fn a_failed_transfer_fails_its_readers_and_is_not_offered_again() {
        let relay = Relay::new(true, Duration::from_millis(50));
        let t = relay.begin(1, 3);
        t.push(chunk(0));
        t.fail("tensor `w` failed its checksum");
        let e = read_all(&t).await.unwrap_err();
        assert_eq!(
            (e.code(), e.message()),
            (
                tonic::Code::Aborted,
                "the relay's own pull of version 3 failed: tensor `w` failed its checksum"
            )
        );
        let e = relay.find(1, 3).await.err().expect("refused");
        assert_eq!(
            (e.code(), e.message()),
            (
                tonic::Code::NotFound,
                "this worker has not received version 3 of agent 1 within 50ms"
            )
        );
    }

    #[tokio::test]
    async fn versions_held_without_a_transfer_or_with_the_relay_off_are_refused_at_once() {
        let relay = Relay::new(true, Duration::from_secs(60));
        relay.held(0, 4);
        let e = relay.find(0, 4).await.err().expect("refused");
        assert_eq!(
            e.message(),
            "this worker holds version 4 of agent 0 but has no transfer of version 4 to relay"
        );
        let off = Relay::new(false, Duration::from_secs(60));
        off.begin(0, 5).complete();
        let e = off.find(0, 5).await.err().expect("refused");
        assert_eq!(
            (e.code(), e.message()),
            (
                tonic::Code::NotFound,
                "this worker does not relay weights (started with --relay false)"
            )
        );
    }
}
