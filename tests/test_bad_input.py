"""The standing bad-input suite: each case is a command a user might type with a bad or unusual input, the
exit status it must end with and a fragment of the message it must print (on stderr for an error). Every
case runs end to end (`python run.py ...` or `python -m graft.report ...`) on tiny models; all of them share
one Python start-up (tests/bad_inputs.py forks a child per case). A case that starts giving a traceback, a
different exit status or a vaguer message fails here.

Add a case: one `Case(...)` line, and a setup function if it needs files."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from test_tables import _comparison

ROOT = Path(__file__).resolve().parent.parent
TINY = ("model=tiny_llama", "logger=none", "hardware=cpu", "run.num_prompts=1", "run.max_new_tokens=4")
QUESTION = {"question_id": 81, "category": "writing", "turns": ["Write a haiku about the sea."]}


@dataclass(frozen=True)
class Case:
    id: str
    tool: str  # "run": python run.py ARGS; "report": python -m graft.report ARGS
    args: tuple  # "{t}" is the case folder, "{out}" a fresh run folder of this case
    code: int
    fragment: str  # in stderr, or in stdout when the case succeeds
    setup: object = None  # setup(t: Path) writes the files the case needs
    base: tuple = field(default=TINY)
    check: object = None  # check(t: Path) -> bool: what the case left behind


# --- setups ---------------------------------------------------------------------------------------------


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _finished(t: Path) -> None:
    _comparison(t / "runs" / "mt", "mt", {"eagle3": (1.5, 2.5), "graft": (1.8, 3.0)})


def _torn_summary(t: Path) -> None:
    _finished(t)
    summary = t / "runs" / "mt" / "summary.json"
    summary.write_text(summary.read_text()[:40])


def _torn_samples(t: Path) -> None:
    _finished(t)
    samples = t / "runs" / "mt" / "samples.jsonl"
    samples.write_text(samples.read_text()[:60])
    _write(t / "export" / "mt" / "summary.json", "an earlier export")


def _summary_is_a_folder(t: Path) -> None:
    (t / "runs" / "mt" / "summary.json").mkdir(parents=True)
    _write(t / "runs" / "mt" / "run.json", "{}")


def _readme(body: str):
    def setup(t: Path) -> None:
        _finished(t)
        _write(t / "README.md", body.replace("{t}", str(t)))

    return setup


def _block_drafter(change: dict):
    def setup(t: Path) -> None:
        raw = {
            "architectures": ["DFlashDraftModel"],
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "intermediate_size": 96,
            "num_hidden_layers": 1,
            "block_size": 16,
            "dflash_config": {"target_layer_ids": [0, 1], "mask_token_id": 7},
            **change,
        }
        for key in [k for k, v in change.items() if v is DROP]:
            del raw[key]
        _write(t / "block" / "config.json", json.dumps(raw))
        _write(t / "block" / "model.safetensors", "")

    return setup


DROP = object()


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]


def _ids(run: Path) -> list[str]:
    return [r["id"] for r in _records(run)]


def _statuses(run: Path) -> list[str]:
    return [r["status"] for r in _records(run)]


def _question_file(text: str):
    return lambda t: _write(t / "q.jsonl", text)


CASES = [
    # names and config values
    Case("unknown model", "run", ("model=gpt5",), 2, "smollm2_135m", base=()),
    Case("unknown method", "run", ("method=magic",), 2, "pld", base=()),
    Case("unknown dataset", "run", ("dataset=imagenet",), 2, "builtin", base=()),
    Case(
        "increasing thresholds", "run", ("method=graft", "method.thresholds=[0.1,0.2,0.3]"), 0, "is the list reversed?"
    ),
    Case(
        "decreasing draft_tokens", "run", ("method=pruned", "method.draft_tokens=[40,24,8]"), 0, "is the list reversed?"
    ),
    Case("threads above the cores", "run", ("method=ar", "hardware.num_threads=1000"), 2, "hardware.num_threads=1000"),
    Case("CUDA without a GPU", "run", ("method=ar", "hardware=gpu"), 2, "torch sees no CUDA device"),
    Case("zero prompts", "run", ("method=ar", "run.num_prompts=0"), 2, "num_prompts=0"),
    Case("zero budget", "run", ("method=graft", "method.total_tokens=0"), 2, "total_tokens=0"),
    # the output folder
    Case(
        "out_dir is a file",
        "run",
        ("method=ar", "run.out_dir={t}/taken"),
        2,
        "is a file, not a folder",
        setup=lambda t: _write(t / "taken", ""),
    ),
    Case(
        "samples.jsonl is a folder",
        "run",
        ("method=ar",),
        2,
        "is a directory; a run writes a file there",
        setup=lambda t: (t / "out" / "samples.jsonl").mkdir(parents=True),
    ),
    Case(
        "torn run.json",
        "run",
        ("method=ar",),
        2,
        "run.json is not valid JSON",
        setup=lambda t: _write(t / "out" / "run.json", '{"config_ha'),
    ),
    Case(
        "another config's folder",
        "run",
        ("method=ar",),
        2,
        "holds results of a different config",
        setup=lambda t: _write(t / "out" / "run.json", json.dumps({"config_hash": "0", "config": {}})),
    ),
    # weights, heads, block drafters and cost profiles
    Case(
        "model folder without config.json",
        "run",
        ("model=pretrained", "model.path={t}", "method=pld"),
        2,
        "has no config.json",
        base=("logger=none", "hardware=cpu"),
    ),
    Case(
        "missing model folder",
        "run",
        ("model=pretrained", "model.path={t}/no/model", "method=pld"),
        2,
        "no such directory",
        base=("logger=none", "hardware=cpu"),
    ),
    Case("missing EAGLE head", "run", ("method=eagle3", "method.head={t}/no_head"), 2, "no such directory"),
    Case(
        "EAGLE head config not JSON",
        "run",
        ("method=eagle3", "method.head={t}/head"),
        2,
        "config.json",
        setup=lambda t: (_write(t / "head" / "config.json", "{"), _write(t / "head" / "model.safetensors", "")),
    ),
    Case(
        "block size 0",
        "run",
        ("model=tiny_qwen3", "method=dflash", "method.checkpoint={t}/block"),
        2,
        "block_size=0: expected an integer >= 2",
        setup=_block_drafter({"block_size": 0}),
    ),
    Case(
        "block size missing",
        "run",
        ("model=tiny_qwen3", "method=dflash", "method.checkpoint={t}/block"),
        2,
        "names no block_size",
        setup=_block_drafter({"block_size": DROP}),
    ),
    Case(
        "float layer id",
        "run",
        ("model=tiny_qwen3", "method=dflash", "method.checkpoint={t}/block"),
        2,
        "target_layer_ids=1.5",
        setup=_block_drafter({"dflash_config": {"target_layer_ids": [1.5], "mask_token_id": 7}}),
    ),
    Case("cost profile missing", "run", ("method=graft_auto", "method.cost_profile={t}/none.json"), 2, "no such file"),
    Case(
        "cost profile not JSON",
        "run",
        ("method=graft_auto", "method.cost_profile={t}/p.json"),
        2,
        "p.json",
        setup=lambda t: _write(t / "p.json", "{not json"),
    ),
    Case(
        "cost profile of another model",
        "run",
        ("method=graft_auto", f"method.cost_profile={ROOT}/results/cost_model/cost_profile_cpu.json"),
        2,
        "was measured for another target",
    ),
    # datasets
    Case(
        "dataset row not JSON",
        "run",
        ("method=ar", "dataset=mt_bench", "dataset.path={t}/q.jsonl"),
        2,
        "q.jsonl:1: not valid JSON",
        setup=_question_file("{not json\n"),
    ),
    Case(
        "dataset row without turns",
        "run",
        ("method=ar", "dataset=mt_bench", "dataset.path={t}/q.jsonl"),
        2,
        "q.jsonl:1: missing field 'turns'",
        setup=_question_file(json.dumps({"question_id": 1}) + "\n"),
    ),
    Case(
        "empty dataset",
        "run",
        ("method=ar", "dataset=mt_bench", "dataset.path={t}/q.jsonl"),
        2,
        "has no prompts: its source is empty",
        setup=_question_file(""),
    ),
    Case(
        "duplicate ids are made unique",
        "run",
        ("method=ar", "dataset=mt_bench", "dataset.path={t}/q.jsonl", "run.num_prompts=2"),
        0,
        "summary:",
        setup=_question_file(json.dumps(QUESTION) + "\n" + json.dumps(QUESTION) + "\n"),
        check=lambda t: _ids(t / "out") == ["mt_bench-81", "mt_bench-81#2"],
    ),
    Case(
        "prompt longer than the context is skipped",
        "run",
        ("method=ar", "model.max_context=8"),
        0,
        "skipped",
        check=lambda t: _statuses(t / "out") == ["skipped"],
    ),
    # the table tools
    Case("tables: missing path", "report", ("tables", "{t}/nothing"), 2, "nothing: no such file or directory"),
    Case("tables: empty folder", "report", ("tables", "{t}"), 2, "no finished runs under it"),
    Case(
        "tables: torn summary", "report", ("tables", "{t}/runs"), 2, "summary.json: not valid JSON", setup=_torn_summary
    ),
    Case(
        "tables: summary is a folder", "report", ("tables", "{t}/runs"), 2, "is a directory", setup=_summary_is_a_folder
    ),
    Case(
        "tables: --out is a file",
        "report",
        ("tables", "{t}/runs", "--out", "{t}/runs/mt/run.json"),
        2,
        "run.json",
        setup=_finished,
    ),
    Case(
        "plot: torn summary",
        "report",
        ("plot", "{t}/runs", "--out", "{t}/fig"),
        2,
        "not valid JSON",
        setup=_torn_summary,
    ),
    Case(
        "plot: torn samples",
        "report",
        ("plot", "{t}/runs", "--out", "{t}/fig"),
        2,
        "samples.jsonl:1: torn record",
        setup=_torn_samples,
    ),
    Case("export: missing source", "report", ("export", "{t}/nothing", "{t}/export"), 2, "no such file or directory"),
    Case("export: empty source", "report", ("export", "{t}", "{t}/../elsewhere"), 2, "no finished runs"),
    Case("export: into itself", "report", ("export", "{t}/runs", "{t}/runs"), 2, "overlap", setup=_finished),
    Case(
        "export: into a run folder",
        "report",
        ("export", "{t}/runs", "{t}/runs/mt/export"),
        2,
        "overlap",
        setup=_finished,
    ),
    Case("export: torn samples", "report", ("export", "{t}/runs", "{t}/export"), 2, "torn record", setup=_torn_samples),
    Case("render: missing README", "report", ("render", "{t}/README.md"), 2, "README.md"),
    Case(
        "render: unclosed block",
        "report",
        ("render", "--check", "{t}/README.md"),
        2,
        "README.md:3: generated block is never closed",
        setup=_readme("# R\n\n<!-- generated: tables {t}/runs -->\nold\n"),
    ),
    Case(
        "render: unknown kind",
        "report",
        ("render", "{t}/README.md"),
        2,
        "unknown generated block kind 'tabels'",
        setup=_readme("<!-- generated: tabels x -->\n<!-- /generated -->\n"),
    ),
    Case(
        "render: block of a missing path",
        "report",
        ("render", "{t}/README.md"),
        2,
        "README.md:1: block 'tables",
        setup=_readme("<!-- generated: tables {t}/gone -->\n<!-- /generated -->\n"),
    ),
    Case(
        "render: stale block",
        "report",
        ("render", "--check", "{t}/README.md"),
        1,
        "generated blocks are stale",
        setup=_readme("<!-- generated: tables {t}/runs -->\nhand-typed\n<!-- /generated -->\n"),
    ),
    Case(
        "summarize: torn summary",
        "report",
        ("summarize", "{t}/runs/mt/summary.json"),
        2,
        "not valid JSON",
        setup=_torn_summary,
    ),
    Case("compare: missing root", "report", ("compare", "{t}/before", "{t}/after"), 2, "before: no such directory"),
    Case(
        "compare: nothing in common",
        "report",
        ("compare", "{t}/runs", "{t}"),
        2,
        "no method has a run directory",
        setup=_finished,
    ),
]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every case's (exit status, stdout, stderr), from one driver process."""
    base = tmp_path_factory.mktemp("bad_input")
    specs = []
    for number, case in enumerate(CASES):
        t = base / f"case{number:02d}"
        t.mkdir()
        if case.setup:
            case.setup(t)
        args = [a.format(t=t) for a in case.args]
        if case.tool == "run" and not any(a.startswith("run.out_dir=") for a in args):
            args.append(f"run.out_dir={t}/out")
        specs.append({"id": case.id, "tool": case.tool, "args": [*case.base, *args] if case.tool == "run" else args})
    cases_file, results_file = base / "cases.json", base / "results.json"
    cases_file.write_text(json.dumps(specs))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "bad_inputs.py"), str(cases_file), str(results_file)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return base, json.loads(results_file.read_text())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(outcomes, case):
    base, results = outcomes
    got = results[case.id]
    shown = f"exit {got['code']}\nstdout: {got['stdout'][-1500:]}\nstderr: {got['stderr'][-1500:]}"
    assert "Traceback" not in got["stderr"], shown
    assert got["code"] == case.code, shown
    assert case.fragment in (got["stderr"] if case.code else got["stdout"]), shown
    if case.code == 2:
        assert got["stderr"].strip().startswith("error:"), shown
    if case.check:
        assert case.check(base / f"case{CASES.index(case):02d}"), shown


def test_a_failed_export_keeps_the_earlier_one(outcomes):
    base, _ = outcomes
    number = next(i for i, c in enumerate(CASES) if c.id == "export: torn samples")
    export = base / f"case{number:02d}" / "export"
    assert (export / "mt" / "summary.json").read_text() == "an earlier export"
    assert sorted(p.name for p in export.parent.iterdir() if p.name.startswith(".")) == []
