"""Every run says what produced it (run.json's `provenance`): the code's commit and dirty flag, or the installed
version where it runs from no checkout; the libraries; the sha256 of the dataset's files; the revisions (or the
hashed configs) of its model, heads and drafters. One `git` subprocess a run at most; no git is no failure."""

import hashlib
import json
import subprocess

import pytest
from conftest import compose

from graft.config.experiment import validate
from graft.run import provenance


def test_a_tiny_run_records_its_provenance_with_one_git_call_and_export_keeps_it(tmp_path, monkeypatch):
    from graft.report.export import export
    from graft.run.runner import run

    calls = []
    real = subprocess.run

    def counted(command, *args, **kwargs):
        if command and command[0] == "git":
            calls.append(command)
        return real(command, *args, **kwargs)

    monkeypatch.setattr(provenance.subprocess, "run", counted)
    resolved = compose(["model=tiny_llama", "methods=[pld,eagle3]", "run.num_prompts=1", "run.max_new_tokens=4"])
    resolved["logger"]["name"] = "none"
    resolved["run"].update(out_dir=str(tmp_path / "run"), warmup=False, progress=False)
    run(validate(resolved), resolved)
    assert len(calls) == 1  # commit and dirty flag from one `git status`

    block = json.loads((tmp_path / "run" / "run.json").read_text())["provenance"]
    assert set(block) == {"code", "libraries", "dataset", "models"}
    code = block["code"]
    assert code["package"] == "graft-harness" and code["version"]
    assert (code["commit"] is None) == ("reason" in code)  # a checkout's commit, or why there is none
    if code["commit"] is not None:
        assert len(code["commit"]) == 40 and isinstance(code["dirty"], bool)
    import torch
    import transformers

    assert block["libraries"]["torch"] == torch.__version__
    assert block["libraries"]["transformers"] == transformers.__version__
    assert "cuda" in block["libraries"]
    assert block["dataset"]["source"] == "builtin" and len(block["dataset"]["prompts_sha256"]) == 64
    assert block["models"]["target"]["kind"] == "random"
    assert block["models"]["heads"]["random"]["kind"] == "random"
    assert block["models"]["heads"]["random"]["used_by"] == ["eagle3"]

    export(tmp_path / "run", tmp_path / "exported")  # the committed copy keeps the block
    assert json.loads((tmp_path / "exported" / "run.json").read_text())["provenance"] == block


def test_no_checkout_or_no_git_is_said_not_raised(tmp_path, monkeypatch):
    state = provenance.git_state(tmp_path)  # an installed package: no .git beside it
    assert state["commit"] is None and state["dirty"] is None and "not a git checkout" in state["reason"]
    (tmp_path / "graft").mkdir()  # a copy of the source without .git: its source is hashed, and an edit shows
    (tmp_path / "graft" / "a.py").write_text("x = 1\n")
    first = provenance.git_state(tmp_path)["source_sha256"]
    (tmp_path / "graft" / "a.py").write_text("x = 2\n")
    assert provenance.git_state(tmp_path)["source_sha256"] != first

    (tmp_path / ".git").mkdir()

    def missing(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(provenance.subprocess, "run", missing)
    assert provenance.git_state(tmp_path) == {"commit": None, "dirty": None, "reason": "git is not installed"}


def test_a_checkout_gives_its_commit_and_whether_tracked_files_changed(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    try:
        git("init", "-q")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no git here")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True)
    state = provenance.git_state(tmp_path)
    assert state == {"commit": head.stdout.strip(), "dirty": False, "changed": 0, "untracked": 0}
    (tmp_path / "new.py").write_text("")
    assert provenance.git_state(tmp_path)["dirty"] is False  # an untracked file outside the code is counted, not dirt
    (tmp_path / "a.py").write_text("x = 2\n")
    assert provenance.git_state(tmp_path) == {**state, "dirty": True, "changed": 1, "untracked": 1}
    git("checkout", "-q", "a.py")
    (tmp_path / "graft" / "configs" / "method").mkdir(parents=True)  # the README's "Adding a method": a new YAML
    (tmp_path / "graft" / "configs" / "method" / "mine.yaml").write_text("name: mine\n")
    new = provenance.git_state(tmp_path)
    assert new["dirty"] is True and new["untracked_code"] == ["graft/configs/method/mine.yaml"]


def test_dataset_files_are_hashed(tmp_path):
    questions = tmp_path / "question.jsonl"
    questions.write_text('{"question_id": 1, "category": "qa", "turns": ["Why?"]}\n')
    dataset = validate(compose(["dataset=spec_bench", f"dataset.path={tmp_path}"])).dataset
    found = provenance.dataset(dataset, None)
    (entry,) = found["files"]
    assert entry["path"] == str(questions.resolve())
    assert entry["sha256"] == hashlib.sha256(questions.read_bytes()).hexdigest()


def test_models_give_a_hub_revision_or_a_hashed_config(tmp_path):
    snapshot = tmp_path / "hub" / "models--org--head" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    assert provenance.artefact(str(snapshot)) == {
        "kind": "local",
        "path": str(snapshot.resolve()),
        "hub_id": "org/head",
        "revision": "a" * 40,
    }
    folder = tmp_path / "my_head"
    folder.mkdir()
    (folder / "config.json").write_text('{"hidden_size": 8}')
    (folder / "model.safetensors").write_bytes(b"weights")
    found = provenance.artefact(str(folder))
    assert found["revision"] is None and "reason" in found
    assert found["config_sha256"] == hashlib.sha256(b'{"hidden_size": 8}').hexdigest()
    assert found["weights_sha256"] == {"model.safetensors": hashlib.sha256(b"weights").hexdigest()}
    assert provenance.artefact("random")["kind"] == "random"


def test_a_resumed_run_keeps_the_first_provenance_and_adds_what_differs():
    first = {"code": {"commit": "a"}, "libraries": {"torch": "1"}}
    assert provenance.resumed_update({}, first) == {"provenance": first}
    assert provenance.resumed_update({"provenance": first}, first) is None
    later = {"code": {"commit": "b"}, "libraries": {"torch": "1"}}
    update = provenance.resumed_update({"provenance": first}, later)
    assert update == {"provenance_resumed": [{"code": {"commit": "b"}}]}
    assert provenance.resumed_update({"provenance": first, **update}, later) is None  # said once
