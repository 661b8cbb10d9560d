//! MLflow's REST API (`/api/2.0/mlflow/...`), the calls the tracker makes, typed. Every call is
//! one HTTP exchange through `comas_service::openai::Endpoint` (the workspace's one HTTP
//! client), so a failure is a `CallError` whose `retryable()` says whether to try again.
use comas_service::openai::{CallError, Endpoint};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::time::Duration;

/// One call's limit (connect, send, read).
const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// MLflow's bounds on one `runs/log-batch` (its REST API reference).
pub const MAX_METRICS_PER_BATCH: usize = 1000;
pub const MAX_PARAMS_PER_BATCH: usize = 100;
/// Longest parameter value MLflow 3 stores; a longer one is cut (and says so).
pub const MAX_PARAM_VALUE: usize = 6000;

/// The tag that finds a job's run again after a restart.
pub const JOB_TAG: &str = "comas.job_id";

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Metric {
    pub key: String,
    pub value: f64,
    /// Milliseconds since the epoch: the record's own time, so sending a record twice logs
    /// one and the same metric (MLflow keeps one copy of an identical metric).
    pub timestamp: i64,
    pub step: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyValue {
    pub key: String,
    pub value: String,
}

/// A run as MLflow describes it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RunInfo {
    pub run_id: String,
    pub experiment_id: String,
    #[serde(default)]
    pub artifact_uri: String,
}

#[derive(Debug, Clone, Deserialize)]
struct Run {
    info: RunInfo,
    #[serde(default)]
    data: RunData,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct RunData {
    #[serde(default)]
    metrics: Vec<LatestMetric>,
}

#[derive(Debug, Clone, Deserialize)]
struct LatestMetric {
    #[serde(default)]
    step: i64,
}

/// How a run ended, in MLflow's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    Running,
    Finished,
    Failed,
    Killed,
}

impl RunStatus {
    fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "RUNNING",
            RunStatus::Finished => "FINISHED",
            RunStatus::Failed => "FAILED",
            RunStatus::Killed => "KILLED",
        }
    }
}

pub struct Client {
    endpoint: Endpoint,
}

impl Client {
    pub fn new(url: &str) -> Result<Self, CallError> {
        Ok(Self { endpoint: Endpoint::parse(url, None)? })
    }

    async fn post<R: serde::de::DeserializeOwned>(
        &self,
        route: &str,
        body: serde_json::Value,
    ) -> Result<R, CallError> {
        let path = self.endpoint.under(&format!("/api/2.0/mlflow/{route}"));
        self.endpoint.post_json(&path, &body, CALL_TIMEOUT).await
    }

    /// The id of experiment `name`, made if there is none.
    pub async fn experiment(&self, name: &str) -> Result<String, CallError> {
        #[derive(Deserialize)]
        struct Made {
            experiment_id: String,
        }
        match self.experiment_by_name(name).await {
            Err(CallError::Status { code: 404, .. }) => {
                match self.post::<Made>("experiments/create", json!({ "name": name })).await {
                    Ok(m) => Ok(m.experiment_id),
                    // Made meanwhile by someone else (another job of the same experiment).
                    Err(CallError::Status { code: 400 | 409, .. }) => {
                        self.experiment_by_name(name).await
                    }
                    Err(e) => Err(e),
                }
            }
            found => found,
        }
    }

    /// The id of experiment `name`; a 404 when there is none.
    async fn experiment_by_name(&self, name: &str) -> Result<String, CallError> {
        #[derive(Deserialize)]
        struct Got {
            experiment: Experiment,
        }
        #[derive(Deserialize)]
        struct Experiment {
            experiment_id: String,
        }
        let query: String =
            percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC)
                .collect();
        let path = self
            .endpoint
            .under(&format!("/api/2.0/mlflow/experiments/get-by-name?experiment_name={query}"));
        let bytes = self.endpoint.call(hyper::Method::GET, &path, None, CALL_TIMEOUT).await?;
        serde_json::from_slice::<Got>(&bytes)
            .map(|g| g.experiment.experiment_id)
            .map_err(|e| CallError::Malformed(e.to_string()))
    }

    /// The run of job `job` in `experiment`, with the highest step it has a metric at.
    pub async fn find_run(
        &self,
        experiment: &str,
        job: &str,
    ) -> Result<Option<(RunInfo, i64)>, CallError> {
        #[derive(Deserialize)]
        struct Found {
            #[serde(default)]
            runs: Vec<Run>,
        }
        // Job ids are letters, digits and dashes (checked by the caller): nothing to escape.
        let filter = format!("tags.`{JOB_TAG}` = '{job}'");
        let found: Found = self
            .post(
                "runs/search",
                json!({ "experiment_ids": [experiment], "filter": filter, "max_results": 1 }),
            )
            .await?;
        Ok(found.runs.into_iter().next().map(|r| {
            let latest = r.data.metrics.iter().map(|m| m.step).max().unwrap_or(0);
            (r.info, latest)
        }))
    }

    pub async fn create_run(
        &self,
        experiment: &str,
        name: &str,
        start_ms: i64,
        tags: &[KeyValue],
    ) -> Result<RunInfo, CallError> {
        #[derive(Deserialize)]
        struct Made {
            run: Run,
        }
        let made: Made = self
            .post(
                "runs/create",
                json!({ "experiment_id": experiment, "run_name": name, "start_time": start_ms, "tags": tags }),
            )
            .await?;
        Ok(made.run.info)
    }

    pub async fn log_batch(
        &self,
        run: &str,
        metrics: &[Metric],
        params: &[KeyValue],
    ) -> Result<(), CallError> {
        let _: serde_json::Value = self
            .post("runs/log-batch", json!({ "run_id": run, "metrics": metrics, "params": params }))
            .await?;
        Ok(())
    }

    pub async fn set_status(
        &self,
        run: &str,
        status: RunStatus,
        end_ms: Option<i64>,
    ) -> Result<(), CallError> {
        let mut body = json!({ "run_id": run, "status": status.as_str() });
        if let Some(t) = end_ms {
            body["end_time"] = json!(t);
        }
        let _: serde_json::Value = self.post("runs/update", body).await?;
        Ok(())
    }

    /// Uploads `bytes` as the run's artifact `name`, through the server's artifact proxy (a
    /// server started with `--serve-artifacts`, the default since MLflow 2). A run whose
    /// artifacts live elsewhere (S3, a shared folder) cannot take them from here.
    pub async fn upload(&self, run: &RunInfo, name: &str, bytes: Vec<u8>) -> Result<(), CallError> {
        let Some(under) = run.artifact_uri.strip_prefix("mlflow-artifacts:") else {
            return Err(CallError::Status {
                code: 400,
                message: format!(
                    "the run's artifacts are stored at {:?}, which comas cannot write to; start the server with --serve-artifacts",
                    run.artifact_uri
                ),
            });
        };
        // `mlflow-artifacts:/0/RUN/artifacts` or `mlflow-artifacts://host/0/RUN/artifacts`.
        let rel = match under.strip_prefix("//") {
            Some(rest) => rest.split_once('/').map_or("", |(_, p)| p),
            None => under.trim_start_matches('/'),
        };
        let path =
            self.endpoint.under(&format!("/api/2.0/mlflow-artifacts/artifacts/{rel}/{name}"));
        self.endpoint.call(hyper::Method::PUT, &path, Some(bytes), CALL_TIMEOUT).await?;
        Ok(())
    }
}
