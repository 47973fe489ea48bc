"""notebooks/reproduce_figures.ipynb runs on the committed records and writes every table and figure;
notebooks/runs.ipynb reads a comparison and a single-method run alike."""

import os

import pytest
from conftest import ROOT, finish_run

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")


@pytest.mark.slow
def test_the_notebook_regenerates_the_committed_tables_and_figures(tmp_path, monkeypatch):
    if not (ROOT / "results" / "cpu_embedded" / "runs").is_dir():
        pytest.skip("no committed cpu_embedded records")
    monkeypatch.setenv("GRAFT_RESULTS_OUT", str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(ROOT / "notebooks" / "reproduce_figures.ipynb", as_version=4)
    nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}}
    ).execute()
    for name in ("tables.md", "tables.tex", "rows.csv", "categories.csv"):  # what the records give, to the byte
        assert (tmp_path / name).read_bytes() == (ROOT / "results" / "cpu_embedded" / name).read_bytes(), name
    from graft.analysis.plots import FIGURES

    for name in FIGURES:
        assert (tmp_path / "figures" / f"{name}.png").stat().st_size > 1000
    # the figures' one table of numbers, to the byte (the images themselves vary with the matplotlib build)
    beside = "figures/beside_paper.csv"
    assert (tmp_path / beside).read_bytes() == (ROOT / "results" / "cpu_embedded" / beside).read_bytes()
    assert os.environ["GRAFT_RESULTS_OUT"] == str(tmp_path)


def _single(path, speedup: float, tau: float):
    """A finished single-method run directory (`python run.py method=graft`): records with `method` and `baseline`."""
    import json

    from test_tables import _method_summary, _turn

    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps(_method_summary("mt", "graft", speedup, tau, 32)))
    (path / "run.json").write_text(json.dumps({"config_hash": "y"}))
    record = {
        "id": "p1",
        "category": "writing",
        "status": "ok",
        "baseline": {"turns": [_turn([1, 1, 1, 1], None)]},
        "method": {
            "turns": [_turn([3, 2, 4], "check@0")],
            "totals": {"steps": 3, "step_tokens": 9, "tokens_per_s": 12.5},
        },
        "lossless": {"checked": True, "equal": True, "first_divergence": None},
        "speedup_wall": speedup,
    }
    (path / "samples.jsonl").write_text(json.dumps(record) + "\n")
    finish_run(path)


def test_the_runs_notebook_reads_comparisons_and_single_method_runs(tmp_path, monkeypatch):
    from test_tables import _comparison

    _comparison(tmp_path / "runs" / "compare", "mt", {"eagle3": (1.5, 2.5), "graft": (1.8, 3.0)})
    _single(tmp_path / "runs" / "single", 1.25, 3.0)
    monkeypatch.setenv("GRAFT_RUNS", str(tmp_path / "runs"))
    notebook = nbformat.read(ROOT / "notebooks" / "runs.ipynb", as_version=4)
    nbclient.NotebookClient(
        notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}}
    ).execute()
    methods, prompts, steps = ["".join(o.get("text", "") for o in cell.outputs) for cell in notebook.cells[2:5]]
    # run model dataset method n_prompts tau speedup_wall ...
    rows = {(cells[0], cells[3]): cells[5:7] for cells in map(str.split, methods.splitlines()[1:])}
    assert rows == {
        ("compare", "ar"): ["1.000", "1.000"],
        ("compare", "eagle3"): ["2.500", "1.500"],
        ("compare", "graft"): ["3.000", "1.800"],
        ("single", "graft"): ["3.000", "1.250"],
    }
    # per prompt (run method prompt category tau tokens_per_s speedup_wall lossless): the single run's record
    # verdicts and totals; the comparison's records have no totals, tau from the turns (3 + 1 + 2 over 3 steps)
    per_prompt = {(cells[0], cells[1]): cells for cells in map(str.split, prompts.splitlines()[1:])}
    assert per_prompt[("single", "graft")] == ["single", "graft", "p1", "writing", "3.000", "12.500", "1.250", "True"]
    assert per_prompt[("compare", "graft")][4] == "2.000"
    assert {key[1] for key in per_prompt} == {"ar", "eagle3", "graft"} and ("single", "ar") in per_prompt
    assert "single ar 4 1.000" in " ".join(steps.split())  # the baseline's 4 steps of one token each
