//! What a figure shows, as plain data: panels of series of (step, value) points, built from the
//! metrics log. Nothing here draws; `render` turns a [`Figure`] into pixels.
use crate::read::{field, num_at, number, Metrics, Record};
use anyhow::{bail, Result};
use comas_workflow::method::Chart;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// A group of panels, as named by `--panels`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    Rewards,
    Training,
    Lengths,
    Accuracy,
    Times,
    /// A method's own panels (CoMAS's `judging`, MAPPA's `coaching`, CoSIR's `sharing`), by
    /// the group's name and its method's.
    Method {
        group: &'static str,
        method: &'static str,
    },
}

impl Group {
    /// Every group, in the order a figure shows them: the methods' own after the lengths.
    pub fn all() -> Vec<Group> {
        let methods = comas_workflow::registry::chart_groups()
            .into_iter()
            .map(|(group, method)| Group::Method { group, method });
        [Group::Rewards, Group::Training, Group::Lengths]
            .into_iter()
            .chain(methods)
            .chain([Group::Accuracy, Group::Times])
            .collect()
    }

    pub fn name(self) -> &'static str {
        match self {
            Group::Rewards => "rewards",
            Group::Training => "training",
            Group::Lengths => "lengths",
            Group::Accuracy => "accuracy",
            Group::Times => "times",
            Group::Method { group, .. } => group,
        }
    }

    /// A group by its name (any case).
    pub fn named(name: &str) -> Option<Group> {
        Group::all().into_iter().find(|g| g.name().eq_ignore_ascii_case(name))
    }

    /// The groups named in `--panels` (comma-separated, any case), in the order given; none: all.
    pub fn parse_list(names: &[String]) -> Result<Vec<Group>> {
        let mut out = Vec::new();
        for name in names.iter().flat_map(|n| n.split(',')).map(str::trim).filter(|n| !n.is_empty())
        {
            let Some(g) = Group::named(name) else {
                let known: Vec<_> = Group::all().iter().map(|g| g.name()).collect();
                bail!(
                    "unknown panel {name:?} in --panels: use some of {}, separated by commas",
                    known.join(", ")
                );
            };
            if !out.contains(&g) {
                out.push(g);
            }
        }
        Ok(out)
    }
}

#[derive(Debug, Clone, Default)]
pub struct Options {
    pub title: String,
    /// Also show each agent's reward per role.
    pub roles: bool,
    /// The groups asked for; empty: all, leaving out those without data.
    pub groups: Vec<Group>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    /// One point per record; `None` where the value is missing or null: a gap in the line.
    pub points: Vec<(f64, Option<f64>)>,
    /// Palette index: a role's or an agent's colour, the same wherever it appears.
    pub colour: usize,
    /// Dash pattern index; `None` draws a solid line.
    pub dash: Option<usize>,
    /// Mark every point, for sparse series such as evals.
    pub markers: bool,
}

impl Series {
    fn new(
        name: impl Into<String>,
        records: &[Record],
        value: impl Fn(&Value) -> Option<f64>,
    ) -> Series {
        let points = records.iter().map(|r| (r.x, value(&r.value))).collect();
        Series { name: name.into(), points, colour: 0, dash: None, markers: false }
    }

    fn colour(mut self, c: usize) -> Series {
        self.colour = c;
        self
    }

    fn dash(mut self, d: usize) -> Series {
        self.dash = Some(d);
        self
    }

    fn markers(mut self) -> Series {
        self.markers = true;
        self
    }

    /// The y values alone, in order.
    #[allow(dead_code)] // for tests and other callers
    pub fn values(&self) -> Vec<Option<f64>> {
        self.points.iter().map(|p| p.1).collect()
    }

