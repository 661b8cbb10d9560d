//! Tests of `comas plot`. The cli crate has only a binary target, so the module is compiled into
//! this test directly and its public functions are called without going through the binary.
//! What a figure shows is checked on its content (panels, series, points); the drawn files are
//! only checked to be well-formed PNG and SVG.
#[allow(dead_code)]
#[path = "../src/plot.rs"]
mod plot;

use plot::content::{Figure, Group, Options, Panel, Series};
use plot::read::{parse_log, read_log, Metrics};
use plot::render::Grid;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/plot").join(name)
}

fn args(metrics: PathBuf, output: PathBuf) -> plot::Args {
    plot::Args {
        inputs: vec![metrics],
        output,
        title: None,
        panels: Vec::new(),
        roles: false,
        width: 1440,
        height: None,
        columns: None,
    }
}

fn build(m: &Metrics, roles: bool, groups: &[Group]) -> Figure {
    Figure::build(m, &Options { title: "test".into(), roles, groups: groups.to_vec() }).unwrap()
}

fn full(roles: bool) -> Figure {
    build(&read_log(&fixture("full.jsonl")).unwrap(), roles, &[])
}

fn panel<'a>(fig: &'a Figure, key: &str) -> &'a Panel {
    fig.panel(key).unwrap_or_else(|| {
        panic!("no panel {key}; have {:?}", fig.panels.iter().map(|p| p.key).collect::<Vec<_>>())
    })
}

fn series<'a>(fig: &'a Figure, key: &str, name: &str) -> &'a Series {
    let p = panel(fig, key);
    p.series(name).unwrap_or_else(|| panic!("no series {name:?} in {key}; have {:?}", names(p)))
}

fn names(p: &Panel) -> Vec<&str> {
    p.series.iter().map(|s| s.name.as_str()).collect()
}

/// Points equal to `want`, values within 1e-12 (they come from decimal text), gaps exactly.
fn assert_points(s: &Series, want: &[(f64, Option<f64>)]) {
    let ok = s.points.len() == want.len()
        && s.points.iter().zip(want).all(|(g, w)| {
            g.0 == w.0
                && match (g.1, w.1) {
                    (Some(a), Some(b)) => (a - b).abs() <= 1e-12,
                    (None, None) => true,
                    _ => false,
                }
        });
    assert!(ok, "series {:?}: got {:?}, expected {want:?}", s.name, s.points);
}

/// (step, value) points for steps 0, 1, 2.
fn steps3(v: [Option<f64>; 3]) -> Vec<(f64, Option<f64>)> {
    vec![(0.0, v[0]), (1.0, v[1]), (2.0, v[2])]
}

// ---- reading the log -----------------------------------------------------------------------

#[test]
fn reads_step_and_eval_records_and_ignores_other_kinds() {
    let m = read_log(&fixture("three_steps.jsonl")).unwrap();
    assert_eq!(m.job_id.as_deref(), Some("j-fixture"));
    assert_eq!(m.steps.iter().map(|r| r.x).collect::<Vec<_>>(), vec![0.0, 1.0, 2.0]);
    assert_eq!(m.evals.iter().map(|r| r.x).collect::<Vec<_>>(), vec![0.0]);
    let m = read_log(&fixture("full.jsonl")).unwrap();
    assert_eq!(m.job_id.as_deref(), Some("j-full"));
    assert_eq!(m.steps.iter().map(|r| r.x).collect::<Vec<_>>(), vec![0.0, 1.0, 2.0]);
    assert_eq!(m.evals.iter().map(|r| r.x).collect::<Vec<_>>(), vec![0.0, 3.0]);
}

