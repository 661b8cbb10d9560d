//! An emulated cluster network on one machine (issue 45): every service in its own network
//! namespace, all joined by a bridge in a hub namespace, as pods on a cluster network. Each
//! service's link can be shaped (`tc tbf`: a rate in both directions), cut (its bridge port down:
//! silent, as a pulled cable), partitioned from one peer, made lossy (`iptables` in its namespace,
//! silent drops), or delayed (a user-space delay line, `delay_line`). The test process reaches the
//! services through one veth of its own on the same /24; no traffic leaves the addresses a `Net`
//! makes.
//!
//! Invariants:
//! - everything a `Net` makes is named from `comas-net-<pid>-<n>` (namespaces) or `cn<k>`
//!   (interfaces of subnet `10.211.<k>.0/24`), so nothing else on the machine is touched;
//! - it is removed on drop (a failed test's panic included) and on Ctrl-C or SIGTERM; a run
//!   that was SIGKILLed leaves names whose pid is gone, which the next `Net` removes (so does
//!   `scripts/netns-clean.sh`);
//! - a fault changes only the link of the service it names; `heal` restores that link.
//!
//! Needs root, `ip`, `tc` and `iptables-legacy` (`scripts/setup-netns.sh` installs iptables).
use super::delay_line::DelayLine;
use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Once};
use std::time::Duration;

const PREFIX: &str = "comas-net-";
const IPTABLES: &str = "iptables-legacy";
/// The chains every namespace's faults go into, so that `heal` is one flush.
const FAULT_CHAINS: [(&str, &str); 2] = [("OUTPUT", "comas-out"), ("INPUT", "comas-in")];

/// One service's place on the network.
#[derive(Debug)]
pub struct Host {
    pub name: String,
    pub ns: String,
    pub ip: String,
    /// Its port on the bridge, in the hub namespace.
    port: String,
}

impl Host {
    /// An interface of this host's delay line in the hub namespace: its port is `cn<k>p<i>`,
    /// beside it `cn<k>x<i>` (the port's own bridge), `cn<k>a<i>` and `cn<k>b<i>` (the taps).
    fn beside(&self, kind: char) -> String {
        self.port.replacen('p', &kind.to_string(), 1)
    }
}

/// A link's shape in both directions.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub rate_mbit: f64,
}

pub struct Net {
    tag: String,
    subnet: u8,
    hub: String,
    pub hosts: Vec<Host>,
    /// Every link's shape when no fault is on it.
    base: Option<Shape>,
    /// The delay lines on services' links, by service.
    delays: Mutex<HashMap<String, DelayLine>>,
}

/// Nets alive in this process, for the Ctrl-C handler.
static LIVE: Mutex<Vec<String>> = Mutex::new(Vec::new());
static SERIAL: AtomicUsize = AtomicUsize::new(0);

