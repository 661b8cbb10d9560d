//! Drawing a [`Figure`] with `plotters`: a title over a grid of charts, one per panel, as PNG
//! (bitmap backend, encoded with `png`) or SVG. Text uses DejaVu Sans from the `dejavu` crate,
//! registered with plotters' ab_glyph font table, so no system font is ever looked up.
use crate::content::{Figure, Panel};
use crate::{MAX_SIDE, MIN_SIDE};
use anyhow::{anyhow, bail, Context, Result};
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::sync::OnceLock;

/// Height of one row of panels when `--height` is not given, and of the title band above them.
const ROW_HEIGHT: u32 = 300;
const TITLE_BAND: u32 = 50;
/// Smallest panel that still fits its caption, tick labels and legend.
const MIN_CELL: (u32, u32) = (220, 160);

/// Agent and role colours, picked to stay apart on white; index 7 is the grey of "mean"/"all".
const PALETTE: [RGBColor; 10] = [
    RGBColor(0x1f, 0x5f, 0xbf),
    RGBColor(0xe0, 0x69, 0x1a),
    RGBColor(0x2a, 0x9d, 0x4b),
    RGBColor(0xc8, 0x32, 0x3c),
    RGBColor(0x7b, 0x4f, 0xb8),
    RGBColor(0x8c, 0x5a, 0x3c),
    RGBColor(0xd6, 0x53, 0x9f),
    RGBColor(0x5f, 0x6b, 0x73),
    RGBColor(0xa3, 0xa3, 0x18),
    RGBColor(0x1a, 0xa6, 0xb7),
];
/// (dash, gap) in pixels, one pattern per agent (or per variant of a series).
const DASHES: [(u32, u32); 4] = [(7, 4), (2, 3), (10, 3), (4, 6)];

/// Where the panels go: `cols` by `rows` cells under the title, in a `width` by `height` image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    pub cols: u32,
    pub rows: u32,
    pub width: u32,
    pub height: u32,
}

impl Grid {
    /// Up to three panels a row unless `columns` says otherwise; the height follows the rows.
    pub fn new(
        panels: usize,
        width: u32,
        height: Option<u32>,
        columns: Option<u32>,
    ) -> Result<Grid> {
        let n = panels.max(1) as u32;
        let cols = match columns {
            Some(0) => bail!("--columns 0: use at least 1"),
            Some(c) => c.min(n),
            None => [1, 2, 2, 2].get(n as usize - 1).copied().unwrap_or(3),
        };
        let rows = n.div_ceil(cols);
        let height = height.unwrap_or((TITLE_BAND + rows * ROW_HEIGHT).clamp(MIN_SIDE, MAX_SIDE));
        if width / cols < MIN_CELL.0 {
            bail!("--width {width} is too narrow for {cols} panels side by side: use at least {} or fewer --columns", cols * MIN_CELL.0);
        }
        if height.saturating_sub(TITLE_BAND) / rows < MIN_CELL.1 {
            bail!(
                "--height {height} is too small for {rows} rows of panels: use at least {}, more --columns or fewer --panels",
                TITLE_BAND + rows * MIN_CELL.1
            );
        }
        Ok(Grid { cols, rows, width, height })
    }
}

/// Registers the embedded font under the family names plotters asks for; once per process.
fn register_fonts() -> Result<()> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        ["sans-serif", "serif", "monospace"].iter().all(|name| {
            plotters::style::register_font(name, FontStyle::Normal, dejavu::sans::regular()).is_ok()
        })
    });
    if !ok {
        bail!("internal error: the embedded DejaVu Sans font did not load");
    }
    Ok(())
}

pub fn svg(fig: &Figure, grid: &Grid) -> Result<String> {
    register_fonts()?;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (grid.width, grid.height)).into_drawing_area();
        draw(&root, fig, grid)?;
    }
    Ok(out)
}

pub fn png(fig: &Figure, grid: &Grid) -> Result<Vec<u8>> {
    register_fonts()?;
    let (w, h) = (grid.width, grid.height);
    let mut rgb = vec![0u8; w as usize * h as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
        draw(&root, fig, grid)?;
    }
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header().context("cannot encode the PNG")?;
    writer.write_image_data(&rgb).context("cannot encode the PNG")?;
    writer.finish().context("cannot encode the PNG")?;
    Ok(out)
}

fn failed(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("cannot draw the figure: {e}")
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    fig: &Figure,
    grid: &Grid,
) -> Result<()> {
    root.fill(&WHITE).map_err(failed)?;
    let body = root.titled(&fig.title, ("sans-serif", 26)).map_err(failed)?;
    let cells = body.split_evenly((grid.rows as usize, grid.cols as usize));
    // One legend width for all panels, so that their plot areas line up in the grid.
    let mut widest = 0;
    for s in fig.panels.iter().flat_map(|p| &p.series) {
        widest = widest.max(root.estimate_text_size(&s.name, &legend_style()).map_err(failed)?.0);
    }
    let legend_w = (widest + 44).min(grid.width / grid.cols * 2 / 5);
    let x = fig.x_range();
    for (panel, cell) in fig.panels.iter().zip(&cells) {
        draw_panel(cell, panel, x, legend_w)?;
    }
    root.present().map_err(failed)
}

