//! A job's metrics log drawn as a grid of charts, in PNG or SVG; or, given several `comas eval`
//! summaries, accuracy against checkpoint step. Used by `comas plot` and by the coordinator,
//! which attaches the figure to a job's MLflow run.
//!
//! [`read`] reads the log's step and eval records, [`content`] turns them into plain panels of
//! series of (step, value) points, and [`render`] draws those with `plotters`. Keeping what is
//! shown apart from how it is drawn lets the tests check exact numbers without looking at pixels.
pub mod content;
pub mod read;
pub mod render;

use anyhow::{bail, Result};
use content::{Figure, Options};
use read::Metrics;
use render::Grid;
use std::path::Path;

/// Smallest and largest figure side accepted, in pixels.
pub const MIN_SIDE: u32 = 400;
pub const MAX_SIDE: u32 = 8192;
/// Figure width when none is asked for.
pub const DEFAULT_WIDTH: u32 = 1440;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Svg,
    Png,
}

impl Format {
    /// The format named by the output's extension (case does not matter).
    pub fn from_path(path: &Path) -> Result<Format> {
        let ext = path.extension().and_then(|e| e.to_str()).map(|e| e.to_ascii_lowercase());
        match ext.as_deref() {
            Some("svg") => Ok(Format::Svg),
            Some("png") => Ok(Format::Png),
            Some(other) => bail!("cannot write {}: unknown extension .{other}; give the output a name ending in .svg or .png", path.display()),
            None => bail!("cannot tell which format to write for {}: give the output a name ending in .svg or .png", path.display()),
        }
    }
}

/// Checks a figure side given as `name` (a flag or a key) against [`MIN_SIDE`]..=[`MAX_SIDE`].
pub fn check_side(name: &str, v: u32) -> Result<()> {
    if !(MIN_SIDE..=MAX_SIDE).contains(&v) {
        bail!("{name} {v} is out of range: use a value from {MIN_SIDE} to {MAX_SIDE} pixels");
    }
    Ok(())
}

/// The title when none is given: the job id from the log, else the log's name.
pub fn default_title(m: &Metrics, log_name: &str) -> String {
    match &m.job_id {
        Some(id) => format!("job {id}"),
        None => log_name.to_string(),
    }
}

/// A figure drawn as `format` on `grid`.
pub fn draw(figure: &Figure, format: Format, grid: &Grid) -> Result<Vec<u8>> {
    Ok(match format {
        Format::Svg => render::svg(figure, grid)?.into_bytes(),
        Format::Png => render::png(figure, grid)?,
    })
}

/// The figure `comas plot LOG -o NAME.png` draws with no other flag: every group with data,
/// the team's rewards only, the default title and size.
pub fn default_png(m: &Metrics, log_name: &str) -> Result<Vec<u8>> {
    let options = Options { title: default_title(m, log_name), roles: false, groups: Vec::new() };
    let figure = Figure::build(m, &options)?;
    let grid = Grid::new(figure.panels.len(), DEFAULT_WIDTH, None, None)?;
    draw(&figure, Format::Png, &grid)
}