    /// Runs of consecutive present points: each is drawn as one line, split at the gaps.
    pub fn runs(&self) -> Vec<Vec<(f64, f64)>> {
        let mut out = vec![Vec::new()];
        for &(x, y) in &self.points {
            match y {
                Some(y) => out.last_mut().unwrap().push((x, y)),
                None if out.last().unwrap().is_empty() => {}
                None => out.push(Vec::new()),
            }
        }
        out.retain(|r| !r.is_empty());
        out
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    pub group: Group,
    /// Stable name, e.g. `training.lr`.
    pub key: &'static str,
    pub title: &'static str,
    /// The log fields the panel is drawn from, for messages about missing data.
    pub needs: &'static str,
    /// A share in [0, 1]: the y axis always spans that.
    pub unit: bool,
    /// Only series with at least one value.
    pub series: Vec<Series>,
}

impl Panel {
    fn new(
        group: Group,
        key: &'static str,
        title: &'static str,
        needs: &'static str,
        unit: bool,
        series: Vec<Series>,
    ) -> Panel {
        let series =
            series.into_iter().filter(|s| s.points.iter().any(|p| p.1.is_some())).collect();
        Panel { group, key, title, needs, unit, series }
    }

    #[allow(dead_code)] // for tests and other callers
    pub fn series(&self, name: &str) -> Option<&Series> {
        self.series.iter().find(|s| s.name == name)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    pub title: String,
    pub panels: Vec<Panel>,
    /// Panels without data that were left out: (key, what they need).
    pub left_out: Vec<(&'static str, &'static str)>,
}

impl Figure {
    pub fn build(m: &Metrics, o: &Options) -> Result<Figure> {
        let explicit = !o.groups.is_empty();
        // A method's own panels are drawn for a log of that method only: another method's log
        // does not list them as missing.
        let method =
            m.steps.first().map(|r| comas_workflow::registry::method_of(&r.value).to_string());
        let groups = if explicit {
            o.groups.clone()
        } else {
            Group::all().into_iter().filter(|g| !matches!(g, Group::Method { method: of, .. } if Some(*of) != method.as_deref())).collect()
        };
        let mut fig = Figure { title: o.title.clone(), panels: Vec::new(), left_out: Vec::new() };
        for g in groups {
            if let (Group::Method { group, method: of }, Some(logged)) = (g, &method) {
                if of != logged {
                    bail!(
                        "panel {group:?} is drawn from {of} step records; this log is of {logged}"
                    );
                }
            }
            let (full, empty): (Vec<Panel>, Vec<Panel>) =
                panels(g, m, o.roles).into_iter().partition(|p| !p.series.is_empty());
            if explicit && full.is_empty() {
                let needs: Vec<_> = empty.iter().map(|p| p.needs).collect();
                bail!(
                    "panel {:?} has no data in this log: it needs {}",
                    g.name(),
                    needs.join("; or ")
                );
            }
            fig.left_out.extend(empty.iter().map(|p| (p.key, p.needs)));
            fig.panels.extend(full);
        }
        if fig.panels.is_empty() {
            bail!("nothing to plot: the step records have none of the fields that the panels show (reward, accuracy, seconds, ...)");
        }
        Ok(fig)
    }

    #[allow(dead_code)] // for tests and other callers
    pub fn panel(&self, key: &str) -> Option<&Panel> {
        self.panels.iter().find(|p| p.key == key)
    }

