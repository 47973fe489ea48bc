"""`python -m graft.report tables` and `plot` on hand-written run directories: the numbers in the tables are the literal
values written, and every figure file appears."""

import json
import subprocess
import sys

from conftest import ROOT, finish_run

HARDWARE = {"device": "cpu", "cpu": "test CPU"}


def _method_summary(dataset, method, speedup, tau, budget, stages=None):
    return {
        "model": "m",
        "dataset": dataset,
        "method": method,
        "temperature": 0.0,
        "n_prompts": 1,
        "tau": tau,
        "speedup_wall": speedup,
        "speedup_decode": speedup,
        "avg_nodes_per_step": budget / 2,
        "tokens_per_s": 10 * speedup,
        "lossless": True,
        "retrieval_share": 0.5,
        "ms_per_step": 30.0,
        "hardware": HARDWARE,
        "time_split": {"draft": 0.2, "verify": 0.7, "other": 0.1},
        "stages": stages,
        "method_config": {"total_tokens": budget},
    }


def _turn(accepted, stage):
    n = len(accepted)
    return {
        "steps": n,
        "accept_lengths": accepted,
        "nodes": [8] * n,
        "draft_ms": [2.0] * n,
        "verify_ms": [30.0] * n,
        "other_ms": [1.0] * n,
        "step_info": [{"stage": stage}] * n,
        "step_sources": [[3, 4, 1, 1]] * n,
    }


def _comparison(path, dataset, numbers, budget=60, thresholds=None, model="m", config=None):
    """A finished comparison run directory: numbers = {method: (speedup, tau)}; `config`: run.json's config."""
    path.mkdir(parents=True)
    methods = {
        m: _method_summary(dataset, m, s, t, budget, {"dense": 0.25, "check@0": 0.75} if m == "graft" else None)
        for m, (s, t) in numbers.items()
    }
    for summary in methods.values():
        summary["model"] = model
    if thresholds:
        methods["graft"]["method_config"]["thresholds"] = thresholds
    rows = {
        "ar": {
            "tau": 1.0,
            "speedup_wall": 1.0,
            "speedup_decode": 1.0,
            "avg_nodes_per_step": 1.0,
            "tokens_per_s": 10.0,
            "ms_per_step": 25.0,
        }
    }
    summary = {
        "kind": "comparison",
        "model": model,
        "dataset": dataset,
        "hardware": HARDWARE,
        "rows": rows,
        "methods": methods,
    }
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "run.json").write_text(json.dumps({"config_hash": "x", **({"config": config} if config else {})}))
    record = {
        "id": "p1",
        "status": "ok",
        "baseline": {"turns": [_turn([1, 1, 1], None)]},
        "methods": {m: {"side": {"turns": [_turn([3, 1, 2], "check@0" if m == "graft" else None)]}} for m in numbers},
    }
    (path / "samples.jsonl").write_text(json.dumps(record) + "\n")
    finish_run(path)


def _sweep(tmp_path):
    _comparison(tmp_path / "sweep" / "dataset=mt", "mt", {"eagle3": (1.5, 2.5), "graft": (1.8, 3.0)})
    _comparison(tmp_path / "sweep" / "dataset=he", "he", {"eagle3": (2.5, 3.5), "graft": (3.0, 4.2)})
    return tmp_path / "sweep"