#[test]
fn eval_records_sit_at_after_steps_else_at_step() {
    let text = concat!(
        r#"{"kind":"step","step":0,"reward_mean":0.5}"#,
        "\n",
        r#"{"kind":"eval","step":1,"after_steps":5,"accuracy":{"last_round":0.25}}"#,
        "\n",
        r#"{"kind":"eval","step":2,"accuracy":0.75}"#,
        "\n",
    );
    let fig = build(&parse_log(text, "x").unwrap(), false, &[Group::Accuracy]);
    assert_points(
        series(&fig, "accuracy", "held-out sampled"),
        &[(2.0, Some(0.75)), (5.0, Some(0.25))],
    );
    let err =
        parse_log("{\"kind\":\"step\",\"step\":0}\n{\"kind\":\"eval\",\"accuracy\":1}\n", "log")
            .unwrap_err();
    assert!(
        format!("{err:#}").contains("line 2") && format!("{err:#}").contains("after_steps"),
        "{err:#}"
    );
}

#[test]
fn reward_falls_back_to_role_means() {
    // No reward_mean: the count-weighted mean of the roles, (3 * 1.0 + 1 * 0.0) / 4.
    let text = r#"{"kind":"step","step":0,"reward":{"solver":{"mean":1.0,"count":3},"scorer":{"mean":0.0,"count":1}}}"#;
    let fig = build(&parse_log(text, "x").unwrap(), false, &[Group::Rewards]);
    assert_points(series(&fig, "rewards", "mean"), &[(0.0, Some(0.75))]);
    assert_points(series(&fig, "rewards", "solver"), &[(0.0, Some(1.0))]);
}

#[test]
fn repeated_steps_keep_the_last_record_and_sort() {
    let text = concat!(
        r#"{"kind":"step","step":2,"reward_mean":0.2}"#,
        "\n",
        r#"{"kind":"step","step":1,"reward_mean":0.1}"#,
        "\n",
        r#"{"kind":"step","step":2,"reward_mean":0.9}"#,
        "\n",
    );
    let m = parse_log(text, "x").unwrap();
    assert_eq!(m.steps.iter().map(|r| r.x).collect::<Vec<_>>(), vec![1.0, 2.0]);
    assert_points(
        series(&build(&m, false, &[]), "rewards", "mean"),
        &[(1.0, Some(0.1)), (2.0, Some(0.9))],
    );
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
    assert!(
        format!("{err:#}").contains("line 1") && format!("{err:#}").contains("\"step\""),
        "{err:#}"
    );
}

#[test]
fn unfinished_last_line_is_skipped_but_a_broken_middle_line_is_not() {
    let good = r#"{"kind":"step","step":0,"agents":[{"agent":0,"reward_mean":0.5}]}"#;
    let m = parse_log(&format!("{good}\n{{\"kind\":\"step\",\"st"), "x").unwrap();
    assert_eq!(m.steps.len(), 1);
    let err = parse_log(&format!("{good}\n{{\"kind\":\"step\",\"st\n"), "x").unwrap_err();
    assert!(format!("{err:#}").contains("line 2"), "{err:#}");
}

