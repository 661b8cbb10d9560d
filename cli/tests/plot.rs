//! Tests of `comas plot`. The cli crate has only a binary target, so the module is compiled into
//! this test directly and its public functions are called without going through the binary.
#[allow(dead_code)]
#[path = "../src/plot.rs"]
mod plot;

use plot::{nice_ticks, nice_ticks_n, parse_log, read_log, tick_label, Figure, Options, Scale, TextMode};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/plot").join(name)
}

fn opts(width: u32, height: u32, roles: bool) -> Options {
    Options { width, height, title: "test figure".into(), roles }
}

fn args(metrics: PathBuf, output: PathBuf) -> plot::Args {
    plot::Args { metrics, output, title: None, width: 960, height: 960, roles: false }
}

/// The value of attribute `name` in one SVG element line.
fn attr<'a>(element: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let start = element.find(&key)? + key.len();
    let len = element[start..].find('"')?;
    Some(&element[start..start + len])
}

/// Element lines of `tag` whose attributes include all of `with` (name, value).
fn elements<'a>(svg: &'a str, tag: &str, with: &[(&str, &str)]) -> Vec<&'a str> {
    let open = format!("<{tag} ");
    svg.lines().filter(|l| l.starts_with(&open)).filter(|l| with.iter().all(|(k, v)| attr(l, k) == Some(*v))).collect()
}

fn points(polyline: &str) -> Vec<(f64, f64)> {
    attr(polyline, "points")
        .unwrap()
        .split(' ')
        .map(|p| {
            let (x, y) = p.split_once(',').unwrap();
            (x.parse().unwrap(), y.parse().unwrap())
        })
        .collect()
}

fn assert_close(got: (f64, f64), want: (f64, f64)) {
    assert!((got.0 - want.0).abs() <= 0.006 && (got.1 - want.1).abs() <= 0.006, "point {got:?}, expected {want:?}");
}

// ---- ticks and scales ----------------------------------------------------------------------

#[test]
fn nice_ticks_on_round_ranges() {
    assert_eq!(nice_ticks(0.0, 1.0), vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0]);
    assert_eq!(nice_ticks(0.0, 100.0), vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
    assert_eq!(nice_ticks(0.0, 7.0), vec![0.0, 2.0, 4.0, 6.0, 8.0]);
    assert_eq!(nice_ticks(1.0, 3.0), vec![1.0, 1.5, 2.0, 2.5, 3.0]);
    assert_eq!(nice_ticks_n(0.0, 1.0, 2), vec![0.0, 0.5, 1.0]);
}

#[test]
fn nice_ticks_cover_ragged_and_negative_ranges() {
    assert_eq!(nice_ticks(-0.2, 0.5), vec![-0.2, 0.0, 0.2, 0.4, 0.6]);
    assert_eq!(nice_ticks(-0.23, 0.61), vec![-0.4, -0.2, 0.0, 0.2, 0.4, 0.6, 0.8]);
    assert_eq!(nice_ticks(0.013, 0.048), vec![0.01, 0.02, 0.03, 0.04, 0.05]);
    assert_eq!(nice_ticks(120.0, 980.0), vec![0.0, 200.0, 400.0, 600.0, 800.0, 1000.0]);
    // Reversed bounds are accepted.
    assert_eq!(nice_ticks(1.0, 0.0), vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0]);
}

#[test]
fn nice_ticks_survive_degenerate_input() {
    for (lo, hi) in [(5.0, 5.0), (0.0, 0.0), (-3.0, -3.0), (f64::NAN, 1.0), (0.0, f64::INFINITY)] {
        let t = nice_ticks(lo, hi);
        assert!(t.len() >= 2, "{lo}..{hi}: {t:?}");
        assert!(t.iter().all(|v| v.is_finite()), "{lo}..{hi}: {t:?}");
        assert!(t.windows(2).all(|w| w[0] < w[1]), "{lo}..{hi}: {t:?}");
        if lo.is_finite() && hi.is_finite() {
            assert!(t[0] <= lo && *t.last().unwrap() >= hi, "{lo}..{hi}: {t:?}");
        }
    }
    assert_eq!(nice_ticks(0.0, 0.0), vec![-1.0, -0.5, 0.0, 0.5, 1.0]);
}

