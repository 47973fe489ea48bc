"""Complete means verified: a run directory whose samples.jsonl was torn or deleted after its summary said
"complete" is resumed, and every resume ends with the records an uninterrupted run wrote."""

import json
import os
import shutil
import socket

import pytest
from conftest import compose

from graft.analysis.stats import INTERVAL_METHOD
from graft.config.experiment import validate
from graft.records.writer import LOCK as LOCK_NAME
from graft.records.writer import RunDir, completed_summary

OVERRIDES = ["model=tiny_llama", "method=pld", "run.num_prompts=3", "run.max_new_tokens=8", "logger=none"]
QUIET = ["run.warmup=false", "run.progress=false"]


def run_in(path):
    from graft.run.runner import run

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
    # the intervals' entries over the same three prompts, under the method's name, at the summary's own figures;
    # three prompts are too few for an interval (graft/analysis/stats.py: MIN_N_FOR_INTERVAL)
    overall = summary["intervals"]["pld"]["all"]
    assert summary["interval_method"] == INTERVAL_METHOD and "repeats" not in summary  # run.repeats=1: none
    for metric in ("speedup_wall", "speedup_decode", "tau"):
        entry = overall[metric]
        assert entry["n"] == 3 and abs(entry["value"] - summary[metric]) < 1e-9, metric
        assert entry["low"] is None and entry["high"] is None, metric


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
        assert "resuming" in caplog.text, offset  # a warning (graft/records/writer.py's logger)
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
    from graft.run.runner import run

    overrides = ["model=tiny_qwen3", "method=dflash", "run.num_prompts=1", "run.max_new_tokens=4", "logger=none"]
    resolved = compose([*overrides, *QUIET])
    resolved["run"]["out_dir"] = str(tmp_path)
    assert resolved["method"].get("block_size") is None
    summary = run(validate(resolved), resolved)
    assert summary["method_config"]["block_size"] == 8  # a random drafter's default size


def test_repeats_measure_every_prompt_again_and_resume(tmp_path):
    """run.repeats=2: every prompt of a comparison measured twice, the second pass after the first, each
    record its own (`<id>#2`, naming its prompt); greedy tokens equal in both; summary.json's `repeats` gives
    each headline ratio per repeat, the intervals take each prompt once; a run cut short resumes to the same
    records, and one run again with run.repeats=1 reports the first pass alone."""
    from graft.run.runner import run

    overrides = ["model=tiny_llama", "methods=[pld]", "run.num_prompts=2", "run.max_new_tokens=4", "logger=none"]
    resolved = compose([*overrides, *QUIET, "run.repeats=2"])
    resolved["run"]["out_dir"] = str(tmp_path / "twice")
    summary = run(validate(resolved), resolved)
    records = [json.loads(line) for line in (tmp_path / "twice" / "samples.jsonl").read_text().splitlines()]
    first, second = records[:2], records[2:]
    assert [r["id"] + "#2" for r in first] == [r["id"] for r in second] == summary["complete"]["ids"][2:]
    assert [(r["prompt_id"], r["repeat"]) for r in second] == [(r["id"], 2) for r in first]
    assert all("repeat" not in r and "prompt_id" not in r for r in first)  # the records run.repeats=1 writes

    def hashes(record):
        sides = (record["baseline"], record["methods"]["pld"]["side"])
        return [turn["tokens_sha256"] for side in sides for turn in side["turns"]]

    assert [hashes(r) for r in first] == [hashes(r) for r in second]
    assert summary["complete"]["plan"]["repeats"] == 2 and summary["n_prompts"] == 2
    spread = summary["repeats"]["methods"]["pld"]
    assert summary["repeats"]["R"] == 2 and summary["methods"]["pld"]["repeats"] == {"R": 2, **spread}
    for metric in ("speedup_wall", "speedup_decode", "tau"):
        values = spread[metric]["values"]
        assert len(values) == 2 and spread[metric]["min"] <= spread[metric]["mean"] <= spread[metric]["max"]
        assert summary["intervals"]["pld"]["all"][metric]["n"] == 2  # a prompt's repeats are one observation
    assert spread["tau"]["values"][0] == spread["tau"]["values"][1] == summary["methods"]["pld"]["tau"]
    # cut after the first record of the second pass: the rerun measures the last one alone
    whole = (tmp_path / "twice" / "samples.jsonl").read_text()
    shutil.copytree(tmp_path / "twice", tmp_path / "cut")
    (tmp_path / "cut" / "samples.jsonl").write_text("".join(whole.splitlines(keepends=True)[:3]))
    (tmp_path / "cut" / "summary.json").unlink()
    resolved["run"]["out_dir"] = str(tmp_path / "cut")
    resumed = run(validate(resolved), resolved)
    lines = (tmp_path / "cut" / "samples.jsonl").read_text().splitlines()
    assert lines[:3] == whole.splitlines()[:3] and json.loads(lines[3])["id"] == second[1]["id"]
    assert resumed["complete"]["ids"] == summary["complete"]["ids"] and resumed["repeats"]["R"] == 2
    # the same folder with run.repeats=1: its first pass, no repeats block (the second pass stays on disk)
    once = compose([*overrides, *QUIET, "run.repeats=1"])
    once["run"]["out_dir"] = str(tmp_path / "cut")
    single = run(validate(once), once)
    assert single["complete"]["ids"] == summary["complete"]["ids"][:2] and "repeats" not in single