    /// The x range shared by all panels, widened around a single step so that it has a width.
    pub fn x_range(&self) -> (f64, f64) {
        let xs = self
            .panels
            .iter()
            .flat_map(|p| &p.series)
            .flat_map(|s| &s.points)
            .filter(|p| p.1.is_some())
            .map(|p| p.0);
        let (lo, hi) =
            xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| (lo.min(x), hi.max(x)));
        if lo > hi {
            (0.0, 1.0)
        } else if lo == hi {
            (lo - 1.0, hi + 1.0)
        } else {
            (lo, hi)
        }
    }
}

/// Colour of the all-roles / all-agents line (grey in the palette).
pub const GREY: usize = 7;

fn panels(g: Group, m: &Metrics, roles: bool) -> Vec<Panel> {
    let steps = &m.steps;
    match g {
        Group::Rewards => {
            let team = role_names(steps.iter().flat_map(|r| team_rewards(&r.value).into_keys()));
            let mut series: Vec<Series> = team
                .iter()
                .map(|role| {
                    Series::new(role.as_str(), steps, |v| team_rewards(v).get(role).map(|r| r.0))
                        .colour(role_colour(role, &team))
                })
                .collect();
            series.push(Series::new("mean", steps, team_mean).colour(GREY));
            if roles {
                for (k, id) in agent_ids(m).into_iter().enumerate() {
                    let mine = role_names(
                        steps
                            .iter()
                            .filter_map(|r| agent(&r.value, id))
                            .flat_map(|a| role_rewards(a.get("reward")).into_keys()),
                    );
                    for role in mine {
                        let s = Series::new(format!("agent {id} {role}"), steps, |v| {
                            agent(v, id)
                                .and_then(|a| role_rewards(a.get("reward")).get(&role).map(|r| r.0))
                        });
                        series.push(s.colour(role_colour(&role, &team)).dash(k));
                    }
                }
            }
            vec![Panel::new(
                g,
                "rewards",
                "Reward by role",
                "reward.<role>.mean or reward_mean in the step records",
                false,
                series,
            )]
        }
        Group::Training => {
            let ids = agent_ids(m);
            let per_agent = |key: &str| -> Vec<Series> {
                let path = format!("train.{key}");
                ids.iter()
                    .enumerate()
                    .map(|(c, &id)| {
                        Series::new(format!("agent {id}"), steps, |v| agent_num(v, id, &path))
                            .colour(c)
                    })
                    .collect()
            };
            let mut kl = Vec::new();
            for (c, &id) in ids.iter().enumerate() {
                kl.push(
                    Series::new(format!("agent {id} kl"), steps, |v| agent_num(v, id, "train.kl"))
                        .colour(c),
                );
                kl.push(
                    Series::new(format!("agent {id} approx_kl"), steps, |v| {
                        agent_num(v, id, "train.approx_kl")
                    })
                    .colour(c)
                    .dash(0),
                );
            }
            vec![
                Panel::new(
                    g,
                    "training.loss",
                    "Training loss",
                    "agents[].train.loss",
                    false,
                    per_agent("loss"),
                ),
                Panel::new(
                    g,
                    "training.kl",
                    "KL divergence",
                    "agents[].train.kl or approx_kl",
                    false,
                    kl,
                ),
                Panel::new(
                    g,
                    "training.clip",
                    "Clip fraction",
                    "agents[].train.clip_frac",
                    false,
                    per_agent("clip_frac"),
                ),
                Panel::new(
                    g,
                    "training.grad_norm",
                    "Gradient norm",
                    "agents[].train.grad_norm",
                    false,
                    per_agent("grad_norm"),
                ),
                Panel::new(
                    g,
                    "training.lr",
                    "Learning rate",
                    "agents[].train.lr",
                    false,
                    per_agent("lr"),
                ),
            ]
        }
        Group::Lengths => {
            let per_role = |path: &str| -> Vec<Series> {
                let names = role_names(
                    steps
                        .iter()
                        .filter_map(|r| field(&r.value, path)?.as_object())
                        .flat_map(|o| o.keys().cloned()),
                );
                names
                    .iter()
                    .map(|role| {
                        Series::new(role.as_str(), steps, |v| num_at(v, &format!("{path}.{role}")))
                            .colour(role_colour(role, &names))
                    })
                    .collect()
            };
            let mut truncation = per_role("truncation_rate_by_role");
            truncation
                .push(Series::new("all", steps, |v| num_at(v, "truncation_rate")).colour(GREY));
            vec![
                Panel::new(
                    g,
                    "lengths.completion",
                    "Completion length (tokens)",
                    "completion_len.<role> in the step records",
                    false,
                    per_role("completion_len"),
                ),
                Panel::new(
                    g,
                    "lengths.truncation",
                    "Truncation rate",
                    "truncation_rate_by_role or truncation_rate in the step records",
                    true,
                    truncation,
                ),
            ]
        }
        Group::Accuracy => {
            // The accuracy each method reports; older eval records carry it as a plain number.
            let accuracy =
                |v: &Value| comas_workflow::registry::summary(v).and_then(|s| s.accuracy);
            let held_out = move |v: &Value| accuracy(v).or_else(|| number(v.get("accuracy")));
            let series = vec![
                Series::new("train", steps, accuracy),
                Series::new("held-out sampled", &m.evals, held_out).colour(1).markers(),
                Series::new("held-out greedy", &m.evals, move |v| {
                    v.get("greedy").and_then(accuracy)
                })
                .colour(2)
                .markers(),
            ];
            vec![Panel::new(
                g,
                "accuracy",
                "Accuracy",
                "the method's accuracy (CoMAS: accuracy.last_round) in the step or eval records",
                true,
                series,
            )]
        }
        Group::Times => {
            let series = ["rollout", "train", "broadcast"]
                .into_iter()
                .enumerate()
                .map(|(c, k)| {
                    Series::new(k, steps, |v| num_at(v, &format!("seconds.{k}"))).colour(c)
                })
                .collect();
            vec![Panel::new(
                g,
                "times",
                "Stage times (s)",
                "seconds.rollout, seconds.train or seconds.broadcast in the step records",
                false,
                series,
            )]
        }
        Group::Method { group, .. } => {
            let records: Vec<&Value> = steps.iter().map(|r| &r.value).collect();
            let charts =
                comas_workflow::registry::charts(&records).into_iter().filter(|c| c.group == group);
            charts.map(|c| chart_panel(g, c, steps)).collect()
        }
    }
}

/// A method's chart as a panel: its lines against the steps' x values.
fn chart_panel(g: Group, c: Chart, steps: &[Record]) -> Panel {
    let names: Vec<String> = c.lines.iter().map(|l| l.name.clone()).collect();
    let series = c
        .lines
        .into_iter()
        .map(|l| {
            let colour = l.colour.unwrap_or_else(|| role_colour(&l.name, &names));
            let points = steps.iter().zip(l.values).map(|(r, v)| (r.x, v)).collect();
            Series { name: l.name, points, colour, dash: None, markers: false }
        })
        .collect();
    Panel::new(g, c.key, c.title, c.needs, c.share, series)
}

/// The agent with this index in a record's `agents` list (its `agent` field, else its position).
fn agent(rec: &Value, id: i64) -> Option<&Value> {
    let list = rec.get("agents")?.as_array()?;
    list.iter()
        .enumerate()
        .find(|(i, a)| {
            a.is_object() && a.get("agent").and_then(Value::as_i64).unwrap_or(*i as i64) == id
        })
        .map(|(_, a)| a)
}

fn agent_num(rec: &Value, id: i64, path: &str) -> Option<f64> {
    agent(rec, id).and_then(|a| num_at(a, path))
}

fn agent_ids(m: &Metrics) -> Vec<i64> {
    let mut ids = BTreeSet::new();
    for r in &m.steps {
        for (i, a) in
            r.value.get("agents").and_then(Value::as_array).into_iter().flatten().enumerate()
        {
            if a.is_object() {
                ids.insert(a.get("agent").and_then(Value::as_i64).unwrap_or(i as i64));
            }
        }
    }
    ids.into_iter().collect()
}

const ROLES: [&str; 3] = ["solver", "evaluator", "scorer"];

/// Role names without repeats, the usual three first.
fn role_names(names: impl Iterator<Item = String>) -> Vec<String> {
    let rank = |r: &str| ROLES.iter().position(|k| *k == r).unwrap_or(ROLES.len());
    let mut v: Vec<String> = names.collect::<BTreeSet<_>>().into_iter().collect();
    v.sort_by_key(|r| rank(r)); // stable: other roles stay alphabetical
    v
}

/// A role's colour: fixed for the usual three, so that it is the same in every panel; other
/// roles take the next ones in the order of `names`.
fn role_colour(role: &str, names: &[String]) -> usize {
    ROLES.iter().position(|k| *k == role).unwrap_or_else(|| {
        ROLES.len()
            + names
                .iter()
                .filter(|n| !ROLES.contains(&n.as_str()))
                .position(|n| n == role)
                .unwrap_or(0)
    })
}

/// (mean, weight) per role of a `reward` object `{role: {mean, count}}`; the weight is the
/// count, or 1 where it is missing.
fn role_rewards(reward: Option<&Value>) -> BTreeMap<String, (f64, f64)> {
    let Some(roles) = reward.and_then(Value::as_object) else { return BTreeMap::new() };
    roles
        .iter()
        .filter_map(|(role, r)| {
            let mean = number(r.get("mean"))?;
            Some((role.clone(), (mean, number(r.get("count")).filter(|&c| c > 0.0).unwrap_or(1.0))))
        })
        .collect()
}

/// The team's reward per role: the record's own `reward`, else its agents' pooled by count
/// (older logs have rewards only per agent), else, for a method whose agents report one
/// `reward_mean` over their `samples` (NeuroMAS), those pooled as the role `all`.
fn team_rewards(rec: &Value) -> BTreeMap<String, (f64, f64)> {
    let own = role_rewards(rec.get("reward"));
    if !own.is_empty() {
        return own;
    }
    let agents = || rec.get("agents").and_then(Value::as_array).into_iter().flatten();
    let mut pooled: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for a in agents() {
        for (role, (mean, w)) in role_rewards(a.get("reward")) {
            let e = pooled.entry(role).or_default();
            e.0 += mean * w;
            e.1 += w;
        }
    }
    if pooled.is_empty() {
        for a in agents() {
            if let (Some(mean), Some(w)) =
                (number(a.get("reward_mean")), number(a.get("samples")).filter(|&w| w > 0.0))
            {
                let e = pooled.entry("all".to_string()).or_default();
                e.0 += mean * w;
                e.1 += w;
            }
        }
    }
    pooled.into_iter().map(|(role, (sum, w))| (role, (sum / w, w))).collect()
}

/// `reward_mean`, else the count-weighted mean over the roles.
fn team_mean(rec: &Value) -> Option<f64> {
    number(rec.get("reward_mean")).or_else(|| {
        let (sum, w) =
            team_rewards(rec).values().fold((0.0, 0.0), |(s, w), (m, c)| (s + m * c, w + c));
        (w > 0.0).then(|| sum / w)
    })
}

/// One panel of accuracy against checkpoint step from `comas eval` summaries: a line per
/// (benchmark tag, setup), its points in step order.
pub fn checkpoint_figure(
    title: String,
    summaries: &[(std::path::PathBuf, comas_workflow::eval::EvalSummary)],
) -> Result<Figure> {
    let mut lines: BTreeMap<String, Vec<(f64, Option<f64>)>> = BTreeMap::new();
    for (_, s) in summaries {
        let step = s.checkpoint_step.unwrap_or_default() as f64;
        for c in &s.cells {
            lines
                .entry(format!("{} {}", c.tag, c.setup))
                .or_default()
                .push((step, Some(c.accuracy)));
        }
    }
    if lines.is_empty() {
        bail!("the evaluations hold no graded questions");
    }
    let series = lines
        .into_iter()
        .enumerate()
        .map(|(i, (name, mut points))| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series { name, points, colour: i, dash: None, markers: true }
        })
        .collect();
    let panel = Panel::new(
        Group::Accuracy,
        "eval.checkpoints",
        "Accuracy by checkpoint step",
        "summary.json of comas eval runs",
        true,
        series,
    );
    Ok(Figure { title, panels: vec![panel], left_out: Vec::new() })
}

#[cfg(test)]
mod tests;
