"""95% intervals (graft/analysis/stats.py) on literal records: the point value is the summary's own figure and lies
inside its interval; identical prompts give a zero-width interval, fewer than MIN_N_FOR_INTERVAL prompts none; a
hand-written comparison run with two categories gives `python -m graft.report tables --by category` one row per
category with the literal values (and n, where too few for an interval), "all" stratified by category, and the
paper-shaped table's speedup its interval. By simulation, the printed intervals cover the true ratio about 95%
of the time at the n they are printed for; a prompt's repeats (run.repeats) are one observation."""

import csv
import io
import json

import numpy as np

from graft.analysis import stats
from graft.analysis.stats import MIN_N_FOR_INTERVAL, format_interval, interval, intervals, paired_rows
from graft.records.metrics import side_totals, summarize


def _turn(new_tokens, wall_s, step_tokens, steps, decode_s):
    return {
        "prompt_tokens": 20,
        "new_tokens": new_tokens,
        "step_tokens": step_tokens,
        "steps": steps,
        "wall_s": wall_s,
        "decode_s": decode_s,
        "prefill_s": wall_s - decode_s,
        "nodes": [4] * steps,
        "draft_ms": [1.0] * steps,
        "verify_ms": [10.0] * steps,
        "other_ms": [0.5] * steps,
        "step_sources": [],
    }


def _side(*turns):
    return {"turns": list(turns), "totals": side_totals(list(turns))}


def _record(pid, category, method, baseline):
    """A single-method run's prompt record (what summarize() reads)."""
    return {
        "id": pid,
        "category": category,
        "status": "ok",
        "method": method,
        "baseline": baseline,
        "lossless": {"checked": False, "equal": None, "first_divergence": None},
    }


# four prompts of different speeds and acceptance, the baseline at its own pace on each
MIXED = [
    _record("p1", "a", _side(_turn(30, 1.5, 30, 10, 1.2)), _side(_turn(30, 3.0, 30, 30, 2.8))),
    _record("p2", "a", _side(_turn(40, 1.6, 40, 16, 1.4)), _side(_turn(40, 4.4, 40, 40, 4.1))),
    _record(
        "p3", "b", _side(_turn(20, 1.4, 20, 12, 1.1), _turn(10, 0.5, 10, 4, 0.4)), _side(_turn(30, 2.5, 30, 30, 2.3))
    ),
    _record("p4", "b", _side(_turn(25, 0.9, 25, 7, 0.8)), _side(_turn(25, 2.0, 25, 25, 1.9))),
]


def test_the_interval_contains_the_point_value_and_the_value_is_the_summarys():
    summary = summarize(MIXED * 3, {})
    named = [{**r, "_method": "pld"} for r in MIXED * 3]  # twelve prompts: three of each kind
    overall = intervals(named)["pld"]["all"]
    assert set(intervals(named)) == {"pld"}  # a single-method run's intervals are under its method's name
    for metric in ("speedup_wall", "speedup_decode", "tau"):
        entry = overall[metric]
        assert entry["n"] == 12
        assert abs(entry["value"] - summary[metric]) < 1e-12, metric
        assert entry["low"] < entry["value"] < entry["high"], (metric, entry)
        few = intervals([{**r, "_method": "pld"} for r in MIXED])["pld"]["all"][metric]  # four: no interval
        assert few["low"] is None and few["high"] is None and few["n"] == 4
        assert abs(few["value"] - entry["value"]) < 1e-12
    # the literal figures: tokens/s 20, 25, 15.79, 27.78 against 10, 9.09, 12, 12.5; steps 10, 16, 16, 7
    method_tps, base_tps = (20 + 25 + 30 / 1.9 + 25 / 0.9) / 4, (10 + 40 / 4.4 + 12 + 12.5) / 4
    assert abs(overall["speedup_wall"]["value"] - method_tps / base_tps) < 1e-12
    assert abs(overall["tau"]["value"] - 125 / 49) < 1e-12
    assert abs(overall["speedup_decode"]["value"] - (11.1 / 125) / (4.9 / 125)) < 1e-12
    # the same again: the jackknife draws nothing at random, so a table rendered twice is the same table
    assert intervals(named)["pld"]["all"] == overall


