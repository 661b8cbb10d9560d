//! `comas plot`: draw a job's metrics log as a figure, in SVG or PNG.
//!
//! How it works, in three steps:
//! 1. [`parse_log`] reads the coordinator's JSON lines, keeps the `"kind":"step"` records and turns
//!    them into one value per (agent, step) for each curve; anything missing or null is a gap.
//! 2. [`Figure::build`] lays out the panels (reward, score, parse failures, accuracy) on a shared
//!    step axis and turns the curves into a flat list of drawing primitives (rectangles, lines,
//!    polylines, circles, text) in pixel coordinates.
//! 3. [`Figure::to_svg`] writes that list as SVG. PNG output rasterises the very same SVG with
//!    `resvg`; the only difference is that text is emitted as glyph outlines (see [`TextMode`]).
//!
//! Why text becomes glyph outlines for PNG: a rasteriser needs font files to draw `<text>`, and no
//! fonts can be assumed on the machines that run this (CI and the cluster images carry none). An
//! embedded TrueType font would also pull a shaping engine (harfrust, skrifa, fontdb) into the
//! build. Instead every character is drawn from the public-domain 8x8 bitmap font of the `font8x8`
//! crate as small filled squares, which always renders, needs no font lookup, and keeps the PNG
//! path free of anything that can fail at run time. The SVG output keeps real `<text>` elements
//! so that browsers draw it with their own fonts and the text stays selectable.
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Smallest and largest figure side accepted, in pixels.
pub const MIN_SIDE: u32 = 400;
pub const MAX_SIDE: u32 = 8192;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The job's metrics log: JSON lines as the coordinator writes them (`metrics.jsonl`).
    pub metrics: PathBuf,
    /// Where to write the figure. The extension picks the format: `.svg` or `.png`.
    /// Written atomically (a temporary file in the same folder, then renamed).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Title at the top (default: the job id from the log, else the log's file name).
    #[arg(long)]
    pub title: Option<String>,
    /// Figure width in pixels.
    #[arg(long, default_value_t = 960)]
    pub width: u32,
    /// Figure height in pixels.
    #[arg(long, default_value_t = 960)]
    pub height: u32,
    /// Also draw each role's mean reward (solver, evaluator, scorer) as dashed lines.
    #[arg(long)]
    pub roles: bool,
}

pub fn run(args: Args) -> Result<()> {
    // Cheap checks first, so a typo in the output name fails before the log is read.
    let format = Format::from_path(&args.output)?;
    check_size(args.width, args.height)?;
    let metrics = read_log(&args.metrics)?;
    let title = args.title.clone().unwrap_or_else(|| default_title(&metrics, &args.metrics));
    let opts = Options { width: args.width, height: args.height, title, roles: args.roles };
    let figure = Figure::build(&metrics, &opts);
    let bytes = match format {
        Format::Svg => figure.to_svg(TextMode::Text).into_bytes(),
        Format::Png => svg_to_png(&figure.to_svg(TextMode::Glyphs), args.width, args.height)?,
    };
    write_atomic(&args.output, &bytes)?;
    tracing::info!(
        output = %args.output.display(),
        steps = metrics.steps.len(),
        agents = metrics.agents.len(),
        "wrote plot"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Output format, size, writing

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

pub fn check_size(width: u32, height: u32) -> Result<()> {
    for (name, v) in [("--width", width), ("--height", height)] {
        if !(MIN_SIDE..=MAX_SIDE).contains(&v) {
            bail!("{name} {v} is out of range: use a value from {MIN_SIDE} to {MAX_SIDE} pixels");
        }
    }
    Ok(())
}

/// Writes `bytes` to `path` so that readers see either the old file or the whole new one: the
/// data goes to a hidden temporary file in the same folder first (same file system, so the
/// rename is atomic), is synced, and then renamed over the destination.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        bail!("cannot write {}: the folder {} does not exist", path.display(), dir.display());
    }
    let name = path.file_name().with_context(|| format!("cannot write {}: the path names no file", path.display()))?;
    let tmp = dir.join(format!(".{}.{}.tmp", name.to_string_lossy(), std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    let result = written.and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("cannot write {}", path.display()));
    }
    Ok(())
}

fn default_title(m: &Metrics, log: &Path) -> String {
    match &m.job_id {
        Some(id) => format!("job {id}"),
        None => log.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
    }
}

// ---------------------------------------------------------------------------------------------
// Reading the metrics log

/// The curves of one log, aligned on [`Metrics::steps`]: every vector of an agent has one entry
/// per step, `None` where the value was missing, null, not a number, or the agent was absent.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Metrics {
    /// The first job id seen in a step record, if any.
    pub job_id: Option<String>,
    /// Global steps in ascending order; a step logged twice keeps its last record.
    pub steps: Vec<f64>,
    /// Keyed by the agent's index.
    pub agents: BTreeMap<i64, AgentSeries>,
}

