"""`python -m graft.report export --format spec-bench`: a comparison run as Spec-Bench answer files, in the layout
Spec-Bench's evaluation/eval.py writes and evaluation/speed.py / equal.py read (graft/report/specbench.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import finish_run

from graft.report.__main__ import main as report
from graft.report.specbench import question_id


def turn(new_tokens: int, wall_s: float, accept_lengths: list[int], text: str | None) -> dict:
    t = {"prompt_tokens": 9, "new_tokens": new_tokens, "step_tokens": sum(accept_lengths)}
    t.update(steps=len(accept_lengths), wall_s=wall_s, accept_lengths=accept_lengths, tokens_sha256="0" * 16)
    return t if text is None else {**t, "text": text}


def write_run(folder: Path, texts: bool = True) -> Path:
    """A finished comparison run (graft/run/runner.py's layout): two Spec-Bench prompts, one of two turns, and a
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
    return finish_run(folder)


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


def test_runs_without_texts_are_refused_naming_the_run(tmp_path, capsys):
    """speed.py counts the baseline's tokens from its texts: empty texts gave it a speedup of -61."""
    write_run(tmp_path / "runs" / "run", texts=False)
    with pytest.raises(SystemExit) as exit_:
        report(["export", "--format", "spec-bench", str(tmp_path / "runs"), str(tmp_path / "answers")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(tmp_path / "runs" / "run") in err and "no texts" in err
    assert not (tmp_path / "answers").exists()


def test_categories_are_spec_bench_tasks_and_an_unknown_one_is_named(tmp_path, capsys):
    run = write_run(tmp_path / "run")
    records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "dataset": "builtin"}))
    records[0]["category"], records[1]["category"] = "chat", "math"  # the built-in set's
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    finish_run(run)
    report(["export", "--format", "spec-bench", str(run), str(tmp_path / "answers")])
    graft = read_answers(tmp_path / "answers" / "tiny-graft.jsonl")
    assert [a["category"] for a in graft] == ["chat", "math_reasoning"]  # not MT-Bench's math (speed.py's mt_bench)
    assert "no Spec-Bench task for chat (1)" in capsys.readouterr().err

    (run / "summary.json").write_text(json.dumps({**summary, "dataset": "mt_bench"}))
    finish_run(run)
    report(["export", "--format", "spec-bench", str(run), str(tmp_path / "mt")])
    assert [a["category"] for a in read_answers(tmp_path / "mt" / "tiny-graft.jsonl")] == ["chat", "math"]
    capsys.readouterr()

    records[1]["category"] = "4k"
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    finish_run(run)
    with pytest.raises(SystemExit) as exit_:
        report(["export", "--format", "spec-bench", str(run), str(tmp_path / "refused")])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and "4k" in err and "CATEGORIES" in err
    assert not (tmp_path / "refused").exists()


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
    finish_run(run)
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
    finish_run(run)
    report(["export", "--format", "spec-bench", str(run), str(tmp_path / "answers")])
    ids = [a["question_id"] for a in read_answers(tmp_path / "answers" / "tiny-graft.jsonl")]
    assert ids == ["chat-1", "code-1"]


# --- import: answer files back into a run folder ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A finished comparison of the tiny model, with its texts: pld and eagle3 against one baseline, 3 prompts."""
    from conftest import compose

    from graft.config.experiment import validate
    from graft.run.runner import run

    out = tmp_path_factory.mktemp("tiny") / "run"
    resolved = compose(["model=tiny_llama", "methods=[pld,eagle3]", "run.num_prompts=3", "run.max_new_tokens=8"])
    resolved["logger"]["name"] = "none"
    resolved["run"].update(out_dir=str(out), warmup=False, progress=False)
    run(validate(resolved), resolved)
    return out


