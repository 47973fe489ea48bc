"""`python -m graft.report summarize` on literal summaries: a comparison gives a row per compared method with its
numbers (not dashes), a single-method run its one row."""

import json

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
