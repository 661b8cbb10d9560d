//! The CoMAS test job on an emulated network (`netns::Net`): the coordinator, two learners and
//! the workers each in a namespace of its own, reached by their namespace addresses with mutual
//! TLS on, as pods are.
use super::netns::Net;
use super::*;
use comas_service::tls::{install_client, Authority, ClientTls, Validity};
use std::sync::OnceLock;

/// This process's CA and its client identity, installed for every channel the test process
/// opens from then on: a test binary that builds a cluster on a net runs no plaintext ones.
fn authority() -> &'static (Authority, PathBuf) {
    static CA: OnceLock<(Authority, PathBuf)> = OnceLock::new();
    CA.get_or_init(|| {
        let ca = Authority::new("emulated cluster CA").unwrap();
        let dir = std::env::temp_dir().join(format!("comas-net-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = ca.issue(&["test-client"], Validity::Current).unwrap();
        let files =
            [("ca.pem", ca.pem().to_string()), ("client.pem", cert), ("client-key.pem", key)];
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
        let client = ClientTls::new(
            &dir.join("ca.pem"),
            Some((&dir.join("client.pem"), &dir.join("client-key.pem"))),
            None,
        )
        .unwrap();
        install_client(Some(client));
        (ca, dir)
    })
}

impl Cluster {
    /// The CoMAS job of `comas_job` (two agents, fixed-length turns) on an emulated network of
    /// a coordinator, two learners and `workers` workers, each with a certificate for its own
    /// address, each worker with `worker_env` set. `shape` limits every service's link.
    pub fn build_on_net(
        dir: &Path,
        workers: usize,
        tokens: u32,
        steps: u64,
        worker_flags: &[&str],
        worker_env: &[(&str, &str)],
        shape: Option<netns::Shape>,
    ) -> Self {
        let mut names = vec!["coordinator".to_string(), "learner-0".into(), "learner-1".into()];
        names.extend((0..workers).map(|i| format!("worker-{i}")));
        let net = Net::new(&names.iter().map(String::as_str).collect::<Vec<_>>(), shape);
        let (ca, ca_dir) = authority();
        let ips: Vec<&str> = net.hosts.iter().map(|h| h.ip.as_str()).collect();
        let (cert, key) = ca.issue(&ips, Validity::Current).unwrap();
        let tls = dir.join("tls");
        std::fs::create_dir_all(&tls).unwrap();
        std::fs::write(tls.join("service.pem"), cert).unwrap();
        std::fs::write(tls.join("service-key.pem"), key).unwrap();
        let env = [
            ("COMAS_TLS_CERT", tls.join("service.pem").display().to_string()),
            ("COMAS_TLS_KEY", tls.join("service-key.pem").display().to_string()),
            ("COMAS_TLS_CA", ca_dir.join("ca.pem").display().to_string()),
        ];
        let learner_ports = vec![free_port(), free_port()];
        write_job_of(dir, &learner_ports, tokens, false, steps);
        // The learners by their namespace addresses, over TLS.
        let job = dir.join("job.toml");
        let mut text = std::fs::read_to_string(&job).unwrap();
        for (k, port) in learner_ports.iter().enumerate() {
            text = text.replace(
                &format!("\"http://127.0.0.1:{port}\""),
                &format!("\"https://{}:{port}\"", net.ip(&format!("learner-{k}"))),
            );
        }
        std::fs::write(&job, text).unwrap();
        let mut c =
            Self::launch_full(dir, learner_ports, 0, &[], steps, worker_flags, &env, Some(net));
        for _ in 0..workers {
            c.add_worker_with(worker_env);
        }
        c
    }
}