def _report(command: str, tmp_path, out):
    proc = subprocess.run(
        [sys.executable, "-m", "graft.report", command, str(_sweep(tmp_path)), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_make_tables_writes_the_paper_shaped_table(tmp_path):
    out = tmp_path / "tables"
    _report("tables", tmp_path, out)
    table = (out / "tables.md").read_text()
    graft_row = next(line for line in table.splitlines() if line.startswith("| graft"))
    assert [cell.strip() for cell in graft_row.strip("|").split("|")] == [
        "graft",
        "3.00x / 4.20",
        "1.80x / 3.00",
        "2.40x / 3.60",
    ]
    ar_row = next(line for line in table.splitlines() if line.startswith("| ar"))
    assert "1.00x / 1.00" in ar_row
    assert "Graft over EAGLE-3 (mean speedup_wall): +20.0%" in table
    assert "check@0" in table and "75.0%" in table  # the split table
    assert "\\begin{tabular}" in (out / "tables.tex").read_text()
    assert (out / "rows.csv").read_text().count("\n") == 1 + 2 * 3  # header, then ar, eagle3, graft per dataset


def test_plot_writes_every_figure(tmp_path):
    out = tmp_path / "figures"
    _report("plot", tmp_path, out)
    from graft.analysis.plots import FIGURES

    for name in FIGURES:
        for suffix in (".png", ".pdf"):
            assert (out / f"{name}{suffix}").stat().st_size > 1000, name
    import csv

    import pytest

    claims = list(csv.DictReader((out / "beside_paper.csv").open()))
    ratios = {row["dataset"]: float(row["ratio"]) for row in claims if row["comparison"] == "Graft over EAGLE-3"}
    # records without per-side totals: the summaries' ratio, 1.8 / 1.5 and 3.0 / 2.5
    assert ratios["mt"] == pytest.approx(1.2) and ratios["he"] == pytest.approx(1.2)


def test_the_palette_gives_a_method_one_colour_whatever_else_is_plotted():
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba

    from graft.analysis.drawing import bar_groups
    from graft.analysis.styles import PALETTE, method_style

    colours = [method_style(name)["color"] for name in PALETTE]
    assert len(set(colours)) == len(colours)  # no two listed methods share a colour
    assert method_style("not_a_method") == method_style("not_a_method")  # hashed, not positional

    def graft_colour(methods):  # the colour of Graft's bar in a bar chart of `methods`
        fig, ax = plt.subplots()
        bar_groups(ax, [("d", {m: (1.2, None, None) for m in methods})], methods, "speedup_wall")
        colour = next(c for c in ax.containers if c.get_label() == "Graft").patches[0].get_facecolor()
        plt.close(fig)
        return colour

    assert graft_colour(["eagle3", "graft"]) == graft_colour(["pld", "samd", "pruned", "graft"])
    assert graft_colour(["graft"]) == to_rgba(method_style("graft")["color"])


def test_the_relative_claims_table_is_the_ratio_of_two_methods_over_the_same_prompts(tmp_path):
    import pandas as pd
    import pytest

    from graft.analysis.claims import relative_claims
    from graft.analysis.tables import method_rows
    from graft.report.figures import CLAIMS

    numbers = {"eagle3": (2.0, 3.0), "pruned": (4.0, 2.0), "graft": (4.0, 3.5), "dflash": (2.0, 3.0)}
    numbers["dflash_graft"] = (2.4, 3.2)
    run = tmp_path / "run"
    _comparison(run, "mt", numbers)
    tps = {"ar": [10, 10], "eagle3": [20, 20], "pruned": [40, 40], "graft": [30, 50], "dflash": [10, 30]}
    tps["dflash_graft"] = [22, 26]

    def side(name, k):
        totals = {"tokens_per_s": tps[name][k], "decode_s": 1.0, "step_tokens": 10, "steps": 5}
        return {"turns": [_turn([1, 1], None)], "totals": totals}

    records = [
        {
            "id": f"p{k}",
            "status": "ok",
            "baseline": side("ar", k),
            "methods": {m: {"side": side(m, k)} for m in numbers},
        }
        for k in range(2)
    ]
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    finish_run(run)
    table = relative_claims(method_rows([run]), pd.read_csv(CLAIMS, dtype={"dataset": str, "model": str}))
    got = {(r.method, r.over): r for r in table.itertuples()}
    assert got[("graft", "eagle3")].ratio == pytest.approx(40 / 20)  # mean tokens/s over the same two prompts
    assert got[("graft", "pruned")].ratio == pytest.approx(40 / 40)
    assert got[("dflash_graft", "dflash")].ratio == pytest.approx(24 / 20)
    assert got[("graft", "eagle3")].prompts == 2
    graft = got[("graft", "eagle3")]
    assert pd.isna(graft.low) and pd.isna(graft.high)  # two prompts: too few for an interval (graft/analysis/stats.py)
    assert (graft.published_low, graft.published_high) == (1.074, 1.218)  # +7.4% to +21.8% over EAGLE-3
    assert got[("dflash_graft", "dflash")].published == pytest.approx(3.71 / 3.40, abs=1e-3)
    assert ("graft_root", "eagle3") not in got  # no run here has Graft(ROOT)


def test_the_pareto_front_keeps_only_undominated_points():
    from graft.analysis.drawing import pareto_front

    points = [(4, 1.0), (8, 1.5), (8, 1.2), (16, 1.4), (32, 2.0), (2, 0.5)]
    assert pareto_front(points) == [5, 0, 1, 4]


def test_a_sweep_gets_one_row_per_setting_not_an_average(tmp_path):
    sweep = tmp_path / "pareto"
    _comparison(sweep / "b8", "mt", {"eagle3": (0.9, 1.7), "graft": (1.6, 1.8)}, 8, [0.35, 0.25, 0.15])
    _comparison(sweep / "b60", "mt", {"eagle3": (0.6, 2.3), "graft": (1.2, 2.6)}, 60, [0.5, 0.35, 0.25])
    from graft.report.tables import build

    markdown, _, _ = build([str(sweep)], "speedup_wall")
    lines = markdown.splitlines()
    row8 = next(line for line in lines if line.startswith("| (8, '0.35/0.25/0.15')"))
    assert "1.60x / 1.80 / 4.0" in row8
    row60 = next(line for line in lines if line.startswith("| (60, '-')"))
    assert "0.60x / 2.30 / 30.0" in row60
    assert "graft 8 nodes at 0.35/0.25/0.15 (1.60x, tau 1.80)" in markdown
    assert "eagle3 8 nodes at - (0.90x, tau 1.70)" in markdown


def test_the_readme_quick_start_table_is_its_committed_run():
    """README.md's quick-start table is the output of the run it names (results/quick_start/run), to the digits
    it prints: a re-measured table must come with its run."""
    readme = (ROOT / "README.md").read_text()
    assert "results/quick_start/run" in readme
    rows = json.loads((ROOT / "results" / "quick_start" / "run" / "summary.json").read_text())["rows"]
    printed = {}
    for line in readme[readme.index("## Quick start") : readme.index("per category: speedup_wall")].splitlines():
        cells = [c.strip() for c in line.strip("│").split("│")]
        if len(cells) == 7 and cells[1][:1].isdigit():
            printed[cells[0].removesuffix(" (baseline)")] = cells[1:]
    assert list(printed) == list(rows)
    for method, (tau, wall, decode, nodes, tps, _) in printed.items():
        row = rows[method]
        assert tau == f"{row['tau']:.2f}" and wall == f"{row['speedup_wall']:.3f}x", method
        assert decode == f"{row['speedup_decode']:.3f}x" and nodes == f"{row['avg_nodes_per_step']:.1f}", method
        assert tps == f"{row['tokens_per_s']:.1f}", method


def test_results_readme_tables_match_their_committed_records():
    proc = subprocess.run(
        [sys.executable, "-m", "graft.report", "render", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]


def test_render_notices_a_results_folder_whose_tables_trail_the_code_and_rewrites_it(tmp_path):
    """A folder's tables.md names the command that wrote it; `render --check` runs it again over the committed
    records and names every file that differs (here a rows.csv written before a column was added)."""
    import shutil

    folder = tmp_path / "long_context"
    shutil.copytree(ROOT / "results" / "long_context", folder, ignore=shutil.ignore_patterns("runs", "figures"))
    (tmp_path / "README.md").write_text("no generated blocks\n")
    rows = (folder / "rows.csv").read_text().splitlines(keepends=True)
    (folder / "rows.csv").write_text("".join(",".join(r.split(",")[:-1]) + "\n" for r in rows))  # a column short
    check = [sys.executable, "-m", "graft.report", "render", "--check", str(tmp_path / "README.md")]
    proc = subprocess.run(check, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and f"{folder}/rows.csv;" in proc.stderr, proc.stderr[-2000:]
    assert "tables.md" not in proc.stderr  # the other files are as the records give them
    subprocess.run(check[:4] + check[5:], cwd=ROOT, check=True, capture_output=True, timeout=300)
    assert (folder / "rows.csv").read_text() == (ROOT / "results" / "long_context" / "rows.csv").read_text()
    assert subprocess.run(check, cwd=ROOT, capture_output=True, timeout=300).returncode == 0


def test_render_results_notices_a_hand_edited_table(tmp_path):
    readme = tmp_path / "README.md"
    block = "<!-- generated: lossless results/lossless/mt_bench.json -->\n| typed by hand |\n<!-- /generated -->\n"
    readme.write_text(block)
    proc = subprocess.run(
        [sys.executable, "-m", "graft.report", "render", "--check", str(readme)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and "stale" in proc.stderr
    subprocess.run([sys.executable, "-m", "graft.report", "render", str(readme)], cwd=ROOT, check=True)
    assert "| graft | 20/20 equal |" in readme.read_text()


def test_the_hardware_column_names_the_gpu_else_the_cpu_and_its_vector_instructions():
    from graft.records.reader import hardware_name

    assert hardware_name({"cpu": "AMD EPYC", "cpu_isa": "AVX2"}) == "AMD EPYC, AVX2"
    assert hardware_name({"cpu": "AMD EPYC"}) == "AMD EPYC"  # records from before cpu_isa
    assert hardware_name({"cpu": "AMD EPYC", "cpu_isa": "AVX512", "gpu": "NVIDIA H200"}) == "NVIDIA H200"
    assert hardware_name({}) is None


def test_the_side_by_side_gives_medians_of_rounds_and_the_ratio_range():
    """graft/bench/e2e.py's summary (graft/report/e2e.py) over two rounds of hand-written records: tokens/s per round = tokens /
    seconds summed over the round's prompts, the table the median of the rounds, x AR the median of each
    round's own ratio, with its range."""
    from graft.report import e2e as bench

    def run(tokens, seconds):
        phases = {"steps": tokens, "prefill_s": 0.0, "draft_s": 0.0, "verify_s": seconds, "other_s": 0.0}
        return {"tokens": [1] * tokens, "seconds": seconds, "phases": phases}

    records = [  # ar 10 tokens/s in round 0, 20 in round 1; graft 15 then 20 (two prompts a round)
        {"prompt": "a", "round": 0, "ar": run(5, 0.5), "graft@6": run(5, 0.25)},
        {"prompt": "b", "round": 0, "ar": run(5, 0.5), "graft@6": run(5, 0.41666666666666663)},
        {"prompt": "a", "round": 1, "ar": run(10, 0.5), "graft@6": run(10, 0.5)},
        {"prompt": "b", "round": 1, "ar": run(10, 0.5), "graft@6": run(10, 0.5)},
    ]
    records[2]["graft@6"]["tokens"] = [2] * 10  # not equal to AR's in one record
    table = {row["system"]: row for row in bench.summarise(records, ["ar", "graft@6"])}
    assert abs(table["ar"]["tokens_per_s"] - 15.0) < 1e-9  # median of 10 and 20
    assert abs(table["graft@6"]["tokens_per_s"] - 17.5) < 1e-9  # median of 15 and 20
    assert abs(table["graft@6"]["x_ar"] - 1.25) < 1e-9  # median of 1.5 and 1.0, not 17.5 / 15
    assert table["graft@6"]["x_ar_range"] == [1.0, 1.5]
    assert table["ar"]["equal"] and table["graft@6"]["equal"] is False
    one_round = bench.summarise(records[:2], ["ar", "graft@6"])
    assert "x_ar_range" not in one_round[1] and abs(one_round[1]["x_ar"] - 1.5) < 1e-9


def test_systems_on_the_bfloat16_target_are_checked_and_timed_against_its_own_ar(tmp_path):
    """bench_e2e's /bf16 systems run on a second float target: their tokens are compared with ar/bf16's (not ar's),
    their 'x its AR' is against ar/bf16, and render_results gives the same ratio from the per-prompt records."""
    from graft.report import e2e as bench
    from graft.report.render import side_by_side

    def run(tokens, seconds, token=1):
        phases = {"steps": tokens, "prefill_s": 0.0, "draft_s": 0.0, "verify_s": seconds, "other_s": 0.0}
        return {"tokens": [token] * tokens, "seconds": seconds, "phases": phases}

    names = ["ar", "ar/bf16", "graft@16/bf16"]
    # ar 10 tokens/s; ar/bf16 20 (other tokens: another float target); graft on it 30, its tokens equal ar/bf16's
    records = [
        {"prompt": "a", "round": 0, "ar": run(10, 1.0), "ar/bf16": run(10, 0.5, 2), "graft@16/bf16": run(9, 0.3, 2)}
    ]
    records[0]["graft@16/bf16"]["tokens"] = [2] * 10
    records[0]["graft@16/bf16"]["seconds"] = 1 / 3
    table = {row["system"]: row for row in bench.summarise(records, names)}
    assert table["ar/bf16"]["equal"] and table["graft@16/bf16"]["equal"]  # each against ar/bf16, not ar
    assert abs(table["graft@16/bf16"]["x_own_ar"] - 1.5) < 1e-9 and abs(table["graft@16/bf16"]["x_ar"] - 3.0) < 1e-9
    assert "x_own_ar" not in table["ar"]
    path = tmp_path / "e2e.json"
    stored = [
        {k: v if k in ("prompt", "round") else {"n": len(v["tokens"]), "seconds": v["seconds"]} for k, v in r.items()}
        for r in records
    ]
    path.write_text(json.dumps({"table": list(table.values()), "records": stored}))
    lines = side_by_side(str(path)).splitlines()
    assert lines[0].endswith("| x its AR |")
    assert lines[-1] == "| graft@16/bf16 | 30.0 | - | 3.00 | 1.50 |"


def test_the_side_by_side_gives_the_tau_a_system_would_need_for_a_ratio_to_its_own_ar(tmp_path):
    """tau_needed = ratio x (draft + verify + other ms a step) / its AR's ms per token: at the step costs
    measured, the tokens a step would have to commit."""
    from graft.report import e2e as bench

    def run(steps, tokens, draft, verify, other):
        phases = {"steps": steps, "prefill_s": 0.0, "draft_s": draft, "verify_s": verify, "other_s": other}
        return {"tokens": [1] * (tokens + 1), "seconds": draft + verify + other, "phases": phases}

    # ar/bf16: 10 steps of 10 ms, one token each; graft: 5 steps of 2 + 12 + 1 = 15 ms, 10 tokens (tau 2)
    records = [
        {
            "prompt": "a",
            "round": 0,
            "ar/bf16": run(10, 10, 0.0, 0.1, 0.0),
            "graft@16/bf16": run(5, 10, 0.01, 0.06, 0.005),
        }
    ]
    table = {row["system"]: row for row in bench.summarise(records, ["ar/bf16", "graft@16/bf16"], tau_for=1.8)}
    graft = table["graft@16/bf16"]
    assert abs(graft["tau"] - 2.0) < 1e-9 and abs(graft["x_own_ar"] - 4 / 3) < 1e-9
    assert abs(graft["tau_needed"] - 1.8 * 15 / 10) < 1e-9  # 2.7 tokens a step for 1.8x
    assert "tau_needed" not in table["ar/bf16"]
    assert "tau_needed" not in bench.summarise(records, ["ar/bf16", "graft@16/bf16"])[1]
    assert bench.tau_needed(15.0, 10.0, 1.0) == 1.5  # break-even
    from graft.report.render import step_split

    path = tmp_path / "e2e.json"
    path.write_text(json.dumps({"tau_for": 1.8, "table": list(table.values())}))
    lines = step_split(str(path)).splitlines()
    assert lines[0].endswith("| tau for 1.8x its AR |")
    assert lines[-2].endswith("| - |") and lines[-1].endswith("| 2.70 |")  # ar/bf16 needs none; graft 2.7


def test_the_ab_native_table_gives_each_context_and_token_count_old_to_new(tmp_path):
    from graft.report.render import ab_native

    report = {
        "contexts": {
            "256": {"1": {"old": 15.0, "new": 14.5}, "8": {"old": 23.25, "new": 22.0}},
            "4096": {"1": {"old": 26.0, "new": 25.0}, "8": {"old": 66.0, "new": 49.75}},
        }
    }
    path = tmp_path / "ab.json"
    path.write_text(json.dumps(report))
    assert ab_native(str(path)).splitlines() == [
        "| context | 1 (decode) | 8 |",
        "|---|---|---|",
        "| 256 | 15.00 -> 14.50 | 23.25 -> 22.00 |",
        "| 4,096 | 26.00 -> 25.00 | 66.00 -> 49.75 |",
    ]


def _killed(path, dataset, numbers, planned=3):
    """A comparison run killed after its first prompt, in the middle of writing its second: summary.json (as the
    runner rewrites it after each prompt) without `complete`, samples.jsonl ending in a torn line."""
    _comparison(path, dataset, numbers, config={"run": {"num_prompts": planned}})
    summary = json.loads((path / "summary.json").read_text())
    del summary["complete"]
    (path / "summary.json").write_text(json.dumps({**summary, "n_prompts": 1, "n_skipped": 0}))
    with open(path / "samples.jsonl", "a") as f:
        f.write('{"id": "p2", "status": "o')
    return path


def test_an_unfinished_run_is_skipped_and_named_or_shown_marked_partial(tmp_path, capsys):
    from graft.report.tables import build

    sweep = tmp_path / "sweep"
    _comparison(sweep / "mt", "mt", {"eagle3": (1.5, 2.5), "graft": (1.8, 3.0)})
    _killed(sweep / "he", "he", {"eagle3": (2.5, 3.5), "graft": (3.0, 4.2)})
    markdown, _, rows = build([str(sweep)], "speedup_wall")
    assert f"{sweep / 'he'}: partial (1 of 3 prompts); skipped (pass --partial to show it)" in capsys.readouterr().err
    assert set(rows["dataset"]) == {"mt"} and "| he" not in markdown and not rows["partial"].any()
    markdown, _, rows = build([str(sweep)], "speedup_wall", partial=True)
    assert f"{sweep / 'he'}: partial (1 of 3 prompts); shown, marked partial" in capsys.readouterr().err
    graft_partial = next(line for line in markdown.splitlines() if line.startswith("| graft (partial)"))
    assert "3.00x / 4.20" in graft_partial  # its own row: never averaged with a finished run's
    assert set(rows[rows["partial"]]["dataset"]) == {"he"}


def test_runs_of_one_cell_that_differ_in_a_setting_are_shown_apart_and_the_table_says_why(tmp_path):
    from graft.report.tables import build

    sweep = tmp_path / "sweep"
    for tokens, speed in ((64, 1.2), (128, 1.6)):
        config = {"run": {"max_new_tokens": tokens, "seed": 0}, "dataset": {"name": "mt"}}
        _comparison(sweep / f"t{tokens}", "mt", {"eagle3": (speed - 0.2, 2.0), "graft": (speed, 3.0)}, config=config)
    markdown, _, rows = build([str(sweep)], "speedup_wall")
    lines = markdown.splitlines()
    # rows.csv's settings column: the one setting that splits the cell, not every key the runs were made with
    assert sorted(set(rows["settings"])) == ["run.max_new_tokens=128", "run.max_new_tokens=64"]
    assert "1.20x / 3.00" in next(line for line in lines if line.startswith("| graft (max_new_tokens=64)"))
    assert "1.60x / 3.00" in next(line for line in lines if line.startswith("| graft (max_new_tokens=128)"))
    assert not any(line.split("|")[1].strip() == "graft" for line in lines if line.startswith("|"))  # no average
    assert "differ in run.max_new_tokens; shown apart" in markdown
    # repeats (only the seed differs) stay one setting: averaged, with their range
    repeats = tmp_path / "repeats"
    for seed, speed in ((0, 1.2), (1, 1.4)):
        config = {"run": {"max_new_tokens": 64, "seed": seed}}
        _comparison(repeats / f"s{seed}", "mt", {"eagle3": (1.0, 2.0), "graft": (speed, 3.0)}, config=config)
    markdown, _, rows = build([str(repeats)], "speedup_wall")
    assert "1.30x (1.20-1.40) / 3.00" in markdown and "differ in" not in markdown
    assert set(rows["settings"]) == {""}


def test_the_stage_table_keeps_every_model(tmp_path):
    from graft.report.tables import build

    runs = tmp_path / "runs"
    _comparison(runs / "a", "mt", {"eagle3": (1.5, 2.5), "graft": (1.8, 3.0)}, model="llama")
    _comparison(runs / "b", "mt", {"eagle3": (1.2, 2.0), "graft": (1.4, 2.4)}, model="qwen")
    markdown, _, _ = build([str(runs)], "speedup_wall")
    stages = markdown.split("Share of steps per pruning stage")[1]
    assert "| llama / graft / mt" in stages and "| qwen / graft / mt" in stages