#[derive(Debug, Default, Clone, PartialEq)]
pub struct AgentSeries {
    /// `reward_mean`, or else the count-weighted mean over the roles' means.
    pub reward: Vec<Option<f64>>,
    /// Mean reward per role name (`reward.<role>.mean`).
    pub role_reward: BTreeMap<String, Vec<Option<f64>>>,
    /// Mean of the valid scores 1–3, from `score_hist`.
    pub score: Vec<Option<f64>>,
    /// `parse_failure_rate`, or else the share of `invalid` in `score_hist`.
    pub parse_failure: Vec<Option<f64>>,
    /// `accuracy.last_round`.
    pub accuracy: Vec<Option<f64>>,
}

/// One agent's values in one step record.
#[derive(Debug, Default, Clone)]
struct AgentPoint {
    reward: Option<f64>,
    roles: BTreeMap<String, f64>,
    score: Option<f64>,
    parse_failure: Option<f64>,
    accuracy: Option<f64>,
}

pub fn read_log(path: &Path) -> Result<Metrics> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("metrics log {} does not exist: pass the metrics.jsonl file that a job wrote", path.display())
        }
        Err(e) => return Err(e).with_context(|| format!("cannot read metrics log {}", path.display())),
    };
    let text = match String::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            let upto = e.utf8_error().valid_up_to();
            let line = e.as_bytes()[..upto].iter().filter(|&&b| b == b'\n').count() + 1;
            bail!("{}, line {line}: not UTF-8 text; is this a metrics log?", path.display());
        }
    };
    parse_log(&text, &path.display().to_string())
}

/// Parses the text of a metrics log; `source` names it in error messages.
pub fn parse_log(text: &str, source: &str) -> Result<Metrics> {
    let mut records: Vec<(f64, Vec<(i64, AgentPoint)>)> = Vec::new();
    let mut job_id = None;
    let mut lines = text.split('\n').enumerate().peekable();
    while let Some((i, line)) = lines.next() {
        let n = i + 1;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        // A last line without its newline may still be being written by a running job.
        let unfinished = lines.peek().is_none() && !text.ends_with('\n');
        let value: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(_) if unfinished => {
                tracing::warn!("{source}, line {n}: ignoring an unfinished last line");
                continue;
            }
            Err(e) => {
                bail!("{source}, line {n}: not valid JSON ({e}); each line must be one JSON object")
            }
        };
        let Some(obj) = value.as_object() else {
            bail!("{source}, line {n}: expected a JSON object, found {}", kind_of(&value));
        };
        if obj.get("kind").and_then(Value::as_str) != Some("step") {
            continue;
        }
        let Some(step) = number(obj.get("step")) else {
            bail!("{source}, line {n}: step record without a numeric \"step\" field");
        };
        if job_id.is_none() {
            job_id = obj.get("job_id").and_then(Value::as_str).map(str::to_owned);
        }
        let agents = match obj.get("agents").and_then(Value::as_array) {
            Some(list) => list
                .iter()
                .enumerate()
                .filter(|(_, a)| a.is_object())
                .map(|(idx, a)| {
                    let id = a.get("agent").and_then(Value::as_i64).unwrap_or(idx as i64);
                    (id, agent_point(a))
                })
                .collect(),
            None => Vec::new(),
        };
        records.push((step, agents));
    }
    if records.is_empty() {
        bail!(
            "{source} has no step records (lines with \"kind\":\"step\"): the job has not finished a \
             step yet, or this is not a metrics log"
        );
    }
    // Order by step; when a step repeats (a resumed job), the later line wins.
    records.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut deduped: Vec<(f64, Vec<(i64, AgentPoint)>)> = Vec::with_capacity(records.len());
    for r in records {
        match deduped.last_mut() {
            Some(last) if last.0 == r.0 => *last = r,
            _ => deduped.push(r),
        }
    }
    let n = deduped.len();
    let mut m = Metrics { job_id, steps: deduped.iter().map(|r| r.0).collect(), ..Default::default() };
    for (s, (_, agents)) in deduped.into_iter().enumerate() {
        for (id, p) in agents {
            let a = m.agents.entry(id).or_insert_with(|| AgentSeries {
                reward: vec![None; n],
                score: vec![None; n],
                parse_failure: vec![None; n],
                accuracy: vec![None; n],
                role_reward: BTreeMap::new(),
            });
            a.reward[s] = p.reward;
            a.score[s] = p.score;
            a.parse_failure[s] = p.parse_failure;
            a.accuracy[s] = p.accuracy;
            for (role, v) in p.roles {
                a.role_reward.entry(role).or_insert_with(|| vec![None; n])[s] = Some(v);
            }
        }
    }
    Ok(m)
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A finite number, or `None` for anything else (missing, null, a string, ...).
fn number(v: Option<&Value>) -> Option<f64> {
    v.and_then(Value::as_f64).filter(|x| x.is_finite())
}