#[test]
fn tick_labels_are_clean() {
    assert_eq!(tick_label(0.6000000000000001, 0.2), "0.6");
    assert_eq!(tick_label(-0.0, 0.2), "0.0");
    assert_eq!(tick_label(1000.0, 200.0), "1000");
    assert_eq!(tick_label(0.05, 0.01), "0.05");
    assert_eq!(tick_label(-0.4, 0.2), "-0.4");
}

#[test]
fn scale_maps_data_to_pixels() {
    let x = Scale { d0: 0.0, d1: 10.0, r0: 100.0, r1: 300.0 };
    assert_eq!(x.map(0.0), 100.0);
    assert_eq!(x.map(2.5), 150.0);
    assert_eq!(x.map(10.0), 300.0);
    // A y scale runs upwards: the domain's top is the smaller pixel row.
    let y = Scale { d0: -0.2, d1: 0.6, r0: 400.0, r1: 80.0 };
    assert!((y.map(0.2) - 240.0).abs() < 1e-9);
    assert_eq!(y.map(0.6), 80.0);
    // An empty domain maps to the middle instead of dividing by zero.
    assert_eq!(Scale { d0: 1.0, d1: 1.0, r0: 0.0, r1: 10.0 }.map(1.0), 5.0);
}

// ---- reading the log -----------------------------------------------------------------------

#[test]
fn reads_step_records_and_ignores_other_kinds() {
    let m = read_log(&fixture("three_steps.jsonl")).unwrap();
    assert_eq!(m.job_id.as_deref(), Some("j-fixture"));
    assert_eq!(m.steps, vec![0.0, 1.0, 2.0]);
    assert_eq!(m.agents.keys().copied().collect::<Vec<_>>(), vec![0, 1]);
    let (a0, a1) = (&m.agents[&0], &m.agents[&1]);
    assert_eq!(a0.reward, vec![Some(0.1), Some(0.3), Some(0.5)]);
    assert_eq!(a1.reward, vec![Some(-0.2), Some(0.0), Some(0.4)]);
    // Mean valid score from {"1":1,"2":5,"3":6}: (1 + 10 + 18) / 12.
    assert_eq!(a0.score[0], Some(29.0 / 12.0));
    assert_eq!(a1.score[0], Some(1.5));
    assert_eq!(a0.parse_failure, vec![Some(0.25); 3]);
    assert_eq!(a1.parse_failure[0], Some(0.0));
    assert_eq!(a1.accuracy, vec![Some(0.5), None, Some(1.0)]);
    assert_eq!(a0.role_reward["solver"], vec![Some(0.4), Some(0.5), Some(0.7)]);
    assert_eq!(a0.role_reward.len(), 3);
}

#[test]
fn nulls_and_missing_fields_are_gaps() {
    let m = read_log(&fixture("null_fields.jsonl")).unwrap();
    let a = &m.agents[&0];
    assert_eq!(a.reward, vec![Some(0.2), None, None]);
    assert_eq!(a.score, vec![Some(2.25), None, None]);
    // No parse_failure_rate field: the invalid share of the histogram (0 of 4).
    assert_eq!(a.parse_failure, vec![Some(0.0), None, None]);
    assert_eq!(a.accuracy, vec![None, None, None]);
}

#[test]
fn reward_falls_back_to_role_means() {
    let text = r#"{"kind":"step","step":0,"agents":[{"agent":3,"reward":{"solver":{"mean":1.0,"count":3},"scorer":{"mean":0.0,"count":1}}}]}"#;
    let m = parse_log(text, "x").unwrap();
    assert_eq!(m.agents[&3].reward, vec![Some(0.75)]);
}

