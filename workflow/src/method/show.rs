//! How a method's figures are shown: the rows of a before/after table and the accuracy every
//! method reports (`comas local`'s last table, `comas plot`'s accuracy panel), and a method's own
//! panels. Plain data; the command line formats and draws it.

/// How a row's value reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A share in [0, 1], shown as a percentage.
    Share,
    /// A signed value (a mean reward).
    Signed,
    /// A plain number.
    Number,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub name: String,
    pub value: Option<f64>,
    pub unit: Unit,
}

impl Row {
    pub fn new(name: impl Into<String>, value: Option<f64>, unit: Unit) -> Row {
        Row { name: name.into(), value, unit }
    }
}

/// A step's or an evaluation's figures in brief.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// The share of answers that were right, as the method grades them.
    pub accuracy: Option<f64>,
    /// How many answers `accuracy` is a share of.
    pub graded: Option<u64>,
    /// The rows of a before/after table, the accuracy's first.
    pub rows: Vec<Row>,
}

/// One line of a panel: a value per step record.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub name: String,
    /// Palette index; `None` takes the colour of the role the line is named after.
    pub colour: Option<usize>,
    pub values: Vec<Option<f64>>,
}

/// A panel a method adds to `comas plot`.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// The `--panels` group it belongs to (one of the method's `CHART_GROUPS`).
    pub group: &'static str,
    /// Stable name, e.g. `coaching.score`.
    pub key: &'static str,
    pub title: &'static str,
    /// The log fields it is drawn from, for messages about missing data.
    pub needs: &'static str,
    /// Values are shares in [0, 1].
    pub share: bool,
    pub lines: Vec<Line>,
}
