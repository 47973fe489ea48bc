"""notebooks/reproduce_figures.ipynb runs on the committed records and writes every table and figure."""

import os

import pytest

from conftest import ROOT

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")


def test_the_notebook_regenerates_the_committed_tables_and_figures(tmp_path, monkeypatch):
    if not (ROOT / "results" / "cpu_embedded" / "runs").is_dir():
        pytest.skip("no committed cpu_embedded records")
    monkeypatch.setenv("GRAFT_RESULTS_OUT", str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(ROOT / "notebooks" / "reproduce_figures.ipynb", as_version=4)
    nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}}
    ).execute()
    committed = (ROOT / "results" / "cpu_embedded" / "tables.md").read_text()
    assert (tmp_path / "tables.md").read_text() == committed  # the committed table is what the records give
    from graft.plots import FIGURES

    for name in FIGURES:
        assert (tmp_path / "figures" / f"{name}.png").stat().st_size > 1000
    assert os.environ["GRAFT_RESULTS_OUT"] == str(tmp_path)