def test_run_repeats_must_be_a_whole_number_of_one_or_more():
    from graft.schema import ConfigError

    for value, words in (("0", "an integer >= 1"), ("1.5", "must be an integer")):
        with pytest.raises(ConfigError) as err:
            validate(compose([*OVERRIDES, f"run.repeats={value}"]))
        assert str(err.value).startswith(f"run.repeats={value}") and words in str(err.value)
        assert "\n" not in str(err.value)


HOLD = """
import sys, time
from graft.records.writer import RunDir
RunDir(sys.argv[1], {"x": 1})
print("locked", flush=True)
time.sleep(60)
"""


def test_one_writer_per_run_folder_and_a_dead_writers_lock_is_taken_over(tmp_path, caplog):
    """Two real processes: while one holds the folder, a second open is refused naming it (pid, host, since);
    once it is killed (its pid dead on this host) the lock is taken over with a warning, and closing removes it."""
    import socket
    import subprocess
    import sys

    from graft.records.writer import LOCK, RunDirConflict

    folder = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirConflict) as refused:
            RunDir(folder, {"x": 1})
        message = str(refused.value)
        assert f"is being written by another run (pid {holder.pid} on {socket.gethostname()}, since " in message
        assert "\n" not in message and str(folder / LOCK) in message
    finally:
        holder.kill()
        holder.wait()
    assert json.loads((folder / LOCK).read_text())["pid"] == holder.pid  # a killed run cannot remove its lock
    caplog.clear()
    with RunDir(folder, {"x": 1}):
        assert json.loads((folder / LOCK).read_text())["pid"] != holder.pid
    assert (
        "taking over the lock of a run that is gone" in caplog.text
        and f"pid {holder.pid} is not running" in caplog.text
    )
    assert not (folder / LOCK).exists()


def test_a_run_ended_by_sigterm_lets_go_of_its_folder(tmp_path):
    """SLURM's time limit and scancel send SIGTERM, whose default would end the run without removing its lock."""
    import signal
    import subprocess
    import sys

    from graft.records.writer import LOCK

    folder = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked" and (folder / LOCK).is_file()
    holder.send_signal(signal.SIGTERM)
    assert holder.wait(timeout=30) == 128 + signal.SIGTERM
    assert not (folder / LOCK).exists()
    RunDir(folder, {"x": 1}).close()  # the next run opens it at once