fn agent_point(a: &Value) -> AgentPoint {
    let mut p = AgentPoint::default();
    let mut weighted = (0.0, 0.0);
    if let Some(roles) = a.get("reward").and_then(Value::as_object) {
        for (role, r) in roles {
            if let Some(mean) = number(r.get("mean")) {
                let w = number(r.get("count")).filter(|&c| c > 0.0).unwrap_or(1.0);
                weighted.0 += w * mean;
                weighted.1 += w;
                p.roles.insert(role.clone(), mean);
            }
        }
    }
    p.reward = number(a.get("reward_mean")).or_else(|| (weighted.1 > 0.0).then(|| weighted.0 / weighted.1));
    let (score, invalid_share) = score_summary(a.get("score_hist"));
    p.score = score;
    p.parse_failure = number(a.get("parse_failure_rate")).or(invalid_share);
    p.accuracy = number(a.get("accuracy").and_then(|acc| acc.get("last_round")));
    p
}

/// (mean of the valid scores 1–3, share of invalid scores) from a `score_hist` object.
fn score_summary(hist: Option<&Value>) -> (Option<f64>, Option<f64>) {
    let Some(h) = hist.and_then(Value::as_object) else {
        return (None, None);
    };
    let count = |k: &str| number(h.get(k)).filter(|&c| c >= 0.0).unwrap_or(0.0);
    let (mut sum, mut valid) = (0.0, 0.0);
    for s in 1..=3 {
        let c = count(&s.to_string());
        sum += s as f64 * c;
        valid += c;
    }
    let invalid = count("invalid");
    let mean = (valid > 0.0).then(|| sum / valid);
    let share = (valid + invalid > 0.0).then(|| invalid / (valid + invalid));
    (mean, share)
}

// ---------------------------------------------------------------------------------------------
// Scales and ticks

/// Maps the data interval [d0, d1] linearly onto the pixel interval [r0, r1] (r1 < r0 for a y
/// axis, whose pixels grow downwards).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scale {
    pub d0: f64,
    pub d1: f64,
    pub r0: f64,
    pub r1: f64,
}

impl Scale {
    pub fn map(&self, v: f64) -> f64 {
        if self.d1 == self.d0 {
            return (self.r0 + self.r1) / 2.0;
        }
        self.r0 + (v - self.d0) / (self.d1 - self.d0) * (self.r1 - self.r0)
    }
}

/// Round tick values covering [lo, hi], about five intervals apart (see [`nice_ticks_n`]).
#[allow(dead_code)] // the figure uses nice_ticks_n; kept as the plain entry point
pub fn nice_ticks(lo: f64, hi: f64) -> Vec<f64> {
    nice_ticks_n(lo, hi, 5)
}

/// Tick values covering [lo, hi] with about `target` intervals between them. The spacing is 1, 2
/// or 5 times a power of ten; the first tick is at or below `lo` and the last at or above `hi`,
/// so the ticks' ends can serve as the axis domain. An empty or invalid interval is widened
/// around its value (or replaced by [0, 1]) so there are always at least two ticks.
pub fn nice_ticks_n(lo: f64, hi: f64, target: usize) -> Vec<f64> {
    ticks_with_step(lo, hi, target, 0.0)
}

/// Like [`nice_ticks_n`] but the spacing is at least `min_step` (whole steps for the x axis).
fn ticks_with_step(lo: f64, hi: f64, target: usize, min_step: f64) -> Vec<f64> {
    let (lo, hi) = widen(lo, hi);
    let step = nice_step((hi - lo) / target.max(1) as f64).max(min_step);
    // The small slack keeps a bound that sits on a tick (up to rounding) from adding another.
    let first = (lo / step + 1e-9).floor();
    let last = (hi / step - 1e-9).ceil();
    if !(first.is_finite() && last.is_finite()) || last - first > 1000.0 || last <= first {
        return vec![lo, hi];
    }
    let decimals = decimals_for(step);
    let scale = 10f64.powi(decimals as i32);
    (first as i64..=last as i64)
        .map(|k| {
            let v = k as f64 * step;
            // Snap away representation noise such as 0.6000000000000001; `+ 0.0` turns -0 into 0.
            let snapped = (v * scale).round() / scale;
            (if snapped.is_finite() { snapped } else { v }) + 0.0
        })
        .collect()
}

