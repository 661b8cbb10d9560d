//! The throwaway certificate authority of `comas local`: made at start, it signs one
//! certificate for the machine's loopback names, which every service of the local cluster serves
//! and dials with (mutual TLS on one machine). Clusters bring their own certificates
//! (`crate::tls::TlsArgs`). Certificates that must be refused (expired ones) are made only with
//! the `test-certs` feature, for tests.
use crate::tls::TlsError;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The files of a throwaway CA and one certificate for every service of one machine.
#[derive(Debug, Clone)]
pub struct LocalFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A certificate authority made here, for `comas local` and tests.
pub struct Authority {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: String,
}

/// When a certificate [`Authority::issue`] makes is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// From a day ago for a year.
    Current,
    /// Expired yesterday: only tests need a certificate that must be refused.
    #[cfg(any(test, feature = "test-certs"))]
    Expired,
}

impl Authority {
    pub fn new(name: &str) -> Result<Self, TlsError> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = rcgen::KeyPair::generate()?;
        let pem = params.self_signed(&key)?.pem();
        Ok(Self { issuer: rcgen::Issuer::new(params, key), pem })
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// A certificate for `names` (DNS names or IP addresses), good for both serving and
    /// dialling: (certificate PEM, private key PEM).
    pub fn issue(&self, names: &[&str], validity: Validity) -> Result<(String, String), TlsError> {
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, names.first().copied().unwrap_or("comas"));
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let day = time_day();
        let now = std::time::SystemTime::now();
        let (from, to) = match validity {
            Validity::Current => (now - day, now + 365 * day),
            #[cfg(any(test, feature = "test-certs"))]
            Validity::Expired => (now - 30 * day, now - day),
        };
        params.not_before = from.into();
        params.not_after = to.into();
        let key = rcgen::KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// Writes the CA and a certificate for this machine's loopback names into `dir`.
    pub fn write_local(&self, dir: &Path) -> Result<LocalFiles, TlsError> {
        std::fs::create_dir_all(dir)
            .map_err(|err| TlsError::Io { path: dir.to_path_buf(), err })?;
        let (cert, key) = self.issue(&["localhost", "127.0.0.1", "::1"], Validity::Current)?;
        let files = LocalFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join("service.pem"),
            key: dir.join("service-key.pem"),
        };
        for (path, text) in [(&files.ca, self.pem.as_str()), (&files.cert, cert.as_str())] {
            crate::write_atomic(path, text.as_bytes())
                .map_err(|err| TlsError::Io { path: path.clone(), err })?;
        }
        crate::write_private(&files.key, key.as_bytes())
            .map_err(|err| TlsError::Io { path: files.key.clone(), err })?;
        Ok(files)
    }
}

fn time_day() -> Duration {
    Duration::from_secs(24 * 3600)
}