#[test]
fn repeated_steps_keep_the_last_record_and_sort() {
    let text = concat!(
        r#"{"kind":"step","step":2,"agents":[{"agent":0,"reward_mean":0.2}]}"#,
        "\n",
        r#"{"kind":"step","step":1,"agents":[{"agent":0,"reward_mean":0.1}]}"#,
        "\n",
        r#"{"kind":"step","step":2,"agents":[{"agent":0,"reward_mean":0.9}]}"#,
        "\n",
    );
    let m = parse_log(text, "x").unwrap();
    assert_eq!(m.steps, vec![1.0, 2.0]);
    assert_eq!(m.agents[&0].reward, vec![Some(0.1), Some(0.9)]);
}

#[test]
fn malformed_line_error_names_its_line() {
    let err = read_log(&fixture("malformed.jsonl")).unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("line 3"), "{msg}");
    assert!(msg.contains("malformed.jsonl"), "{msg}");
    assert!(msg.contains("JSON"), "{msg}");

    let err = parse_log("{\"kind\":\"step\",\"step\":0}\n[1,2]\n", "log").unwrap_err();
    assert!(format!("{err:#}").contains("line 2"), "{err:#}");
    let err = parse_log("{\"kind\":\"step\",\"agents\":[]}\n", "log").unwrap_err();
    assert!(format!("{err:#}").contains("line 1") && format!("{err:#}").contains("\"step\""), "{err:#}");
}

#[test]
fn unfinished_last_line_is_skipped_but_a_broken_middle_line_is_not() {
    let good = r#"{"kind":"step","step":0,"agents":[{"agent":0,"reward_mean":0.5}]}"#;
    let m = parse_log(&format!("{good}\n{{\"kind\":\"step\",\"st"), "x").unwrap();
    assert_eq!(m.steps, vec![0.0]);
    let err = parse_log(&format!("{good}\n{{\"kind\":\"step\",\"st\n"), "x").unwrap_err();
    assert!(format!("{err:#}").contains("line 2"), "{err:#}");
}

#[test]
fn log_without_step_records_is_an_error() {
    let err = read_log(&fixture("no_steps.jsonl")).unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("no step records"), "{msg}");
    assert!(parse_log("", "empty").unwrap_err().to_string().contains("no step records"));
}

#[test]
fn missing_log_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.svg");
    let err = plot::run(args(dir.path().join("nope.jsonl"), out.clone())).unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("nope.jsonl") && msg.contains("does not exist"), "{msg}");
    assert!(!out.exists());
}

// ---- the SVG -------------------------------------------------------------------------------

#[test]
fn layout_and_scales_follow_the_data() {
    let m = read_log(&fixture("three_steps.jsonl")).unwrap();
    let fig = Figure::build(&m, &opts(960, 960, false));
    let keys: Vec<_> = fig.panels.iter().map(|p| p.key).collect();
    assert_eq!(keys, ["reward", "score", "parse_failure", "accuracy"]);
    assert_eq!(fig.x_ticks, vec![0.0, 1.0, 2.0]);
    let r = fig.panel("reward").unwrap();
    // 78 px left margin; right edge = 960 - legend (96) - 28.
    assert_eq!((r.rect.x, r.rect.right(), r.rect.y), (78.0, 836.0, 80.0));
    assert_eq!(r.y_ticks, vec![-0.2, 0.0, 0.2, 0.4, 0.6]);
    assert_eq!((r.y.d0, r.y.d1, r.y.r0, r.y.r1), (-0.2, 0.6, r.rect.bottom(), r.rect.y));
    assert_eq!((r.x.d0, r.x.d1), (0.0, 2.0));
    let s = fig.panel("score").unwrap();
    assert_eq!((s.y.d0, s.y.d1), (1.0, 3.0));
    assert_eq!(fig.panel("parse_failure").unwrap().y_ticks, vec![0.0, 0.5, 1.0]);
    assert_eq!(fig.panel("accuracy").unwrap().y_ticks, vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0]);
    // Panels stack downwards without overlapping, all inside the figure.
    for w in fig.panels.windows(2) {
        assert!(w[0].rect.bottom() < w[1].rect.y);
        assert_eq!(w[0].rect.x, w[1].rect.x);
    }
    assert!(fig.panels.last().unwrap().rect.bottom() < 960.0 - 30.0);
}