def test_identical_prompts_give_a_zero_width_interval_and_too_few_none():
    same = [MIXED[0]] * MIN_N_FOR_INTERVAL
    rows = paired_rows(same)["method"]
    for metric, value in (("speedup_wall", 2.0), ("tau", 3.0)):
        entry = interval(rows, metric)
        assert entry == {"value": value, "low": value, "high": value, "n": MIN_N_FOR_INTERVAL}, metric
    for n in (1, 2, MIN_N_FOR_INTERVAL - 1):
        assert interval(rows[:n], "speedup_wall") == {"value": 2.0, "low": None, "high": None, "n": n}
    four = interval(rows[:4], "speedup_wall")
    assert format_interval(four) == "2.00x" and format_interval(four, note_n=True) == "2.00x (n=4)"
    assert format_interval(interval(rows, "tau"), "") == "3.00 [3.00, 3.00]"
    assert format_interval(None) == "-"
    # an interval recorded by an older summary over fewer prompts is not printed either
    assert format_interval({"value": 2.0, "low": 1.5, "high": 2.5, "n": 4}) == "2.00x"
    skipped = {"id": "p9", "category": "a", "status": "skipped"}
    assert len(paired_rows([*same, skipped])["method"]) == MIN_N_FOR_INTERVAL  # a skipped prompt is no observation


def _comparison_run(path, copies: int = 3):
    """A finished comparison run: categories x (2.00x, tau 3) and y (3.00x, tau 4) for graft, each of 2 *
    `copies` identical prompts; eagle3 1.00x, tau 2 everywhere; the baseline 10 tokens/s on every prompt."""
    x_base, y_base = _side(_turn(30, 3.0, 30, 30, 2.7)), _side(_turn(40, 4.0, 40, 40, 3.6))
    sides = {
        "x": {"graft": _side(_turn(30, 1.5, 30, 10, 0.9)), "eagle3": _side(_turn(30, 3.0, 30, 15, 2.7))},
        "y": {"graft": _side(_turn(40, 40 / 30, 40, 10, 1.2)), "eagle3": _side(_turn(40, 4.0, 40, 20, 3.6))},
    }
    records = []
    for number, category in enumerate(["x", "y"] * 2 * copies):
        methods = {name: {"side": side, "speedup_wall": None} for name, side in sides[category].items()}
        base = x_base if category == "x" else y_base
        records.append({"id": f"p{number}", "category": category, "status": "ok", "baseline": base, "methods": methods})
    rows = {"ar": {"tau": 1.0, "speedup_wall": 1.0, "speedup_decode": 1.0, "tokens_per_s": 10.0}}
    methods = {}
    for name, speedup, tau in (("eagle3", 1.0, 2.0), ("graft", 2.5, 3.5)):
        methods[name] = {"model": "m", "dataset": "d", "method": name, "n_prompts": len(records), "tau": tau}
        methods[name].update(speedup_wall=speedup, speedup_decode=speedup, hardware={"cpu": "test CPU"})
        rows[name] = {"tau": tau, "speedup_wall": speedup}
    summary = {"kind": "comparison", "model": "m", "dataset": "d", "hardware": {"cpu": "test CPU"}}
    summary.update(rows=rows, methods=methods, complete={"ids": [r["id"] for r in records]})
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "run.json").write_text(json.dumps({"config_hash": "x"}))
    extra = {**records[0], "id": "outside"}  # an earlier, larger selection's record: not the summary's
    extra["methods"] = {n: {**e, "side": _side(_turn(30, 0.1, 30, 1, 0.1))} for n, e in extra["methods"].items()}
    (path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*records, extra]))
    return path


