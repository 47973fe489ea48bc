"""The standing bad-input suite: each case is a command a user might type with a bad or unusual input, the
exit status it must end with and a fragment of the message it must print (on stderr for an error). Every
case runs end to end (`python run.py ...` or `python -m graft.<report|train|costmodel|gpu_check> ...`) on tiny
models; all of them share one Python start-up (tests/bad_inputs.py forks a child per case). A case that starts
giving a traceback, a different exit status or a vaguer message fails here. Grouped by surface: names and config
values, Hydra's syntax, the output folder, weights and checkpoints, cost profiles, datasets, the table tools,
the cost model's and device check's commands, the trainers.

Add a case: one `Case(...)` line, and a setup function if it needs files."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from test_tables import _comparison, _killed

pytestmark = pytest.mark.slow  # 114 commands end to end (about 90 s): `make test-fast` leaves it out

ROOT = Path(__file__).resolve().parents[2]
TINY = ("model=tiny_llama", "logger=none", "hardware=cpu", "run.num_prompts=1", "run.max_new_tokens=4")
QUESTION = {"question_id": 81, "category": "writing", "turns": ["Write a haiku about the sea."]}


@dataclass(frozen=True)
class Case:
    id: str
    tool: str  # "run": python run.py ARGS; "report", "train", "costmodel", "gpu_check": python -m graft.<tool> ARGS
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


def _held(t: Path) -> None:
    """A run folder that another run on this host is writing: its lock names this test process, alive."""
    import os
    import socket

    holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": "2026-12-04 09:00:00 UTC"}
    _write(t / "out" / ".lock", json.dumps(holder))


def _killed_run(t: Path) -> None:
    _killed(t / "runs" / "mt", "mt", {"eagle3": (1.5, 2.5), "graft": (1.8, 3.0)})


def _earlier_export(t: Path) -> None:
    _finished(t)
    _write(t / "export" / "NOTES.md", "not an export's")
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


def _questions(*records: dict):
    return _question_file("".join(json.dumps({"question_id": i, **r}) + "\n" for i, r in enumerate(records)))


def _bytes(name: str, data: bytes):
    def setup(t: Path) -> None:
        (t / name).write_bytes(data)

    return setup


def _profile(change: dict):
    """A cost profile file (json.dumps writes float('nan') as NaN, which JSON readers take)."""
    raw = {
        "device": "cpu: elsewhere",
        "model": "tiny_llama",
        "nodes": [1, 2, 4, 8, 16],
        "contexts": [128],
        "verify_table_ms": [[1.0, 1.1, 1.3, 1.8, 2.9]],
        "overhead_table_ms": [0.1, 0.1, 0.1, 0.2, 0.2],
    }
    return lambda t: _write(t / "p.json", json.dumps({**raw, **change}))


def _profile_and_runs(change: dict):
    def setup(t: Path) -> None:
        _finished(t)
        _profile(change)(t)

    return setup


TORN_SAFETENSORS = b"\x40\x00\x00\x00\x00\x00\x00\x00{"  # a header of 64 bytes announced, one there


def _head(weights: str, data: bytes):
    """An EAGLE-3 head config for tiny_llama and a weights file `weights` holding `data`."""
    raw = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 272,
        "draft_vocab_size": 272,
        "num_hidden_layers": 1,
    }

    def setup(t: Path) -> None:
        _write(t / "head" / "config.json", json.dumps(raw))
        (t / "head" / weights).write_bytes(data)

    return setup


def _pretrained(files: dict):
    """A local Llama folder for model=pretrained: its config, a word-level tokenizer, and `files` (name: bytes)."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 272,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
    }
    tokenizer = {
        "version": "1.0",
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "hello": 1}, "unk_token": "[UNK]"},
    }

    def setup(t: Path) -> None:
        _write(t / "m" / "config.json", json.dumps(config))
        _write(t / "m" / "tokenizer.json", json.dumps(tokenizer))
        _write(t / "m" / "tokenizer_config.json", json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
        for name, data in files.items():
            (t / "m" / name).write_bytes(data)

    return setup


# python -m graft.train dflash on tiny_llama from a given conversations file: a fit of a few steps
DFLASH = (
    "dflash",
    "model=tiny_llama",
    "hardware=cpu",
    "train.out_dir={t}/train",
    "train.data.conversations={t}/conv.jsonl",
    "train.export.dir={t}/export",
    "train.drafter.num_layers=1",
    "train.drafter.block_size=4",
    "train.fit.block_min=2",
    "train.fit.block_max=4",
    "train.fit.anchors=2",
    "train.fit.batch_sequences=2",
    "train.fit.heldout=0",
    "train.fit.epochs=1",
)
EAGLE3 = (
    "eagle3",
    "model=tiny_llama",
    "hardware=cpu",
    "train.out_dir={t}/train",
    "train.export.dir={t}/export",
    "train.head.draft_vocab=64",
)


def _conversations(text: str | None = None):
    """conv.jsonl: four conversations of token ids (or `text`)."""
    rows = [
        {"id": f"c{i}", "prompt_ids": list(range(1, 13)), "answer_ids": list(range(20 + i, 44 + i))} for i in range(4)
    ]
    body = "".join(json.dumps(r) + "\n" for r in rows) if text is None else text
    return lambda t: _write(t / "conv.jsonl", body)


def _conversations_and(name: str, data: bytes):
    def setup(t: Path) -> None:
        _conversations()(t)
        (t / name).write_bytes(data)

    return setup


def _nothing_written(t: Path) -> bool:
    """A refused run left no records and no summary behind."""
    return not (t / "out" / "summary.json").exists() and not (t / "out" / "samples.jsonl").exists()


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
    Case(
        "GPUs 0 under the SLURM launcher",
        "run",
        ("-m", "hydra/launcher=graft_slurm", "model.num_gpus=0"),
        2,
        "model.num_gpus='0' is not allowed",
    ),
    Case("--cfg with -m", "run", ("-m", "hydra/launcher=graft_slurm", "--cfg", "job"), 2, "drop -m"),
    Case("a run folder that cannot be made", "run", ("method=ar", "run.out_dir=/proc/graft_run"), 2, "cannot be made"),
    Case(
        "a method sweep without -m",
        "run",
        ("method=pld,graft",),
        2,
        "add -m (python run.py -m method=pld,graft)",
        base=(),
    ),
    Case("a budget of the root alone", "run", ("method=graft_auto", "method.total_tokens=1"), 2, "method=ar decodes"),
    Case(
        "tensor parallel on a CPU",
        "run",
        ("method=ar", "hardware.tensor_parallel=true"),
        2,
        "hardware.tensor_parallel=true needs CUDA GPUs",
    ),
    Case("GPU count on a CPU", "run", ("method=ar", "model.num_gpus=4"), 2, "model.num_gpus=4 asks for GPUs"),
    Case(
        "only the baseline compared",
        "run",
        ("methods=[ar]",),
        2,
        "a comparison needs at least one method besides it",
        check=_nothing_written,
    ),
    Case("the baseline among the compared", "run", ("methods=[pld,ar]",), 2, "lists ar, the autoregressive baseline"),
    # Hydra's grammar: what it refuses is named with the quoting that passes it
    Case("unquoted ~", "run", ("method=ar", "run.out_dir=~/x"), 2, """at '~' (character 13); quote the value"""),
    Case("unquoted ~ in a path", "run", ("method=ar", "dataset.path=~/q.jsonl"), 2, """'dataset.path="~/q.jsonl"'"""),
    Case("non-ASCII letter", "run", ("method=ar", "run.out_dir=résumé"), 2, """'run.out_dir="résumé"'"""),
    Case(
        "a space in the folder is fine",
        "run",
        ("method=ar", "run.out_dir={t}/a b"),
        0,
        "summary:",
        check=lambda t: (t / "a b" / "summary.json").is_file(),
    ),
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
        "second writer",
        "run",
        ("method=ar",),
        2,
        "is being written by another run (pid ",
        setup=_held,
        check=lambda t: (t / "out" / ".lock").is_file() and not (t / "out" / "run.json").exists(),
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
    Case(
        "block drafter weights torn",
        "run",
        ("model=tiny_qwen3", "method=dflash", "method.checkpoint={t}/block"),
        2,
        "block/model.safetensors: not a readable safetensors file",
        setup=_block_drafter({}),
    ),
    Case(
        "EAGLE head safetensors torn",
        "run",
        ("method=eagle3", "method.head={t}/head"),
        2,
        "head/model.safetensors: not a readable safetensors file",
        setup=_head("model.safetensors", TORN_SAFETENSORS),
    ),
    Case(
        "EAGLE head .bin torn",
        "run",
        ("method=eagle3", "method.head={t}/head"),
        2,
        "head/pytorch_model.bin: not a readable PyTorch weights file",
        setup=_head("pytorch_model.bin", b"PK\x03\x04 torn"),
    ),
    Case(
        "model weights torn",
        "run",
        ("model=pretrained", "model.path={t}/m", "method=ar"),
        2,
        "model.safetensors not readable as safetensors",
        setup=_pretrained({"model.safetensors": TORN_SAFETENSORS}),
        base=("logger=none", "hardware=cpu"),
    ),
    Case(
        "model weight index torn",
        "run",
        ("model=pretrained", "model.path={t}/m", "method=ar"),
        2,
        "model.safetensors.index.json, which is not a weight index",
        setup=_pretrained({"model.safetensors.index.json": b'{"weight_map": ', "model-00001.safetensors": b""}),
        base=("logger=none", "hardware=cpu"),
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
    Case(
        "cost profile with NaN",
        "run",
        ("method=graft_auto", "method.cost_profile={t}/p.json", "method.cost_profile_mismatch=warn"),
        2,
        "p.json is not a cost profile (verify_table_ms[0][1]=nan: expected a finite number of ms > 0)",
        setup=_profile({"verify_table_ms": [[1.0, float("nan"), 1.3, 1.8, 2.9]]}),
    ),
    Case(
        "cost profile with a negative cost",
        "run",
        ("method=graft_auto", "method.cost_profile={t}/p.json", "method.cost_profile_mismatch=warn"),
        2,
        "overhead_table_ms[2]=-0.5",
        setup=_profile({"overhead_table_ms": [0.1, 0.1, -0.5, 0.2, 0.2]}),
    ),
    Case(
        "cost profile with a free forward",
        "run",
        ("method=graft_auto", "method.cost_profile={t}/p.json", "method.cost_profile_mismatch=warn"),
        2,
        "verify_table_ms[0][0]=0.0",
        setup=_profile({"verify_table_ms": [[0.0, 1.1, 1.3, 1.8, 2.9]]}),
    ),
    Case(
        "cost profile with an infinite cost",
        "run",
        ("method=graft_auto", "method.cost_profile={t}/p.json", "method.cost_profile_mismatch=warn"),
        2,
        "commit_move_ms=inf",
        setup=_profile({"commit_move_ms": float("inf")}),
    ),
    Case(
        "cost profile is a list",
        "run",
        ("method=graft_auto", "method.cost_profile={t}/p.json", "method.cost_profile_mismatch=warn"),
        2,
        "a JSON list, not an object",
        setup=lambda t: _write(t / "p.json", "[]"),
    ),
    Case(
        "budget beyond the context",
        "run",
        ("method=graft_auto", "method.total_tokens=3000"),
        2,
        "method.total_tokens=3000 does not fit the context of tiny_llama (model.max_context=2048)",
    ),
    Case(
        "context too short to measure",
        "run",
        ("method=graft_auto", "model.max_context=16"),
        2,
        "method.total_tokens=12 does not fit the context of tiny_llama (model.max_context=16) with room to measure "
        "its costs; allowed: 1..7",
    ),
    Case(
        "auto context 0",
        "run",
        ("method=eagle3_auto", "method.auto_context=0"),
        2,
        "method.auto_context=0",
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
        "empty turn",
        "run",
        ("method=ar", "dataset=mt_bench", "dataset.path={t}/q.jsonl"),
        2,
        "q.jsonl:2: turn 2 is empty or only whitespace ('')",
        setup=_questions({"turns": ["Hello."]}, {"turns": ["Hello.", ""]}),
        check=_nothing_written,
    ),
    Case(
        "whitespace-only turn",
        "run",
        ("method=ar", "dataset=mt_bench", "dataset.path={t}/q.jsonl"),
        2,
        "q.jsonl:1: turn 1 is empty or only whitespace",
        setup=_questions({"turns": [" \n\t"]}),
    ),
    Case(
        "dataset not UTF-8",
        "run",
        ("method=ar", "dataset=mt_bench", "dataset.path={t}/q.jsonl"),
        2,
        "q.jsonl:2: not UTF-8 text (byte 0xe9 at column 16)",
        setup=_bytes("q.jsonl", b'{"turns": ["Hi."]}\n{"turns": ["caf\xe9"]}\n'),
    ),
    Case(
        "category is a list",
        "run",
        ("method=ar", "dataset=mt_bench", "dataset.path={t}/q.jsonl", "run.num_prompts=2"),
        2,
        "q.jsonl:2: field 'category' is ['math', 'code']; expected a string",
        setup=_questions({"category": "math", "turns": ["1 + 1?"]}, {"category": ["math", "code"], "turns": ["Hi."]}),
        check=_nothing_written,
    ),
    Case(
        "question id is a list",
        "run",
        ("method=ar", "dataset=mt_bench", "dataset.path={t}/q.jsonl"),
        2,
        "field 'question_id' is [1]; expected a string or an integer",
        setup=_question_file(json.dumps({"question_id": [1], "turns": ["Hi."]}) + "\n"),
    ),
    Case(
        "gzip file that is not gzip",
        "run",
        ("method=ar", "dataset=mt_bench", "dataset.path={t}/q.jsonl.gz"),
        2,
        "q.jsonl.gz: not a readable gzip file",
        setup=_bytes("q.jsonl.gz", b'{"turns": ["Hi."]}\n'),
    ),
    Case(
        "long text not UTF-8",
        "run",
        ("method=ar", "dataset=long_synthetic", "dataset.path={t}/essays.txt", "dataset.lengths=[64]"),
        2,
        "essays.txt: not UTF-8 text (byte 0xe9 at offset 3)",
        setup=_bytes("essays.txt", b"caf\xe9 " * 400),
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
    Case(
        "tables: a killed run",
        "report",
        ("tables", "{t}/runs"),
        2,
        "mt: partial (1 of 3 prompts); pass --partial to show them",
        setup=_killed_run,
    ),
    Case(
        "tables: a killed run, --partial",
        "report",
        ("tables", "{t}/runs", "--partial"),
        0,
        "| graft (partial)",
        setup=_killed_run,
    ),
    Case(
        "export: a killed run",
        "report",
        ("export", "{t}/runs", "{t}/export"),
        2,
        "mt: partial (1 of 3 prompts)",
        setup=_killed_run,
        check=lambda t: not (t / "export").exists(),
    ),
    Case(
        "export: into a non-empty folder",
        "report",
        ("export", "{t}/runs", "{t}/export"),
        2,
        "export: is not empty; pass --replace",
        setup=_earlier_export,
        check=lambda t: (t / "export" / "mt" / "summary.json").read_text() == "an earlier export",
    ),
    Case(
        "export: --replace keeps what it did not write",
        "report",
        ("export", "{t}/runs", "{t}/export", "--replace"),
        0,
        "export/mt",
        setup=_earlier_export,
        check=lambda t: (t / "export" / "NOTES.md").read_text() == "not an export's"
        and "records_sha1" in (t / "export" / "mt" / "summary.json").read_text(),
    ),
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
        "stale, not what the records give today",
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
    Case(
        "compare: missing root",
        "report",
        ("compare", "{t}/before", "{t}/after"),
        2,
        "before: no such file or directory",
    ),
    Case("unknown report command", "report", ("tabels",), 2, "unknown command 'tabels'; commands: tables"),
    Case(
        "check-lossless: unknown method",
        "report",
        ("check-lossless", "--methods", "pld,magic", "--base", "model=tiny_llama", "--out", "{t}/l.json"),
        2,
        "--methods names 'magic', which is no method config; available: ar, dflash",
    ),
    Case(
        "check-lossless: unknown dataset",
        "report",
        ("check-lossless", "--methods", "pld", "--datasets", "imagenet", "--base", "model=tiny_llama"),
        2,
        "--datasets names 'imagenet', which is no dataset config; available: builtin",
    ),
    Case(
        "check-lossless: zero prompts",
        "report",
        ("check-lossless", "--methods", "pld", "--num-prompts", "0", "--base", "model=tiny_llama"),
        2,
        "--num-prompts 0 is not allowed",
    ),
    Case(
        "check-lossless: unknown base key",
        "report",
        ("check-lossless", "--methods", "pld", "--base", "model.max_contxt=8", "--out", "{t}/l.json"),
        2,
        "unknown key 'model.max_contxt'",
    ),
    # the cost model's commands
    Case(
        "costmodel project: profile with NaN",
        "costmodel",
        ("project", "{t}/runs", "--profile", "{t}/p.json"),
        2,
        "verify_table_ms[0][1]=nan",
        setup=_profile_and_runs({"verify_table_ms": [[1.0, float("nan"), 1.3, 1.8, 2.9]]}),
    ),
    Case(
        "costmodel project: records without steps",
        "costmodel",
        ("project", "{t}/runs", "--profile", "{t}/p.json"),
        2,
        "records no 'prompt_tokens' per turn, which a projection reads",
        setup=_profile_and_runs({}),
    ),
    Case(
        "costmodel project: no runs",
        "costmodel",
        ("project", "{t}", "--profile", "{t}/p.json"),
        2,
        "no finished runs under it",
        setup=_profile({}),
    ),
    Case(
        "costmodel profile: unknown model",
        "costmodel",
        ("profile", "model=gpt5", "--out", "{t}/p.json"),
        2,
        "unknown model 'gpt5'; available model configs:",
    ),
    Case(
        "costmodel forward: unquoted ~",
        "costmodel",
        ("forward", "model=pretrained", "model.path=~/m"),
        2,
        """quote the value for Hydra, inside the shell's quotes: 'model.path="~/m"'""",
    ),
    Case("unknown costmodel command", "costmodel", ("profiles",), 2, "unknown command 'profiles'"),
    # the device check
    Case(
        "gpu_check: negative budget",
        "gpu_check",
        ("--device", "cpu", "--quick", "--budget-s", "-5", "--out", "{t}/g.json"),
        2,
        "--budget-s -5 is not allowed; expected seconds > 0",
        check=lambda t: not (t / "g.json").exists(),
    ),
    Case(
        "gpu_check: zero budget",
        "gpu_check",
        ("--device", "cpu", "--quick", "--budget-s", "0", "--out", "{t}/g.json"),
        2,
        "--budget-s 0 is not allowed",
    ),
    Case(
        "gpu_check: --out is a folder",
        "gpu_check",
        ("--device", "cpu", "--quick", "--out", "{t}"),
        2,
        "is a folder; the report is a file",
    ),
    # the trainers (python -m graft.train eagle3|dflash)
    Case(
        "train: warm-up 0 means none",
        "train",
        (*DFLASH, "train.fit.warmup_steps=0"),
        0,
        "exported",
        setup=_conversations(),
        check=lambda t: (t / "export" / "config.json").is_file(),
    ),
    Case(
        "train: zero epochs",
        "train",
        (*DFLASH, "train.fit.epochs=0"),
        2,
        "train.fit.epochs=0 is not allowed; expected an integer >= 1",
        setup=_conversations(),
        check=lambda t: not (t / "train" / "features").exists(),
    ),
    Case(
        "train: negative warm-up",
        "train",
        (*DFLASH, "train.fit.warmup_steps=-1"),
        2,
        "train.fit.warmup_steps=-1 is not allowed; expected an integer >= 0 (0: no warm-up)",
        setup=_conversations(),
    ),
    Case(
        "train: zero features",
        "train",
        (*DFLASH, "train.drafter.num_features=0"),
        2,
        "train.drafter.num_features=0 is not allowed",
        setup=_conversations(),
    ),
    Case(
        "train: missing conversations",
        "train",
        (*DFLASH, "train.data.conversations={t}/none.jsonl"),
        2,
        "none.jsonl' is not allowed; expected null (generate them) or an existing conversations.jsonl",
    ),
    Case(
        "train: conversations not JSON",
        "train",
        DFLASH,
        2,
        "conv.jsonl:2: not valid JSON",
        setup=_conversations('{"prompt_ids": [1], "answer_ids": [2]}\n{"prompt_ids": [1\n'),
    ),
    Case(
        "train: conversation without answer",
        "train",
        DFLASH,
        2,
        "conv.jsonl: record 1: 'answer_ids' is not a list of token ids",
        setup=_conversations('{"prompt_ids": [1, 2]}\n'),
    ),
    Case(
        "train: empty conversations",
        "train",
        DFLASH,
        2,
        "conv.jsonl holds no conversations",
        setup=_conversations(""),
    ),
    Case(
        "train: torn checkpoint to start from",
        "train",
        (*DFLASH, "train.fit.init_from={t}/init.pt"),
        2,
        "init.pt: not a readable PyTorch file",
        setup=_conversations_and("init.pt", b"PK\x03\x04 torn"),
    ),
    Case(
        "train: torn resume checkpoint",
        "train",
        DFLASH,
        2,
        "checkpoint.pt: not a readable PyTorch file",
        setup=lambda t: (_conversations()(t), _write(t / "train" / "checkpoint.pt", "")),
    ),
    Case("train: unknown trainer", "train", ("eagle4",), 2, "unknown command 'eagle4'; commands: eagle3, dflash"),
    Case("train: unknown key", "train", (*EAGLE3, "train.fit.epoch=3"), 2, "Key 'epoch' is not in struct"),
    Case(
        "train: unknown model",
        "train",
        ("eagle3", "model=tiny_lama", "train.out_dir={t}/train"),
        2,
        "Could not find 'model/tiny_lama'; Available options in 'model': deepseek_r1_llama_8b",
    ),
    Case("train: unquoted ~", "train", ("eagle3", "train.out_dir=~/x"), 2, """'train.out_dir="~/x"'"""),
    Case("train: unknown stage", "train", (*EAGLE3, "train.stage=fitt"), 2, "train.stage='fitt' is not allowed"),
    Case(
        "train: fit before features",
        "train",
        (*EAGLE3, "train.stage=fit"),
        2,
        "no feature records under",
    ),
    Case(
        "train: draft vocabulary beyond the target's",
        "train",
        (*EAGLE3, "train.stage=fit", "train.head.draft_vocab=1000"),
        2,
        "train.head.draft_vocab=1000 is not allowed; expected 1..272",
    ),
    Case(
        "compare: nothing in common",
        "report",
        ("compare", "{t}/runs", "{t}"),
        2,
        "no method of a run directory is under both",
        setup=_finished,
    ),
    # the bench and stats commands' arguments, and the peer runner's
    Case("e2e: no prompts", "bench", ("e2e", "--prompts", "0"), 2, "--prompts 0 is not allowed"),
    Case("compile: nodes not a list", "bench", ("compile", "--nodes", "x"), 2, "--nodes x is not allowed"),
    Case("compile: unknown model", "bench", ("compile", "--model", "bogus"), 2, "--model bogus: unknown"),
    Case("native-ab: unknown ref", "bench", ("native-ab", "--ref", "nosuchrev"), 2, "--ref nosuchrev: not a rev"),
    Case("moe-experts: no rounds", "bench", ("moe-experts", "--rounds", "0"), 2, "--rounds 0 is not allowed"),
    Case("stats: no trials", "module:graft.analysis.stats", ("--coverage", "--trials", "0"), 2, "--trials 0"),
    Case("peers: unknown method", "peers", ("vllm", "--out", "{t}/p", "--methods", "ar,medusa"), 2, "medusa"),
    Case("peers: no vLLM", "peers", ("vllm", "--out", "{t}/p", "--python", "{t}/none"), 2, "make peers"),
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
    if case.code == 2:  # the one line, after any progress bars (a trainer's) and nothing else
        assert re.sub(r"[^\n]*\d+%\|[^\n]*\n?", "", got["stderr"]).strip().startswith("error:"), shown
    if case.check:
        assert case.check(base / f"case{CASES.index(case):02d}"), shown


def test_a_failed_export_keeps_the_earlier_one(outcomes):
    base, _ = outcomes
    number = next(i for i, c in enumerate(CASES) if c.id == "export: torn samples")
    export = base / f"case{number:02d}" / "export"
    assert (export / "mt" / "summary.json").read_text() == "an earlier export"
    assert sorted(p.name for p in export.parent.iterdir() if p.name.startswith(".")) == []
