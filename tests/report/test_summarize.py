"""`python -m graft.report summarize` on literal summaries: a comparison gives a row per compared method with its
numbers (not dashes), a single-method run its one row."""

import json

from conftest import finish_run

from graft.report.summarize import main

HARDWARE = {"device": "cpu", "cpu": "test CPU", "torch_threads": 2}


def _method(name: str, speedup: float, tau: float, budget: int) -> dict:
    return {
        "model": "m",
        "method": name,
        "dataset": "mt",
        "hardware": HARDWARE,
        "method_config": {"total_tokens": budget},
        "n_prompts": 2,
        "tau": tau,
        "tokens_per_s": 20.0 * speedup,
        "baseline_tokens_per_s": 20.0,
        "speedup_wall": speedup,
        "speedup_decode": speedup + 0.1,
        "avg_nodes_per_step": budget / 2,
        "retrieval_share": 0.25,
        "graft_overhead": 0.05,
        "loop_overhead": 0.1,
        "lossless": True,
    }


COMPARISON = {
    "kind": "comparison",
    "model": "m",
    "dataset": "mt",
    "hardware": HARDWARE,
    "method": "ar",
    "baseline": "ar",
    "n_prompts": 2,
    "rows": {"ar": {"tau": 1.0, "speedup_wall": 1.0, "tokens_per_s": 20.0}},
    "methods": {"pld": _method("pld", 1.2, 1.5, 10), "graft": _method("graft", 1.75, 2.5, 60)},
}


def _rows(text: str) -> dict[str, list[str]]:
    lines = [line for line in text.splitlines() if line.startswith("| m |")]
    return {cells[1]: cells for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines)}


def test_a_comparison_gives_a_row_per_method_with_its_numbers(tmp_path, capsys):
    (tmp_path / "compare").mkdir()
    (tmp_path / "compare" / "summary.json").write_text(json.dumps(COMPARISON))
    (tmp_path / "single").mkdir()
    (tmp_path / "single" / "summary.json").write_text(json.dumps(_method("eagle3", 1.5, 2.0, 24)))
    for run in ("compare", "single"):
        (tmp_path / run / "samples.jsonl").write_text('{"id": "p1"}\n{"id": "p2"}\n')
        finish_run(tmp_path / run)
    main([str(tmp_path / "compare" / "summary.json"), str(tmp_path / "single"), "--out", str(tmp_path / "t.md")])
    text = capsys.readouterr().out
    rows = _rows(text)
    assert list(rows) == ["pld", "graft", "eagle3"]
    # model method dataset budget n_prompts tau tokens_per_s baseline_tokens_per_s speedup_wall speedup_decode ...
    assert rows["graft"][:10] == ["m", "graft", "mt", "60", "2", "2.50", "35.0", "20.0", "1.750", "1.850"]
    assert rows["pld"][3:9] == ["10", "2", "1.50", "24.0", "20.0", "1.200"]
    assert rows["eagle3"][3] == "24"
    assert "-" not in rows["graft"] and "-" not in rows["pld"]
    assert "Hardware: test CPU (2 threads)" in text
    assert (tmp_path / "t.md").read_text() == text


def test_a_run_of_repeats_has_their_mean_and_range_in_a_column(tmp_path, capsys):
    """run.repeats > 1: each method's summary holds `repeats`; the table adds a column of speedup_wall's mean
    (min-max) over them, and leaves runs of one pass "-" (a table of such runs alone has no such column)."""
    spread = {"mean": 1.7, "min": 1.6, "max": 1.8, "values": [1.6, 1.8]}
    repeated = {
        **COMPARISON,
        "methods": {"graft": {**_method("graft", 1.75, 2.5, 60), "repeats": {"R": 2, "speedup_wall": spread}}},
    }
    for name, summary in (("repeated", repeated), ("single", _method("eagle3", 1.5, 2.0, 24))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
        (tmp_path / name / "samples.jsonl").write_text('{"id": "p1"}\n{"id": "p2"}\n')
        finish_run(tmp_path / name)
    main([str(tmp_path / "repeated"), str(tmp_path / "single")])
    text = capsys.readouterr().out
    assert text.splitlines()[0].endswith("| lossless | speedup_wall_repeats |")
    rows = _rows(text)
    assert rows["graft"][-1] == "1.700 (1.600-1.800), R=2" and rows["eagle3"][-1] == "-"
    main([str(tmp_path / "single")])
    assert "speedup_wall_repeats" not in capsys.readouterr().out


def _single_run(path, name: str, complete: bool = True):
    """A single-method run folder (summary, one record with its method side), finished or killed (no `complete`)."""
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps({**_method(name, 1.5, 2.0, 24), "n_skipped": 0}))
    turn = {"tokens_sha256": "0" * 16, "accept_lengths": [2, 1], "nodes": [4, 4], "step_tokens": 3, "steps": 2}
    (path / "samples.jsonl").write_text(json.dumps({"id": "p1", "status": "ok", "method": {"turns": [turn]}}) + "\n")
    (path / "run.json").write_text(json.dumps({"config": {"method": {"name": name}}}))  # as every run writes one
    finish_run(path)
    if not complete:
        summary = json.loads((path / "summary.json").read_text())
        del summary["complete"]
        (path / "summary.json").write_text(json.dumps(summary))
    return path