#[test]
fn log_without_step_records_is_an_error() {
    let err = read_log(&fixture("no_steps.jsonl")).unwrap_err();
    assert!(format!("{err:#}").contains("no step records"), "{err:#}");
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

// ---- the figure's content ------------------------------------------------------------------

#[test]
fn full_log_has_every_panel_and_series() {
    let fig = full(false);
    let keys: Vec<_> = fig.panels.iter().map(|p| p.key).collect();
    assert_eq!(
        keys,
        [
            "rewards",
            "training.loss",
            "training.kl",
            "training.clip",
            "training.grad_norm",
            "training.lr",
            "lengths.completion",
            "lengths.truncation",
            "judging.rates",
            "judging.correctness",
            "judging.separation",
            "accuracy",
            "times"
        ]
    );
    assert!(fig.left_out.is_empty(), "{:?}", fig.left_out);
    assert_eq!(names(panel(&fig, "rewards")), ["solver", "evaluator", "scorer", "mean"]);
    assert_eq!(names(panel(&fig, "training.loss")), ["agent 0", "agent 1"]);
    assert_eq!(
        names(panel(&fig, "training.kl")),
        ["agent 0 kl", "agent 0 approx_kl", "agent 1 kl", "agent 1 approx_kl"]
    );
    assert_eq!(names(panel(&fig, "lengths.completion")), ["solver", "evaluator", "scorer"]);
    assert_eq!(names(panel(&fig, "lengths.truncation")), ["solver", "evaluator", "scorer", "all"]);
    assert_eq!(names(panel(&fig, "judging.rates")), ["score parse rate", "approval rate"]);
    assert_eq!(names(panel(&fig, "judging.correctness")), ["correct", "wrong"]);
    assert_eq!(names(panel(&fig, "accuracy")), ["train", "held-out sampled", "held-out greedy"]);
    assert_eq!(names(panel(&fig, "times")), ["rollout", "train", "broadcast"]);
    // A role has one colour in every panel; "mean" and "all" are grey.
    for key in ["rewards", "lengths.completion", "lengths.truncation"] {
        let colours: Vec<_> = panel(&fig, key).series.iter().map(|s| s.colour).collect();
        assert_eq!(colours[..3], [0, 1, 2], "{key}");
    }
    assert_eq!(
        (series(&fig, "rewards", "mean").colour, series(&fig, "lengths.truncation", "all").colour),
        (7, 7)
    );
    // Shares keep the whole [0, 1] axis; the others follow their data.
    let unit: Vec<_> = fig.panels.iter().filter(|p| p.unit).map(|p| p.key).collect();
    assert_eq!(unit, ["lengths.truncation", "judging.rates", "accuracy"]);
}

#[test]
fn points_are_the_logged_numbers() {
    let fig = full(false);
    let s = |key, name| series(&fig, key, name);
    assert_points(s("rewards", "solver"), &steps3([Some(0.125), Some(0.3125), Some(0.5)]));
    assert_points(s("rewards", "evaluator"), &steps3([Some(0.75), Some(0.625), Some(0.5)]));
    assert_points(s("rewards", "mean"), &steps3([Some(0.3125), Some(0.3125), Some(0.375)]));
    assert_points(
        s("training.loss", "agent 0"),
        &steps3([Some(-0.0625), Some(-0.1875), Some(-0.03125)]),
    );
    assert_points(
        s("training.kl", "agent 0 approx_kl"),
        &steps3([Some(-0.00125), Some(0.0078125), Some(0.001953125)]),
    );
    assert_points(
        s("training.clip", "agent 1"),
        &steps3([Some(0.0078125), None, Some(0.00390625)]),
    );
    assert_points(s("training.grad_norm", "agent 1"), &steps3([Some(0.5), None, Some(0.75)]));
    assert_points(
        s("training.lr", "agent 0"),
        &steps3([Some(0.0003), Some(0.000298), Some(0.000292)]),
    );
    assert_points(
        s("lengths.completion", "solver"),
        &steps3([Some(80.5), Some(86.0), Some(70.25)]),
    );
    assert_points(
        s("lengths.truncation", "evaluator"),
        &steps3([Some(0.5), Some(0.5625), Some(0.25)]),
    );
    assert_points(s("lengths.truncation", "all"), &steps3([Some(0.375), Some(0.4375), Some(0.25)]));
    assert_points(
        s("judging.rates", "score parse rate"),
        &steps3([Some(1.0), Some(0.9375), Some(1.0)]),
    );
    assert_points(s("judging.correctness", "correct"), &steps3([Some(1.0), Some(1.0), Some(1.0)]));
    assert_points(s("accuracy", "train"), &steps3([Some(0.125), Some(0.3125), Some(0.5)]));
    assert_points(s("times", "rollout"), &steps3([Some(40.5), Some(33.875), Some(26.75)]));
    assert_points(s("times", "train"), &steps3([Some(44.25), Some(32.5), Some(30.0)]));
}

#[test]
fn nulls_and_missing_values_are_gaps() {
    let fig = full(false);
    let s = |key, name| series(&fig, key, name);
    // approval_rate is null at step 1, solver_reward_by_correctness has no "wrong" there, the
    // broadcast time is missing, completion_len.scorer is null, and agent 1's `train` is null.
    assert_points(s("judging.rates", "approval rate"), &steps3([Some(0.0625), None, Some(0.25)]));
    assert_points(s("judging.correctness", "wrong"), &steps3([Some(0.0), None, Some(0.125)]));
    assert_points(s("times", "broadcast"), &steps3([Some(0.0625), None, Some(0.125)]));
    assert_points(s("lengths.completion", "scorer"), &steps3([Some(15.0), None, Some(14.5)]));
    assert_points(s("training.loss", "agent 1"), &steps3([Some(-0.125), None, Some(-0.09375)]));
    // A gap splits the line into runs; present points stay connected.
    assert_eq!(s("times", "broadcast").runs(), vec![vec![(0.0, 0.0625)], vec![(2.0, 0.125)]]);
    assert_eq!(s("times", "rollout").runs(), vec![vec![(0.0, 40.5), (1.0, 33.875), (2.0, 26.75)]]);

    // A log full of nulls and wrong types: gaps everywhere, never an error.
    let m = read_log(&fixture("null_fields.jsonl")).unwrap();
    let fig = build(&m, true, &[]);
    assert_points(series(&fig, "accuracy", "train"), &steps3([None, None, Some(0.5)]));
    assert_points(series(&fig, "times", "rollout"), &steps3([Some(10.2), None, Some(10.2)]));
    assert_points(
        series(&fig, "training.loss", "agent 0"),
        &steps3([Some(0.01), None, Some(0.01)]),
    );
    // Rewards only per agent at step 0 (pooled: 0.3, 0.2, 0.1 with equal counts), none after.
    assert_points(series(&fig, "rewards", "solver"), &steps3([Some(0.3), None, None]));
    assert_points(series(&fig, "rewards", "mean"), &steps3([Some(0.2), None, None]));
}

#[test]
fn eval_records_land_at_their_after_steps() {
    let fig = full(false);
    assert_points(
        series(&fig, "accuracy", "held-out sampled"),
        &[(0.0, Some(0.125)), (3.0, Some(0.375))],
    );
    // The second eval ran without a greedy game: a gap.
    assert_points(series(&fig, "accuracy", "held-out greedy"), &[(0.0, Some(0.6875)), (3.0, None)]);
    assert!(series(&fig, "accuracy", "held-out sampled").markers);
    assert!(!series(&fig, "accuracy", "train").markers);
    // The shared x axis reaches the last eval, after the last step.
    assert_eq!(fig.x_range(), (0.0, 3.0));
}

#[test]
fn roles_flag_adds_per_agent_reward_series() {
    let fig = full(true);
    assert_eq!(
        names(panel(&fig, "rewards")),
        [
            "solver",
            "evaluator",
            "scorer",
            "mean",
            "agent 0 solver",
            "agent 0 evaluator",
            "agent 0 scorer",
            "agent 1 solver",
            "agent 1 evaluator",
            "agent 1 scorer"
        ]
    );
    assert_points(
        series(&fig, "rewards", "agent 1 solver"),
        &steps3([Some(0.0), Some(0.25), Some(0.5)]),
    );
    assert_points(
        series(&fig, "rewards", "agent 0 evaluator"),
        &steps3([Some(0.75), Some(0.6875), Some(0.5)]),
    );
    // Per-agent lines take their role's colour and a dash of their own.
    let (a0, a1, team) = (
        series(&fig, "rewards", "agent 0 solver"),
        series(&fig, "rewards", "agent 1 solver"),
        series(&fig, "rewards", "solver"),
    );
    assert_eq!((a0.colour, a1.colour), (team.colour, team.colour));
    assert_eq!((team.dash, a0.dash, a1.dash), (None, Some(0), Some(1)));
    // Without the flag the other panels are the same.
    let plain = full(false);
    assert_eq!(names(panel(&plain, "rewards")).len(), 4);
    assert_eq!(&fig.panels[1..], &plain.panels[1..]);
}

#[test]
fn an_old_log_leaves_out_panels_without_data() {
    // three_steps.jsonl predates the judging, length and per-role fields at the top level.
    let fig = build(&read_log(&fixture("three_steps.jsonl")).unwrap(), false, &[]);
    let keys: Vec<_> = fig.panels.iter().map(|p| p.key).collect();
    assert_eq!(
        keys,
        [
            "rewards",
            "training.loss",
            "training.kl",
            "training.clip",
            "training.grad_norm",
            "training.lr",
            "accuracy",
            "times"
        ]
    );
    let left: Vec<_> = fig.left_out.iter().map(|l| l.0).collect();
    assert_eq!(
        left,
        [
            "lengths.completion",
            "lengths.truncation",
            "judging.rates",
            "judging.correctness",
            "judging.separation"
        ]
    );
    // Team rewards pooled from the agents by count: solver (0.4 * 16 + 0.0 * 16) / 32 at step 0.
    assert_points(series(&fig, "rewards", "solver"), &steps3([Some(0.2), Some(0.3), Some(0.65)]));
    // The old eval record has a plain accuracy number.
    assert_points(series(&fig, "accuracy", "held-out sampled"), &[(0.0, Some(0.9))]);
    assert_eq!(names(panel(&fig, "training.kl")), ["agent 0 kl", "agent 1 kl"]);
}

#[test]
fn a_requested_panel_without_data_is_an_error() {
    let m = read_log(&fixture("three_steps.jsonl")).unwrap();
    let err = Figure::build(
        &m,
        &Options {
            title: "t".into(),
            roles: false,
            groups: vec![Group::Rewards, Group::named("judging").unwrap()],
        },
    )
    .unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("\"judging\"")
            && msg.contains("score_parse_rate")
            && msg.contains("solver_reward_by_correctness"),
        "{msg}"
    );

    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.svg");
    let mut a = args(fixture("three_steps.jsonl"), out.clone());
    a.panels = vec!["lengths".into()];
    let msg = format!("{:#}", plot::run(a).unwrap_err());
    assert!(
        msg.contains("\"lengths\"")
            && msg.contains("completion_len")
            && msg.contains("three_steps.jsonl"),
        "{msg}"
    );
    assert!(!out.exists());
}