@pytest.mark.parametrize("job,taken", [("4242", True), ("4243", False)])
def test_a_requeued_slurm_job_takes_over_its_own_lock_from_another_node(tmp_path, monkeypatch, job, taken):
    """A lock of another host is trusted for 10 minutes, unless it names this process's own SLURM job: SLURM never
    runs one job twice, so that holder is the same job before its requeue."""
    from graft.records.writer import LOCK, RunDirConflict

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / LOCK).write_text(json.dumps({"pid": 1, "host": "node-17", "started": "now", "slurm_job": "4242"}))
    monkeypatch.setenv("SLURM_JOB_ID", job)
    if taken:
        with RunDir(folder, {"x": 1}):
            assert json.loads((folder / LOCK).read_text())["slurm_job"] == "4242"
    else:
        with pytest.raises(RunDirConflict, match="pid 1 on node-17"):
            RunDir(folder, {"x": 1})


def test_a_lock_that_is_not_a_file_is_refused_in_one_line_and_one_naming_pid_0_is_taken_over(tmp_path):
    """A FIFO named .lock hung every run and reader; os.kill(0, 0) signals a process group, so pid 0 read as live."""
    from graft.records.folder import lock_holder
    from graft.records.writer import LOCK, RunDirConflict

    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / LOCK)
    with pytest.raises(RunDirConflict) as err:
        RunDir(fifo, {"x": 1})
    assert "is not a regular file" in str(err.value) and "\n" not in str(err.value)
    assert lock_holder(fifo) is None  # readers do not wait on it either
    zero = tmp_path / "zero"
    zero.mkdir()
    (zero / LOCK).write_text(json.dumps({"pid": 0, "host": socket.gethostname(), "started": "then"}))
    with RunDir(zero, {"x": 1}):
        assert json.loads((zero / LOCK).read_text())["pid"] == os.getpid()


def test_a_run_lets_go_of_its_folder_when_it_fails(tmp_path, monkeypatch):
    """The lock is taken before the model loads and let go of whatever ends the run, so its rerun is not refused."""
    import graft.run.runner
    from graft.records.writer import LOCK

    def fail(*args, **kwargs):
        assert (tmp_path / LOCK).is_file()  # held while the model loads
        raise RuntimeError("out of memory")

    monkeypatch.setattr(graft.run.runner, "load_model", fail)
    with pytest.raises(RuntimeError, match="out of memory"):
        run_in(tmp_path)
    assert not (tmp_path / LOCK).exists()
    RunDir(tmp_path, {"x": 1}).close()


def test_an_exported_run_still_verifies_and_a_killed_one_is_partial(uninterrupted, tmp_path):
    """export strips the texts and recomputes `complete`'s sha1 over what it writes: the export verifies as the
    run did (the run's own sha1 kept); a run without `complete` (killed between prompts) is partial."""
    from graft.records.reader import run_problem
    from graft.report.export import export

    path, _ = uninterrupted
    assert run_problem(path) is None
    (written,) = export(path, tmp_path / "export")
    assert not (written / LOCK_NAME).exists() and sorted(p.name for p in written.iterdir()) == [
        "run.json",
        "samples.jsonl.gz",
        "summary.json",
    ]
    source, exported = (json.loads((p / "summary.json").read_text())["complete"] for p in (path, written))
    assert (
        exported["records_sha1"] != source["records_sha1"] and exported["source_records_sha1"] == source["records_sha1"]
    )
    assert run_problem(written) is None
    killed = tmp_path / "killed"
    shutil.copytree(path, killed)
    summary = json.loads((killed / "summary.json").read_text())
    del summary["complete"]
    (killed / "summary.json").write_text(json.dumps(summary))
    assert run_problem(killed) == "partial (3 of 3 prompts)"
    lines = (killed / "samples.jsonl").read_text().splitlines()
    (killed / "samples.jsonl").write_text("\n".join(lines[:2]) + "\n")
    summary["complete"] = source
    (killed / "summary.json").write_text(json.dumps(summary))
    assert run_problem(killed).startswith("not complete: 1 of its 3 records are missing")
