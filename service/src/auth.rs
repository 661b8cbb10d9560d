//! Bearer tokens on a service's API. The operator keeps a token file that holds SHA-256 hashes
//! of the tokens (never the tokens), each with its scopes; a client names its token in the
//! `authorization: Bearer …` header. The file is read again when it changes, so tokens are
//! added or revoked without a restart. Without a file the API is open, as before.
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::{Request, Status};

/// The environment variable a client reads its token from.
pub const TOKEN_ENV: &str = "COMAS_TOKEN";

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Status, lists, progress streams, results.
    Read,
    /// Submit, cancel and resume jobs (and read).
    Submit,
    /// Register as a rollout worker and send heartbeats.
    Worker,
    /// Everything.
    Admin,
}

impl Scope {
    pub const ALL: [Scope; 4] = [Scope::Read, Scope::Submit, Scope::Worker, Scope::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Submit => "submit",
            Scope::Worker => "worker",
            Scope::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// Whether a token with this scope may do what `need` names.
    fn allows(self, need: Scope) -> bool {
        self == need || self == Scope::Admin || (self == Scope::Submit && need == Scope::Read)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("token file {0}: {1}")]
    File(String, String),
    #[error("token file {path} line {line}: {message}")]
    Line { path: String, line: usize, message: String },
    #[error("the token in {TOKEN_ENV} cannot be sent as a header: {0}")]
    BadToken(String),
}

/// The hex SHA-256 of a token, as the token file holds it.
pub fn hash_token(token: &str) -> String {
    Sha256::digest(token.trim().as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// A new random token: 32 bytes from the operating system, as hex.
pub fn new_token() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Debug, Clone)]
struct Entry {
    name: String,
    scopes: Vec<Scope>,
}

#[derive(Debug, Default)]
struct Loaded {
    modified: Option<SystemTime>,
    tokens: HashMap<String, Entry>,
}

/// Lines `HASH SCOPES [NAME]`: the token's hex SHA-256, its scopes separated by commas, and a
/// name for the logs; `#` starts a comment.
fn parse(path: &Path, text: &str) -> Result<HashMap<String, Entry>, AuthError> {
    let shown = path.display().to_string();
    let mut tokens = HashMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let bad = |message: String| AuthError::Line { path: shown.clone(), line: i + 1, message };
        let mut parts = line.split_whitespace();
        let (hash, scopes, name) = (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or("unnamed"),
        );
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("the first field must be a token's SHA-256 as 64 hex digits (`comas token new` prints the line)".into()));
        }
        let scopes = scopes
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| {
                Scope::parse(s).ok_or_else(|| {
                    bad(format!("unknown scope `{s}`: use read, submit, worker or admin"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if scopes.is_empty() {
            return Err(bad(
                "give the token's scopes after its hash (read, submit, worker, admin)".into(),
            ));
        }
        tokens.insert(hash.to_ascii_lowercase(), Entry { name: name.to_string(), scopes });
    }
    Ok(tokens)
}

/// A token file, read again whenever its modification time changes.
#[derive(Debug)]
pub struct TokenFile {
    path: PathBuf,
    state: Mutex<Loaded>,
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl TokenFile {
    /// Reads the file; a missing or malformed one is an error at start-up.
    pub fn open(path: &Path) -> Result<Self, AuthError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| AuthError::File(path.display().to_string(), e.to_string()))?;
        let tokens = parse(path, &text)?;
        Ok(Self {
            path: path.to_path_buf(),
            state: Mutex::new(Loaded { modified: modified(path), tokens }),
        })
    }

    /// Picks up an edited file. One that no longer parses keeps the tokens that were in force.
    fn refresh(&self, state: &mut Loaded) {
        let now = modified(&self.path);
        if now == state.modified {
            return;
        }
        state.modified = now;
        match std::fs::read_to_string(&self.path)
            .map_err(|e| AuthError::File(self.path.display().to_string(), e.to_string()))
            .and_then(|t| parse(&self.path, &t))
        {
            Ok(tokens) => {
                tracing::info!(path = %self.path.display(), tokens = tokens.len(), "token file reloaded");
                state.tokens = tokens;
            }
            Err(e) => {
                tracing::error!(error = %e, "the edited token file is not valid; the previous tokens stay in force")
            }
        }
    }

    /// Lets `request` through if it carries a known token whose scopes allow `need`; `what`
    /// names the call in the refusal.
    pub fn check<T>(&self, request: &Request<T>, need: Scope, what: &str) -> Result<(), Status> {
        let header = request.metadata().get("authorization").and_then(|v| v.to_str().ok());
        let Some(token) = header.and_then(|h| h.strip_prefix("Bearer ")) else {
            return Err(Status::unauthenticated(format!("{what} needs a token: set {TOKEN_ENV} to a token this service's --tokens file lists")));
        };
        let hash = hash_token(token);
        let mut state = self.state.lock().expect("token lock");
        self.refresh(&mut state);
        let Some(entry) = state.tokens.get(&hash) else {
            return Err(Status::unauthenticated(format!("{what}: the token in {TOKEN_ENV} is not one this service knows (revoked, or for another service?)")));
        };
        if entry.scopes.iter().any(|s| s.allows(need)) {
            return Ok(());
        }
        let has: Vec<&str> = entry.scopes.iter().map(|s| s.as_str()).collect();
        Err(Status::permission_denied(format!(
            "{what} needs scope `{}`; token `{}` has {}",
            need.as_str(),
            entry.name,
            has.join(", ")
        )))
    }
}

/// The service's token check: `None` when it runs without a token file (open).
pub fn check<T>(
    tokens: Option<&TokenFile>,
    request: &Request<T>,
    need: Scope,
    what: &str,
) -> Result<(), Status> {
    tokens.map_or(Ok(()), |t| t.check(request, need, what))
}

/// A client interceptor that sends a bearer token with every call (none: nothing added).
#[derive(Debug, Clone, Default)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Bearer {
    pub fn new(token: Option<&str>) -> Result<Self, AuthError> {
        match token.map(str::trim).filter(|t| !t.is_empty()) {
            None => Ok(Self(None)),
            Some(t) => format!("Bearer {t}").parse().map(|v| Self(Some(v))).map_err(
                |e: tonic::metadata::errors::InvalidMetadataValue| {
                    AuthError::BadToken(e.to_string())
                },
            ),
        }
    }

    /// The token in `COMAS_TOKEN`, if set.
    pub fn from_env() -> Result<Self, AuthError> {
        Self::new(std::env::var(TOKEN_ENV).ok().as_deref())
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(token: Option<&str>) -> Request<()> {
        let mut b = Bearer::new(token).unwrap();
        tonic::service::Interceptor::call(&mut b, Request::new(())).unwrap()
    }

    #[test]
    fn scopes_missing_wrong_and_revoked_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        let (reader, submitter) = (new_token(), new_token());
        std::fs::write(
            &path,
            format!(
                "# who may do what\n{} read alice\n{} submit ci\n",
                hash_token(&reader),
                hash_token(&submitter)
            ),
        )
        .unwrap();
        let t = TokenFile::open(&path).unwrap();
        assert!(t.check(&with(Some(&reader)), Scope::Read, "ListJobs").is_ok());
        let e = t.check(&with(Some(&reader)), Scope::Submit, "SubmitJob").unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(
            e.message().contains("needs scope `submit`; token `alice` has read"),
            "{}",
            e.message()
        );
        assert!(t.check(&with(Some(&submitter)), Scope::Read, "GetJob").is_ok());
        assert_eq!(
            t.check(&with(Some(&submitter)), Scope::Worker, "RegisterWorker").unwrap_err().code(),
            tonic::Code::PermissionDenied
        );
        let e = t.check(&with(None), Scope::Read, "ListJobs").unwrap_err();
        assert!(
            e.code() == tonic::Code::Unauthenticated && e.message().contains("set COMAS_TOKEN"),
            "{}",
            e.message()
        );
        assert_eq!(
            t.check(&with(Some("guess")), Scope::Read, "ListJobs").unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        // Revoked by editing the file: no restart. A later broken edit keeps what was in force.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, format!("{} admin ops\n", hash_token(&submitter))).unwrap();
        assert_eq!(
            t.check(&with(Some(&reader)), Scope::Read, "ListJobs").unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert!(t.check(&with(Some(&submitter)), Scope::Worker, "RegisterWorker").is_ok());
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, "not a token line\n").unwrap();
        assert!(t.check(&with(Some(&submitter)), Scope::Submit, "SubmitJob").is_ok());
        // Malformed files are refused at start with the line named.
        std::fs::write(&path, format!("{} write\n", hash_token("x"))).unwrap();
        assert!(TokenFile::open(&path)
            .unwrap_err()
            .to_string()
            .contains("line 1: unknown scope `write`"));
        assert!(check(None, &with(None), Scope::Admin, "anything").is_ok(), "no file: open");
    }
}
