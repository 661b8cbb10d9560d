//! `comas convert-bench` as a user runs it: parquet files laid out as Hugging Face publishes
//! them (written here with the parquet crate, snappy and zstd), JSONL and JSON files in, records
//! out that `comas eval` reads with the right grader; and the errors a wrong file gets.
use comas_workflow::eval::{parse_bench, BenchItem, GraderKind};
use parquet::basic::{Compression, ZstdLevel};
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

fn comas(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_comas"))
        .args(args)
        .env("COMAS_THREADS", "1")
        .output()
        .expect("comas runs")
}

fn convert(format: &str, inputs: &[&Path], out: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["convert-bench", "--format", format, "--out", out.to_str().unwrap()];
    for i in inputs {
        args.extend(["--input", i.to_str().unwrap()]);
    }
    args.extend_from_slice(extra);
    comas(&args)
}

fn converted(format: &str, inputs: &[&Path], out: &Path) -> Vec<BenchItem> {
    let o = convert(format, inputs, out, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    parse_bench(&std::fs::read_to_string(out).unwrap()).unwrap()
}

/// A column as pyarrow writes it: nullable strings, lists of strings, or int64.
enum Column {
    Str(&'static str, Vec<&'static str>),
    StrList(&'static str, Vec<Vec<&'static str>>),
    Int(&'static str, Vec<i64>),
}

fn write_parquet(path: &Path, columns: &[Column], compression: Compression) {
    let fields: Vec<String> = columns
        .iter()
        .map(|c| match c {
            Column::Str(name, _) => format!("OPTIONAL BYTE_ARRAY {name} (UTF8);"),
            // The three-level LIST layout of pyarrow 13+ (`list` / `element`).
            Column::StrList(name, _) => format!("OPTIONAL group {name} (LIST) {{ REPEATED group list {{ OPTIONAL BYTE_ARRAY element (UTF8); }} }}"),
            Column::Int(name, _) => format!("OPTIONAL INT64 {name};"),
        })
        .collect();
    let schema = Arc::new(
        parse_message_type(&format!("message schema {{ {} }}", fields.join(" "))).unwrap(),
    );
    let props = Arc::new(WriterProperties::builder().set_compression(compression).build());
    let mut writer =
        SerializedFileWriter::new(std::fs::File::create(path).unwrap(), schema, props).unwrap();
    let mut group = writer.next_row_group().unwrap();
    for c in columns {
        let mut col = group.next_column().unwrap().unwrap();
        match c {
            Column::Str(_, values) => {
                let v: Vec<ByteArray> = values.iter().map(|s| ByteArray::from(*s)).collect();
                col.typed::<ByteArrayType>()
                    .write_batch(&v, Some(&vec![1; v.len()]), None)
                    .unwrap();
            }
            Column::StrList(_, lists) => {
                // Definition level 3 = element present; repetition level 0 starts a new row.
                let v: Vec<ByteArray> =
                    lists.iter().flatten().map(|s| ByteArray::from(*s)).collect();
                let rep: Vec<i16> =
                    lists.iter().flat_map(|l| (0..l.len()).map(|i| i16::from(i > 0))).collect();
                col.typed::<ByteArrayType>()
                    .write_batch(&v, Some(&vec![3; v.len()]), Some(&rep))
                    .unwrap();
            }
            Column::Int(_, values) => {
                col.typed::<Int64Type>()
                    .write_batch(values, Some(&vec![1; values.len()]), None)
                    .unwrap();
            }
        }
        col.close().unwrap();
    }
    group.close().unwrap();
    writer.close().unwrap();
}

/// Two rows of cais/mmlu (`all/test-00000-of-00001.parquet`): question, subject, choices, answer.
fn mmlu_parquet(path: &Path) {
    write_parquet(
        path,
        &[
            Column::Str(
                "question",
                vec!["Find the degree for the given field extension Q(sqrt(2), sqrt(3), sqrt(18)) over Q.", "Find the characteristic of the ring 2Z."],
            ),
            Column::Str("subject", vec!["abstract_algebra", "abstract_algebra"]),
            Column::StrList("choices", vec![vec!["0", "4", "2", "6"], vec!["0", "3", "12", "30"]]),
            Column::Int("answer", vec![1, 0]),
        ],
        Compression::SNAPPY,
    );
}

#[test]
fn parquet_json_and_jsonl_files_become_records_that_eval_reads() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();

    // MMLU from parquet; two inputs are concatenated, ids counting on across them.
    let mmlu = d.join("mmlu.parquet");
    mmlu_parquet(&mmlu);
    let items = converted("mmlu", &[&mmlu, &mmlu], &d.join("mmlu.jsonl"));
    let got: Vec<(&str, &str, &str)> =
        items.iter().map(|i| (i.id.as_str(), i.answer.as_str(), i.grader.name())).collect();
    assert_eq!(
        got,
        [
            ("mmlu-0", "B", "choice"),
            ("mmlu-1", "A", "choice"),
            ("mmlu-2", "B", "choice"),
            ("mmlu-3", "A", "choice")
        ]
    );
    assert_eq!(
        items[1].query,
        "The following is a multiple-choice question about abstract algebra.\n\nFind the characteristic of the ring 2Z.\n\nA) 0\nB) 3\nC) 12\nD) 30\n\nReason step by step, then put only the letter of the correct option (A, B, C or D) in \\boxed{}."
    );
    assert_eq!(items[0].tag, "mmlu");

    // MBPP (sanitized config) from a zstd parquet: the imports lead the checker.
    let mbpp = d.join("mbpp.parquet");
    write_parquet(
        &mbpp,
        &[
            Column::Str("source_file", vec!["Benchmark Questions Verification V2.ipynb"]),
            Column::Int("task_id", vec![17]),
            Column::Str("prompt", vec!["Write a function that returns the perimeter of a square given its side length as input."]),
            Column::Str("code", vec!["def square_perimeter(a):\n  return 4*a"]),
            Column::StrList("test_imports", vec![vec!["import math"]]),
            Column::StrList("test_list", vec![vec!["assert math.isclose(square_perimeter(10), 40)", "assert square_perimeter(5)==20"]]),
        ],
        Compression::ZSTD(ZstdLevel::default()),
    );
    let items = converted("mbpp", &[&mbpp], &d.join("mbpp.jsonl"));
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].id, "mbpp/17");
    assert_eq!(
        items[0].grader,
        GraderKind::Code { checker: "import math\nassert math.isclose(square_perimeter(10), 40)\nassert square_perimeter(5)==20".into() }
    );
    assert!(items[0]
        .query
        .ends_with("assert square_perimeter(5)==20\n\nWrite the Python function and reply with the complete code in a single ```python code block."));

    // MBPP's full config as the JSONL of its GitHub release.
    let jsonl = d.join("mbpp.jsonl.in.jsonl");
    std::fs::write(
        &jsonl,
        concat!(
            r#"{"text": "Write a function to find the shared elements from the given two lists.", "code": "def similar_elements(a, b):\r\n  return tuple(set(a) & set(b))", "task_id": 2, "test_setup_code": "", "test_list": ["assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))", "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))"], "challenge_test_list": []}"#,
            "\n\n",
            r#"{"text": "Write a python function to identify non-prime numbers.", "code": "import math\r\ndef is_not_prime(n): ...", "task_id": 3, "test_setup_code": "", "test_list": ["assert is_not_prime(2) == False", "assert is_not_prime(10) == True"], "challenge_test_list": []}"#,
            "\n"
        ),
    )
    .unwrap();
    let items = converted("mbpp", &[&jsonl], &d.join("mbpp-full.jsonl"));
    assert_eq!(items.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(), ["mbpp/2", "mbpp/3"]);
    assert_eq!(
        items[1].grader,
        GraderKind::Code {
            checker: "assert is_not_prime(2) == False\nassert is_not_prime(10) == True".into()
        }
    );

    // GSM8K as `datasets.Dataset.to_json` writes it: JSON lines under a .json name.
    let gsm = d.join("gsm8k-test.json");
    std::fs::write(
        &gsm,
        concat!(
            r#"{"question":"Janet’s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her friends every day with four. She sells the remainder at the farmers' market daily for $2 per fresh duck egg. How much in dollars does she make every day at the farmers' market?","answer":"Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every day at the farmer’s market.\n#### 18"}"#,
            "\n"
        ),
    )
    .unwrap();
    let items = converted("gsm8k", &[&gsm], &d.join("gsm8k.jsonl"));
    assert_eq!(
        (items[0].id.as_str(), items[0].answer.as_str(), &items[0].grader),
        ("gsm8k-0", "18", &GraderKind::Math)
    );
    assert!(items[0].query.ends_with(
        "at the farmers' market?\n\nReason step by step, then put the final answer in \\boxed{}."
    ));

    // SciBench as its GitHub release: a JSON array per textbook.
    let sci = d.join("atkins.json");
    std::fs::write(
        &sci,
        r#"[{"problem_text": "Suppose that $10.0 \\mathrm{~mol} \\mathrm{C}_2 \\mathrm{H}_6(\\mathrm{~g})$ is confined to $4.860 \\mathrm{dm}^3$ at $27^{\\circ} \\mathrm{C}$. Predict the pressure exerted by the ethane from the perfect gas.", "answer_latex": " 50.7", "answer_number": "50.7", "unit": "$\\mathrm{atm}$ ", "source": "atkins", "problemid": " e1.17(a)(a)", "comment": " "}]"#,
    )
    .unwrap();
    let items = converted("scibench", &[&sci], &d.join("scibench.jsonl"));
    assert_eq!(
        (items[0].id.as_str(), items[0].answer.as_str(), &items[0].grader),
        ("scibench/atkins/e1.17(a)(a)", "50.7", &GraderKind::Numeric)
    );
    assert!(
        items[0]
            .query
            .contains("from the perfect gas. The unit of the answer is $\\mathrm{atm}$.\n\n"),
        "{}",
        items[0].query
    );
}

