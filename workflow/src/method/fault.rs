//! What a method's check finds wrong in a record a worker sent back.
use crate::turn::TurnFault;

/// Why a returned record is refused (the coordinator runs its episode again).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordFault {
    /// Not JSON of the method's record type.
    #[error("not valid JSON: {0}")]
    Json(String),
    /// One sampled turn is inconsistent in itself; `at` names it ("answer 3", "node 1:0").
    #[error("{at}: {fault}")]
    Turn { at: String, fault: TurnFault },
    /// A record its episode cannot produce: counts, order, speakers, or another job's settings.
    #[error("{0}")]
    Shape(String),
}

impl RecordFault {
    /// A shape fault with `what` said of the turn named `at`.
    pub fn at(at: impl std::fmt::Display, what: impl std::fmt::Display) -> Self {
        RecordFault::Shape(format!("{at}: {what}"))
    }

    /// `fault` of the sampled turn named `at`.
    pub fn turn(at: impl std::fmt::Display, fault: TurnFault) -> Self {
        RecordFault::Turn { at: at.to_string(), fault }
    }
}

impl From<String> for RecordFault {
    fn from(message: String) -> Self {
        RecordFault::Shape(message)
    }
}
