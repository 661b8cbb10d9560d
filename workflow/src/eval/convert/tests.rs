use super::*;
use crate::eval::{parse_bench, GraderKind};
use serde_json::json;

fn one(format: Format, row: Value) -> BenchRecord {
    convert_row(format, row, 7, 0).unwrap()
}

/// The record as `comas eval` reads it back.
fn read_back(r: &BenchRecord) -> crate::eval::BenchItem {
    parse_bench(&serde_json::to_string(r).unwrap()).unwrap().remove(0)
}

#[test]
fn gsm8k_takes_the_number_after_the_hashes() {
    let row = json!({
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
    });
    let r = one(Format::Gsm8k, row);
    assert_eq!(r.gt, Gt::Text("72".into()));
    assert_eq!(r.id, "gsm8k-7");
    assert_eq!((r.tag.as_str(), r.source.as_str()), ("gsm8k", "gsm8k"));
    assert_eq!(
            r.query,
            "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?\n\nReason step by step, then put the final answer in \\boxed{}."
        );
    let item = read_back(&r);
    assert_eq!(
        (item.grader, item.answer.as_str(), item.id.as_str()),
        (GraderKind::Math, "72", "gsm8k-7")
    );
    assert_eq!(gsm8k_final_answer("so 1,000 + 200 = 1200\n#### 1,200"), Some("1200".into()));
    assert_eq!(gsm8k_final_answer("#### -3.5 "), Some("-3.5".into()));
    assert_eq!(gsm8k_final_answer("72"), None);
    let err =
        convert_row(Format::Gsm8k, json!({"question": "q", "answer": "72"}), 0, 0).unwrap_err();
    assert_eq!(err, ConvertError::NoFinalAnswer);
}

#[test]
fn math500_uses_its_answer_column_else_the_last_box_of_the_solution() {
    let row = json!({
        "problem": "Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.  Enter your answer in the form $(r,\\theta),$ where $r > 0$ and $0 \\le \\theta < 2 \\pi.$",
        "solution": "We have that $r = \\sqrt{0^2 + 3^2} = 3.$ ... Therefore, the polar coordinates are $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$",
        "answer": "\\left( 3, \\frac{\\pi}{2} \\right)",
        "subject": "Precalculus",
        "level": 2,
        "unique_id": "test/precalculus/807.json"
    });
    let r = one(Format::Math500, row);
    assert_eq!(r.gt, Gt::Text("\\left( 3, \\frac{\\pi}{2} \\right)".into()));
    assert_eq!(r.id, "test/precalculus/807.json");
    assert!(r.query.starts_with("Convert the point $(0,3)$"), "{}", r.query);
    assert!(
        r.query.ends_with("\n\nReason step by step, then put the final answer in \\boxed{}."),
        "{}",
        r.query
    );
    assert_eq!(read_back(&r).grader, GraderKind::Math);

    // MATH (hendrycks) rows: no answer column, nested braces in the box.
    let row = json!({
        "problem": "What is $\\frac{1}{2} + \\frac{1}{3}$?",
        "level": "Level 1",
        "type": "Prealgebra",
        "solution": "We get $\\boxed{3}$ first, no: $\\frac{1}{2}+\\frac{1}{3} = \\boxed{\\frac{5}{6}}$."
    });
    let r = one(Format::Math500, row);
    assert_eq!((r.gt, r.id.as_str()), (Gt::Text("\\frac{5}{6}".into()), "math500-7"));
    assert_eq!(last_boxed("so $\\boxed 5$."), Some("5"));
    assert_eq!(last_boxed("\\fbox{x^{2}} end"), Some("x^{2}"));
    assert_eq!(last_boxed("\\boxed{unclosed"), None);
    let err = convert_row(
        Format::Math500,
        json!({"problem": "p", "answer": "", "solution": "no box"}),
        0,
        0,
    )
    .unwrap_err();
    assert_eq!(err, ConvertError::NoBoxedAnswer);
}