impl Net {
    /// A bridge and one namespace per name in `services`, each with an address of a fresh /24
    /// and its link shaped to `base`.
    pub fn new(services: &[&str], base: Option<Shape>) -> Self {
        preflight();
        on_interrupt_remove_all();
        remove_stale();
        let tag =
            format!("{PREFIX}{}-{}", std::process::id(), SERIAL.fetch_add(1, Ordering::SeqCst));
        // A subnet is free until its leg has its address: both under the lock, so two nets of
        // one process never share one.
        let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
        let subnet = free_subnet();
        let hub = format!("{tag}-hub");
        let mut net = Net {
            tag: tag.clone(),
            subnet,
            hub: hub.clone(),
            hosts: Vec::new(),
            base,
            delays: Mutex::new(HashMap::new()),
        };
        live.push(tag);
        ip(&["netns", "add", &hub]);
        ip(&["-n", &hub, "link", "set", "lo", "up"]);
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &hub, "link", "set", "br0", "up"]);
        // The test process's own leg: 10.211.<k>.1 in the host namespace.
        let leg = format!("cn{subnet}");
        ip(&["link", "add", &leg, "type", "veth", "peer", "name", "up0", "netns", &hub]);
        ip(&["-n", &hub, "link", "set", "up0", "master", "br0", "up"]);
        ip(&["addr", "add", &format!("10.211.{subnet}.1/24"), "dev", &leg]);
        ip(&["link", "set", &leg, "up"]);
        drop(live);
        for (i, name) in services.iter().enumerate() {
            net.add_host(name, i + 2);
            if let Some(shape) = base {
                net.shape(name, shape);
            }
        }
        net
    }

    fn add_host(&mut self, name: &str, index: usize) {
        assert!(index < 255, "a Net holds at most 252 services");
        let ns = format!("{}-{name}", self.tag);
        let port = format!("cn{}p{index}", self.subnet);
        let ip_addr = format!("10.211.{}.{index}", self.subnet);
        ip(&["netns", "add", &ns]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        ip(&[
            "link", "add", &port, "netns", &self.hub, "type", "veth", "peer", "name", "eth0",
            "netns", &ns,
        ]);
        ip(&["-n", &self.hub, "link", "set", &port, "master", "br0", "up"]);
        ip(&["-n", &ns, "addr", "add", &format!("{ip_addr}/24"), "dev", "eth0"]);
        ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        for (hook, chain) in FAULT_CHAINS {
            in_ns(&ns, &[IPTABLES, "-w", "-N", chain]);
            in_ns(&ns, &[IPTABLES, "-w", "-A", hook, "-j", chain]);
        }
        self.hosts.push(Host { name: name.into(), ns, ip: ip_addr, port });
    }

    pub fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no service {name:?} on this net"))
    }

    /// The test process's own address on the net.
    pub fn leg_ip(&self) -> String {
        format!("10.211.{}.1", self.subnet)
    }

    /// Limits the test process's own link (a learner run in-process sits behind it).
    pub fn shape_leg(&self, shape: Shape) {
        let tbf = tbf_args(shape.rate_mbit);
        let leg = format!("cn{}", self.subnet);
        let mut up = vec!["tc", "qdisc", "replace", "dev", leg.as_str(), "root"];
        up.extend(tbf.iter().map(String::as_str));
        run("tc", &up[1..]);
        let mut down = vec!["tc", "qdisc", "replace", "dev", "up0", "root"];
        down.extend(tbf.iter().map(String::as_str));
        in_ns(&self.hub, &down);
    }

    pub fn ip(&self, name: &str) -> &str {
        &self.host(name).ip
    }

    /// The namespace a service runs in, if the net has one of that name.
    pub fn ns_of(&self, name: &str) -> Option<&str> {
        self.hosts.iter().find(|h| h.name == name).map(|h| h.ns.as_str())
    }

    /// Limits `name`'s link to `shape` in both directions (its upload on its side, its download
    /// on the bridge's).
    pub fn shape(&self, name: &str, shape: Shape) {
        let h = self.host(name);
        let tbf = tbf_args(shape.rate_mbit);
        let mut up = vec!["tc", "qdisc", "replace", "dev", "eth0", "root"];
        up.extend(tbf.iter().map(String::as_str));
        in_ns(&h.ns, &up);
        let mut down = vec!["tc", "qdisc", "replace", "dev", h.port.as_str(), "root"];
        down.extend(tbf.iter().map(String::as_str));
        in_ns(&self.hub, &down);
    }

    /// Removes `name`'s shaping.
    pub fn unshape(&self, name: &str) {
        let h = self.host(name);
        in_ns_lenient(&h.ns, &["tc", "qdisc", "del", "dev", "eth0", "root"]);
        in_ns_lenient(&self.hub, &["tc", "qdisc", "del", "dev", &h.port, "root"]);
    }

    /// Cuts `name` off from everyone: its bridge port goes down. Packets are dropped silently,
    /// as on a pulled cable; the service sees no error until its own timeouts.
    pub fn cut(&self, name: &str) {
        ip(&["-n", &self.hub, "link", "set", &self.host(name).port, "down"]);
    }

    /// Drops every packet between `name` and `peer`, both ways, silently.
    pub fn partition(&self, name: &str, peer: &str) {
        let (h, p) = (self.host(name), self.ip(peer).to_string());
        in_ns(&h.ns, &[IPTABLES, "-w", "-A", "comas-out", "-d", &p, "-j", "DROP"]);
        in_ns(&h.ns, &[IPTABLES, "-w", "-A", "comas-in", "-s", &p, "-j", "DROP"]);
    }

    /// Drops a random `percent` of `name`'s packets in each direction.
    pub fn lose(&self, name: &str, percent: f64) {
        let p = format!("{}", percent / 100.0);
        let h = self.host(name);
        for chain in ["comas-out", "comas-in"] {
            in_ns(
                &h.ns,
                &[
                    IPTABLES,
                    "-w",
                    "-A",
                    chain,
                    "-m",
                    "statistic",
                    "--mode",
                    "random",
                    "--probability",
                    &p,
                    "-j",
                    "DROP",
                ],
            );
        }
    }

    /// Holds every frame of `name`'s link `delay`, each way (a round trip through it gains
    /// twice that): its bridge port moves to a bridge of its own, joined to the net's by a
    /// delay line. Its shape, cuts and drops still apply.
    pub fn delay(&self, name: &str, delay: Duration) {
        let h = self.host(name);
        let (bridge, a, b) = (h.beside('x'), h.beside('a'), h.beside('b'));
        let mut delays = self.delays.lock().unwrap_or_else(|p| p.into_inner());
        assert!(!delays.contains_key(name), "{name}'s link is already delayed");
        let line = DelayLine::new(&self.hub, &a, &b, delay);
        let hub = |args: &[&str]| ip(&[&["-n", self.hub.as_str()], args].concat());
        hub(&["link", "add", &bridge, "type", "bridge"]);
        hub(&["link", "set", &bridge, "up"]);
        hub(&["link", "set", &a, "master", &bridge, "up"]);
        hub(&["link", "set", &b, "master", "br0", "up"]);
        hub(&["link", "set", &h.port, "master", &bridge]);
        delays.insert(name.to_string(), line);
    }

    /// Undoes every fault on `name`'s link: port up on the net's bridge, no delay, no drops,
    /// its base shape.
    pub fn heal(&self, name: &str) {
        let h = self.host(name);
        let line = self.delays.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
        if let Some(line) = line {
            ip(&["-n", &self.hub, "link", "set", &h.port, "master", "br0"]);
            drop(line);
            in_ns_lenient(&self.hub, &["ip", "link", "del", &h.beside('x')]);
        }
        ip(&["-n", &self.hub, "link", "set", &h.port, "up"]);
        for (_, chain) in FAULT_CHAINS {
            in_ns(&h.ns, &[IPTABLES, "-w", "-F", chain]);
        }
        match self.base {
            Some(shape) => self.shape(name, shape),
            None => self.unshape(name),
        }
    }

    /// Bytes `name` has sent and received on its link, as its kernel counts them.
    pub fn bytes(&self, name: &str) -> (u64, u64) {
        let h = self.host(name);
        let read = |what: &str| -> u64 {
            let out = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &h.ns,
                    "cat",
                    &format!("/sys/class/net/eth0/statistics/{what}"),
                ])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0)
        };
        (read("tx_bytes"), read("rx_bytes"))
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        remove(&self.tag);
        LIVE.lock().unwrap_or_else(|p| p.into_inner()).retain(|t| t != &self.tag);
    }
}

