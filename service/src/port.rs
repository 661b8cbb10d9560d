//! A port for a process that must be told its port before it binds (a vLLM server, a test's
//! services in other network namespaces), where handing it a bound socket (`fd:N`) is not
//! possible.
//!
//! Binding port 0 and dropping the socket is not enough: the kernel hands out the same
//! ephemeral range to every `connect` and every later `bind(0)`, so in the moment between the
//! drop and the child's bind another process (often a client's outgoing connection) can take
//! the port. Ports are therefore picked below the ephemeral range, where the kernel never
//! picks by itself, starting from a place that differs between processes, never twice in one
//! process, and only when nothing holds them now.
use std::net::{Ipv4Addr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};

/// The lowest port handed out: above the well-known services.
const FIRST: u32 = 10_000;
/// Where the kernel's ephemeral range starts when /proc does not say (Linux's default).
const DEFAULT_EPHEMERAL_START: u32 = 32_768;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A TCP port that nothing holds now and that this process has not handed out before. The
/// caller's child binds it a moment later; only a process that picks the same port on purpose
/// can take it first.
pub fn spare_port() -> std::io::Result<u16> {
    let end = range_end();
    for _ in FIRST..end {
        let port = candidate(NEXT.fetch_add(1, Ordering::Relaxed), end);
        // Any address: a port held on one address only would still clash with a wildcard bind.
        if TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).is_ok() {
            return Ok(port);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        format!("every port from {FIRST} to {end} is taken"),
    ))
}

/// The `n`th port this process tries, of those below `end`. Processes start at different
/// places, so two test binaries rarely probe the same ports.
fn candidate(n: u32, end: u32) -> u16 {
    let span = end - FIRST;
    let start = std::process::id().wrapping_mul(2_654_435_761) % span;
    (FIRST + (start + n % span) % span) as u16
}

/// One past the last port handed out: the start of the kernel's ephemeral range (at least one
/// port above `FIRST`).
fn range_end() -> u32 {
    ephemeral_start().max(FIRST + 1)
}

/// The first port of the kernel's ephemeral range.
fn ephemeral_start() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(DEFAULT_EPHEMERAL_START)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_below_the_ephemeral_range_and_never_repeat() {
        let end = range_end();
        let ports: Vec<u16> = (0..200).map(|_| spare_port().unwrap()).collect();
        assert!(ports.iter().all(|&p| (FIRST..end).contains(&(p as u32))), "{ports:?}");
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len());
    }

    #[test]
    fn a_held_port_is_skipped() {
        let port = spare_port().unwrap();
        // Hold the next port this process would try, then ask again.
        let held_port = candidate(NEXT.load(Ordering::Relaxed), range_end());
        let held = TcpListener::bind((Ipv4Addr::LOCALHOST, held_port));
        let got = spare_port().unwrap();
        assert_ne!(got, port);
        if held.is_ok() {
            assert_ne!(got, held_port);
        }
    }
}
