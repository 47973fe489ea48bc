"""Complete means verified: a run directory whose samples.jsonl was torn or deleted after its summary said
"complete" is resumed, and every resume ends with the records an uninterrupted run wrote."""

import json
import shutil

import pytest

from conftest import compose
from graft.config import validate
from graft.records import RunDir, completed_summary

OVERRIDES = ["model=tiny_llama", "method=pld", "run.num_prompts=3", "run.max_new_tokens=8", "logger=none"]
QUIET = ["run.warmup=false", "run.progress=false"]


def run_in(path):
    from graft.runner import run

    resolved = compose([*OVERRIDES, *QUIET])
    resolved["run"]["out_dir"] = str(path)
    run(validate(resolved), resolved)
    return resolved


def outcome(path) -> list[tuple]:
    """What a resume must reproduce: each prompt's id and the tokens every side generated, in id order."""
    rows = [json.loads(line) for line in (path / "samples.jsonl").read_text().splitlines()]
    tokens = lambda side: [t["tokens_sha256"] for t in side["turns"]] if side else None  # noqa: E731
    return sorted((r["id"], tokens(r["method"]), tokens(r["baseline"])) for r in rows)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    path = tmp_path_factory.mktemp("whole")
    resolved = run_in(path)
    return path, resolved


def test_a_whole_run_is_complete_and_its_summary_names_its_records(uninterrupted):
    path, resolved = uninterrupted
    plan = {"num_prompts": 3, "dataset_num_prompts": resolved["dataset"].get("num_prompts")}
    summary = completed_summary(path, resolved, plan)
    assert summary is not None and len(summary["complete"]["ids"]) == 3 and summary["complete"]["records_sha1"]
    # the 95% intervals over the same three prompts, under the method's name, around the summary's own figures
    overall = summary["intervals"]["pld"]["all"]
    for metric in ("speedup_wall", "speedup_decode", "tau"):
        entry = overall[metric]
        assert entry["n"] == 3 and abs(entry["value"] - summary[metric]) < 1e-9, metric
        assert entry["low"] <= entry["value"] <= entry["high"], metric


def test_every_tear_and_a_deletion_resume_to_the_same_records(uninterrupted, tmp_path, caplog):
    path, resolved = uninterrupted
    whole = (path / "samples.jsonl").read_bytes()
    ends = [i + 1 for i, b in enumerate(whole) if b == ord("\n")]
    # inside each record, at each line's end, one byte past it, and the file deleted (None)
    offsets = sorted({1, ends[0] // 2, ends[0] - 1, ends[0], ends[0] + 1, (ends[0] + ends[1]) // 2, ends[1] - 1})
    offsets += [ends[1], ends[1] + 7, len(whole) - 2, None]  # (without only its last newline it is intact)
    expected = outcome(path)
    for offset in offsets:
        copy = tmp_path / f"cut_{offset}"
        shutil.copytree(path, copy)
        resolved_copy = json.loads(json.dumps(resolved))
        resolved_copy["run"]["out_dir"] = str(copy)
        if offset is None:
            (copy / "samples.jsonl").unlink()
        else:
            (copy / "samples.jsonl").write_bytes(whole[:offset])
        plan = {"num_prompts": 3, "dataset_num_prompts": resolved["dataset"].get("num_prompts")}
        caplog.clear()
        assert completed_summary(copy, resolved_copy, plan) is None, offset  # never "already complete"
        assert "resuming" in caplog.text, offset  # a warning (graft/records.py's logger)
        run_in(copy)
        assert outcome(copy) == expected, offset
        assert completed_summary(copy, resolved_copy, plan) is not None, offset
        assert not list(copy.glob("*.tmp")), offset


def test_a_prompt_recorded_twice_keeps_one_record_and_the_rewrite_is_whole(tmp_path):
    rundir = RunDir(tmp_path, {"x": 1})
    for record in ({"id": "a", "v": 1}, {"id": "b", "v": 2}, {"id": "a", "v": 3}):
        rundir.append(record)
    with open(rundir.samples_path, "a") as f:
        f.write('{"id": "c", "v"')  # torn by a kill
    assert rundir.finished() == [{"id": "b", "v": 2}, {"id": "a", "v": 3}]
    assert [json.loads(line)["id"] for line in rundir.samples_path.read_text().splitlines()] == ["b", "a"]


def test_the_summary_records_the_block_size_a_checkpoint_chose(tmp_path):
    """method.block_size=null means the checkpoint's: the record names the size the run used."""
    from graft.runner import run

    overrides = ["model=tiny_qwen3", "method=dflash", "run.num_prompts=1", "run.max_new_tokens=4", "logger=none"]
    resolved = compose([*overrides, *QUIET])
    resolved["run"]["out_dir"] = str(tmp_path)
    assert resolved["method"].get("block_size") is None
    summary = run(validate(resolved), resolved)
    assert summary["method_config"]["block_size"] == 8  # a random drafter's default size