def test_an_exported_run_imports_back_with_the_same_taus_and_tokens_per_second(tiny_run, tmp_path, capsys):
    """Exact, not approximate: the answer files carry every count as an integer and every wall time as the float
    JSON writes exactly (repr), and import computes tau, tokens/s and speedup as the run's summary does."""
    answers, imported = tmp_path / "answers", tmp_path / "imported"
    report(["export", "--format", "spec-bench", str(tiny_run), str(answers)])
    assert sorted(p.name for p in answers.iterdir()) == [
        "tiny_llama-eagle3.jsonl",
        "tiny_llama-pld.jsonl",
        "tiny_llama-vanilla.jsonl",
    ]
    report(["import", "--format", "spec-bench", str(answers), "--out", str(imported), "--dataset", "builtin_quick"])
    ours = json.loads((tiny_run / "summary.json").read_text())
    theirs = json.loads((imported / "summary.json").read_text())
    assert theirs["model"] == "tiny_llama" and theirs["dataset"] == "builtin_quick"
    assert set(theirs["rows"]) == {"ar", "pld (imported)", "eagle3 (imported)"}
    for name in ("ar", "pld", "eagle3"):
        mine, back = ours["rows"][name], theirs["rows"][name if name == "ar" else f"{name} (imported)"]
        assert back["tau"] == mine["tau"]
        assert back["tokens_per_s"] == mine["tokens_per_s"]
        assert back["speedup_wall"] == mine["speedup_wall"]
    records = [json.loads(line) for line in (imported / "samples.jsonl").read_text().splitlines()]
    originals = [json.loads(line) for line in (tiny_run / "samples.jsonl").read_text().splitlines()]
    assert [r["question_id"] for r in records] == [r["id"] for r in originals]  # the built-in ids, as exported
    mapped = {"chat": "chat", "code": "code", "math": "math_reasoning", "summarisation": "summarization"}
    assert [r["category"] for r in records] == [mapped[r["category"]] for r in originals]  # Spec-Bench's

    # marked as imported, with the files it came from, and finished (summary.json's `complete` verifies)
    from graft.records.writer import records_problem

    run = json.loads((imported / "run.json").read_text())
    assert run["imported"]["format"] == "spec-bench" == theirs["imported"]["format"]
    files = {f["file"]: f for f in run["imported"]["files"]}
    assert files["tiny_llama-vanilla.jsonl"]["role"] == "baseline"
    assert (
        files["tiny_llama-pld.jsonl"]["sha256"]
        == hashlib.sha256((answers / "tiny_llama-pld.jsonl").read_bytes()).hexdigest()
    )
    complete = theirs["complete"]
    assert records_problem(records, complete["ids"], complete["records_sha1"]) is None

    # exported again, the same answers (but for each answer's id and time stamp)
    report(["export", "--format", "spec-bench", str(imported), str(tmp_path / "again")])
    strip = lambda rows: [{k: v for k, v in a.items() if k not in ("answer_id", "tstamp", "model_id")} for a in rows]  # noqa: E731
    assert strip(read_answers(tmp_path / "again" / "tiny_llama-pld (imported).jsonl")) == strip(
        read_answers(answers / "tiny_llama-pld.jsonl")
    )


def test_tables_and_figures_show_imported_runs_beside_ours_marked(tiny_run, tmp_path):
    answers, imported = tmp_path / "answers", tmp_path / "runs" / "imported"
    report(["export", "--format", "spec-bench", str(tiny_run), str(answers)])
    report(["import", str(answers), "--out", str(imported), "--dataset", "builtin_quick"])
    report(["tables", str(tiny_run), str(imported), "--out", str(tmp_path / "tables")])
    table = (tmp_path / "tables" / "tables.md").read_text()
    cells = {row[1].strip(): row[2].strip() for row in (line.split("|") for line in table.splitlines()) if len(row) > 3}
    assert {"ar", "ar (imported)", "pld", "pld (imported)", "eagle3", "eagle3 (imported)"} <= set(cells)
    assert cells["pld (imported)"] == cells["pld"] and cells["eagle3 (imported)"] == cells["eagle3"]
    written = [p.name for p in main_plot(tiny_run, imported, tmp_path / "figures")]
    assert "speedup_bars.png" in written or any(name.endswith(".png") for name in written)


def main_plot(*runs_and_out: Path) -> list[Path]:
    from graft.report.figures import make_figures

    *runs, out = runs_and_out
    return make_figures([str(r) for r in runs], out)


def test_eagle_answer_files_import_with_steps_from_idxs(tmp_path, capsys):
    """EAGLE's answers: no category, `idxs` (the loop index of each turn's last step, so steps = idxs + 1) and
    new_tokens (what the steps committed), no accepted lengths."""
    folder = tmp_path / "mt_bench"
    folder.mkdir()

    def answer(qid, new_tokens, idxs, wall):
        choice = {"index": 0, "turns": ["x"] * len(new_tokens), "idxs": idxs, "new_tokens": new_tokens}
        return json.dumps(
            {"question_id": qid, "answer_id": "a", "model_id": "m", "choices": [{**choice, "wall_time": wall}]}
        )

    (folder / "llama3-ea-temperature-0.0.jsonl").write_text(
        answer(81, [30, 20], [9, 4], [1.0, 1.0]) + "\n" + answer(82, [12], [3], [0.5]) + "\n"
    )
    (folder / "llama3-baseline-temperature-0.0.jsonl").write_text(
        answer(81, [30, 20], [29, 19], [3.0, 2.0]) + "\n" + answer(82, [12], [11], [1.5]) + "\n"
    )
    report(["import", str(folder), "--out", str(tmp_path / "run")])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["model"] == "llama3" and summary["dataset"] == "mt_bench" and summary["temperature"] == 0.0
    row = summary["rows"]["ea (imported)"]
    assert row["tau"] == pytest.approx(62 / 19)  # (30 + 20 + 12) tokens over (10 + 5 + 4) steps
    assert summary["rows"]["ar"]["tau"] == pytest.approx(1.0)
    assert row["tokens_per_s"] == pytest.approx((25.0 + 24.0) / 2)
    assert row["speedup_wall"] == pytest.approx(24.5 / 9.0)  # the baseline: 50 tokens in 5 s, 12 in 1.5 s
    assert summary["imported"]["how"]["ea (imported)"] == "steps from idxs + 1, step tokens from new_tokens"

    with pytest.raises(SystemExit):  # a folder whose baseline cannot be told
        report(["import", str(tmp_path / "run"), "--out", str(tmp_path / "other")])
    assert "error:" in capsys.readouterr().err