fn legend_style() -> TextStyle<'static> {
    TextStyle::from(("sans-serif", 13).into_font()).pos(Pos::new(HPos::Left, VPos::Center))
}

/// One panel: the chart, and its legend in a strip on the right, where it never hides a line.
fn draw_panel<DB: DrawingBackend>(
    cell: &DrawingArea<DB, Shift>,
    p: &Panel,
    x: (f64, f64),
    legend_w: u32,
) -> Result<()> {
    let (w, h) = cell.dim_in_pixel();
    let (plot, legend) = cell.split_horizontally(w.saturating_sub(legend_w));
    let y = y_range(p);
    let mut chart = ChartBuilder::on(&plot)
        .caption(p.title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(x.0..x.1, y.0..y.1)
        .map_err(failed)?;
    let x_fmt =
        |v: &f64| if v.fract() == 0.0 { format!("{:.0}", v + 0.0) } else { format!("{v:.1}") };
    let y_fmt = |v: &f64| tick_label(*v, y);
    chart
        .configure_mesh()
        // Steps are whole numbers: no more labels than steps, so none falls between two.
        .x_labels(((x.1 - x.0).round() as usize + 1).clamp(2, 8))
        .y_labels(6)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .x_desc("step")
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 13))
        .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
        .light_line_style(RGBColor(0xf3, 0xf3, 0xf3))
        .draw()
        .map_err(failed)?;

    // Legend rows start level with the top of the chart and squeeze together when many.
    let row_h = ((h as i32 - 80) / p.series.len().max(1) as i32).clamp(8, 18);
    for (i, s) in p.series.iter().enumerate() {
        let colour = PALETTE[s.colour % PALETTE.len()];
        let line = colour.stroke_width(2);
        let dash = s.dash.map(|d| DASHES[d % DASHES.len()]);
        for run in s.runs() {
            // A lone point between gaps has no line to show it: it always gets a marker.
            if s.markers || run.len() == 1 {
                chart
                    .draw_series(run.iter().map(|&pt| Circle::new(pt, 3, colour.filled())))
                    .map_err(failed)?;
            }
            if run.len() > 1 {
                match dash {
                    Some((len, gap)) => {
                        chart.draw_series(DashedLineSeries::new(run, len, gap, line))
                    }
                    None => chart.draw_series(LineSeries::new(run, line)),
                }
                .map_err(failed)?;
            }
        }
        let row = 44 + i as i32 * row_h;
        let sample = vec![(0, row), (24, row)];
        match dash {
            Some((len, gap)) => legend.draw(&DashedPathElement::new(sample, len, gap, line)),
            None => legend.draw(&PathElement::new(sample, line)),
        }
        .map_err(failed)?;
        if s.markers {
            legend.draw(&Circle::new((12, row), 3, colour.filled())).map_err(failed)?;
        }
        legend.draw(&Text::new(s.name.as_str(), (30, row), legend_style())).map_err(failed)?;
    }
    Ok(())
}

/// The y range: the data padded by 5%, all of [0, 1] for shares, never empty.
fn y_range(p: &Panel) -> (f64, f64) {
    let ys = p.series.iter().flat_map(|s| &s.points).filter_map(|pt| pt.1);
    let (mut lo, mut hi) =
        ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), y| (lo.min(y), hi.max(y)));
    if p.unit {
        (lo, hi) = (lo.min(0.0), hi.max(1.0));
    }
    if lo > hi {
        return (0.0, 1.0);
    }
    if lo == hi {
        let pad = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
        return (lo - pad, hi + pad);
    }
    let pad = (hi - lo) * 0.05;
    (lo - pad, hi + pad)
}

/// A tick label with the digits that ticks about a fifth of the axis apart need, so that
/// neighbours differ; an axis of tiny values (learning rates) in scientific notation.
fn tick_label(v: f64, (lo, hi): (f64, f64)) -> String {
    let step = ((hi - lo) / 5.0).abs().max(1e-300);
    if v.abs() < step * 1e-6 {
        return "0".to_owned();
    }
    let magnitude = lo.abs().max(hi.abs());
    if magnitude < 1e-3 {
        let digits = (magnitude.log10().floor() - step.log10().floor()).clamp(1.0, 4.0) as usize;
        return format!("{v:.digits$e}");
    }
    let decimals = (-step.log10().floor()).clamp(0.0, 6.0) as usize;
    format!("{v:.decimals$}")
}
