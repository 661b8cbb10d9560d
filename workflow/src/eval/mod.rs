//! Evaluation (spec §8): benchmark items and the four inference setups as pure state machines.
//! A [`Dialogue`] is one question under one setup: it asks for chat calls, takes their replies,
//! and ends with the one output that is graded. The driver (`comas eval`) decodes the pending
//! calls of every question together, so all setups' calls share the engine's continuous batch.
mod bench;
pub mod convert;
pub mod method;
mod program;
mod prompts;
mod setup;
mod summary;

pub use method::Evaluation;
pub use bench::{arithmetic, humaneval_query, parse_bench, BenchError, BenchItem, GraderKind};
pub use program::{
    call_seed, no_room_error, CallRecord, EvalEpisode, EvalJobConfig, EvalQuestion, EvalRunMetrics, EvalSettings, EvalTranscript, EVAL_MAX_NEW_TOKENS,
    EVAL_TEMPERATURE,
};
pub use setup::{Call, Dialogue, DialogueError, Setup, UnknownSetup, TERMINATOR};
pub use summary::{EvalCell, EvalSummary};