def _answers(folder: Path, name: str, *answers: dict) -> None:
    """An answer file of Spec-Bench's layout: each answer {qid, new_tokens, wall, steps, lengths} (one turn)."""
    folder.mkdir(exist_ok=True)
    lines = []
    for a in answers:
        choice = {"index": 0, "turns": ["x"], "new_tokens": [a["new_tokens"]], "wall_time": [a["wall"]],
                  "decoding_steps": [a["steps"]], "accept_lengths": a["lengths"]}  # fmt: skip
        lines.append(json.dumps({"question_id": a["qid"], "choices": [choice], **a.get("extra", {})}))
    (folder / name).write_text("\n".join(lines) + "\n")


def _good(qid=1, **changed) -> dict:
    return {"qid": qid, "new_tokens": 9, "wall": 1.0, "steps": 4, "lengths": [3, 2, 2, 1], **changed}


@pytest.mark.parametrize(
    "bad,needles",
    [
        (dict(new_tokens=-2), ["m-graft.jsonl:1", "new_tokens -2", ">= 0"]),
        (dict(wall=0.0), ["m-graft.jsonl:1", "wall_time 0.0", "> 0"]),
        (dict(wall=float("nan")), ["wall_time nan"]),
        (dict(lengths=[9, 9, 9, 9]), ["accept_lengths commit 36 tokens, new_tokens says 9"]),
        (dict(lengths=[3, 2, 0, 1]), ["accept_lengths holds 0"]),
        (dict(qid=[1, 2]), ["m-graft.jsonl:1", "question_id [1, 2] is a list"]),
    ],
)
def test_an_import_refuses_values_that_cannot_be_true_naming_file_line_and_value(tmp_path, capsys, bad, needles):
    _answers(tmp_path / "a", "m-vanilla.jsonl", _good(steps=8, lengths=[1] * 8))
    _answers(tmp_path / "a", "m-graft.jsonl", _good(**bad))
    with pytest.raises(SystemExit) as done:
        report(["import", str(tmp_path / "a"), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert done.value.code == 2 and all(n in err for n in needles) and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


def test_an_answer_file_that_is_not_utf8_is_named(tmp_path, capsys):
    _answers(tmp_path / "a", "m-vanilla.jsonl", _good(steps=8, lengths=[1] * 8))
    (tmp_path / "a" / "m-graft.jsonl").write_bytes(
        json.dumps({"question_id": "caf\u00e9"}, ensure_ascii=False).encode("latin-1") + b"\n"
    )
    with pytest.raises(SystemExit):
        report(["import", str(tmp_path / "a"), "--out", str(tmp_path / "run")])
    assert "m-graft.jsonl: not UTF-8 text" in capsys.readouterr().err


def test_two_files_of_one_method_import_as_two_rows_named_by_their_files(tmp_path, capsys):
    """m-graft.jsonl and m-graft-float16.jsonl both read as `graft`: one of them was dropped without a word."""
    _answers(tmp_path / "a", "m-vanilla.jsonl", _good(steps=8, lengths=[1] * 8))
    _answers(tmp_path / "a", "m-graft.jsonl", _good())
    _answers(tmp_path / "a", "m-graft-float16.jsonl", _good(steps=2, lengths=[5, 4]))
    report(["import", str(tmp_path / "a"), "--out", str(tmp_path / "run")])
    rows = json.loads((tmp_path / "run" / "summary.json").read_text())["rows"]
    assert rows["graft (imported)"]["tau"] == pytest.approx(8 / 4)
    assert rows["graft-float16 (imported)"]["tau"] == pytest.approx(9 / 2)
    assert "labelled by their names" in capsys.readouterr().err


def test_a_partial_export_is_marked_in_its_answer_files_and_imports_as_partial(tiny_run, tmp_path, capsys):
    from graft.analysis.tables import method_rows
    from graft.records.reader import RecordError, run_problem

    killed = tmp_path / "killed"
    shutil.copytree(tiny_run, killed)
    summary = json.loads((killed / "summary.json").read_text())
    (killed / "summary.json").write_text(json.dumps({k: v for k, v in summary.items() if k != "complete"}))
    report(["export", "--format", "spec-bench", str(killed), str(tmp_path / "answers"), "--partial"])
    lines = [json.loads(line) for f in (tmp_path / "answers").glob("*.jsonl") for line in f.read_text().splitlines()]
    assert lines and all(line["partial"] is True for line in lines)
    report(["import", str(tmp_path / "answers"), "--out", str(tmp_path / "back")])
    assert "imported as partial" in capsys.readouterr().err
    assert run_problem(tmp_path / "back") is not None  # unfinished, as the run it came from
    with pytest.raises(RecordError, match="no finished runs"):
        method_rows([tmp_path / "back"])
    assert not method_rows([tmp_path / "back"], partial=True).empty