#[test]
fn panels_flag_selects_and_orders_groups() {
    assert_eq!(
        Group::parse_list(&["Times,accuracy".into(), "times".into()]).unwrap(),
        [Group::Times, Group::Accuracy]
    );
    assert_eq!(Group::parse_list(&[]).unwrap(), []);
    let m = read_log(&fixture("full.jsonl")).unwrap();
    let fig = build(&m, false, &[Group::Times, Group::Accuracy]);
    assert_eq!(fig.panels.iter().map(|p| p.key).collect::<Vec<_>>(), ["times", "accuracy"]);
    // Only the times panel: the x axis covers the steps alone, not the eval after them.
    assert_eq!(build(&m, false, &[Group::Times]).x_range(), (0.0, 2.0));
}

#[test]
fn unknown_panel_name_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.png");
    let mut a = args(fixture("full.jsonl"), out.clone());
    a.panels = vec!["rewards".into(), "speed".into()];
    let msg = format!("{:#}", plot::run(a).unwrap_err());
    assert!(
        msg.contains("\"speed\"")
            && msg.contains(
                "rewards, training, lengths, judging, coaching, sharing, grading, accuracy, times"
            ),
        "{msg}"
    );
    assert!(!out.exists());
}

#[test]
fn a_single_step_gets_an_axis_of_some_width() {
    let fig = build(&read_log(&fixture("single_step.jsonl")).unwrap(), false, &[]);
    assert_eq!(fig.x_range(), (3.0, 5.0));
    assert_points(series(&fig, "rewards", "solver"), &[(4.0, Some(0.3))]);
    assert_eq!(series(&fig, "rewards", "solver").runs(), vec![vec![(4.0, 0.3)]]);
}

