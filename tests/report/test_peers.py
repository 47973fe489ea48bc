"""The vLLM peer runner (graft/peers/vllm_runner.py) against a stand-in worker (fake_vllm_worker.py): the run folder it
writes, what tables make of it, a method vLLM refuses, an interrupted run resumed, bad input. The real vLLM is
cross-checked in test_vllm_cross_check.py."""

import json
import sys
from pathlib import Path

import pytest

from graft.peers import vllm_runner as vllm
from graft.schema import ConfigError

FAKE = Path(__file__).with_name("fake_vllm_worker.py")
pytestmark = pytest.mark.embedded  # the embedded model's tokenizer and chat template


def _plan(*overrides, methods="ar,ngram,eagle3"):
    from conftest import compose

    from graft.config.experiment import validate

    cfg = validate(compose(["logger=none", "dataset=builtin_quick", "run.num_prompts=3", "run.max_new_tokens=10",
                            *overrides]))  # fmt: skip
    plan, chat, prompts = vllm.plan_peer(
        cfg, python=Path(sys.executable), methods=vllm.parse_methods(methods), k=4, dtype="auto", max_model_len=4096
    )
    return cfg, plan, chat, prompts


@pytest.fixture
def fake(tmp_path, monkeypatch):
    log = tmp_path / "requests.jsonl"
    monkeypatch.setenv("FAKE_VLLM_LOG", str(log))
    return log


def test_a_peer_run_is_a_comparison_against_vllms_own_ar_that_tables_show_as_vllm_rows(tmp_path, fake):
    from graft.analysis.tables import method_rows

    cfg, plan, chat, prompts = _plan()
    out = vllm.run_peer(cfg, plan, chat, prompts, out=tmp_path / "peer", worker=FAKE)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["peer"]["engine"] == "vllm" and summary["peer"]["version"] == "0.0-fake"
    assert summary["peer"]["settings"]["eagle3"]["num_speculative_tokens"] == 4
    assert summary["peer"]["settings"]["eagle3"]["model"].endswith("smollm2_135m_eagle3")
    assert summary["peer"]["settings"]["ar"] is None and summary["peer"]["dtype"] == "float32"
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == [p.id for p in prompts]
    turn = records[0]["methods"]["ngram (vllm)"]["side"]["turns"][0]
    # 10 tokens: the first from the prefill, 9 from steps accepting 2, 0, 1, 2 drafts (3 + 1 + 2 + 3)
    assert turn["accept_lengths"] == [3, 1, 2, 3] and turn["steps"] == 4 and turn["tau"] == 9 / 4
    assert turn["stop_reason"] == "max_new_tokens" and len(turn["token_ids"]) == 10
    assert records[0]["methods"]["ngram (vllm)"]["lossless"]["equal"] is True
    parted = records[0]["methods"]["eagle3 (vllm)"]["lossless"]
    assert parted["equal"] is False and parted["first_divergence"] == {"turn": 0, "token": 3}
    rows = method_rows([out])
    assert sorted(rows["method"]) == ["ar (vllm)", "eagle3 (vllm)", "ngram (vllm)"] and set(rows["engine"]) == {"vllm"}
    ngram = rows.set_index("method").loc["ngram (vllm)"]
    assert ngram["tau"] == pytest.approx(9 / 4) and ngram["lossless"] == True  # noqa: E712
    assert rows.set_index("method").loc["eagle3 (vllm)", "lossless"] == False  # noqa: E712
    assert not (tmp_path / ".peer.progress.jsonl").exists()


def test_vllms_batched_ar_throughput_joins_the_batch_series_as_its_own_line(tmp_path, fake):
    from graft.analysis.batch import batch_rows, batch_series

    cfg, plan, chat, prompts = _plan(methods="ar,ngram")
    out = vllm.run_peer(cfg, plan, chat, prompts, out=tmp_path / "peer", worker=FAKE, batch_sizes=[1, 4])
    peer = json.loads((out / "summary.json").read_text())["peer"]["batch_throughput"]
    # batch 4 streams the 3 prompts 6 times (at least 4 B conversations, as run.batch_size=4 does)
    assert [(p["batch_size"], p["sequences"]) for p in peer] == [(1, 3), (4, 18)]
    rows = batch_rows([out])
    line = rows[rows["method"] == "ar (vllm)"].sort_values("batch_size")
    assert list(line["batch_size"]) == [1, 4] and list(line["throughput_tokens_per_s"]) == pytest.approx([100, 400])
    assert set(line["stream"]) == {"steady"} and len(list(batch_series(rows))) == 1