def _cells(markdown: str, first: str) -> list[str]:
    line = next(line for line in markdown.splitlines() if line.startswith(f"| {first} "))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_the_category_table_has_a_row_per_category_with_the_literal_values(tmp_path, capsys):
    from graft.report.tables import main

    run = _comparison_run(tmp_path / "runs" / "d")  # x and y, six prompts each
    out = tmp_path / "tables"
    main([str(tmp_path / "runs"), "--by", "category", "--out", str(out)])
    markdown = (out / "tables.md").read_text()
    by_category = markdown[markdown.index("### ") :]  # past the line naming the command
    by_category = by_category[by_category.index("by category") :]
    assert _cells(by_category, "category") == ["category", "eagle3", "graft"]  # the baseline (1.00x) left out
    # six prompts a category: too few for an interval, so the value and n
    assert _cells(by_category, "x") == ["x", "1.00x / 2.00 (n=6)", "2.00x / 3.00 (n=6)"]
    assert _cells(by_category, "y") == ["y", "1.00x / 2.00 (n=6)", "3.00x / 4.00 (n=6)"]
    # all twelve, stratified by category: every category's prompts are identical, so no spread is left (the
    # mix of categories is fixed by the dataset); resampled across categories, the mix would give one
    assert _cells(by_category, "all")[2] == "2.50x [2.50, 2.50] / 3.50 [3.50, 3.50]"
    rows = paired_rows(_records(run))["graft"]
    plain, strata = interval(rows, "speedup_wall"), interval(rows, "speedup_wall", stratify=True)
    assert plain["low"] < 2.5 < plain["high"] and strata["low"] == strata["high"] == 2.5
    assert [line.split("|")[1].strip() for line in by_category.splitlines() if line.startswith("| ")][1:] == [
        "x",
        "y",
        "all",
    ]
    assert "Prompts per category: x 6, y 6." in markdown and "from 10 prompts on" in markdown
    # the paper-shaped table: the speedup with its interval (from the records: summary.json has none)
    graft = _cells(markdown, "graft")
    assert graft[1] == "2.50x [2.50, 2.50] / 3.50" and graft[2] == "2.50x / 3.50"
    assert _cells(markdown, "ar")[1] == "1.00x / 1.00"  # the baseline's ratio is 1 by definition
    assert "x & 1.00x / 2.00 (n=6) & 2.00x / 3.00 (n=6)" in (out / "tables.tex").read_text()
    with open(out / "categories.csv") as f:
        table = list(csv.DictReader(f))
    columns = [c for c in table[0] if c != "partial"]  # (partial: whether the run had finished)
    assert columns == "run model dataset temperature hardware method category metric value low high n".split()
    assert len(table) == 3 * 3 * 3  # (ar, eagle3, graft) x (all, x, y) x three metrics
    (y,) = [r for r in table if (r["method"], r["category"], r["metric"]) == ("graft", "y", "speedup_wall")]
    assert y["run"] == str(run) and y["n"] == "6"
    assert (round(float(y["value"]), 9), y["low"], y["high"]) == (3.0, "", "")
    # written to summary.json the way graft/analysis/stats.py computes them, the intervals are read from there
    summary = json.loads((run / "summary.json").read_text())
    summary["intervals"] = {"graft": {"all": {"speedup_wall": {"value": 2.5, "low": 0.5, "high": 9.5, "n": 12}}}}
    summary["interval_method"] = stats.INTERVAL_METHOD
    (run / "summary.json").write_text(json.dumps(summary))
    capsys.readouterr()
    main([str(tmp_path / "runs")])
    assert _cells(capsys.readouterr().out, "graft")[1] == "2.50x [0.50, 9.50] / 3.50"
    # an older summary's intervals (another method) are recomputed from the records
    del summary["interval_method"]
    (run / "summary.json").write_text(json.dumps(summary))
    main([str(tmp_path / "runs")])
    assert _cells(capsys.readouterr().out, "graft")[1] == "2.50x [2.50, 2.50] / 3.50"
    # and a run of fewer prompts says how many, in place of the interval
    small = _comparison_run(tmp_path / "small" / "d", copies=1)
    main([str(small)])
    assert _cells(capsys.readouterr().out, "graft")[1] == "2.50x (n=4) / 3.50"


def _records(run):
    summary = json.loads((run / "summary.json").read_text())
    wanted = set(summary["complete"]["ids"])
    return [r for r in map(json.loads, (run / "samples.jsonl").read_text().splitlines()) if r["id"] in wanted]


def test_the_console_prints_a_row_per_category():
    from rich.console import Console

    from graft.analysis.console import category_table

    spread = intervals([{**r, "_method": "pld"} for r in [MIXED[0], MIXED[0], MIXED[3], MIXED[3], MIXED[3]]])
    table = category_table(spread, ["pld"])
    text = io.StringIO()
    Console(file=text, width=120).print(table)
    lines = [line for line in text.getvalue().splitlines() if line.startswith("│")]
    assert [[cell.strip() for cell in line.split("│")[1:-1]] for line in lines] == [
        ["a", "2", "2.00x / 3.00"],  # two and three prompts: too few for an interval (the n column says so)
        ["b", "3", "2.22x / 3.57"],
    ]
    assert category_table(intervals([{**MIXED[0], "_method": "pld"}]), ["pld"]) is None  # one category: none