#[test]
fn svg_has_one_reward_polyline_per_agent_at_the_expected_pixels() {
    let m = read_log(&fixture("three_steps.jsonl")).unwrap();
    let fig = Figure::build(&m, &opts(960, 960, false));
    let svg = fig.to_svg(TextMode::Text);
    let rp = fig.panel("reward").unwrap();
    let (left, right, bottom, h) = (rp.rect.x, rp.rect.right(), rp.rect.bottom(), rp.rect.h);
    let lines = elements(&svg, "polyline", &[("data-panel", "reward")]);
    assert_eq!(lines.len(), 2, "{lines:#?}");
    let expected = [(0, [0.1, 0.3, 0.5]), (1, [-0.2, 0.0, 0.4])];
    for (agent, values) in expected {
        let line = elements(&svg, "polyline", &[("data-panel", "reward"), ("data-agent", &agent.to_string())]);
        assert_eq!(line.len(), 1);
        let pts = points(line[0]);
        assert_eq!(pts.len(), 3);
        for (i, (p, v)) in pts.iter().zip(values).enumerate() {
            // x: steps 0..2 over the panel's width; y: -0.2..0.6 from the bottom up.
            let want_x = left + i as f64 / 2.0 * (right - left);
            let want_y = bottom - (v + 0.2) / 0.8 * h;
            assert_close(*p, (want_x, want_y));
        }
        assert_eq!(elements(&svg, "circle", &[("data-panel", "reward"), ("data-agent", &agent.to_string())]).len(), 3);
    }
    // The three x positions are the panel's left edge, middle and right edge.
    let a0 = points(elements(&svg, "polyline", &[("data-panel", "reward"), ("data-agent", "0")])[0]);
    assert_close((a0[1].0, 0.0), (457.0, 0.0));
    assert_close((a0[2].0, 0.0), (836.0, 0.0));
    // Agents get different colours.
    assert_ne!(attr(lines[0], "stroke"), attr(lines[1], "stroke"));
}

#[test]
fn svg_has_legend_title_ticks_and_labels() {
    let m = read_log(&fixture("three_steps.jsonl")).unwrap();
    let svg = Figure::build(&m, &opts(960, 960, false)).to_svg(TextMode::Text);
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"960\" height=\"960\""));
    assert!(svg.trim_end().ends_with("</svg>"));
    for label in [
        ">agent 0</text>",
        ">agent 1</text>",
        ">test figure</text>",
        ">step</text>",
        ">reward</text>",
        ">accuracy</text>",
        ">-0.2</text>",
        ">0.6</text>",
        ">1.5</text>",
        ">0.5</text>",
        ">Mean reward per agent</text>",
        ">Solver accuracy (last round)</text>",
    ] {
        assert!(svg.contains(label), "missing {label}");
    }
    // x tick labels 0, 1, 2 once each, under the bottom panel.
    for t in ["0", "1", "2"] {
        let n = svg.lines().filter(|l| l.starts_with("<text") && l.ends_with(&format!(">{t}</text>"))).count();
        assert_eq!(n, 1, "x tick {t}");
    }
    assert!(!svg.contains("no data"));
    assert!(!svg.contains("<path"), "text mode writes no glyph paths");
}

#[test]
fn gaps_split_lines_and_single_points_still_get_markers() {
    let m = read_log(&fixture("three_steps.jsonl")).unwrap();
    let svg = Figure::build(&m, &opts(960, 960, false)).to_svg(TextMode::Text);
    // Agent 1's accuracy is null at step 1: no line joins steps 0 and 2, but both are marked.
    assert!(elements(&svg, "polyline", &[("data-panel", "accuracy"), ("data-agent", "1")]).is_empty());
    assert_eq!(elements(&svg, "circle", &[("data-panel", "accuracy"), ("data-agent", "1")]).len(), 2);
    assert_eq!(elements(&svg, "polyline", &[("data-panel", "accuracy"), ("data-agent", "0")]).len(), 1);
}

