//! A delay line for one link of the emulated network (issue 45 §3). This kernel has no `netem`
//! (nor `fq`), so added latency is made in user space: two TAP devices in the hub namespace
//! stand between a service's bridge port and the bridge, and every frame read from one is
//! written to the other `delay` after it was read, both ways.
//!
//! Invariants:
//! - a frame leaves in the order it came, no earlier than `delay` after it was read;
//! - the line drops nothing itself (a frame a TAP will not take is the kernel's to drop, as a
//!   full queue's would be);
//! - dropping the line ends its threads and closes the TAPs, which the kernel then removes.
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often an idle thread of the line looks at its stop flag.
const POLL: Duration = Duration::from_millis(50);

pub struct DelayLine {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl DelayLine {
    /// TAPs named `a` and `b`, made in namespace `ns` and up, joined by a line that holds each
    /// frame `delay`. The caller puts them on bridges.
    pub fn new(ns: &str, a: &str, b: &str, delay: Duration) -> Self {
        let (ta, tb) = in_namespace(ns, || (tap(a), tap(b)));
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let ends = [(ta.try_clone().unwrap(), tb.try_clone().unwrap()), (tb, ta)];
        for (from, to) in ends {
            let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
            let s = Arc::clone(&stop);
            threads.push(std::thread::spawn(move || read_frames(from, tx, delay, &s)));
            let s = Arc::clone(&stop);
            threads.push(std::thread::spawn(move || write_frames(to, rx, &s)));
        }
        Self { stop, threads }
    }
}

impl Drop for DelayLine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Reads frames as they come and hands each on with the time it may leave.
fn read_frames(
    mut from: File,
    tx: mpsc::Sender<(Instant, Vec<u8>)>,
    delay: Duration,
    stop: &AtomicBool,
) {
    let mut buf = vec![0u8; 65_536];
    while !stop.load(Ordering::SeqCst) {
        let mut fd = libc::pollfd { fd: from.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: poll(2) on one descriptor this thread owns, for at most POLL.
        let ready = unsafe { libc::poll(&mut fd, 1, POLL.as_millis() as libc::c_int) };
        if ready <= 0 {
            continue;
        }
        match from.read(&mut buf) {
            Ok(n) if n > 0 => {
                if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                    return;
                }
            }
            _ => std::thread::sleep(POLL),
        }
    }
}

/// Writes each frame once its time has come, in the order read.
fn write_frames(mut to: File, rx: mpsc::Receiver<(Instant, Vec<u8>)>, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        let Ok((due, frame)) = rx.recv_timeout(POLL) else { continue };
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        // A TAP whose other side is down refuses frames: the link's loss, not the line's.
        let _ = to.write(&frame);
    }
}

/// `f`'s result, run on a thread in network namespace `ns` (`ip netns` names): sockets and
/// devices it makes stay there.
pub fn in_namespace<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            let handle = File::open(format!("/run/netns/{ns}"))
                .unwrap_or_else(|e| panic!("namespace {ns}: {e}"));
            // SAFETY: setns(2) of this thread alone (a network namespace is per thread).
            let rc = unsafe { libc::setns(handle.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns into {ns}: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .unwrap()
    })
}

/// A TAP device named `name` in this thread's namespace, without packet information: each read
/// is one Ethernet frame.
fn tap(name: &str) -> File {
    let f = OpenOptions::new().read(true).write(true).open("/dev/net/tun").unwrap();
    // SAFETY: an all-zero ifreq is valid; its name and flags are set below.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    assert!(name.len() < libc::IFNAMSIZ, "interface name {name:?} is too long");
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF reads and writes the ifreq it is given, which outlives the call.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), libc::TUNSETIFF, &mut req) };
    assert_eq!(rc, 0, "TAP {name}: {}", std::io::Error::last_os_error());
    f
}
