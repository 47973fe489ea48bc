"""run.batch_size: a comparison decoded B sequences at a time writes the records a batch-1 run writes (the same
tokens), plus the slot of every turn and its group's totals; summary.json's `batch` gives throughput against
batched AR; an interrupted batched run resumes without lost or duplicated records."""

import json

import pytest
from conftest import compose

from graft.config.experiment import validate
from graft.run import runner

OVERRIDES = ["model=tiny_llama", "methods=[pld,graft]", "run.max_new_tokens=8", "logger=none", "dataset=builtin"]
QUIET = ["run.warmup=false", "run.progress=false"]


def run_in(path, *extra):
    resolved = compose([*OVERRIDES, *QUIET, *extra])
    resolved["run"]["out_dir"] = str(path)
    return runner.run(validate(resolved), resolved)


def records(path) -> list[dict]:
    return [json.loads(line) for line in (path / "samples.jsonl").read_text().splitlines()]


def tokens(record) -> dict:
    sides = {"baseline": record["baseline"], **{m: e["side"] for m, e in record["methods"].items()}}
    return {role: [turn["tokens_sha256"] for turn in side["turns"]] for role, side in sides.items()}


@pytest.fixture(scope="module")
def alone_and_batched(tmp_path_factory):
    root = tmp_path_factory.mktemp("batched")
    alone = run_in(root / "b1", "run.num_prompts=6")
    batched = run_in(root / "b3", "run.num_prompts=6", "run.batch_size=3")
    return root, alone, batched


def test_a_batched_comparison_writes_the_tokens_of_a_batch_1_run(alone_and_batched):
    """Six prompts at B = 3 are a stream of twelve (the dataset twice: at least 4 x B sequences), the second pass
    recorded as repeats; every record holds the tokens of the batch-1 run's."""
    root, _, batched = alone_and_batched
    one, three = records(root / "b1"), records(root / "b3")
    assert [r["id"] for r in three] == [r["id"] for r in one] + [f"{r['id']}#2" for r in one]
    assert [tokens(r) for r in three] == [tokens(r) for r in one] * 2
    assert batched["methods"]["pld"]["lossless"] and batched["methods"]["graft"]["lossless"]
    for record in three:
        assert record["batch"]["size"] == 3
        assert all(0 <= turn["slot"] < 3 for turn in record["baseline"]["turns"])
    assert all("batch" not in r and "slot" not in r["baseline"]["turns"][0] for r in one)


def test_summary_gives_throughput_against_batched_ar(alone_and_batched):
    _, alone, batched = alone_and_batched
    assert "batch" not in alone
    table = batched["batch"]
    assert table["batch_size"] == 3 and table["groups"] == 1  # six prompts twice: one stream of 4 x B
    assert table["stream_repeats"] == 2 and table["groups_cut"] == []
    roles = table["roles"]
    assert set(roles) == {"baseline", "pld", "graft"}
    assert roles["baseline"]["speedup_throughput"] is None
    for role, row in roles.items():
        assert row["throughput_tokens_per_s"] == pytest.approx(row["tokens"] / row["wall_s"])
        assert row["throughput_decode_tokens_per_s"] > row["throughput_tokens_per_s"]
        assert 1 <= row["sequences_per_step"] <= row["steady_sequences_per_step"] <= 3
        assert row["positions_per_node"] == 1.0  # the CPU engine's ragged rows: no padding computed
        assert 0 < row["prefill_share"] < 1
        assert row["latency_tokens_per_s_p50"] <= row["latency_tokens_per_s_p90"]
        if role != "baseline":
            want = row["throughput_tokens_per_s"] / roles["baseline"]["throughput_tokens_per_s"]
            assert row["speedup_throughput"] == pytest.approx(want)
    assert roles["baseline"]["nodes_per_step"] == roles["baseline"]["sequences_per_step"]  # AR: one node each


