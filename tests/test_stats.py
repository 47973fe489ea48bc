"""95% bootstrap intervals (graft/stats.py) on literal records: the point value is the summary's own figure and
lies inside its interval; identical prompts give a zero-width interval, one prompt none; a hand-written
comparison run with two categories gives `python -m graft.report tables --by category` one row per category
with the literal values, and the paper-shaped table's speedup its interval."""

import csv
import io
import json

from graft.metrics import side_totals, summarize
from graft.stats import format_interval, interval, intervals, paired_rows


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
    summary = summarize(MIXED, {})
    named = [{**r, "_method": "pld"} for r in MIXED]
    overall = intervals(named)["pld"]["all"]
    assert set(intervals(named)) == {"pld"}  # a single-method run's intervals are under its method's name
    for metric in ("speedup_wall", "speedup_decode", "tau"):
        entry = overall[metric]
        assert entry["n"] == 4
        assert abs(entry["value"] - summary[metric]) < 1e-12, metric
        assert entry["low"] < entry["value"] < entry["high"], (metric, entry)
    # the literal figures: tokens/s 20, 25, 15.79, 27.78 against 10, 9.09, 12, 12.5; steps 10, 16, 16, 7
    method_tps, base_tps = (20 + 25 + 30 / 1.9 + 25 / 0.9) / 4, (10 + 40 / 4.4 + 12 + 12.5) / 4
    assert abs(overall["speedup_wall"]["value"] - method_tps / base_tps) < 1e-12
    assert abs(overall["tau"]["value"] - 125 / 49) < 1e-12
    assert abs(overall["speedup_decode"]["value"] - (11.1 / 125) / (4.9 / 125)) < 1e-12
    # the same again: the resampling is seeded, so a table rendered twice is the same table
    assert intervals(named)["pld"]["all"] == overall


def test_identical_prompts_give_a_zero_width_interval_and_one_prompt_none():
    same = [MIXED[0]] * 5
    rows = paired_rows(same)["method"]
    for metric, value in (("speedup_wall", 2.0), ("tau", 3.0)):
        entry = interval(rows, metric)
        assert entry == {"value": value, "low": value, "high": value, "n": 5}, metric
    one = interval(rows[:1], "speedup_wall")
    assert one == {"value": 2.0, "low": None, "high": None, "n": 1}
    assert format_interval(one) == "2.00x" and format_interval(interval(rows, "tau"), "") == "3.00 [3.00, 3.00]"
    assert format_interval(None) == "-"
    skipped = {"id": "p9", "category": "a", "status": "skipped"}
    assert len(paired_rows([*same, skipped])["method"]) == 5  # a skipped prompt is no observation


