//! `comas plot`: draw a job's metrics log as a grid of charts, in PNG or SVG; or, given the
//! output folders of several `comas eval` runs, accuracy against checkpoint step.
//!
//! [`read`] reads the log's step and eval records, [`content`] turns them into plain panels of
//! series of (step, value) points, and [`render`] draws those with `plotters`. Keeping what is
//! shown apart from how it is drawn lets the tests check exact numbers without looking at pixels.
pub mod content;
pub mod read;
pub mod render;

use content::{Figure, Group, Options};
use read::{read_log, Metrics};
use render::Grid;

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// Smallest and largest figure side accepted, in pixels.
pub const MIN_SIDE: u32 = 400;
pub const MAX_SIDE: u32 = 8192;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The job's metrics log: JSON lines as the coordinator writes them (`metrics.jsonl`). Or
    /// several `comas eval --out` folders (each with its summary.json and checkpoint step):
    /// then one panel of accuracy against checkpoint step, a line per benchmark and setup.
    #[arg(required = true, num_args = 1..)]
    pub inputs: Vec<PathBuf>,
    /// Where to write the figure. The extension picks the format: `.svg` or `.png`.
    /// Written atomically (a temporary file in the same folder, then renamed).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Title at the top (default: the job id from the log, else the log's file name).
    #[arg(long)]
    pub title: Option<String>,
    /// Groups of panels to draw, in this order, separated by commas: rewards, training, lengths,
    /// judging, accuracy, times. Default: all of them that have data.
    #[arg(long, value_delimiter = ',')]
    pub panels: Vec<String>,
    /// Also draw each agent's reward per role (dashed), besides the team's.
    #[arg(long, visible_alias = "per-agent")]
    pub roles: bool,
    /// Figure width in pixels.
    #[arg(long, default_value_t = 1440)]
    pub width: u32,
    /// Figure height in pixels (default: 300 per row of panels, plus the title).
    #[arg(long)]
    pub height: Option<u32>,
    /// Panels per row (default: up to 3).
    #[arg(long)]
    pub columns: Option<u32>,
}

pub fn run(args: Args) -> Result<()> {
    // Cheap checks first, so a typo fails before the log is read.
    let format = Format::from_path(&args.output)?;
    let groups = Group::parse_list(&args.panels)?;
    check_side("--width", args.width)?;
    if let Some(h) = args.height {
        check_side("--height", h)?;
    }
    let (figure, what) = if args.inputs.iter().all(|p| p.is_dir()) {
        let summaries = args
            .inputs
            .iter()
            .map(|d| read::read_eval_summary(d).map(|s| (d.clone(), s)))
            .collect::<Result<Vec<_>>>()?;
        let title = args.title.clone().unwrap_or_else(|| "accuracy by checkpoint".to_string());
        (content::checkpoint_figure(title, &summaries)?, format!("{} evaluations", summaries.len()))
    } else {
        let [log] = args.inputs.as_slice() else {
            bail!("give one metrics log, or only `comas eval` output folders (to draw accuracy against checkpoint step)");
        };
        let metrics = read_log(log)?;
        let title = args.title.clone().unwrap_or_else(|| default_title(&metrics, log));
        let figure = Figure::build(&metrics, &Options { title, roles: args.roles, groups })
            .with_context(|| format!("cannot plot {}", log.display()))?;
        (figure, format!("{} steps", metrics.steps.len()))
    };
    if !figure.left_out.is_empty() {
        let list: Vec<_> =
            figure.left_out.iter().map(|(key, needs)| format!("{key} (needs {needs})")).collect();
        eprintln!("comas plot: left out panels without data: {}", list.join(", "));
    }
    let grid = Grid::new(figure.panels.len(), args.width, args.height, args.columns)?;
    let bytes = match format {
        Format::Svg => render::svg(&figure, &grid)?.into_bytes(),
        Format::Png => render::png(&figure, &grid)?,
    };
    write_atomic(&args.output, &bytes)?;
    tracing::info!(output = %args.output.display(), from = %what, panels = figure.panels.len(), "wrote plot");
    Ok(())
}

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

fn check_side(name: &str, v: u32) -> Result<()> {
    if !(MIN_SIDE..=MAX_SIDE).contains(&v) {
        bail!("{name} {v} is out of range: use a value from {MIN_SIDE} to {MAX_SIDE} pixels");
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically (`comas_files`), with errors that say what to fix.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        bail!("cannot write {}: the folder {} does not exist", path.display(), dir.display());
    }
    if path.file_name().is_none() {
        bail!("cannot write {}: the path names no file", path.display());
    }
    comas_files::write_atomic(path, bytes)
        .with_context(|| format!("cannot write {}", path.display()))
}

fn default_title(m: &Metrics, log: &Path) -> String {
    match &m.job_id {
        Some(id) => format!("job {id}"),
        None => log.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
    }
}