def test_a_later_turn_continues_with_the_methods_own_answer(tmp_path, fake):
    cfg, plan, chat, prompts = _plan("dataset=builtin", "run.num_prompts=2", methods="ar,ngram")
    two = [p for p in prompts if len(p.turns) > 1]
    assert two, "the built-in set has a two-turn prompt among its first two"
    out = vllm.run_peer(cfg, plan, chat, two, out=tmp_path / "peer", worker=FAKE)
    record = json.loads((out / "samples.jsonl").read_text().splitlines()[0])
    first, second = record["baseline"]["turns"]
    answer = chat.prompt_ids([
        {"role": "user", "content": two[0].turns[0]}, {"role": "assistant", "content": first["text"]},
        {"role": "user", "content": two[0].turns[1]},
    ])  # fmt: skip
    assert second["prompt_tokens"] == len(answer)


def test_a_method_vllm_refuses_is_skipped_and_the_run_says_why(tmp_path, fake, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_VLLM_REFUSE", "suffix")
    cfg, plan, chat, prompts = _plan(methods="ar,suffix,ngram")
    out = vllm.run_peer(cfg, plan, chat, prompts, out=tmp_path / "peer", worker=FAKE)
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["methods"]) == ["ngram (vllm)"]
    assert "needs a package this environment lacks" in summary["peer"]["skipped"]["suffix"]
    assert "vLLM did not run suffix" in capsys.readouterr().out


def test_an_interrupted_peer_run_keeps_its_finished_prompts_when_run_again(tmp_path, fake, monkeypatch):
    cfg, plan, chat, prompts = _plan()
    turns = [len(p.turns) for p in prompts]
    monkeypatch.setenv("FAKE_VLLM_DIE_AFTER", str(turns[0]))  # AR's second prompt never comes back
    with pytest.raises(RuntimeError, match="worker ended.*killed"):
        vllm.run_peer(cfg, plan, chat, prompts, out=tmp_path / "peer", worker=FAKE)
    assert len((tmp_path / ".peer.progress.jsonl").read_text().splitlines()) == 1
    monkeypatch.delenv("FAKE_VLLM_DIE_AFTER")
    fake.unlink()
    vllm.run_peer(cfg, plan, chat, prompts, out=tmp_path / "peer", worker=FAKE)
    served = [json.loads(line)["method"] for line in fake.read_text().splitlines()]
    assert served == ["ar"] * sum(turns[1:]) + ["ngram"] * sum(turns) + ["eagle3"] * sum(turns)  # AR's first kept
    assert len((tmp_path / "peer" / "samples.jsonl").read_text().splitlines()) == 3


@pytest.mark.parametrize(
    "change,needles",
    [
        (dict(methods="ar,medusa"), ["--methods 'ar,medusa'", "medusa", "allowed: ar, ngram, suffix, eagle3, dflash"]),
        (dict(k=0), ["--k 0", ">= 1"]),
        (dict(python="/nowhere/python"), ["--python /nowhere/python", "make peers"]),
        (dict(overrides=["model=tiny_llama"]), ["model=tiny_llama has random weights", "checkpoint"]),
    ],
)
def test_bad_peer_input_is_named(tmp_path, change, needles):
    from conftest import compose

    from graft.config.experiment import validate

    cfg = validate(compose(["logger=none", *change.get("overrides", [])]))
    with pytest.raises(ConfigError) as err:
        methods = vllm.parse_methods(change.get("methods", "ar,ngram"))
        vllm.plan_peer(
            cfg, python=Path(change.get("python", sys.executable)), methods=methods, k=change.get("k", 4),
            dtype="auto", max_model_len=4096,
        )  # fmt: skip
    for needle in needles:
        assert needle in str(err.value)


def test_a_peer_run_into_a_folder_holding_files_is_refused_before_vllm_starts(tmp_path, fake):
    cfg, plan, chat, prompts = _plan()
    (tmp_path / "peer").mkdir()
    (tmp_path / "peer" / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not an empty folder"):
        vllm.run_peer(cfg, plan, chat, prompts, out=tmp_path / "peer", worker=FAKE)
    assert not fake.exists() and (tmp_path / "peer" / "keep.txt").read_text() == "mine"
