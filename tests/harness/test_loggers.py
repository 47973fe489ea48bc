"""Weights & Biases as its users expect: online when logged in (else offline, WANDB_MODE or logger.mode deciding
where set), one W&B run per run directory (a rerun continues it), run names carrying every swept key, the
run's records as one artifact, and the per-category intervals as a table. Offline runs are read back from
the files W&B writes (the `.wandb` record log, and `files/`); nothing needs the network."""

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, compose

pytest.importorskip("wandb")

from graft.config.schema import LoggerConfig  # noqa: E402
from graft.run.tracking import INTERVAL_COLUMNS, NullLogger, make_logger  # noqa: E402
from graft.run.wandb_mode import choose_mode  # noqa: E402
from graft.run.wandb_naming import artifact_name, run_name  # noqa: E402


def wandb_records(run_dir: Path) -> list:
    """The records of an offline run's `run-<id>.wandb` (a LevelDB-style log: a 7-byte header, then 32 KiB
    blocks of chunks, each with a 7-byte header: crc32, length, type FULL=1 FIRST=2 MIDDLE=3 LAST=4)."""
    from wandb.proto import wandb_internal_pb2

    data = next(run_dir.glob("run-*.wandb")).read_bytes()
    assert data[:4] == b":W&B"
    records, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def offline_run(wandb_parent: Path) -> dict:
    """One offline run under `wandb_parent`/wandb: its id, name, artifacts {name: (type, [paths])}, summary keys
    and the folder of its files. W&B's service writes the log after finish() returns: read it once it holds
    the run's exit record."""
    runs = sorted((wandb_parent / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs
    deadline = time.monotonic() + 30
    while True:
        records = wandb_records(runs[0])
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    found = {"dir": runs[0], "files": runs[0] / "files", "artifacts": {}, "summary": set()}
    found.update(config={}, metrics={}, history=[])
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "run":
            found["id"], found["name"] = record.run.run_id, record.run.display_name
            found["group"], found["tags"] = record.run.run_group, list(record.run.tags)
            found["config"] = {item.key: json.loads(item.value_json) for item in record.run.config.update}
        elif kind == "metric":
            found["metrics"][record.metric.name or record.metric.glob_name] = record.metric.step_metric
        elif kind == "history":
            row = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
            found["history"].append({k: json.loads(v) for k, v in row.items() if not k.startswith("_")})
        elif kind == "artifact":
            contents = sorted(entry.path for entry in record.artifact.manifest.contents)
            found["artifacts"][record.artifact.name] = (record.artifact.type, contents)
        elif kind == "summary":
            found["summary"] |= {update.key or "/".join(update.nested_key) for update in record.summary.update}
    return found


def table(files: Path, key: str) -> dict:
    return json.loads(next(files.glob(f"media/table/{key}_*.table.json")).read_text())


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """W&B offline, its settings, caches and staged artifact files in tmp_path."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    for variable, folder in (("WANDB_DATA_DIR", "data"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config")):
        monkeypatch.setenv(variable, str(tmp_path / "wandb_home" / folder))
    return tmp_path


# --- the mode ------------------------------------------------------------------------------------------------


def test_the_mode_is_online_when_logged_in_offline_otherwise_and_explicit_settings_win(tmp_path):
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    base = {"HOME": str(home), "WANDB_CONFIG_DIR": str(tmp_path / "config")}

    def mode(cfg_mode="auto", **env):
        return choose_mode(cfg_mode, env={**base, **env}, cwd=elsewhere)

    assert mode()[0] == "offline" and "not logged in" in mode()[1]
    (home / ".netrc").write_text("machine example.org\n  login user\n  password other\n")
    assert mode()[0] == "offline"  # another host's key is no W&B login
    (home / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password 0123456789abcdef\n")  # `wandb login`
    assert mode() == ("online", f"logged in: an API key for api.wandb.ai in {home / '.netrc'}")
    assert mode(WANDB_BASE_URL="https://wandb.example.org")[0] == "offline"  # a self-hosted server: its own key
    assert mode(WANDB_MODE="offline") == ("offline", "WANDB_MODE=offline")
    assert mode("offline") == ("offline", "logger.mode=offline")
    assert mode("online", WANDB_MODE="offline")[0] == "offline"  # the environment wins over the config
    assert mode("disabled", WANDB_MODE="online") == ("disabled", "logger.mode=disabled")  # off always wins
    assert mode(WANDB_MODE="disabled") == ("disabled", "WANDB_MODE=disabled")
    assert mode(WANDB_DISABLED="true")[0] == "disabled"

    (home / ".netrc").unlink()
    assert mode(WANDB_API_KEY="0123456789abcdef") == ("online", "logged in: WANDB_API_KEY is set")
    assert mode(WANDB_MODE="online")[0] == "online"
    assert mode("online")[0] == "online"
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai login user password 0123456789abcdef\n")
    assert mode(NETRC=str(netrc))[0] == "online"
    settings = tmp_path / "config" / "settings"  # W&B's own settings file: `wandb offline`, or a key there
    settings.parent.mkdir()
    settings.write_text("[default]\napi_key = 0123456789abcdef\n")
    assert mode() == ("online", f"logged in: an API key in {settings}")
    settings.write_text("[default]\nmode = offline\n")
    assert mode(NETRC=str(netrc))[0] == "offline"
    assert mode("online", NETRC=str(netrc))[0] == "online"


def test_the_wandb_logger_defaults_to_auto_and_says_which_mode(offline, monkeypatch, capsys):
    assert compose(["logger=wandb"])["logger"]["mode"] == "auto" and LoggerConfig().mode == "auto"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert isinstance(make_logger(LoggerConfig(name="wandb"), {}, str(offline)), NullLogger)
    assert capsys.readouterr().out.strip() == "W&B: disabled (WANDB_MODE=disabled)"
    assert isinstance(make_logger(LoggerConfig(name="none"), {}, str(offline)), NullLogger)
    assert capsys.readouterr().out == ""


# --- names --------------------------------------------------------------------------------------------------


def test_run_names_carry_every_swept_key_and_artifact_names_are_valid():
    resolved = {"model": {"name": "tiny_llama"}, "dataset": {"name": "builtin"}}
    sweep = ["model=tiny_llama", "methods=null", "++method.total_tokens=30", "logger=wandb", "run.num_prompts=2"]
    sweep += ["run.out_dir=/tmp/x", "hydra.sweep.dir=/tmp", "experiment=paper"]
    names = {run_name(resolved, "compare", [*sweep, f"run.temperature={t}"]) for t in (0.0, 0.7)}
    assert names == {f"tiny_llama/compare/builtin/temperature={t},total_tokens=30" for t in (0.0, 0.7)}
    assert run_name(resolved, "ar") == "tiny_llama/ar/builtin"
    assert run_name(resolved, "ar", ["run.seed=1", "method.seed=2"]) == "tiny_llama/ar/builtin/method.seed=2,run.seed=1"
    name = artifact_name("tiny_llama/compare/builtin/methods=[pld,graft],temperature=0.7")
    assert name == "tiny_llama-compare-builtin-methods-pld-graft-temperature-0.7"
    long = [artifact_name("m/compare/d/" + ",".join(f"key{i}={i}" for i in range(40)) + suffix) for suffix in "ab"]
    assert long[0] != long[1] and all(
        len(n) <= 128 and set(n) <= set("abcdefghijklmnopqrstuvwxyz0123456789-_.") for n in long
    )


# --- logged offline, read back --------------------------------------------------------------------------------


def record(prompt: str, category: str, tokens_per_s: float) -> dict:
    totals = {"tokens_per_s": tokens_per_s, "decode_s": 1.0, "step_tokens": 8, "steps": 4}
    base = {"tokens_per_s": 10.0, "decode_s": 2.0, "step_tokens": 8, "steps": 8}
    return {
        "id": prompt,
        "category": category,
        "index": int(prompt[-1]),
        "turns": 1,
        "status": "ok",
        "method": {"totals": totals},
        "baseline": {"totals": base},
        "speedup_wall": tokens_per_s / 10.0,
        "lossless": {"equal": True},
    }


def write_run_dir(out: Path, records: list[dict], summary: dict) -> None:
    (out / "summaries").mkdir(parents=True)
    (out / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (out / "summary.json").write_text(json.dumps(summary))
    (out / "run.json").write_text(json.dumps({"config_hash": "x"}))
    (out / "summaries" / "pld.json").write_text("{}")
    (out / "rows.csv").write_text("method,tau\npld,2.0\n")


def test_a_run_logs_its_records_as_an_artifact_and_a_rerun_continues_the_same_run(offline):
    out = offline / "run"
    resolved = {"model": {"name": "tiny_llama"}, "dataset": {"name": "builtin"}, "run": {"temperature": 0.7}}
    records = [record("p0", "chat", 20.0), record("p1", "chat", 15.0), record("p2", "code", 30.0)]
    summary = {"kind": "run", "method": "pld", "tau": 2.0, "speedup_wall": 2.2}  # no intervals: computed
    write_run_dir(out, records, summary)
    overrides = ["model=tiny_llama", "method=pld", "run.temperature=0.7"]

    logger = make_logger(LoggerConfig(name="wandb"), resolved, str(out), job_type="pld", overrides=overrides)
    logger.finish(summary, records)
    first = offline_run(out)
    assert first["name"] == "tiny_llama/pld/builtin/temperature=0.7"
    name = "tiny_llama-pld-builtin-temperature-0.7"
    files = ["rows.csv", "run.json", "samples.jsonl", "summaries/pld.json", "summary.json"]
    assert first["artifacts"][name] == ("run-records", files)
    intervals = table(first["files"], "tables/intervals")
    assert intervals["columns"] == INTERVAL_COLUMNS == ["method", "category", "metric", "value", "low", "high", "n"]
    rows = {(m, c, metric): (value, n) for m, c, metric, value, low, high, n in intervals["data"]}
    assert set(rows) == {
        ("pld", c, m) for c in ("all", "chat", "code") for m in ("speedup_wall", "speedup_decode", "tau")
    }
    assert rows[("pld", "all", "tau")] == (2.0, 3) and rows[("pld", "code", "speedup_wall")] == (3.0, 1)
    assert {"tau", "pld/speedup_wall_low", "pld/speedup_wall_high"} <= first["summary"]
    assert len(table(first["files"], "tables/samples")["data"]) == 3

    # the same folder again (W&B's files elsewhere this time): the same W&B run, and summary.json's intervals
    given = {"pld": {"all": {"tau": {"value": 2.0, "low": 1.5, "high": 2.5, "n": 3}}, "categories": {}}}
    again = make_logger(LoggerConfig(name="wandb", dir=str(offline / "again")), resolved, str(out), "pld")
    from graft.analysis.stats import (
        INTERVAL_METHOD,
    )  # (recorded the way graft/analysis/stats.py computes them: else recomputed)

    again.finish({**summary, "intervals": given, "interval_method": INTERVAL_METHOD}, records)
    second = offline_run(offline / "again")
    assert second["id"] == first["id"] and second["name"] == "tiny_llama/pld/builtin"
    assert table(second["files"], "tables/intervals")["data"] == [["pld", "all", "tau", 2.0, 1.5, 2.5, 3]]

    other = offline / "other"  # another folder is another W&B run
    write_run_dir(other, records, summary)
    make_logger(LoggerConfig(name="wandb"), resolved, str(other), "pld").finish(summary, records)
    assert offline_run(other)["id"] != first["id"]


@pytest.mark.slow
def test_a_sweep_job_logs_a_run_named_by_its_keys_with_its_tables_figure_and_records(offline):
    """run.py -m, through Hydra: the job's name carries its overrides (a second temperature would be a second
    name: test_run_names_carry_every_swept_key); one job keeps the test short."""
    sweep = offline / "sweep"
    args = [
        "-m",
        "model=tiny_llama",
        "methods=[pld]",
        "run.temperature=0.7",
        "run.num_prompts=2",
        "run.max_new_tokens=4",
        "hardware=cpu",
        "logger=wandb",
        "run.progress=false",
        f"hydra.sweep.dir={sweep}",
    ]
    proc = subprocess.run(
        [sys.executable, "run.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=600, env=dict(os.environ)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "W&B: offline (WANDB_MODE=offline)" in proc.stdout and "wandb sync" in proc.stdout
    (job,) = [p for p in sweep.iterdir() if p.is_dir()]
    run = offline_run(job)
    assert run["name"] == "tiny_llama/compare/builtin_quick/hardware=cpu,max_new_tokens=4,methods=[pld],temperature=0.7"
    artifact = "tiny_llama-compare-builtin_quick-hardware-cpu-max_new_tokens-4-methods-pld-temperature-0.7"
    files = ["pareto.png", "run.json", "samples.jsonl", "summaries/pld.json", "summary.json"]
    assert run["artifacts"][artifact] == ("run-records", files)
    assert {"pld/tau", "ar/tau", "pld/speedup_wall", "pld/lossless", "pld/tau_low"} <= run["summary"]
    intervals = table(run["files"], "tables/intervals")
    assert intervals["columns"] == INTERVAL_COLUMNS
    assert {(row[0], row[1]) for row in intervals["data"]} >= {("pld", "all"), ("ar", "all")}
    samples = table(run["files"], "tables/samples")
    assert samples["columns"][:3] == ["id", "category", "method"] and len(samples["data"]) == 2
    assert list(run["files"].rglob("pareto_*.png"))

    # the comparison's whole config (each method's settings, not the unused default `method: ar`), its provenance,
    # tags saying what ran where, one group per sweep, and per-prompt keys against prompt_index
    config = run["config"]
    assert "method" not in config and list(config["methods"]) == ["pld"] and config["methods"]["pld"]["name"] == "pld"
    assert "max_ngram" in config["methods"]["pld"]  # every key, defaults resolved
    recorded = json.loads((job / "run.json").read_text())
    assert config["provenance"] == json.loads(json.dumps(recorded["provenance"]))
    assert {"model:tiny_llama", "dataset:builtin_quick"} <= set(run["tags"])
    assert any(tag.startswith("hardware:") for tag in run["tags"])
    assert run["group"] == str(sweep)
    assert run["metrics"]["sample/*"] == run["metrics"]["running/*"] == "prompt_index"
    per_prompt = [row for row in run["history"] if "sample/pld/tau" in row]
    assert sorted(row["prompt_index"] for row in per_prompt) == [0, 1]
    assert all("running/pld/speedup_wall" in row for row in per_prompt)


def test_a_failing_job_still_finishes_its_wandb_run(offline, monkeypatch, tiny):
    import wandb

    from graft.config.experiment import validate
    from graft.run import prompt_records, runner

    resolved = compose(["experiment=smoke", "logger=wandb", f"run.out_dir={offline}", "run.warmup=false"])
    resolved["run"]["out_dir"] = str(offline)

    def broken(*args, **kwargs):
        raise RuntimeError("a job that fails")

    monkeypatch.setattr(prompt_records, "measure_prompt", broken)
    monkeypatch.setattr(runner, "load_model", lambda *args, **kwargs: tiny("tiny_llama"))  # the suite's copy
    with pytest.raises(RuntimeError, match="a job that fails"):
        runner.run(validate(resolved), resolved)
    assert wandb.run is None  # finished, not left open
    assert list((offline / "wandb").glob("offline-run-*"))


def test_per_prompt_keys_step_on_prompt_index_so_a_resumed_run_keeps_them(offline, monkeypatch):
    """A resumed W&B run's step has moved past the last prompt (the tables and figures logged at the end advance
    it), and W&B drops a log at an explicit step behind its counter. Per-prompt keys go against `prompt_index`
    instead: nothing is dropped, and the tables have namespaced keys of their own."""
    import wandb

    class ResumedRun:  # what W&B's run does with steps: an explicit step behind its counter is dropped
        def __init__(self, step):
            self.step, self.logged, self.metrics, self.summary, self.dir = step, [], {}, {}, str(offline)

        def define_metric(self, name, step_metric=None, hidden=None):
            self.metrics[name] = step_metric

        def log(self, data, step=None):
            if step is not None and step < self.step:
                return
            self.logged.append(data)
            self.step = (self.step if step is None else step) + 1

        def finish(self, exit_code=0):
            pass

    run = ResumedRun(step=40)  # prompts 0-9 and the final tables of an earlier, interrupted job
    monkeypatch.setattr(wandb, "init", lambda **kwargs: run)
    logger = make_logger(LoggerConfig(name="wandb", mode="offline"), {}, str(offline), job_type="compare")
    rec = {**record("p3", "chat", 20.0), "index": 10}
    for name in ("pld", "graft"):
        logger.log_sample(rec, {"tau": 2.0, "speedup_wall": 2.0}, prefix=f"{name}/")
    assert run.metrics == {"prompt_index": None, "sample/*": "prompt_index", "running/*": "prompt_index"}
    assert [row["prompt_index"] for row in run.logged] == [10, 10]
    assert {"sample/pld/tau", "sample/graft/tau", "running/graft/speedup_wall"} <= set().union(*run.logged)
    logger.finish({"kind": "run", "method": "pld", "tau": 2.0, "speedup_wall": 2.0}, [rec])
    assert {"tables/intervals", "tables/samples"} <= set().union(*run.logged)
