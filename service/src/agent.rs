//! Which agent a learner call is for. One learner process may train several agents (NeuroMAS
//! node adapters over one base), so callers name the agent in each call's metadata.
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Status};

pub const AGENT_METADATA: &str = "comas-agent-id";

/// A client interceptor that names agent `.0` on every call.
#[derive(Debug, Clone, Copy)]
pub struct ForAgent(pub u32);

impl tonic::service::Interceptor for ForAgent {
    fn call(&mut self, mut r: Request<()>) -> Result<Request<()>, Status> {
        r.metadata_mut().insert(AGENT_METADATA, MetadataValue::from(self.0));
        Ok(r)
    }
}

/// The agent a call names, if it names one.
pub fn agent_of(m: &MetadataMap) -> Result<Option<u32>, Status> {
    let Some(v) = m.get(AGENT_METADATA) else { return Ok(None) };
    v.to_str().ok().and_then(|s| s.parse().ok()).map(Some).ok_or_else(|| {
        Status::invalid_argument(format!(
            "metadata {AGENT_METADATA} must be an agent number, got {v:?}"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor;

    #[test]
    fn an_intercepted_call_names_its_agent() {
        let r = ForAgent(7).call(Request::new(())).unwrap();
        assert_eq!(agent_of(r.metadata()).unwrap(), Some(7));
        assert_eq!(agent_of(&MetadataMap::new()).unwrap(), None);
        let mut bad = MetadataMap::new();
        bad.insert(AGENT_METADATA, MetadataValue::from_static("seven"));
        assert_eq!(agent_of(&bad).unwrap_err().code(), tonic::Code::InvalidArgument);
    }
}