def test_summarize_and_compare_skip_an_unfinished_run_or_mark_it_partial(tmp_path, capsys):
    import pytest

    from graft.report.compare import main as compare

    _single_run(tmp_path / "before" / "pld", "pld")
    _single_run(tmp_path / "before" / "graft", "graft")
    _single_run(tmp_path / "after" / "pld", "pld")
    killed = _single_run(tmp_path / "after" / "graft", "graft", complete=False)
    main([str(tmp_path / "after" / "pld"), str(killed / "summary.json")])
    out, err = capsys.readouterr()
    assert list(_rows(out)) == ["pld"]
    assert f"{killed}: partial (2 prompts, no `complete` record); skipped (pass --partial to show it)" in err
    main([str(tmp_path / "after" / "pld"), str(killed), "--partial"])
    assert list(_rows(capsys.readouterr().out)) == ["pld", "graft (partial)"]
    with pytest.raises(SystemExit) as done:
        compare([str(tmp_path / "before"), str(tmp_path / "after")])
    out, err = capsys.readouterr()
    assert done.value.code == 0 and "| pld |" in out and "graft" not in out and f"{killed}: partial" in err
    with pytest.raises(SystemExit):
        compare([str(tmp_path / "before"), str(tmp_path / "after"), "--partial"])
    assert "| graft (partial) | 1.5000 | 1.5000 | 1/1 | True |" in capsys.readouterr().out


def _comparison(path, *overrides):
    from conftest import compose

    from graft.config.experiment import validate
    from graft.run.runner import run

    resolved = compose(["model=tiny_llama", "dataset=builtin_quick", "methods=[pld,graft]", "run.max_new_tokens=8",
                        "logger=none", "run.warmup=false", "run.progress=false", *overrides])  # fmt: skip
    resolved["run"]["out_dir"] = str(path)
    run(validate(resolved), resolved)
    return path


def test_compare_reads_comparison_runs_and_matches_turns_by_prompt_id(tmp_path, capsys):
    """The default run kind (every method and the baseline in one folder) raised KeyError: 'method'; turns were
    matched by position, so two prompt sets read as changed outputs."""
    import pytest

    from graft.report.compare import main as compare

    before = _comparison(tmp_path / "before", "run.num_prompts=3")
    after = _comparison(tmp_path / "after", "run.num_prompts=3")
    with pytest.raises(SystemExit) as done:
        compare([str(before), str(after)])
    out = capsys.readouterr().out
    assert done.value.code == 0 and [line.split(" | ")[0] for line in out.splitlines()[2:]] == [
        "| ar",
        "| pld",
        "| graft",
    ]
    turns = sum(json.loads(line)["turns"] for line in (before / "samples.jsonl").read_text().splitlines())
    assert all(f"| {turns}/{turns} | True |" in line and line.endswith("| - | - |") for line in out.splitlines()[2:])
    other = _comparison(tmp_path / "other", "dataset.categories=[chat]")
    with pytest.raises(SystemExit) as done:
        compare([str(before), str(other)])
    out = capsys.readouterr().out
    graft = next(line for line in out.splitlines() if line.startswith("| graft |"))
    ids = lambda run: {json.loads(line)["id"] for line in (run / "samples.jsonl").read_text().splitlines()}  # noqa: E731
    only_before, only_after = sorted(ids(before) - ids(other)), sorted(ids(other) - ids(before))
    assert only_before and ids(before) & ids(other), "the two prompt sets should overlap in part"
    shown = lambda found: ", ".join(found) or "-"  # noqa: E731
    assert done.value.code == 1 and graft.endswith(f"| {shown(only_before)} | {shown(only_after)} |")
    assert "| True | True / True |" in graft and "| 0/" not in graft  # shared prompts: same outputs, matched by id


def test_summarize_names_a_file_that_is_not_a_summary(tmp_path, capsys):
    """It read run.json as a summary and called a finished run "partial (0 of 4 prompts)"."""
    import pytest

    from graft.report.__main__ import main as report

    run = _single_run(tmp_path / "pld", "pld")
    with pytest.raises(SystemExit) as done:
        report(["summarize", str(run / "run.json")])
    assert done.value.code == 2 and "run.json: not a summary; give a run's folder or its summary.json" in (
        capsys.readouterr().err
    )


def test_a_run_folder_linked_into_a_tree_is_read_like_one_copied_there(tmp_path):
    """`tables` skipped a run folder that is a symlink (rglob does not follow links); a link back up is no loop."""
    from graft.records.reader import run_dirs

    run = _single_run(tmp_path / "store" / "pld", "pld")
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "pld").symlink_to(run, target_is_directory=True)
    (tmp_path / "tree" / "back").symlink_to(tmp_path / "tree", target_is_directory=True)
    assert run_dirs([tmp_path / "tree"]) == [tmp_path / "tree" / "pld"]


def test_one_run_exported_into_a_tree_of_exports_keeps_the_trees_layout(tmp_path):
    """`export RUN TREE --replace` wrote the run at the tree's root, which hid every run below it from the tools."""
    from graft.records.reader import run_dirs
    from graft.report.export import export

    _single_run(tmp_path / "src" / "a", "pld")
    _single_run(tmp_path / "src" / "b", "graft")
    export(tmp_path / "src", tmp_path / "tree")
    later = _single_run(tmp_path / "later" / "c", "pld")
    (written,) = export(later, tmp_path / "tree", replace=True)
    assert written == tmp_path / "tree" / "c" and not (tmp_path / "tree" / "summary.json").exists()
    assert [p.name for p in run_dirs([tmp_path / "tree"])] == ["a", "b", "c"]
    (alone,) = export(later, tmp_path / "empty")  # into an empty folder a run is still the folder itself
    assert alone == tmp_path / "empty"