#[test]
fn grid_fits_the_panels() {
    assert_eq!(
        Grid::new(12, 1440, None, None).unwrap(),
        Grid { cols: 3, rows: 4, width: 1440, height: 1250 }
    );
    assert_eq!(
        Grid::new(3, 1440, None, None).unwrap(),
        Grid { cols: 2, rows: 2, width: 1440, height: 650 }
    );
    // One row is shorter than the smallest figure: the height is raised to it.
    assert_eq!(
        Grid::new(1, 800, None, None).unwrap(),
        Grid { cols: 1, rows: 1, width: 800, height: 400 }
    );
    assert_eq!(
        Grid::new(12, 1440, Some(900), Some(6)).unwrap(),
        Grid { cols: 6, rows: 2, width: 1440, height: 900 }
    );
    let msg = format!("{:#}", Grid::new(12, 1440, Some(500), None).unwrap_err());
    assert!(msg.contains("--height 500") && msg.contains("690"), "{msg}");
    let msg = format!("{:#}", Grid::new(12, 600, None, Some(4)).unwrap_err());
    assert!(msg.contains("--width 600") && msg.contains("--columns"), "{msg}");
    assert!(
        format!("{:#}", Grid::new(12, 1440, None, Some(0)).unwrap_err()).contains("--columns 0")
    );
}