#[test]
fn gpqa_letters_follow_the_seed() {
    let dir = tempfile::tempdir().unwrap();
    let gpqa = dir.path().join("gpqa_diamond.jsonl");
    let rows: Vec<String> = (0..12)
        .map(|i| {
            serde_json::json!({
                "Question": format!("Question {i}: which option is right?"),
                "Correct Answer": "right",
                "Incorrect Answer 1": "wrong 1",
                "Incorrect Answer 2": "wrong 2",
                "Incorrect Answer 3": "wrong 3",
                "Record ID": format!("rec{i}")
            })
            .to_string()
        })
        .collect();
    std::fs::write(&gpqa, rows.join("\n")).unwrap();
    let letters = |seed: &str| -> Vec<BenchItem> {
        let out = dir.path().join(format!("gpqa-{seed}.jsonl"));
        let o = convert("gpqa", &[&gpqa], &out, &["--seed", seed]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        parse_bench(&std::fs::read_to_string(out).unwrap()).unwrap()
    };
    let (a, b, c) = (letters("1"), letters("1"), letters("2"));
    assert_eq!(a, b);
    assert_ne!(
        a.iter().map(|i| &i.answer).collect::<Vec<_>>(),
        c.iter().map(|i| &i.answer).collect::<Vec<_>>()
    );
    for item in a.iter().chain(&c) {
        assert_eq!(item.grader, GraderKind::Choice);
        // The letter recorded as gt labels the correct answer in the query.
        assert!(
            item.query.contains(&format!("\n{}) right\n", item.answer)),
            "{}: {}",
            item.answer,
            item.query
        );
    }
    assert_eq!(a[0].id, "rec0");
}

/// GPQA as its authors release it: a CSV with many more columns than the converter reads, and
/// quoted cells that hold commas, quotes and line breaks.
#[test]
fn gpqa_csv_and_medqa_jsonl_become_choice_records() {
    let dir = tempfile::tempdir().unwrap();
    let gpqa = dir.path().join("gpqa_main.csv");
    std::fs::write(
        &gpqa,
        "Pre-Revision Question,Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2,Incorrect Answer 3,Record ID,High-level domain\n\
         old,\"Which gas, at STP,\nis \"\"noble\"\"?\",Argon,Nitrogen,Oxygen,Chlorine,recA1,Chemistry\n\
         old,Smallest prime?,2,1,4,9,recB2,Math\n",
    )
    .unwrap();
    let items = converted("gpqa", &[&gpqa], &dir.path().join("gpqa.jsonl"));
    assert_eq!(items.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(), ["recA1", "recB2"]);
    assert!(
        items[0].query.starts_with("Which gas, at STP,\nis \"noble\"?\n\n"),
        "{}",
        items[0].query
    );
    assert!(
        items[0].query.contains(&format!("\n{}) Argon\n", items[0].answer)),
        "{}",
        items[0].query
    );
    assert!(items[1].query.contains(&format!("\n{}) 2\n", items[1].answer)), "{}", items[1].query);
    assert!(items.iter().all(|i| i.grader == GraderKind::Choice));

    let medqa = dir.path().join("phrases_no_exclude_test.jsonl");
    let row = |q: &str, idx: &str| {
        serde_json::json!({"question": q, "answer": "x", "options": {"A": "a1", "B": "b1", "C": "c1", "D": "d1"}, "meta_info": "step1", "answer_idx": idx})
            .to_string()
    };
    std::fs::write(&medqa, format!("{}\n{}\n", row("First?", "B"), row("Second?", "D"))).unwrap();
    let items = converted("medqa", &[&medqa], &dir.path().join("medqa.jsonl"));
    assert_eq!(
        items
            .iter()
            .map(|i| (i.id.as_str(), i.answer.as_str(), i.grader.clone()))
            .collect::<Vec<_>>(),
        [("medqa-0", "B", GraderKind::Choice), ("medqa-1", "D", GraderKind::Choice)]
    );
    assert!(
        items[0].query.starts_with("First?\n\nA) a1\nB) b1\nC) c1\nD) d1\n\n"),
        "{}",
        items[0].query
    );
}

#[test]
fn errors_name_the_file_the_column_and_the_row() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let stderr = |o: &Output| {
        assert!(!o.status.success());
        String::from_utf8_lossy(&o.stderr).to_string()
    };

    let mmlu = d.join("mmlu.parquet");
    mmlu_parquet(&mmlu);
    let out = d.join("out.jsonl");
    let e = stderr(&convert("scibench", &[&mmlu], &out, &[]));
    assert!(
        e.contains(&format!("{}: no column `problem_text` for scibench; the columns there are: answer, choices, question, subject", mmlu.display())),
        "{e}"
    );

    let gsm = d.join("gsm8k.jsonl");
    std::fs::write(&gsm, "{\"question\": \"1+1?\", \"answer\": \"1+1=2\\n#### 2\"}\n{\"question\": \"2+2?\", \"answer\": \"4\"}\n").unwrap();
    let e = stderr(&convert("gsm8k", &[&gsm], &out, &[]));
    assert!(e.contains(&format!("{} line 2: cannot convert to a gsm8k record: the answer has no final `#### <number>` line", gsm.display())), "{e}");

    let arr = d.join("math.json");
    std::fs::write(&arr, r#"[{"problem": "p", "answer": "1"}, {"question": "q", "answer": "2"}]"#)
        .unwrap();
    let e = stderr(&convert("math500", &[&arr], &out, &[]));
    assert!(
        e.contains(&format!(
            "{} row 2: no column `problem` for math500; the columns there are: answer, question",
            arr.display()
        )),
        "{e}"
    );

    let csv = d.join("gpqa_diamond.csv");
    std::fs::write(&csv, "Question,Correct Answer\nq,a\n").unwrap();
    let e = stderr(&convert("gpqa", &[&csv], &out, &[]));
    assert!(e.contains(&format!("{} line 2: no column `Incorrect Answer 1` for gpqa; the columns there are: Correct Answer, Question", csv.display())), "{e}");
    let ragged = d.join("ragged.csv");
    std::fs::write(&ragged, "question,options,answer_idx\na,b\n").unwrap();
    let e = stderr(&convert("medqa", &[&ragged], &out, &[]));
    assert!(e.contains(&format!("{}: record 1 is not valid CSV", ragged.display())), "{e}");
    let txt = d.join("gpqa.txt");
    std::fs::write(&txt, "Question\n").unwrap();
    let e = stderr(&convert("gpqa", &[&txt], &out, &[]));
    assert!(
        e.contains("gpqa.txt: unknown file type; use a .parquet, .jsonl, .json or .csv file"),
        "{e}"
    );

    let e = stderr(&convert("humaneval", &[&gsm], &out, &[]));
    assert!(e.contains("unknown benchmark format `humaneval`"), "{e}");
    assert!(!out.exists(), "nothing is written when a conversion fails");
}