def test_the_printed_intervals_cover_the_true_ratio_at_the_n_they_are_printed_for():
    """Lognormal tokens/s per prompt for a method and its baseline (graft/analysis/stats.py: simulate), the truth the
    ratio of their expectations: the interval printed covers it in 90-99% of 400 runs at n = 10, 20, 40, and
    for "all" over four categories of different speedups (stratified); none is printed below n = 10, where the
    percentile bootstrap printed before covered about 78% at n = 4. `python -m graft.analysis.stats --coverage`
    prints the table."""
    for n in (10, 20, 40):
        covered = stats.coverage(n, trials=400, seed=n)
        assert 0.90 <= covered <= 0.99, (n, covered)
    covered = stats.coverage(20, trials=400, categories=stats.FOUR_CATEGORIES)
    assert 0.90 <= covered <= 0.99, covered
    assert [stats.coverage(n) for n in (2, 4, MIN_N_FOR_INTERVAL - 1)] == [None] * 3
    assert stats.coverage(4, "percentile", trials=400) < 0.85
    # the simulation's vectorised intervals are the ones interval() prints from rows
    columns, codes, _ = stats.simulate(np.random.default_rng(5), 1, 12, stats.FOUR_CATEGORIES)
    rows = [
        {"category": str(c), "m_tps": m, "b_tps": b, **{k: 1.0 for k in stats.COLUMNS[2:]}}
        for c, m, b in zip(codes, columns["m_tps"][0], columns["b_tps"][0])
    ]
    _, low, high = stats.jackknife_t(columns, stats.STATISTICS["speedup_wall"], codes)
    printed = interval(rows, "speedup_wall", stratify=True)
    assert abs(printed["low"] - low[0]) < 1e-12 and abs(printed["high"] - high[0]) < 1e-12


def test_a_prompts_repeats_are_one_observation():
    """run.repeats: a prompt's later passes are records of their own (`repeat`, `prompt_id`); the intervals
    take each prompt once, its tokens/s averaged over the passes, and the value is the summary's."""
    again = []
    for record in MIXED:  # a second pass, the baseline 10% slower
        base = _side(*({**t, "wall_s": t["wall_s"] * 1.1} for t in record["baseline"]["turns"]))
        again.append({**record, "id": f"{record['id']}#2", "prompt_id": record["id"], "repeat": 2, "baseline": base})
    rows = paired_rows([{**r, "_method": "pld"} for r in MIXED + again])["pld"]
    assert len(rows) == 4  # four prompts, each measured twice
    entry = intervals([{**r, "_method": "pld"} for r in MIXED + again])["pld"]["all"]["speedup_wall"]
    assert entry["n"] == 4 and abs(entry["value"] - summarize(MIXED + again, {})["speedup_wall"]) < 1e-12
    assert summarize(MIXED + again, {})["n_prompts"] == 4


def test_repeats_have_a_table_and_a_console_column(capsys):
    """A run of run.repeats > 1: tables add each method's mean (min-max) over the repeats per dataset, the
    console a column of it beside the interval; runs of one pass add neither."""
    import pandas as pd

    from graft.analysis.console import print_comparison
    from graft.analysis.tables import repeat_columns, repeat_table

    spread = {"mean": 1.25, "min": 1.2, "max": 1.3, "values": [1.2, 1.3, 1.25]}
    base = {"method": "graft", "dataset": "mt", "repeats": None}
    rows = pd.DataFrame(
        [
            {**base, **repeat_columns({"R": 3, "speedup_wall": spread})},
            {**base, "method": "ar", **repeat_columns({"R": 3, "speedup_wall": spread})},  # the baseline: left out
            {**base, "method": "pld", "dataset": "mt"},  # one pass
        ]
    )
    table = repeat_table(rows, "speedup_wall")
    assert table.to_dict() == {"mt": {"graft": "1.25x (1.20-1.30), R=3"}}
    assert repeat_table(rows[rows["method"] == "pld"].drop(columns=["repeats"])).empty
    summary = {
        "model": "m",
        "dataset": "mt",
        "n_prompts": 2,
        "hardware": {"device": "cpu", "cpu": "test CPU"},
        "baseline": "ar",
        "rows": {"ar": {"tau": 1.0, "speedup_wall": 1.0}, "graft": {"tau": 2.0, "speedup_wall": 1.25}},
        "intervals": {"graft": {"all": {"speedup_wall": {"value": 1.25, "low": None, "high": None, "n": 2}}}},
        "repeats": {"R": 3, "methods": {"graft": {"speedup_wall": spread}}},
    }
    print_comparison(summary, "/tmp/x")
    text = capsys.readouterr().out
    assert "speedup_wall over 3 repeats" in text and "1.250x (1.20-1.30)" in text
    assert "no 95% interval: fewer than 10 prompts" in text and "[" not in text.split("graft")[1].split("\n")[0]