// ---- run: formats, files --------------------------------------------------------------------

#[test]
fn run_writes_a_png_and_an_svg_with_every_panel() {
    let dir = tempfile::tempdir().unwrap();
    let png_out = dir.path().join("curves.png");
    let mut a = args(fixture("full.jsonl"), png_out.clone());
    a.roles = true;
    a.title = Some("full run".into());
    plot::run(a.clone()).unwrap();
    let bytes = std::fs::read(&png_out).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    let reader = png::Decoder::new(std::io::Cursor::new(&bytes)).read_info().unwrap();
    assert_eq!((reader.info().width, reader.info().height), (1440, 1550));

    a.output = dir.path().join("curves.svg");
    plot::run(a.clone()).unwrap();
    let svg = std::fs::read_to_string(&a.output).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{}", &svg[..100]);
    assert!(svg.contains("width=\"1440\"") && svg.contains("height=\"1550\""));
    let fig = full(true);
    for title in std::iter::once("full run").chain(fig.panels.iter().map(|p| p.title)) {
        assert!(
            svg.contains(&format!(">\n{title}\n</text>"))
                || svg.contains(&format!(">{title}</text>")),
            "no title {title:?}"
        );
    }
    for label in ["agent 1 evaluator", "held-out greedy", "broadcast"] {
        assert!(svg.contains(label), "no legend entry {label:?}");
    }
    assert!(!svg.contains("NaN"));
}

#[test]
fn a_log_of_nulls_still_draws() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["nulls.svg", "nulls.png"] {
        let mut a = args(fixture("null_fields.jsonl"), dir.path().join(name));
        a.roles = true;
        plot::run(a).unwrap();
    }
    let svg = std::fs::read_to_string(dir.path().join("nulls.svg")).unwrap();
    assert!(!svg.contains("NaN") && !svg.contains("inf"));
}

#[test]
fn run_writes_atomically_and_replaces_old_output() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("curves.svg");
    std::fs::write(&out, "old").unwrap();
    plot::run(args(fixture("three_steps.jsonl"), out.clone())).unwrap();
    let svg = std::fs::read_to_string(&out).unwrap();
    // The default title names the job.
    assert!(svg.starts_with("<svg") && svg.contains("job j-fixture"), "{}", &svg[..200]);
    let names: Vec<_> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(
        names,
        vec![std::ffi::OsString::from("curves.svg")],
        "no temporary file left behind"
    );
}

#[test]
fn title_text_is_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = args(fixture("single_step.jsonl"), dir.path().join("t.svg"));
    a.title = Some("a<b & \"c\"".into());
    plot::run(a.clone()).unwrap();
    let svg = std::fs::read_to_string(&a.output).unwrap();
    assert!(svg.contains("a&lt;b &amp; &quot;c&quot;"));
    assert!(!svg.contains("a<b"));
}

#[test]
fn unknown_or_missing_extension_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["plot.jpg", "plot"] {
        let out = dir.path().join(name);
        let msg = format!(
            "{:#}",
            plot::run(args(fixture("three_steps.jsonl"), out.clone())).unwrap_err()
        );
        assert!(msg.contains(".svg") && msg.contains(".png"), "{msg}");
        assert!(!out.exists());
    }
    let msg = format!(
        "{:#}",
        plot::run(args(fixture("three_steps.jsonl"), dir.path().join("a.jpg"))).unwrap_err()
    );
    assert!(msg.contains(".jpg"), "{msg}");
    // Case does not matter.
    assert_eq!(plot::Format::from_path(Path::new("A.PNG")).unwrap(), plot::Format::Png);
}

