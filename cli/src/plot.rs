//! `comas plot`: draw a job's metrics log as a grid of charts, in PNG or SVG; or, given the
//! output folders of several `comas eval` runs, accuracy against checkpoint step.
//!
//! The figures are the `comas-plot` crate's (the coordinator draws the same one for a job's
//! MLflow run); this module is the command: its flags, their checks, the file written.
pub use comas_plot::{content, read, render, Format};

use comas_plot::{check_side, default_title};
use content::{Figure, Group, Options};
use read::read_log;
use render::Grid;

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

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
    #[arg(long, default_value_t = comas_plot::DEFAULT_WIDTH)]
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
        let name = log.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let title = args.title.clone().unwrap_or_else(|| default_title(&metrics, &name));
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
    let bytes = comas_plot::draw(&figure, format, &grid)?;
    write_atomic(&args.output, &bytes)?;
    tracing::info!(output = %args.output.display(), from = %what, panels = figure.panels.len(), "wrote plot");
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