fn widen(lo: f64, hi: f64) -> (f64, f64) {
    if !lo.is_finite() || !hi.is_finite() {
        return (0.0, 1.0);
    }
    let (lo, hi) = if hi < lo { (hi, lo) } else { (lo, hi) };
    if hi > lo {
        return (lo, hi);
    }
    let pad = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
    (lo - pad, hi + pad)
}

/// The smallest of 1, 2, 5, 10 times a power of ten that is at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let m = [1.0, 2.0, 5.0].into_iter().find(|&m| norm <= m * (1.0 + 1e-9)).unwrap_or(10.0);
    m * mag
}

/// Digits after the decimal point that labels with this spacing need.
fn decimals_for(step: f64) -> usize {
    (-(step.log10() + 1e-9).floor()).clamp(0.0, 12.0) as usize
}

/// A tick label: as many decimals as the spacing needs, never "-0".
pub fn tick_label(v: f64, step: f64) -> String {
    let s = format!("{:.*}", decimals_for(step), v);
    if s.trim_start_matches('-').chars().all(|c| c == '0' || c == '.') {
        s.trim_start_matches('-').to_owned()
    } else {
        s
    }
}

// ---------------------------------------------------------------------------------------------
// The figure

#[derive(Debug, Clone)]
pub struct Options {
    pub width: u32,
    pub height: u32,
    pub title: String,
    /// Draw per-role reward lines (dashed) too.
    pub roles: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rect {
    pub x: f64,
    pub y: f64,
    pub w: f64,
    pub h: f64,
}

impl Rect {
    pub fn right(&self) -> f64 {
        self.x + self.w
    }
    pub fn bottom(&self) -> f64 {
        self.y + self.h
    }
    #[allow(dead_code)] // for tests
    pub fn contains(&self, x: f64, y: f64) -> bool {
        x >= self.x && x <= self.right() && y >= self.y && y <= self.bottom()
    }
}

/// One panel's placement and scales, kept so that tests (and callers) can map data to pixels.
#[derive(Debug, Clone)]
#[allow(dead_code)] // the scales and ticks are read by tests, not by `run`
pub struct Panel {
    /// "reward", "score", "parse_failure" or "accuracy"; also the `data-panel` attribute in SVG.
    pub key: &'static str,
    pub rect: Rect,
    pub x: Scale,
    pub y: Scale,
    pub y_ticks: Vec<f64>,
    /// Whether any agent has a value to show here.
    pub has_data: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor {
    Start,
    Middle,
    End,
}

#[derive(Debug, Clone)]
enum El {
    Rect { r: Rect, fill: &'static str, stroke: Option<&'static str> },
    Line { x1: f64, y1: f64, x2: f64, y2: f64, stroke: String, width: f64, dash: Option<&'static str> },
    Polyline { pts: Vec<(f64, f64)>, stroke: String, width: f64, dash: Option<&'static str>, tag: String },
    Circle { cx: f64, cy: f64, r: f64, fill: String, tag: String },
    Text { x: f64, y: f64, size: f64, anchor: Anchor, fill: &'static str, bold: bool, vertical: bool, text: String },
}

/// How text is written into the SVG.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextMode {
    /// `<text>` elements, drawn by the viewer's fonts.
    Text,
    /// Filled paths from the built-in bitmap font, for rasterising without fonts.
    Glyphs,
}

/// A laid-out figure: panels with their scales, and what to draw.
#[derive(Debug, Clone)]
#[allow(dead_code)] // x_ticks is read by tests, not by `run`
pub struct Figure {
    pub width: f64,
    pub height: f64,
    pub panels: Vec<Panel>,
    pub x_ticks: Vec<f64>,
    els: Vec<El>,
}

/// Agent colours, picked to stay apart from each other on white; agents past the end reuse them.
const PALETTE: [&str; 10] = ["#1f5fbf", "#e0691a", "#2a9d4b", "#c8323c", "#7b4fb8", "#8c5a3c", "#d6539f", "#5f6b73", "#a3a318", "#1aa6b7"];

/// Dash patterns of the per-role reward lines; roles not listed use the last one.
const ROLE_DASH: [(&str, &str); 4] = [("solver", "7 4"), ("evaluator", "2 3"), ("scorer", "9 3 2 3"), ("", "4 4")];

fn role_dash(role: &str) -> &'static str {
    ROLE_DASH.iter().find(|(r, _)| *r == role).unwrap_or(&ROLE_DASH[3]).1
}

const TICK_SIZE: f64 = 11.0;
const LABEL_SIZE: f64 = 12.0;
const PANEL_TITLE_SIZE: f64 = 13.0;
const TITLE_SIZE: f64 = 18.0;

/// What each panel shows: key, title, y-axis label, fixed range to include (None: from data),
/// and the number of tick intervals to aim for.
struct PanelSpec {
    key: &'static str,
    title: &'static str,
    y_label: &'static str,
    fixed: Option<(f64, f64)>,
    ticks: usize,
    weight: f64,
    values: fn(&AgentSeries) -> &Vec<Option<f64>>,
}

const PANELS: [PanelSpec; 4] = [
    PanelSpec { key: "reward", title: "Mean reward per agent", y_label: "reward", fixed: None, ticks: 5, weight: 3.0, values: |a| &a.reward },
    PanelSpec { key: "score", title: "Mean valid score (1-3)", y_label: "score", fixed: Some((1.0, 3.0)), ticks: 4, weight: 2.0, values: |a| &a.score },
    PanelSpec {
        key: "parse_failure",
        title: "Score parse-failure rate",
        y_label: "failures",
        fixed: Some((0.0, 1.0)),
        ticks: 2,
        weight: 1.2,
        values: |a| &a.parse_failure,
    },
    PanelSpec {
        key: "accuracy",
        title: "Solver accuracy (last round)",
        y_label: "accuracy",
        fixed: Some((0.0, 1.0)),
        ticks: 5,
        weight: 2.0,
        values: |a| &a.accuracy,
    },
];

impl Figure {
    pub fn build(m: &Metrics, o: &Options) -> Figure {
        let (w, h) = (o.width as f64, o.height as f64);
        let mut els = vec![El::Rect { r: Rect { x: 0.0, y: 0.0, w, h }, fill: "#ffffff", stroke: None }];

        // Legend entries decide the right margin.
        let mut legend: Vec<(String, String, Option<&'static str>, bool)> =
            m.agents.keys().enumerate().map(|(i, id)| (format!("agent {id}"), PALETTE[i % PALETTE.len()].to_owned(), None, true)).collect();
        let roles: Vec<String> = if o.roles {
            let mut r: Vec<String> = m.agents.values().flat_map(|a| a.role_reward.keys().cloned()).collect();
            r.sort();
            r.dedup();
            r
        } else {
            Vec::new()
        };
        for role in &roles {
            legend.push((format!("{role} reward"), "#555555".to_owned(), Some(role_dash(role)), false));
        }
        let legend_w = legend.iter().map(|e| text_width(&e.0, LABEL_SIZE) + 40.0).fold(96.0_f64, f64::max);

        let left = 78.0;
        let right = (w - legend_w - 28.0).max(left + 40.0);
        let top = 52.0;
        let bottom = h - 50.0;
        let title_gap = 28.0;
        let total_weight: f64 = PANELS.iter().map(|p| p.weight).sum();
        let avail = (bottom - top - title_gap * PANELS.len() as f64).max(40.0);

        // Shared x axis over the logged steps, in whole steps.
        let (s_lo, s_hi) = match (m.steps.first(), m.steps.last()) {
            (Some(&a), Some(&b)) => (a, b),
            _ => (0.0, 1.0),
        };
        let x_ticks = if s_lo == s_hi { vec![s_lo] } else { ticks_with_step(s_lo, s_hi, 6, 1.0) };
        let (x_d0, x_d1) = if s_lo == s_hi { (s_lo - 1.0, s_lo + 1.0) } else { (x_ticks[0], x_ticks[x_ticks.len() - 1]) };
        let x_step = if x_ticks.len() > 1 { x_ticks[1] - x_ticks[0] } else { 1.0 };

        let max_points = m.steps.len();
        let marker_r = if max_points <= 60 {
            3.0
        } else if max_points <= 250 {
            2.0
        } else {
            1.3
        };

        let mut panels = Vec::new();
        let mut cursor = top;
        for (pi, spec) in PANELS.iter().enumerate() {
            let ph = avail * spec.weight / total_weight;
            let rect = Rect { x: left, y: cursor + title_gap, w: right - left, h: ph };
            cursor = rect.bottom();
            let x = Scale { d0: x_d0, d1: x_d1, r0: rect.x, r1: rect.right() };

            // Data range of this panel (role lines count for the reward panel when drawn).
            let mut vals: Vec<f64> = m.agents.values().flat_map(|a| (spec.values)(a).iter().flatten().copied()).collect();
            let has_data = !vals.is_empty();
            if spec.key == "reward" && o.roles {
                vals.extend(m.agents.values().flat_map(|a| a.role_reward.values().flatten().flatten()));
            }
            let (mut lo, mut hi) = spec.fixed.unwrap_or((f64::INFINITY, f64::NEG_INFINITY));
            for &v in &vals {
                lo = lo.min(v);
                hi = hi.max(v);
            }
            if lo > hi {
                (lo, hi) = (0.0, 1.0);
            }
            // Fewer ticks where the panel is too short for its labels to stay apart.
            let target = spec.ticks.min(((ph / 24.0).floor() as usize).max(1));
            let y_ticks = nice_ticks_n(lo, hi, target);
            let y = Scale { d0: y_ticks[0], d1: y_ticks[y_ticks.len() - 1], r0: rect.bottom(), r1: rect.y };
            let y_step = if y_ticks.len() > 1 { y_ticks[1] - y_ticks[0] } else { 1.0 };

            // Frame, grid, ticks, labels.
            els.push(El::Rect { r: rect, fill: "#ffffff", stroke: Some("#8a8a8a") });
            for &t in &y_ticks {
                let py = y.map(t);
                els.push(El::Line { x1: rect.x, y1: py, x2: rect.right(), y2: py, stroke: "#e6e6e6".into(), width: 1.0, dash: None });
                els.push(El::Line { x1: rect.x - 4.0, y1: py, x2: rect.x, y2: py, stroke: "#555555".into(), width: 1.0, dash: None });
                els.push(text(rect.x - 7.0, py + 4.0, TICK_SIZE, Anchor::End, &tick_label(t, y_step)));
            }
            for &t in &x_ticks {
                let px = x.map(t);
                els.push(El::Line { x1: px, y1: rect.y, x2: px, y2: rect.bottom(), stroke: "#eeeeee".into(), width: 1.0, dash: None });
                els.push(El::Line { x1: px, y1: rect.bottom(), x2: px, y2: rect.bottom() + 4.0, stroke: "#555555".into(), width: 1.0, dash: None });
                if pi == PANELS.len() - 1 {
                    els.push(text(px, rect.bottom() + 17.0, TICK_SIZE, Anchor::Middle, &tick_label(t, x_step)));
                }
            }
            if spec.key == "reward" && y.d0 < 0.0 && y.d1 > 0.0 {
                let py = y.map(0.0);
                els.push(El::Line { x1: rect.x, y1: py, x2: rect.right(), y2: py, stroke: "#9a9a9a".into(), width: 1.0, dash: None });
            }
            els.push(El::Text {
                x: rect.x,
                y: rect.y - 9.0,
                size: PANEL_TITLE_SIZE,
                anchor: Anchor::Start,
                fill: "#222222",
                bold: true,
                vertical: false,
                text: spec.title.to_owned(),
            });
            // The rotated axis label only where it fits beside the panel (the title says it too).
            if text_width(spec.y_label, LABEL_SIZE) <= rect.h - 4.0 {
                els.push(El::Text {
                    x: 20.0,
                    y: rect.y + rect.h / 2.0,
                    size: LABEL_SIZE,
                    anchor: Anchor::Middle,
                    fill: "#333333",
                    bold: false,
                    vertical: true,
                    text: spec.y_label.to_owned(),
                });
            }
            if !has_data {
                els.push(text(rect.x + rect.w / 2.0, rect.y + rect.h / 2.0 + 4.0, LABEL_SIZE, Anchor::Middle, "no data"));
            }

            // Curves: role lines underneath, then each agent's line and markers.
            for (ai, (id, a)) in m.agents.iter().enumerate() {
                let colour = PALETTE[ai % PALETTE.len()];
                if spec.key == "reward" {
                    for role in &roles {
                        if let Some(v) = a.role_reward.get(role) {
                            for run in runs(&m.steps, v, &x, &y) {
                                if run.len() > 1 {
                                    els.push(El::Polyline {
                                        pts: run,
                                        stroke: colour.to_owned(),
                                        width: 1.3,
                                        dash: Some(role_dash(role)),
                                        tag: format!(
                                            "class=\"role-series\" data-panel=\"{}\" data-agent=\"{id}\" data-role=\"{}\"",
                                            spec.key,
                                            xml_escape(role)
                                        ),
                                    });
                                }
                            }
                        }
                    }
                }
                let tag = format!("data-panel=\"{}\" data-agent=\"{id}\"", spec.key);
                for run in runs(&m.steps, (spec.values)(a), &x, &y) {
                    if run.len() > 1 {
                        els.push(El::Polyline { pts: run.clone(), stroke: colour.to_owned(), width: 2.0, dash: None, tag: format!("class=\"series\" {tag}") });
                    }
                    for (cx, cy) in run {
                        els.push(El::Circle { cx, cy, r: marker_r, fill: colour.to_owned(), tag: format!("class=\"point\" {tag}") });
                    }
                }
            }
            panels.push(Panel { key: spec.key, rect, x, y, y_ticks, has_data });
        }

        // Axis label under the shared x axis, the title, the legend.
        let last = panels[panels.len() - 1].rect;
        els.push(text(last.x + last.w / 2.0, last.bottom() + 36.0, LABEL_SIZE, Anchor::Middle, "step"));
        els.push(El::Text {
            x: w / 2.0,
            y: 30.0,
            size: TITLE_SIZE,
            anchor: Anchor::Middle,
            fill: "#111111",
            bold: true,
            vertical: false,
            text: o.title.clone(),
        });
        let lx = right + 18.0;
        let mut ly = panels[0].rect.y + 14.0;
        for (label, colour, dash, marker) in legend {
            els.push(El::Line { x1: lx, y1: ly - 4.0, x2: lx + 24.0, y2: ly - 4.0, stroke: colour.clone(), width: 2.0, dash });
            if marker {
                els.push(El::Circle { cx: lx + 12.0, cy: ly - 4.0, r: 3.0, fill: colour, tag: "class=\"legend-mark\"".into() });
            }
            els.push(text(lx + 32.0, ly, LABEL_SIZE, Anchor::Start, &label));
            ly += 20.0;
        }

        Figure { width: w, height: h, panels, x_ticks, els }
    }

    /// The panel with this key ("reward", "score", "parse_failure", "accuracy").
    #[allow(dead_code)] // for tests and future callers
    pub fn panel(&self, key: &str) -> Option<&Panel> {
        self.panels.iter().find(|p| p.key == key)
    }

    pub fn to_svg(&self, mode: TextMode) -> String {
        let mut s = String::with_capacity(64 * 1024);
        let (w, h) = (num(self.width), num(self.height));
        let _ = writeln!(
            s,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" \
             font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">"
        );
        for el in &self.els {
            match el {
                El::Rect { r, fill, stroke } => {
                    let stroke = stroke.map(|c| format!(" stroke=\"{c}\" stroke-width=\"1\"")).unwrap_or_default();
                    let _ = writeln!(s, "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{fill}\"{stroke}/>", num(r.x), num(r.y), num(r.w), num(r.h));
                }
                El::Line { x1, y1, x2, y2, stroke, width, dash } => {
                    let _ = writeln!(
                        s,
                        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{stroke}\" stroke-width=\"{}\"{}/>",
                        num(*x1),
                        num(*y1),
                        num(*x2),
                        num(*y2),
                        num(*width),
                        dash_attr(*dash)
                    );
                }
                El::Polyline { pts, stroke, width, dash, tag } => {
                    let points: Vec<String> = pts.iter().map(|(x, y)| format!("{},{}", num(*x), num(*y))).collect();
                    let _ = writeln!(
                        s,
                        "<polyline {tag} points=\"{}\" fill=\"none\" stroke=\"{stroke}\" stroke-width=\"{}\" \
                         stroke-linejoin=\"round\" stroke-linecap=\"round\"{}/>",
                        points.join(" "),
                        num(*width),
                        dash_attr(*dash)
                    );
                }
                El::Circle { cx, cy, r, fill, tag } => {
                    let _ = writeln!(
                        s,
                        "<circle {tag} cx=\"{}\" cy=\"{}\" r=\"{}\" fill=\"{fill}\" stroke=\"#ffffff\" stroke-width=\"0.8\"/>",
                        num(*cx),
                        num(*cy),
                        num(*r)
                    );
                }
                El::Text { x, y, size, anchor, fill, bold, vertical, text } => {
                    let rotate = if *vertical { format!(" transform=\"rotate(-90 {} {})\"", num(*x), num(*y)) } else { String::new() };
                    match mode {
                        TextMode::Text => {
                            let anchor = match anchor {
                                Anchor::Start => "start",
                                Anchor::Middle => "middle",
                                Anchor::End => "end",
                            };
                            let weight = if *bold { " font-weight=\"bold\"" } else { "" };
                            let _ = writeln!(
                                s,
                                "<text x=\"{}\" y=\"{}\" font-size=\"{}\" text-anchor=\"{anchor}\" fill=\"{fill}\"{weight}{rotate}>{}</text>",
                                num(*x),
                                num(*y),
                                num(*size),
                                xml_escape(text)
                            );
                        }
                        TextMode::Glyphs => {
                            let d = glyph_path(text, *x, *y, *size, *anchor, *bold);
                            if !d.is_empty() {
                                let _ = writeln!(s, "<path class=\"glyphs\" d=\"{d}\" fill=\"{fill}\" shape-rendering=\"crispEdges\"{rotate}/>");
                            }
                        }
                    }
                }
            }
        }
        s.push_str("</svg>\n");
        s
    }
}

fn text(x: f64, y: f64, size: f64, anchor: Anchor, s: &str) -> El {
    El::Text { x, y, size, anchor, fill: "#333333", bold: false, vertical: false, text: s.to_owned() }
}

/// Splits a series into runs of consecutive present values, mapped to pixels.
fn runs(steps: &[f64], values: &[Option<f64>], x: &Scale, y: &Scale) -> Vec<Vec<(f64, f64)>> {
    let mut out = Vec::new();
    let mut cur: Vec<(f64, f64)> = Vec::new();
    for (s, v) in steps.iter().zip(values) {
        match v {
            Some(v) if v.is_finite() => cur.push((x.map(*s), y.map(*v))),
            _ => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn dash_attr(dash: Option<&str>) -> String {
    dash.map(|d| format!(" stroke-dasharray=\"{d}\"")).unwrap_or_default()
}

/// A coordinate for SVG: at most two decimals, no trailing zeros. Every number that reaches the
/// output goes through here, and a non-finite one (which the code above never produces) would be
/// written as 0 rather than as NaN, which renderers reject.
fn num(v: f64) -> String {
    debug_assert!(v.is_finite(), "non-finite coordinate");
    let v = if v.is_finite() { v } else { 0.0 };
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_owned()
    } else {
        s.to_owned()
    }
}

fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Control characters are not allowed in XML 1.0.
            c if (c as u32) < 0x20 && c != '\t' && c != '\n' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Bitmap text

/// Size of one font pixel for a font size: whole pixels keep the glyphs sharp.
fn glyph_px(size: f64) -> f64 {
    (size / 10.0).round().max(1.0)
}

/// Width that text takes in the bitmap font (wider than most proportional fonts, so layouts
/// sized with it also fit the SVG's own text).
pub fn text_width(s: &str, size: f64) -> f64 {
    s.chars().count() as f64 * 8.0 * glyph_px(size)
}

fn glyph(c: char) -> [u8; 8] {
    use font8x8::UnicodeFonts;
    font8x8::BASIC_FONTS
        .get(c)
        .or_else(|| font8x8::LATIN_FONTS.get(c))
        .or_else(|| font8x8::GREEK_FONTS.get(c))
        .or_else(|| match c {
            // Common typographic dashes and quotes, drawn as their ASCII cousins.
            '\u{2010}'..='\u{2015}' | '\u{2212}' => font8x8::BASIC_FONTS.get('-'),
            '\u{2018}' | '\u{2019}' => font8x8::BASIC_FONTS.get('\''),
            '\u{201C}' | '\u{201D}' => font8x8::BASIC_FONTS.get('"'),
            _ => None,
        })
        .or_else(|| font8x8::BASIC_FONTS.get('?'))
        .unwrap_or([0; 8])
}

/// An SVG path drawing `s` in the 8x8 bitmap font with its baseline at `y`. Each row of a glyph
/// becomes one rectangle per run of lit pixels; in the font's bytes bit 0 is the leftmost pixel,
/// rows 0–6 sit above the baseline and row 7 holds descenders. Bold repeats each run one font
/// pixel to the right.
fn glyph_path(s: &str, x: f64, y: f64, size: f64, anchor: Anchor, bold: bool) -> String {
    let px = glyph_px(size);
    let width = text_width(s, size);
    let x0 = match anchor {
        Anchor::Start => x,
        Anchor::Middle => x - width / 2.0,
        Anchor::End => x - width,
    }
    .round();
    let top = (y - 7.0 * px).round();
    let mut d = String::new();
    for (i, c) in s.chars().enumerate() {
        let rows = glyph(c);
        let gx = x0 + i as f64 * 8.0 * px;
        for (r, bits) in rows.iter().enumerate() {
            let mut col = 0;
            while col < 8 {
                if bits & (1 << col) == 0 {
                    col += 1;
                    continue;
                }
                let start = col;
                while col < 8 && bits & (1 << col) != 0 {
                    col += 1;
                }
                let run = (col - start) as f64 + if bold { 1.0 } else { 0.0 };
                let _ = write!(d, "M{} {}h{}v{}h-{}z", num(gx + start as f64 * px), num(top + r as f64 * px), num(run * px), num(px), num(run * px));
            }
        }
    }
    d
}

// ---------------------------------------------------------------------------------------------
// PNG

/// Rasterises an SVG (written with [`TextMode::Glyphs`]) to PNG bytes of the given size.
pub fn svg_to_png(svg: &str, width: u32, height: u32) -> Result<Vec<u8>> {
    use resvg::{tiny_skia, usvg};
    let tree = usvg::Tree::from_str(svg, &usvg::Options::default()).context("internal error: the plot's SVG did not parse")?;
    let mut pixmap = tiny_skia::Pixmap::new(width, height).with_context(|| format!("cannot allocate a {width}x{height} image"))?;
    pixmap.fill(tiny_skia::Color::WHITE);
    let size = tree.size();
    let transform = tiny_skia::Transform::from_scale(width as f32 / size.width(), height as f32 / size.height());
    resvg::render(&tree, transform, &mut pixmap.as_mut());
    pixmap.encode_png().context("cannot encode the PNG")
}