#[test]
fn mbpp_lists_its_asserts_and_grades_with_them() {
    let full = json!({
        "task_id": 11,
        "text": "Write a python function to remove first and last occurrence of a given character from the string.",
        "code": "def remove_Occ(s,ch): \r\n    return s",
        "test_list": ["assert remove_Occ(\"hello\",\"l\") == \"heo\"", "assert remove_Occ(\"abcda\",\"a\") == \"bcd\"", "assert remove_Occ(\"PHP\",\"P\") == \"H\""],
        "test_setup_code": "",
        "challenge_test_list": []
    });
    let r = one(Format::Mbpp, full);
    assert_eq!(r.id, "mbpp/11");
    assert_eq!(
            r.query,
            "Write a python function to remove first and last occurrence of a given character from the string.\nYour code should pass these tests:\n\nassert remove_Occ(\"hello\",\"l\") == \"heo\"\nassert remove_Occ(\"abcda\",\"a\") == \"bcd\"\nassert remove_Occ(\"PHP\",\"P\") == \"H\"\n\nWrite the Python function and reply with the complete code in a single ```python code block."
        );
    let item = read_back(&r);
    assert_eq!(
            item.grader,
            GraderKind::Code {
                checker:
                    "assert remove_Occ(\"hello\",\"l\") == \"heo\"\nassert remove_Occ(\"abcda\",\"a\") == \"bcd\"\nassert remove_Occ(\"PHP\",\"P\") == \"H\""
                        .into()
            }
        );

    // The sanitized config: `prompt` and `test_imports`; the imports lead the checker.
    let sanitized = json!({
        "source_file": "Benchmark Questions Verification V2.ipynb",
        "task_id": 17,
        "prompt": "Write a function that returns the perimeter of a square given its side length as input.",
        "code": "import math\ndef square_perimeter(a):\n  return 4*a",
        "test_imports": ["import math"],
        "test_list": ["assert math.isclose(square_perimeter(10), 40)", "assert square_perimeter(5)==20"]
    });
    let r = one(Format::Mbpp, sanitized);
    assert_eq!(
        r.gt,
        Gt::Asserts(vec![
            "import math".into(),
            "assert math.isclose(square_perimeter(10), 40)".into(),
            "assert square_perimeter(5)==20".into()
        ])
    );
    assert!(r.query.starts_with("Write a function that returns the perimeter of a square given its side length as input.\nYour code should pass these tests:\n\nassert math.isclose"));
    assert!(!r.query.contains("import math"));
    let err = convert_row(Format::Mbpp, json!({"task_id": 1, "text": "t", "test_list": []}), 0, 0)
        .unwrap_err();
    assert_eq!(err, ConvertError::NoTests);
}

fn gpqa_row(question: &str) -> Value {
    json!({
        "Pre-Revision Question": "old",
        "Question": question,
        "Correct Answer": "10^-4 eV\n",
        "Incorrect Answer 1": "10^-11 eV",
        "Incorrect Answer 2": "10^-8 eV\n",
        "Incorrect Answer 3": "10^-9 eV",
        "Explanation": "According to the uncertainty principle, ...",
        "Record ID": "recU0VJ2FQ0JmbrmS",
        "High-level domain": "Physics",
        "Subdomain": "Physics (general)"
    })
}

#[test]
fn gpqa_shuffles_its_choices_by_seed_and_records_the_right_letter() {
    let q = "Two quantum states with energies E1 and E2 have a lifetime of 10^-9 sec and 10^-8 sec, respectively. We want to clearly distinguish these two energy levels. Which one of the following options could be their energy difference so that they can be clearly resolved?\n";
    let r = convert_row(Format::Gpqa, gpqa_row(q), 3, 0).unwrap();
    assert_eq!(r.id, "recU0VJ2FQ0JmbrmS");
    assert_eq!(r.gt, Gt::Text("B".into()));
    assert_eq!(
            r.query,
            "Two quantum states with energies E1 and E2 have a lifetime of 10^-9 sec and 10^-8 sec, respectively. We want to clearly distinguish these two energy levels. Which one of the following options could be their energy difference so that they can be clearly resolved?\n\nA) 10^-9 eV\nB) 10^-4 eV\nC) 10^-8 eV\nD) 10^-11 eV\n\nReason step by step, then put only the letter of the correct option (A, B, C or D) in \\boxed{}."
        );
    let item = read_back(&r);
    assert_eq!((item.grader, item.answer.as_str()), (GraderKind::Choice, "B"));
    // Same seed, same order (whatever the row's position); the letter always points at the
    // correct answer, and over many questions every letter is used.
    assert_eq!(convert_row(Format::Gpqa, gpqa_row(q), 99, 0).unwrap().query, r.query);
    let mut letters = std::collections::BTreeMap::new();
    for i in 0..200 {
        let (options, letter) =
            gpqa_shuffle(&format!("question {i}"), "right", ["w1", "w2", "w3"], 5);
        assert_eq!(options[LETTERS.iter().position(|&l| l == letter).unwrap()], "right");
        *letters.entry(letter).or_insert(0) += 1;
    }
    assert_eq!(letters.keys().copied().collect::<String>(), "ABCD");
    assert!(letters.values().all(|&n| n > 30), "{letters:?}");
    let moved = (0..20)
        .filter(|i| {
            gpqa_shuffle(&format!("q{i}"), "r", ["a", "b", "c"], 1).1
                != gpqa_shuffle(&format!("q{i}"), "r", ["a", "b", "c"], 2).1
        })
        .count();
    assert!(moved > 5, "another seed moves the answer: {moved} of 20");
}

