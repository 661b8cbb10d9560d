//! Prompts of the DSBench chain and its coach, in our own words (spec 3.1 and 4 list what they
//! must contain). The agents share a file workspace: what one saves, the next finds.
use super::prompts::CoachView;
use crate::turn::Role;

/// What a DSBench agent is told.
pub struct DsView<'a> {
    pub role: Role,
    pub task: &'a str,
    /// Every file in the workspace now, by name.
    pub files: &'a [String],
    /// The previous agent's last message, its thinking removed (spec 2's hand-off).
    pub handoff: &'a str,
    /// The Data Engineer's printed summary, for the Modeler and the Analyst.
    pub preprocessing_summary: Option<&'a str>,
    /// The Modeler's printed summary, for the Analyst.
    pub model_summary: Option<&'a str>,
}

pub const PREPROCESSING_MARK: &str = "---PREPROCESSING_SUMMARY---";
pub const MODEL_MARK: &str = "---MODEL_SUMMARY---";
pub const END_MARK: &str = "---END_SUMMARY---";

/// The text between `mark` and the end mark in a program's output, if it printed one (the
/// last such block counts).
pub fn summary(output: &str, mark: &str) -> Option<String> {
    let start = output.rfind(mark)? + mark.len();
    let rest = &output[start..];
    let end = rest.find(END_MARK).unwrap_or(rest.len());
    Some(rest[..end].trim().to_string()).filter(|s| !s.is_empty())
}

fn file_list(files: &[String]) -> String {
    if files.is_empty() {
        return "  (none)".into();
    }
    files.iter().map(|f| format!("  - {f}")).collect::<Vec<_>>().join("\n")
}

/// The Analyst's warning when the features or the model it needs are not in the workspace.
fn missing_warning(files: &[String]) -> Option<String> {
    let has = |keys: &[&str]| files.iter().any(|f| keys.iter().any(|k| f.to_ascii_lowercase().contains(k)));
    let mut missing = Vec::new();
    if !has(&["x_test", "xtest"]) {
        missing.push("the test features (X_test.pkl)");
    }
    if !has(&["model"]) {
        missing.push("the trained model (model.pkl)");
    }
    (!missing.is_empty())
        .then(|| format!("WARNING: the workspace lacks {}. Check what is there before you load anything, and work with what exists.", missing.join(" and ")))
}

pub fn agent_prompt(v: &DsView<'_>) -> String {
    let (who, duties, sketch) = match v.role {
        Role::DataEngineer => (
            "the Data Engineer, the first of three agents (Data Engineer, Modeler, Analyst)",
            "1. Load train.csv and test.csv and look at their shape, columns, types and missing values.\n\
             2. Clean them and build features the same way for both (fit any encoder or scaler on the training rows only).\n\
             3. Save X_train.pkl, y_train.pkl and X_test.pkl (with pickle), plus any fitted transformer, for the Modeler.\n\
             4. Print a summary between ---PREPROCESSING_SUMMARY--- and ---END_SUMMARY---: shapes, target, features, missing values handled, files saved.",
            "import csv, pickle\nrows = list(csv.DictReader(open('train.csv')))\n# ... build features ...\npickle.dump(X_train, open('X_train.pkl', 'wb'))",
        ),
        Role::Modeler => (
            "the Modeler, the second of three agents (Data Engineer, Modeler, Analyst)",
            "1. Load X_train.pkl and y_train.pkl that the Data Engineer saved.\n\
             2. Decide whether this is classification or regression, try a few models and compare them with cross-validation.\n\
             3. Train the best one on all training rows and save it as model.pkl.\n\
             4. Print a summary between ---MODEL_SUMMARY--- and ---END_SUMMARY---: problem type, best model, validation score, files saved.",
            "import pickle\nX = pickle.load(open('X_train.pkl', 'rb'))\n# ... fit and validate ...\npickle.dump(model, open('model.pkl', 'wb'))",
        ),
        _ => (
            "the Analyst, the last of three agents (Data Engineer, Modeler, Analyst)",
            "1. Load model.pkl and X_test.pkl.\n\
             2. Predict the target for every row of test.csv.\n\
             3. Write submission.csv with the id column of test.csv and the prediction column the task names.\n\
             4. Print how many predictions you wrote, the first rows of the file and its columns.",
            "import csv, pickle\nmodel = pickle.load(open('model.pkl', 'rb'))\n# ... predict ...\nwith open('submission.csv', 'w', newline='') as f:\n    csv.writer(f).writerows(rows)",
        ),
    };
    let mut p = format!(
        "You are {who}. Together you solve one data science task; the team succeeds when the Analyst's submission.csv scores well.\n\n\
         Be quick: keep any thinking short and go straight to a ```python block. Every ```python block you write is run for you in a fresh folder \
         that holds the files listed below, and its output comes back to you, so you can fix errors and run again. Files you save with the \
         names your job asks for are kept for the agents after you. When your files are saved, reply without a code block to finish.\n\n\
         ## Task\n{}\n\n## Files in the workspace\n{}\nOnly these files exist; do not load anything else.\n",
        v.task,
        file_list(v.files)
    );
    if !v.handoff.is_empty() {
        p.push_str(&format!("\n## The previous agent's last message\n{}\n", v.handoff));
    }
    if let Some(s) = v.preprocessing_summary {
        p.push_str(&format!("\n## The Data Engineer's summary\n{s}\n"));
    }
    if let Some(s) = v.model_summary {
        p.push_str(&format!("\n## The Modeler's summary\n{s}\n"));
    }
    p.push_str(&format!("\n## Your job\n{duties}\n\n## A sketch\n```python\n{sketch}\n```\n\n## Rules\n- Never use the test rows to fit anything.\n- Fix every random seed.\n- Check that a file exists before you load it.\n"));
    if v.role == Role::Analyst {
        if let Some(w) = missing_warning(v.files) {
            p.push_str(&format!("\n{w}\n"));
        }
    }
    p
}