#[test]
fn roles_flag_adds_dashed_role_lines() {
    let m = read_log(&fixture("three_steps.jsonl")).unwrap();
    let svg = Figure::build(&m, &opts(960, 960, true)).to_svg(TextMode::Text);
    let roles = elements(&svg, "polyline", &[("class", "role-series")]);
    assert_eq!(roles.len(), 6);
    assert!(roles.iter().all(|l| attr(l, "stroke-dasharray").is_some()));
    assert_eq!(elements(&svg, "polyline", &[("class", "role-series"), ("data-role", "solver")]).len(), 2);
    assert!(svg.contains(">solver reward</text>"));
    // Without the flag there are none.
    let plain = Figure::build(&m, &opts(960, 960, false)).to_svg(TextMode::Text);
    assert!(elements(&plain, "polyline", &[("class", "role-series")]).is_empty());
}

#[test]
fn null_values_leave_no_nan_in_the_svg() {
    let m = read_log(&fixture("null_fields.jsonl")).unwrap();
    for mode in [TextMode::Text, TextMode::Glyphs] {
        let fig = Figure::build(&m, &opts(800, 700, true));
        let svg = fig.to_svg(mode);
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
        assert!(!fig.panel("accuracy").unwrap().has_data);
        assert!(fig.panel("reward").unwrap().has_data);
        // Reward has one isolated value: a marker, no line.
        assert!(elements(&svg, "polyline", &[("data-panel", "reward")]).is_empty());
        assert_eq!(elements(&svg, "circle", &[("data-panel", "reward")]).len(), 1);
    }
    let svg = Figure::build(&m, &opts(800, 700, false)).to_svg(TextMode::Text);
    assert!(svg.contains(">no data</text>"));
}

#[test]
fn a_single_step_is_visible() {
    let m = read_log(&fixture("single_step.jsonl")).unwrap();
    let fig = Figure::build(&m, &opts(960, 960, false));
    let svg = fig.to_svg(TextMode::Text);
    let r = fig.panel("reward").unwrap();
    let marks = elements(&svg, "circle", &[("data-panel", "reward")]);
    assert_eq!(marks.len(), 1);
    let (cx, cy): (f64, f64) = (attr(marks[0], "cx").unwrap().parse().unwrap(), attr(marks[0], "cy").unwrap().parse().unwrap());
    assert!((cx - (r.rect.x + r.rect.w / 2.0)).abs() < 0.01, "single step sits mid-axis: {cx}");
    assert!(r.rect.contains(cx, cy));
    assert!(attr(marks[0], "r").unwrap().parse::<f64>().unwrap() >= 2.0);
    assert_eq!(fig.x_ticks, vec![4.0]);
    assert!(svg.contains(">4</text>"));
}

#[test]
fn text_is_escaped() {
    let m = read_log(&fixture("single_step.jsonl")).unwrap();
    let mut o = opts(960, 960, false);
    o.title = "a<b & \"c\"".into();
    let svg = Figure::build(&m, &o).to_svg(TextMode::Text);
    assert!(svg.contains(">a&lt;b &amp; &quot;c&quot;</text>"));
}

// ---- run: formats, files --------------------------------------------------------------------

#[test]
fn run_writes_svg_atomically_and_replaces_old_output() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("curves.svg");
    std::fs::write(&out, "old").unwrap();
    let mut a = args(fixture("three_steps.jsonl"), out.clone());
    a.title = Some("my run".into());
    plot::run(a).unwrap();
    let svg = std::fs::read_to_string(&out).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains(">my run</text>"));
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("curves.svg")], "no temporary file left behind");
    // The default title names the job.
    plot::run(args(fixture("three_steps.jsonl"), out.clone())).unwrap();
    assert!(std::fs::read_to_string(&out).unwrap().contains(">job j-fixture</text>"));
}

#[test]
fn unknown_or_missing_extension_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["plot.jpg", "plot"] {
        let out = dir.path().join(name);
        let err = plot::run(args(fixture("three_steps.jsonl"), out.clone())).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains(".svg") && msg.contains(".png"), "{msg}");
        assert!(!out.exists());
    }
    let msg = format!("{:#}", plot::run(args(fixture("three_steps.jsonl"), dir.path().join("a.jpg"))).unwrap_err());
    assert!(msg.contains(".jpg"), "{msg}");
    // Case does not matter.
    assert_eq!(plot::Format::from_path(Path::new("A.PNG")).unwrap(), plot::Format::Png);
}