def _comparison_run(path):
    """A finished comparison run: categories x (2.00x, tau 3) and y (3.00x, tau 4) for graft, each of two
    identical prompts; eagle3 1.00x, tau 2 everywhere; the baseline 10 tokens/s on every prompt."""
    x_base, y_base = _side(_turn(30, 3.0, 30, 30, 2.7)), _side(_turn(40, 4.0, 40, 40, 3.6))
    sides = {
        "x": {"graft": _side(_turn(30, 1.5, 30, 10, 0.9)), "eagle3": _side(_turn(30, 3.0, 30, 15, 2.7))},
        "y": {"graft": _side(_turn(40, 40 / 30, 40, 10, 1.2)), "eagle3": _side(_turn(40, 4.0, 40, 20, 3.6))},
    }
    records = []
    for number, category in enumerate(["x", "y", "x", "y"]):
        methods = {name: {"side": side, "speedup_wall": None} for name, side in sides[category].items()}
        base = x_base if category == "x" else y_base
        records.append({"id": f"p{number}", "category": category, "status": "ok", "baseline": base, "methods": methods})
    rows = {"ar": {"tau": 1.0, "speedup_wall": 1.0, "speedup_decode": 1.0, "tokens_per_s": 10.0}}
    methods = {}
    for name, speedup, tau in (("eagle3", 1.0, 2.0), ("graft", 2.5, 3.5)):
        methods[name] = {"model": "m", "dataset": "d", "method": name, "n_prompts": 4, "tau": tau}
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

    run = _comparison_run(tmp_path / "runs" / "d")
    out = tmp_path / "tables"
    main([str(tmp_path / "runs"), "--by", "category", "--out", str(out)])
    markdown = (out / "tables.md").read_text()
    by_category = markdown[markdown.index("by category") :]
    assert _cells(by_category, "category") == ["category", "eagle3", "graft"]  # the baseline (1.00x) left out
    assert _cells(by_category, "x") == [
        "x",
        "1.00x [1.00, 1.00] / 2.00 [2.00, 2.00]",
        "2.00x [2.00, 2.00] / 3.00 [3.00, 3.00]",
    ]
    assert _cells(by_category, "y") == [
        "y",
        "1.00x [1.00, 1.00] / 2.00 [2.00, 2.00]",
        "3.00x [3.00, 3.00] / 4.00 [4.00, 4.00]",
    ]
    whole = _cells(by_category, "all")[2]  # both categories: 2.5x and tau 140 / 40, with a real spread
    assert whole.startswith("2.50x [") and " / 3.50 [" in whole and whole != "2.50x [2.50, 2.50] / 3.50 [3.50, 3.50]"
    assert [line.split("|")[1].strip() for line in by_category.splitlines() if line.startswith("| ")][1:] == [
        "x",
        "y",
        "all",
    ]
    assert "Prompts per category: x 2, y 2." in markdown
    # the paper-shaped table: the speedup with its interval (from the records: summary.json has none)
    graft = _cells(markdown, "graft")
    assert graft[1].startswith("2.50x [") and graft[1].endswith("] / 3.50") and graft[2] == "2.50x / 3.50"
    assert _cells(markdown, "ar")[1] == "1.00x / 1.00"  # the baseline's ratio is 1 by definition
    assert (
        "x & 1.00x [1.00, 1.00] / 2.00 [2.00, 2.00] & 2.00x [2.00, 2.00] / 3.00 [3.00, 3.00]"
        in (out / "tables.tex").read_text()
    )
    with open(out / "categories.csv") as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == "run model dataset temperature hardware method category metric value low high n".split()
    assert len(table) == 3 * 3 * 3  # (ar, eagle3, graft) x (all, x, y) x three metrics
    (y,) = [r for r in table if (r["method"], r["category"], r["metric"]) == ("graft", "y", "speedup_wall")]
    assert y["run"] == str(run) and y["n"] == "2"
    assert [round(float(y[k]), 9) for k in ("value", "low", "high")] == [3.0, 3.0, 3.0]
    # written to summary.json, the intervals are read from there rather than recomputed
    summary = json.loads((run / "summary.json").read_text())
    summary["intervals"] = {"graft": {"all": {"speedup_wall": {"value": 2.5, "low": 0.5, "high": 9.5, "n": 4}}}}
    (run / "summary.json").write_text(json.dumps(summary))
    capsys.readouterr()
    main([str(tmp_path / "runs")])
    assert _cells(capsys.readouterr().out, "graft")[1] == "2.50x [0.50, 9.50] / 3.50"


def test_the_console_prints_a_row_per_category():
    from rich.console import Console

    from graft.report.console import category_table

    spread = intervals([{**r, "_method": "pld"} for r in [MIXED[0], MIXED[0], MIXED[3], MIXED[3], MIXED[3]]])
    table = category_table(spread, ["pld"])
    text = io.StringIO()
    Console(file=text, width=120).print(table)
    lines = [line for line in text.getvalue().splitlines() if line.startswith("│")]
    assert [[cell.strip() for cell in line.split("│")[1:-1]] for line in lines] == [
        ["a", "2", "2.00x [2.00, 2.00] / 3.00"],  # two identical prompts: no spread
        ["b", "3", "2.22x [2.22, 2.22] / 3.57"],
    ]
    assert category_table(intervals([{**MIXED[0], "_method": "pld"}]), ["pld"]) is None  # one category: none