/// What the DSBench coach is told about one action: what every coach is told, and the files.
pub struct DsCoachView<'a> {
    /// The task (as `problem`), the role, the context, the action and its tool output.
    pub action: &'a CoachView<'a>,
    /// Files the agent could use, and files agents before it saved.
    pub files_available: &'a [String],
    pub files_from_previous_agents: &'a [String],
    /// The outcome block (spec 7); the Analyst's coach only.
    pub metrics: Option<&'a str>,
}

pub fn coach_prompt(v: &DsCoachView<'_>) -> String {
    let a = v.action;
    let observation = a.tool_observation.unwrap_or("(no code was run in this action)");
    let metrics = v.metrics.unwrap_or("N/A");
    format!(
        "You coach a chain of three agents that solve a data science task with Python, sharing a folder of files:\n\
         - the data_engineer must save X_train.pkl, y_train.pkl and X_test.pkl (and fitted transformers);\n\
         - the modeler loads them and must save model.pkl;\n\
         - the analyst loads model.pkl and X_test.pkl and must write submission.csv.\n\
         So the files flow: data_engineer -> X_*/y_train -> modeler -> model.pkl -> analyst -> submission.csv.\n\n\
         Score one action of the {role}.\n\n\
         Find the root cause before you blame anyone:\n\
         - X_test.pkl missing is the data_engineer's fault; model.pkl missing is the modeler's fault;\n\
         - a KeyError, TypeError or AttributeError while both files exist is the analyst's fault;\n\
         - the agent whose mistake broke a later step gets 0-2; an agent that failed only because an earlier agent's files were missing gets 3-5;\n\
         - a reply with no code that runs gets 0-2.\n\n\
         Bands: 10 only for exceptional work; 8-9 the code ran and every required file was saved; 6-7 minor problems; 4-5 errors or missing outputs; \
         2-3 crashed because of an earlier failure or a poor approach; 0-1 nothing useful.\n\n\
         For the analyst, cap the score by the computed metrics below unless there is clear evidence that an earlier agent caused a failure this \
         agent could not repair (then at most 8):\n\
         - classification, by ROC AUC or accuracy: 0.85 or more -> at most 9; 0.75-0.85 -> 8; 0.65-0.75 -> 6; 0.55-0.65 -> 4; below 0.55 -> 3;\n\
         - regression, by RMSE as % of the target's range (of its IQR when it has outliers): under 10% -> 9; 10-25% -> 8; 25-50% -> 6; over 50% -> 4.\n\
         When the outcome is poor, a modeler whose model is near chance gets at most 5, and a data_engineer whose features were poor at most 6.\n\n\
         ## Task\n{task}\n\n## Role\n{role}\n\n## Files available to this agent\n{available}\n\n## Files saved by earlier agents\n{previous}\n\n\
         ## What the agent was given\n{input}\n\n## The agent's action\n{output}\n\n## Execution output\n{observation}\n\n## Computed metrics\n{metrics}\n\n\
         Write 3 to 5 sentences: which files were there, whether the code ran, which files it saved, and who is to blame for any failure. Then end with the line\n\
         PROCESS_SCORE: <0-10>\n",
        role = a.role.as_str(),
        task = a.problem,
        available = file_list(v.files_available),
        previous = file_list(v.files_from_previous_agents),
        input = a.agent_input,
        output = a.agent_output,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_thinking_and_the_analysts_warning() {
        let out = format!("rows 10\n{PREPROCESSING_MARK}\nshape (10, 3)\n{END_MARK}\ndone");
        assert_eq!(summary(&out, PREPROCESSING_MARK).as_deref(), Some("shape (10, 3)"));
        assert_eq!(summary("nothing", MODEL_MARK), None);
        assert_eq!(crate::turn::without_thinking("<think>hmm</think>Saved X_train.pkl.<think>x</think> Done."), "Saved X_train.pkl. Done.");
        let files = vec!["test.csv".to_string(), "train.csv".into(), "X_test.pkl".into()];
        let p = agent_prompt(&DsView {
            role: Role::Analyst,
            task: "Predict y.",
            files: &files,
            handoff: "",
            preprocessing_summary: Some("3 features"),
            model_summary: None,
        });
        assert!(p.contains("  - X_test.pkl") && p.contains("The Data Engineer's summary\n3 features") && p.contains("submission.csv"));
        // Only the model is missing, and only it is named.
        assert!(p.contains("WARNING: the workspace lacks the trained model (model.pkl)."), "{p}");
        let p =
            agent_prompt(&DsView { role: Role::DataEngineer, task: "t", files: &files, handoff: "Saved.", preprocessing_summary: None, model_summary: None });
        assert!(p.contains(PREPROCESSING_MARK) && !p.contains("WARNING"));
        let action = CoachView { problem: "t", role: Role::Modeler, agent_input: "in", agent_output: "out", tool_observation: None, ground_truth: None };
        let c = coach_prompt(&DsCoachView { action: &action, files_available: &files, files_from_previous_agents: &[], metrics: None });
        assert!(c.contains("Score one action of the modeler") && c.contains("model.pkl missing is the modeler's fault") && c.contains("PROCESS_SCORE: <0-10>"));
    }
}
