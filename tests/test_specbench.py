"""`python -m graft.report export --format spec-bench`: a comparison run as Spec-Bench answer files, in the layout
Spec-Bench's evaluation/eval.py writes and evaluation/speed.py / equal.py read (graft/report/specbench.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from graft.report.__main__ import main as report
from graft.report.specbench import question_id


def turn(new_tokens: int, wall_s: float, accept_lengths: list[int], text: str | None) -> dict:
    t = {"prompt_tokens": 9, "new_tokens": new_tokens, "step_tokens": sum(accept_lengths)}
    t.update(steps=len(accept_lengths), wall_s=wall_s, accept_lengths=accept_lengths, tokens_sha256="0" * 16)
    return t if text is None else {**t, "text": text}


def write_run(folder: Path, texts: bool = True) -> Path:
    """A finished comparison run (graft/runner.py's layout): two Spec-Bench prompts, one of two turns, and a
    skipped one; the baseline and graft."""
    say = (lambda s: s) if texts else (lambda s: None)
    records = [
        {
            "id": "spec_bench-81",
            "category": "writing",
            "index": 0,
            "turns": 2,
            "status": "ok",
            "baseline": {"turns": [turn(4, 2.0, [1, 1, 1], say("a b c d")), turn(2, 1.0, [1], say("e f"))]},
            "methods": {
                "graft": {
                    "side": {"turns": [turn(4, 1.0, [2, 1], say("a b c d")), turn(2, 0.5, [1], say("e f"))]},
                    "lossless": {"checked": True, "equal": True},
                    "speedup_wall": 2.0,
                }
            },
        },
        {
            "id": "spec_bench-82",
            "category": "math_reasoning",
            "index": 1,
            "turns": 1,
            "status": "ok",
            "baseline": {"turns": [turn(6, 3.0, [1, 1, 1, 1, 1], say("1 2 3 4 5 6"))]},
            "methods": {"graft": {"side": {"turns": [turn(6, 1.0, [3, 2], say("1 2 3 4 5 6"))]}}},
        },
        {"id": "spec_bench-83", "category": "qa", "index": 2, "turns": 1, "status": "skipped", "reason": "too long"},
    ]
    folder.mkdir(parents=True)
    summary = {"model": "tiny", "dataset": "spec_bench", "kind": "comparison", "method": "compare", "methods": {}}
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "run.json").write_text(json.dumps({"config": {}}))
    (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def read_answers(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def speed_like_spec_bench(method_file: Path, base_file: Path) -> tuple[float, float, float]:
    """What Spec-Bench's evaluation/speed.py computes (task "overall"): each question's tokens per second,
    sum(new_tokens) / sum(wall_time), averaged; the mean of every step's accepted length; the baseline's tokens
    counted from its texts (a whitespace tokenizer standing in for the model's, with its BOS taken off)."""
    speeds, accepted = [], []
    for answer in read_answers(method_file):
        picked = answer["choices"][0]
        speeds.append(sum(picked["new_tokens"]) / sum(picked["wall_time"]))
        accepted.extend(picked["accept_lengths"])
    base = []
    for answer in read_answers(base_file):
        picked = answer["choices"][0]
        tokens = sum(len(["<s>", *text.split()]) - 1 for text in picked["turns"])
        base.append(tokens / sum(picked["wall_time"]))
    return float(np.mean(speeds)), float(np.mean(accepted)), float(np.mean(base))


def test_a_comparison_run_becomes_spec_bench_answer_files(tmp_path, capsys):
    run = write_run(tmp_path / "runs" / "run")
    target = tmp_path / "answers"
    report(["export", "--format", "spec-bench", str(run), str(target)])
    assert sorted(p.name for p in target.iterdir()) == ["tiny-graft.jsonl", "tiny-vanilla.jsonl"]
    assert "no texts" not in capsys.readouterr().err

    graft, vanilla = read_answers(target / "tiny-graft.jsonl"), read_answers(target / "tiny-vanilla.jsonl")
    assert [a["question_id"] for a in graft] == [81, 82]  # the dataset's own ids; the skipped prompt has none
    for answer in graft + vanilla:
        assert list(answer) == ["question_id", "category", "answer_id", "model_id", "choices", "tstamp"]
        assert isinstance(answer["answer_id"], str) and isinstance(answer["tstamp"], float)
        (picked,) = answer["choices"]
        assert list(picked) == ["index", "turns", "decoding_steps", "new_tokens", "wall_time", "accept_lengths"]
        assert picked["index"] == 0
        assert all(isinstance(t, str) for t in picked["turns"])
        assert all(isinstance(n, int) for key in ("decoding_steps", "new_tokens") for n in picked[key])
        assert all(isinstance(s, float) for s in picked["wall_time"])
    assert {a["model_id"] for a in graft} == {"tiny-graft"} and {a["model_id"] for a in vanilla} == {"tiny-vanilla"}
    assert [a["category"] for a in graft] == ["writing", "math_reasoning"]

    first = graft[0]["choices"][0]  # per turn, except accept_lengths: every step of both turns in a row
    assert first["turns"] == ["a b c d", "e f"]
    assert first["new_tokens"] == [4, 2] and first["wall_time"] == [1.0, 0.5] and first["decoding_steps"] == [2, 1]
    assert first["accept_lengths"] == [2, 1, 1]
    assert vanilla[0]["choices"][0]["accept_lengths"] == [1, 1, 1, 1]
    assert vanilla[1]["choices"][0] == {
        "index": 0,
        "turns": ["1 2 3 4 5 6"],
        "decoding_steps": [5],
        "new_tokens": [6],
        "wall_time": [3.0],
        "accept_lengths": [1, 1, 1, 1, 1],
    }

    # question 81: 6 tokens in 1.5 s, 82: 6 in 1.0 s; steps accept 2,1,1,3,2; the baseline 6 in 3 s twice
    tokens_per_s, mean_accepted, base_tokens_per_s = speed_like_spec_bench(
        target / "tiny-graft.jsonl", target / "tiny-vanilla.jsonl"
    )
    assert tokens_per_s == pytest.approx(5.0)
    assert mean_accepted == pytest.approx(1.8)
    assert base_tokens_per_s == pytest.approx(2.0)
    assert tokens_per_s / base_tokens_per_s == pytest.approx(2.5)


def test_runs_without_texts_give_empty_turns_and_say_so(tmp_path, capsys):
    run = write_run(tmp_path / "runs" / "run", texts=False)
    report(["export", "--format", "spec-bench", str(tmp_path / "runs"), str(tmp_path / "answers")])
    answers = read_answers(tmp_path / "answers" / "run" / "tiny-graft.jsonl")  # a folder of runs: one subfolder each
    assert [a["choices"][0]["turns"] for a in answers] == [["", ""], [""]]
    assert answers[0]["choices"][0]["new_tokens"] == [4, 2]
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert len(notes) == 2 and "no texts" in notes[0] and "skipped" in notes[1]
    assert run.is_dir()


def test_the_default_format_is_still_the_records(tmp_path, capsys):
    write_run(tmp_path / "runs" / "run")
    report(["export", str(tmp_path / "runs"), str(tmp_path / "export")])
    assert sorted(p.name for p in (tmp_path / "export" / "run").iterdir()) == [
        "run.json",
        "samples.jsonl.gz",
        "summary.json",
    ]


def test_a_bad_record_is_one_line_and_exit_2(tmp_path, capsys):
    run = write_run(tmp_path / "run")
    lines = (run / "samples.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    del record["methods"]["graft"]["side"]["turns"][1]["wall_s"]
    (run / "samples.jsonl").write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")
    with pytest.raises(SystemExit) as exit_:
        report(["export", "--format", "spec-bench", str(run), str(tmp_path / "answers")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and "turn 2 lacks wall_s" in err
    assert not (tmp_path / "answers").exists()  # nothing written before everything is checked


@pytest.mark.parametrize(
    ("record", "dataset", "expected"),
    [
        ({"id": "mt_bench-81"}, "mt_bench", 81),
        ({"id": "mt_bench-81", "question_id": 7}, "mt_bench", 7),
        ({"id": "eagle_qa-abc"}, "eagle_qa", "abc"),
        ({"id": "chat-3"}, "builtin", 3),
        ({"id": "prompt"}, "builtin", "prompt"),
    ],
)
def test_question_ids_are_the_datasets_own(record, dataset, expected):
    assert question_id(record, dataset) == expected


def test_colliding_numbers_fall_back_to_the_ids(tmp_path):
    run = write_run(tmp_path / "run")
    records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    records[0]["id"], records[1]["id"] = "chat-1", "code-1"
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    report(["export", "--format", "spec-bench", str(run), str(tmp_path / "answers")])
    ids = [a["question_id"] for a in read_answers(tmp_path / "answers" / "tiny-graft.jsonl")]
    assert ids == ["chat-1", "code-1"]