#[test]
fn bad_size_or_missing_folder_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = args(fixture("three_steps.jsonl"), dir.path().join("x.svg"));
    a.width = 10;
    assert!(format!("{:#}", plot::run(a).unwrap_err()).contains("--width"));
    let a = args(fixture("three_steps.jsonl"), dir.path().join("no/such/dir/x.svg"));
    assert!(format!("{:#}", plot::run(a).unwrap_err()).contains("does not exist"));
}

fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    assert_eq!(&bytes[12..16], b"IHDR");
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    (be(&bytes[16..20]), be(&bytes[20..24]))
}

#[test]
fn run_writes_png_of_the_requested_size_with_curves_and_text() {
    use resvg::tiny_skia::Pixmap;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("curves.png");
    let mut a = args(fixture("three_steps.jsonl"), out.clone());
    (a.width, a.height) = (800, 620);
    plot::run(a).unwrap();
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(png_size(&bytes), (800, 620));
    let img = Pixmap::decode_png(&bytes).unwrap();
    assert_eq!((img.width(), img.height()), (800, 620));
    let px = |x: u32, y: u32| {
        let c = img.pixel(x, y).unwrap();
        (c.red() as i32, c.green() as i32, c.blue() as i32)
    };
    let count = |x0: f64, y0: f64, x1: f64, y1: f64, f: &dyn Fn((i32, i32, i32)) -> bool| {
        let mut n = 0;
        for y in y0.ceil() as u32..y1.floor() as u32 {
            for x in x0.ceil() as u32..x1.floor() as u32 {
                n += f(px(x, y)) as usize;
            }
        }
        n
    };
    // Same layout as the run above (the title does not move anything).
    let m = read_log(&fixture("three_steps.jsonl")).unwrap();
    let fig = Figure::build(&m, &opts(800, 620, false));
    let r = fig.panel("reward").unwrap().rect;
    let inside = (r.x + 2.0, r.y + 2.0, r.right() - 2.0, r.bottom() - 2.0);
    // Agent 0 is drawn in #1f5fbf, agent 1 in #e0691a.
    let near = |want: (i32, i32, i32)| move |c: (i32, i32, i32)| (c.0 - want.0).abs() + (c.1 - want.1).abs() + (c.2 - want.2).abs() < 60;
    let blue = count(inside.0, inside.1, inside.2, inside.3, &near((0x1f, 0x5f, 0xbf)));
    let orange = count(inside.0, inside.1, inside.2, inside.3, &near((0xe0, 0x69, 0x1a)));
    assert!(blue > 200 && orange > 200, "curve pixels: blue {blue}, orange {orange}");
    // The top corners of the figure stay background white.
    assert_eq!(px(0, 0), (255, 255, 255));
    assert_eq!(px(799, 0), (255, 255, 255));
    // Text is drawn without any font: the title band and the legend have dark pixels.
    let dark = |c: (i32, i32, i32)| c.0 < 100 && c.1 < 100 && c.2 < 100;
    assert!(count(0.0, 0.0, 800.0, 45.0, &dark) > 100, "title pixels");
    assert!(count(r.right() + 40.0, r.y, 800.0, r.y + 50.0, &dark) > 50, "legend pixels");
    // Tick labels left of the reward panel.
    assert!(count(0.0, r.y, r.x - 4.0, r.bottom(), &dark) > 50, "tick label pixels");
}

#[test]
fn glyph_mode_svg_renders_text_as_paths() {
    let m = read_log(&fixture("single_step.jsonl")).unwrap();
    let svg = Figure::build(&m, &opts(960, 960, false)).to_svg(TextMode::Glyphs);
    assert!(!svg.contains("<text"));
    assert!(svg.lines().filter(|l| l.starts_with("<path class=\"glyphs\"")).count() > 10);
    let png = plot::svg_to_png(&svg, 960, 960).unwrap();
    assert_eq!(png_size(&png), (960, 960));
}