#[test]
fn bad_size_or_missing_folder_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = args(fixture("three_steps.jsonl"), dir.path().join("x.svg"));
    a.width = 10;
    let msg = format!("{:#}", plot::run(a).unwrap_err());
    assert!(msg.contains("--width 10") && msg.contains("400") && msg.contains("8192"), "{msg}");
    let mut a = args(fixture("three_steps.jsonl"), dir.path().join("x.svg"));
    a.height = Some(9000);
    assert!(format!("{:#}", plot::run(a).unwrap_err()).contains("--height 9000"));
    let a = args(fixture("three_steps.jsonl"), dir.path().join("no/such/dir/x.svg"));
    assert!(format!("{:#}", plot::run(a).unwrap_err()).contains("does not exist"));
}

#[test]
fn a_mappa_log_shows_the_coach_score_by_role() {
    let line = |step: u32, solver: f64, executor: f64| {
        format!(
            r#"{{"kind":"step","step":{step},"method":"mappa","samples":3,"samples_dropped":1,"reward_mean":0.5,"reward":{{"problem_solver":{{"mean":{},"count":1}}}},"coach_score":{{"problem_solver":{{"mean":{solver},"count":1}},"code_executor":{{"mean":{executor},"count":2}}}},"tool_success_rate":{{"mean":0.5,"count":2}},"outcome_accuracy":{{"mean":1.0,"count":1}}}}"#,
            solver / 10.0
        )
    };
    let m = parse_log(&format!("{}\n{}\n", line(0, 6.0, 3.0), line(1, 7.0, 4.5)), "mappa.jsonl")
        .unwrap();
    let fig = build(&m, false, &[]);
    assert_eq!(names(panel(&fig, "coaching.score")), ["code_executor", "problem_solver"]);
    assert_points(
        series(&fig, "coaching.score", "problem_solver"),
        &[(0.0, Some(6.0)), (1.0, Some(7.0))],
    );
    assert_points(
        series(&fig, "coaching.rates", "actions scored"),
        &[(0.0, Some(0.75)), (1.0, Some(0.75))],
    );
    assert_points(series(&fig, "rewards", "problem_solver"), &[(0.0, Some(0.6)), (1.0, Some(0.7))]);
    // A CoMAS log does not list the coaching panels as missing.
    assert!(full(false).left_out.iter().all(|(key, _)| !key.starts_with("coaching")));
}

#[test]
fn a_cosir_log_shows_team_accuracy_and_the_reward_terms() {
    let line = |step: u32, team: f64, share: f64| {
        format!(
            r#"{{"kind":"step","step":{step},"method":"cosir","team_accuracy":{{"mean":{team},"count":4}},"disclosure_rate":{{"mean":0.25,"count":4}},"reward_terms":{{"share":{{"mean":{share},"count":8}},"use":{{"mean":0.5,"count":4}}}},"reward":{{"discussant":{{"mean":{share},"count":8}}}}}}"#
        )
    };
    let m = parse_log(
        &format!(
            "{}
{}
",
            line(0, 0.25, 0.1),
            line(1, 0.5, 0.3)
        ),
        "cosir.jsonl",
    )
    .unwrap();
    let fig = build(&m, false, &[]);
    assert_points(
        series(&fig, "sharing.rates", "team accuracy"),
        &[(0.0, Some(0.25)), (1.0, Some(0.5))],
    );
    assert_points(
        series(&fig, "sharing.rates", "private cells disclosed"),
        &[(0.0, Some(0.25)), (1.0, Some(0.25))],
    );
    assert_eq!(names(panel(&fig, "sharing.terms")), ["share", "use"]);
    assert_points(series(&fig, "sharing.terms", "share"), &[(0.0, Some(0.1)), (1.0, Some(0.3))]);
    // Other methods' logs do not list the sharing panels as missing.
    assert!(full(false).left_out.iter().all(|(key, _)| !key.starts_with("sharing")));
}
