#!/usr/bin/env python3
"""Writes tasks.jsonl: small tabular modelling tasks for MAPPA's DSBench pipeline, each a CSV
train set with a known target, a test set without it and the hidden answers. The Kaggle tasks of
the paper cannot be downloaded here; these keep their shape (an id column, numeric and
categorical features, missing values, a described metric) at a size a CPU sandbox handles with
the standard library alone. Deterministic: `python3 data/dsbench-mini/generate.py` rewrites the
same file."""
import csv
import io
import json
import math
import random
from pathlib import Path

OUT = Path(__file__).with_name("tasks.jsonl")


def table(rows, columns):
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow(["" if r[c] is None else r[c] for c in columns])
    return buf.getvalue()


def make(task_id, kind, metric, story, features, target, rule, n_train, n_test, seed):
    rng = random.Random(seed)
    rows = []
    for i in range(n_train + n_test):
        x = {name: gen(rng) for name, gen in features}
        y = rule(x, rng)
        # A few missing values in the first numeric feature, as real data has.
        first = features[0][0]
        if rng.random() < 0.05:
            x[first] = None
        rows.append({"id": 1000 + i, **x, target: y})
    names = [n for n, _ in features]
    train, test = rows[:n_train], rows[n_train:]
    description = (
        f"{story}\n\nFiles: train.csv has the columns id, {', '.join(names)} and the target `{target}`; "
        f"test.csv has the same columns without `{target}`. Predict `{target}` for every row of test.csv and write "
        f"submission.csv with the columns id,{target}. Submissions are evaluated on {metric}."
    )
    return {
        "id": task_id,
        "task": "data_science",
        "source": "dsbench-mini",
        "prompt": description,
        # The hidden answers: the outcome block of the Analyst's coach compares submission.csv to these.
        "answer": table(test, ["id", target]),
        "files": {"train.csv": table(train, ["id", *names, target]), "test.csv": table(test, ["id", *names])},
    }


def u(a, b, digits=2):
    return lambda r: round(r.uniform(a, b), digits)


def choice(*options):
    return lambda r: r.choice(options)


def logistic(z):
    return 1.0 / (1.0 + math.exp(-z))


TASKS = [
    make("churn", "classification", "ROC AUC",
         "A phone company wants to know which customers will leave next month.",
         [("tenure_months", u(1, 72, 0)), ("monthly_fee", u(10, 120)), ("plan", choice("basic", "plus", "pro")), ("support_calls", u(0, 9, 0))],
         "churned", lambda x, r: int(r.random() < logistic(0.5 * x["support_calls"] - 0.05 * x["tenure_months"] + 0.01 * x["monthly_fee"] - 0.5)), 160, 40, 1),
    make("loan_default", "classification", "accuracy",
         "A lender wants to flag loans that will default.",
         [("income_k", u(15, 150, 1)), ("loan_k", u(1, 60, 1)), ("years_employed", u(0, 30, 0)), ("region", choice("north", "south", "east", "west"))],
         "default", lambda x, r: int(r.random() < logistic(3.0 * x["loan_k"] / x["income_k"] - 0.1 * x["years_employed"] - 0.5)), 160, 40, 2),
    make("spam", "classification", "F1 score",
         "A mail service wants to tell spam from normal mail using counts taken from each message.",
         [("links", u(0, 12, 0)), ("exclamations", u(0, 15, 0)), ("length_words", u(5, 900, 0)), ("known_sender", choice(0, 1))],
         "spam", lambda x, r: int(r.random() < logistic(0.4 * x["links"] + 0.3 * x["exclamations"] - 2.5 * x["known_sender"] - 1.5)), 160, 40, 3),
    make("disease", "classification", "accuracy",
         "A clinic wants to predict a positive test result from routine measurements.",
         [("age", u(18, 90, 0)), ("bmi", u(16, 42, 1)), ("glucose", u(60, 220, 0)), ("smoker", choice("yes", "no"))],
         "positive", lambda x, r: int(r.random() < logistic(0.03 * (x["glucose"] - 120) + 0.08 * (x["bmi"] - 27) + 0.02 * (x["age"] - 50))), 160, 40, 4),
    make("house_price", "regression", "RMSE",
         "An agency wants to price houses from their basic facts (price in thousands).",
         [("area_m2", u(30, 300, 0)), ("rooms", u(1, 8, 0)), ("age_years", u(0, 100, 0)), ("district", choice("centre", "suburb", "rural"))],
         "price_k", lambda x, r: round(2.2 * x["area_m2"] + 15 * x["rooms"] - 0.8 * x["age_years"] + {"centre": 120, "suburb": 50, "rural": 0}[x["district"]] + r.gauss(0, 25), 1), 160, 40, 5),
    make("energy_use", "regression", "MAE",
         "A utility wants to forecast a building's daily energy use in kWh.",
         [("temp_c", u(-10, 35, 1)), ("occupants", u(1, 200, 0)), ("floor_m2", u(100, 5000, 0)), ("weekday", choice(0, 1))],
         "kwh", lambda x, r: round(0.05 * x["floor_m2"] + 1.5 * x["occupants"] + 4 * abs(x["temp_c"] - 18) + 30 * x["weekday"] + r.gauss(0, 20), 1), 160, 40, 6),
    make("delivery_time", "regression", "RMSE",
         "A courier wants to predict delivery times in minutes.",
         [("distance_km", u(0.5, 40, 1)), ("parcels", u(1, 30, 0)), ("rain", choice(0, 1)), ("vehicle", choice("bike", "van"))],
         "minutes", lambda x, r: round(12 + x["distance_km"] * (4 if x["vehicle"] == "bike" else 2.2) + 0.8 * x["parcels"] + 9 * x["rain"] + r.gauss(0, 5), 1), 160, 40, 7),
    make("crop_yield", "regression", "RMSE",
         "A cooperative wants to predict crop yield in tonnes per hectare.",
         [("rain_mm", u(200, 1200, 0)), ("fertiliser_kg", u(0, 300, 0)), ("sun_hours", u(800, 2600, 0)), ("soil", choice("clay", "loam", "sand"))],
         "yield_t", lambda x, r: round(1 + 0.003 * x["rain_mm"] + 0.008 * x["fertiliser_kg"] + 0.0007 * x["sun_hours"] + {"clay": 0.3, "loam": 0.8, "sand": -0.4}[x["soil"]] + r.gauss(0, 0.4), 2), 160, 40, 8),
]

if __name__ == "__main__":
    with OUT.open("w") as f:
        for t in TASKS:
            f.write(json.dumps(t, sort_keys=True) + "\n")
    print(f"wrote {len(TASKS)} tasks to {OUT}")