/// A command running `program` in namespace `ns`, or here when there is none. `ip netns exec`
/// execs the program, so the child's pid is the program's.
pub fn command_in(ns: Option<&str>, program: &str) -> Command {
    match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, program]);
            c
        }
        None => Command::new(program),
    }
}

/// `tbf` for `rate_mbit`: a burst of 4 ms of the rate (at least 16 KiB, so that one full-size
/// segment always fits) and a queue of 50 ms, over which packets are dropped as a switch would.
fn tbf_args(rate_mbit: f64) -> Vec<String> {
    let bytes_per_sec = rate_mbit * 1e6 / 8.0;
    let burst = ((bytes_per_sec * 0.004) as u64).max(16 * 1024);
    vec![
        "tbf".into(),
        "rate".into(),
        format!("{}kbit", (rate_mbit * 1000.0).round() as u64),
        "burst".into(),
        burst.to_string(),
        "latency".into(),
        "50ms".into(),
    ]
}

/// A clear failure when the machine cannot make namespaces (not root, no iptables).
fn preflight() {
    static CHECKED: Once = Once::new();
    CHECKED.call_once(|| {
        let ok = |cmd: &str, args: &[&str]| {
            Command::new(cmd).args(args).output().is_ok_and(|o| o.status.success())
        };
        assert!(
            ok("ip", &["netns", "list"]) && ok("tc", &["-V"]),
            "the emulated cluster needs root and iproute2 (ip, tc): run the tests as root"
        );
        assert!(
            ok(IPTABLES, &["--version"]),
            "the emulated cluster needs {IPTABLES}: run scripts/setup-netns.sh"
        );
    });
}

/// Removes everything of this process's nets on Ctrl-C or SIGTERM, then exits.
fn on_interrupt_remove_all() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        let _ = ctrlc::set_handler(|| {
            let tags = LIVE.lock().unwrap_or_else(|p| p.into_inner()).clone();
            for tag in tags {
                remove(&tag);
            }
            std::process::exit(130);
        });
    });
}

/// The first `k` with no `10.211.<k>.` address on the host.
fn free_subnet() -> u8 {
    let out = Command::new("ip").args(["-4", "-o", "addr", "show"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    (2..=254u8)
        .find(|k| !text.contains(&format!("10.211.{k}.")))
        .expect("all 253 subnets 10.211.<k>.0/24 are taken: run scripts/netns-clean.sh")
}

/// Kills the processes in every namespace of `tag` and removes the namespaces (the veths go
/// with them).
fn remove(tag: &str) {
    for ns in namespaces().into_iter().filter(|n| n.starts_with(&format!("{tag}-"))) {
        let out = Command::new("ip").args(["netns", "pids", &ns]).output();
        if let Ok(out) = out {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Ok(pid) = pid.parse::<i32>() {
                    // SAFETY: kill(2) with a pid read from the namespace; no memory involved.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
    }
}

/// Removes the nets of processes that no longer exist.
fn remove_stale() {
    let mut tags: Vec<String> = namespaces()
        .iter()
        .filter_map(|ns| {
            let rest = ns.strip_prefix(PREFIX)?;
            let mut parts = rest.splitn(3, '-');
            let (pid, serial) = (parts.next()?, parts.next()?);
            let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
            (!alive).then(|| format!("{PREFIX}{pid}-{serial}"))
        })
        .collect();
    tags.sort();
    tags.dedup();
    for tag in tags {
        remove(&tag);
    }
}

fn namespaces() -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(PREFIX))
        .map(String::from)
        .collect()
}

fn ip(args: &[&str]) {
    run("ip", args);
}

fn in_ns(ns: &str, args: &[&str]) {
    let mut all = vec!["netns", "exec", ns];
    all.extend_from_slice(args);
    run("ip", &all);
}

fn in_ns_lenient(ns: &str, args: &[&str]) {
    let _ = Command::new("ip").args(["netns", "exec", ns]).args(args).output();
}

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}