def test_an_interrupted_batched_run_resumes_without_lost_or_duplicated_records(
    alone_and_batched, tmp_path, monkeypatch
):
    from graft.run import batched

    root, _, _ = alone_and_batched
    real, calls = batched.measure_group, []

    def cut_after_the_first_group(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(batched, "measure_group", cut_after_the_first_group)
    with pytest.raises(KeyboardInterrupt):
        run_in(tmp_path / "cut", "run.num_prompts=6", "run.batch_size=2")  # 12 sequences in groups of 8: cut after one
    assert len(records(tmp_path / "cut")) == 8
    monkeypatch.setattr(batched, "measure_group", real)
    summary = run_in(tmp_path / "cut", "run.num_prompts=6", "run.batch_size=2")
    resumed, alone = records(tmp_path / "cut"), records(root / "b1")
    want = [r["id"] for r in alone] + [f"{r['id']}#2" for r in alone]
    assert sorted(r["id"] for r in resumed) == sorted(want)  # none lost, none twice
    assert {r["id"].split("#")[0]: tokens(r) for r in resumed} == {r["id"]: tokens(r) for r in alone}
    assert summary["batch"]["groups"] == 2
    for role, row in summary["batch"]["roles"].items():  # the totals are the records' own
        side = (lambda r: r["baseline"]) if role == "baseline" else (lambda r, m=role: r["methods"][m]["side"])
        assert row["tokens"] == sum(side(r)["totals"]["new_tokens"] for r in resumed), role


def test_the_totals_of_a_group_cut_by_a_kill_are_not_counted():
    """A group whose records are not all there (a kill between two writes, before records were written per
    group) is left out of the throughput and named; whole groups are counted once."""
    from graft.records.metrics import batch_summary

    def record(i, group):
        totals = {"baseline": {"tokens": 10, "wall_s": 1.0, "prefill_s": 0.1, "steps": 5, "nodes": 5, "sequences": 10}}
        side = {"totals": {"tokens_per_s": 10.0}}
        batch = {"group": group, "totals": totals}
        return {"id": f"p{i}", "status": "ok", "batch": batch, "baseline": side, "methods": {}}

    found = batch_summary([record(0, "p0+2"), record(1, "p0+2"), record(2, "p2+4")], 2)
    assert found["groups"] == 1 and found["groups_cut"] == ["p2+4"]
    assert found["roles"]["baseline"]["tokens"] == 10


def test_a_batch_refuses_what_it_cannot_run_before_the_model_loads(tmp_path):
    with pytest.raises(Exception, match="run.batch_size=2 decodes on one device; not with .*device_map=auto"):
        run_in(tmp_path / "c", "run.batch_size=2", "hardware.fast_path=none", "hardware.device_map=auto")
    with pytest.raises(Exception, match="run.batch_size=0 is not allowed"):
        run_in(tmp_path / "z", "run.batch_size=0")


def test_tables_and_the_figure_lay_runs_out_by_batch_size(alone_and_batched, tmp_path):
    from graft.analysis.batch import batch_rows, batch_table
    from graft.analysis.plots import batch_scaling
    from graft.report.tables import build

    root, alone, batched = alone_and_batched
    rows = batch_rows([root / "b1", root / "b3"])
    assert sorted(set(rows["batch_size"])) == [1, 3]
    assert set(rows["method"]) == {"ar", "pld", "graft"}
    at3 = rows[(rows["batch_size"] == 3) & (rows["method"] == "graft")].iloc[0]
    assert at3["speedup_throughput"] == pytest.approx(batched["batch"]["roles"]["graft"]["speedup_throughput"])
    at1 = rows[(rows["batch_size"] == 1) & (rows["method"] == "ar")].iloc[0]
    ones = records(root / "b1")
    want = sum(r["baseline"]["totals"]["new_tokens"] for r in ones) / sum(
        r["baseline"]["totals"]["wall_s"] for r in ones
    )
    assert at1["throughput_tokens_per_s"] == pytest.approx(want)  # batch 1: summed over the records
    table = batch_table(rows, ["ar", "pld", "graft"])
    assert list(table.columns) == ["B=1", "B=3"] and list(table.index) == ["ar", "pld", "graft"]
    assert table.loc["ar", "B=3"].endswith("tok/s") and " / " in table.loc["graft", "B=1"]
    markdown, _, _ = build([str(root / "b1"), str(root / "b3")], "speedup_wall")
    assert "throughput over batched AR at the same batch size" in markdown
    written = batch_scaling(rows, tmp_path)
    assert [p.suffix for p in written] == [".png", ".pdf"] and all(p.stat().st_size > 0 for p in written)