#[test]
fn medqa_lists_its_options_in_letter_order_and_takes_answer_idx() {
    let row = json!({
        "question": "A 23-year-old woman has burning on urination. Which drug is safest in pregnancy?",
        "answer": "Nitrofurantoin",
        "options": {"C": "Doxycycline", "A": "Ampicillin", "D": "Nitrofurantoin", "B": "Ceftriaxone"},
        "meta_info": "step2&3",
        "answer_idx": "d"
    });
    let r = one(Format::Medqa, row.clone());
    assert_eq!(r.gt, Gt::Text("D".into()));
    assert_eq!(r.id, "medqa-7");
    assert_eq!(
            r.query,
            "A 23-year-old woman has burning on urination. Which drug is safest in pregnancy?\n\nA) Ampicillin\nB) Ceftriaxone\nC) Doxycycline\nD) Nitrofurantoin\n\nReason step by step, then put only the letter of the correct option (A, B, C or D) in \\boxed{}."
        );
    let item = read_back(&r);
    assert_eq!((item.grader, item.answer.as_str()), (GraderKind::Choice, "D"));
    let mut five = row.clone();
    five["options"]["E"] = json!("Trimethoprim");
    assert_eq!(convert_row(Format::Medqa, five, 0, 0).unwrap_err(), ConvertError::ChoiceCount(5));
    let mut bad = row;
    bad["answer_idx"] = json!("F");
    assert_eq!(
        convert_row(Format::Medqa, bad, 0, 0).unwrap_err(),
        ConvertError::BadChoiceAnswer("`F`".into())
    );
}

#[test]
fn mmlu_takes_its_answer_index_as_a_letter() {
    let row = json!({
        "question": "Find the degree for the given field extension Q(sqrt(2), sqrt(3), sqrt(18)) over Q.",
        "subject": "abstract_algebra",
        "choices": ["0", "4", "2", "6"],
        "answer": 1
    });
    let r = one(Format::Mmlu, row);
    assert_eq!((r.gt.clone(), r.id.as_str()), (Gt::Text("B".into()), "mmlu-7"));
    assert_eq!(
            r.query,
            "The following is a multiple-choice question about abstract algebra.\n\nFind the degree for the given field extension Q(sqrt(2), sqrt(3), sqrt(18)) over Q.\n\nA) 0\nB) 4\nC) 2\nD) 6\n\nReason step by step, then put only the letter of the correct option (A, B, C or D) in \\boxed{}."
        );
    assert_eq!(read_back(&r).grader, GraderKind::Choice);
    let letter =
        one(Format::Mmlu, json!({"question": "q", "choices": ["a", "b", "c", "d"], "answer": "d"}));
    assert_eq!(letter.gt, Gt::Text("D".into()));
    assert!(letter.query.starts_with("q\n\nA) a\n"));
    let err = convert_row(
        Format::Mmlu,
        json!({"question": "q", "choices": ["a", "b", "c", "d"], "answer": 4}),
        0,
        0,
    )
    .unwrap_err();
    assert_eq!(err, ConvertError::BadChoiceAnswer("4".into()));
    let err = convert_row(
        Format::Mmlu,
        json!({"question": "q", "choices": ["a", "b"], "answer": 0}),
        0,
        0,
    )
    .unwrap_err();
    assert_eq!(err, ConvertError::ChoiceCount(2));
}

#[test]
fn scibench_states_the_unit_and_asks_for_a_decimal() {
    let row = json!({
        "problem_text": "Assume all gases are perfect unless stated otherwise. Unless otherwise stated, thermodynamic data are for 298.15 K. Calculate the standard enthalpy of solution of $\\mathrm{AgCl}(\\mathrm{s})$ in water from the enthalpies of formation of the solid and the aqueous ions.",
        "answer_latex": " +65.49",
        "answer_number": "+65.49",
        "unit": "$\\mathrm{kJ} \\mathrm{mol}^{-1}$",
        "source": "atkins",
        "problemid": "e2.21(a) ",
        "comment": " "
    });
    let r = one(Format::Scibench, row);
    assert_eq!(
        (r.gt.clone(), r.id.as_str()),
        (Gt::Text("+65.49".into()), "scibench/atkins/e2.21(a)")
    );
    assert_eq!(
            r.query,
            "Assume all gases are perfect unless stated otherwise. Unless otherwise stated, thermodynamic data are for 298.15 K. Calculate the standard enthalpy of solution of $\\mathrm{AgCl}(\\mathrm{s})$ in water from the enthalpies of formation of the solid and the aqueous ions. The unit of the answer is $\\mathrm{kJ} \\mathrm{mol}^{-1}$.\n\nReason step by step, then put the final answer in \\boxed{} as a decimal number, without the unit."
        );
    let item = read_back(&r);
    assert_eq!((item.grader, item.answer.as_str()), (GraderKind::Numeric, "+65.49"));
    // Dimensionless (a blank unit) and a numeric answer_number.
    let r = one(
        Format::Scibench,
        json!({"problem_text": "Calculate $q$.", "answer_number": 0.5, "unit": " "}),
    );
    assert_eq!((r.gt, r.id.as_str()), (Gt::Text("0.5".into()), "scibench-7"));
    assert!(r.query.starts_with("Calculate $q$.\n\nReason"), "{}", r.query);
    let err = convert_row(
        Format::Scibench,
        json!({"problem_text": "p", "answer_number": "1.2 \\times 10^3", "unit": "m"}),
        0,
        0,
    )
    .unwrap_err();
    assert_eq!(err, ConvertError::NotANumber("1.2 \\times 10^3".into()));
}

#[test]
fn missing_and_null_columns_are_named() {
    let err =
        convert_row(Format::Gsm8k, json!({"problem": "p", "answer": "#### 1"}), 0, 0).unwrap_err();
    assert_eq!(
        err.to_string(),
        "no column `question` for gsm8k; the columns there are: answer, problem"
    );
    let err = check_columns(Format::Mbpp, ["task_id", "code", "test_list"]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "no column `text` or `prompt` for mbpp; the columns there are: code, task_id, test_list"
    );
    assert_eq!(check_columns(Format::Math500, ["problem", "solution"]), Ok(()));
    let err = convert_row(Format::Gsm8k, json!({"question": null, "answer": "#### 1"}), 0, 0)
        .unwrap_err();
    assert_eq!(err, ConvertError::NullColumn("`question`".into()));
    let err =
        convert_row(Format::Mmlu, json!({"question": "q", "choices": "abcd", "answer": 0}), 0, 0)
            .unwrap_err();
    assert!(
        matches!(&err, ConvertError::Layout { format: Format::Mmlu, message } if message.contains("expected a sequence")),
        "{err}"
    );
    assert_eq!(
        convert_row(Format::Gsm8k, json!([1]), 0, 0).unwrap_err(),
        ConvertError::NotAnObject("an array".into())
    );
}

#[test]
fn formats_parse_by_name_and_ids_are_made_unique() {
    assert_eq!("MATH500".parse::<Format>(), Ok(Format::Math500));
    assert_eq!("scibench".parse::<Format>().unwrap().to_string(), "scibench");
    assert_eq!(
            "humaneval".parse::<Format>().unwrap_err().to_string(),
            "unknown benchmark format `humaneval`: use gsm8k, math500, mbpp, gpqa, mmlu, medqa or scibench"
        );
    let rec =
        |id: &str| BenchRecord::new(Format::Gsm8k, id.into(), "q".into(), Gt::Text("1".into()));
    let mut rs = vec![rec("a"), rec("a-2"), rec("a"), rec("b"), rec("a")];
    let renamed = dedupe_ids(&mut rs);
    assert_eq!(
        rs.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["a", "a-2", "a-3", "b", "a-4"]
    );
    assert_eq!(
        renamed,
        [("a".to_string(), "a-3".to_string()), ("a".to_string(), "a-4".to_string())]
    );
}

#[test]
fn records_serialise_in_the_spec_field_order() {
    let r = BenchRecord::new(
        Format::Mbpp,
        "mbpp/2".into(),
        "q".into(),
        Gt::Asserts(vec!["assert f()".into()]),
    );
    assert_eq!(
        serde_json::to_string(&r).unwrap(),
        r#"{"query":"q","gt":["assert f()"],"tag":"mbpp","source":"mbpp","id":"mbpp/2"}"#
    );
}
