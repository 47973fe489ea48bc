"""graft/load/resolve.py: every artefact a run needs is found, or named with its fetch command, before the target loads."""

import json
import os
import subprocess
import sys
import time

import huggingface_hub
import pytest
from conftest import ROOT, compose
from huggingface_hub import constants
from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError

from graft import hub
from graft.config.experiment import validate
from graft.draft_models.eagle.checkpoint import _local_dir
from graft.load import resolve as resolve_module
from graft.load.resolve import MissingArtefacts, resolve
from graft.run import runner

CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A 2-layer Llama with a word-level tokenizer, saved as a Hugging Face model folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tiny_llama")
    shape = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    LlamaForCausalLM(LlamaConfig(vocab_size=128, num_key_value_heads=2, **shape)).save_pretrained(path)
    vocab = {chr(i): i - 32 for i in range(32, 127)} | {"<unk>": 95, "</s>": 96}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", eos_token="</s>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """HF_HUB_OFFLINE=1 over an empty Hub cache; the network must not be asked."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(resolve_module, "check_access", lambda repo: pytest.fail(f"asked the Hub about {repo}"))
    monkeypatch.setattr(hub, "download_checkpoint", lambda repo: pytest.fail(f"downloaded {repo}"))
    return tmp_path / "hub"


def config(*overrides):
    return validate(compose(["logger=none", *overrides]))


def cache_repo(cache, repo: str, files: dict[str, str]):
    """A Hub cache entry for `repo` as snapshot_download leaves it (refs/main -> snapshots/<commit>/)."""
    commit = "0" * 40
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name, text in files.items():
        (snapshot / name).write_text(text)
    return snapshot


def run_cli(*args, env=None):
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "run.py", *args, "logger=none", "run.progress=false"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "WANDB_MODE": "disabled", **(env or {})},
    )
    return proc, time.perf_counter() - started


def test_a_missing_head_stops_the_cli_before_the_target_loads(tiny_checkpoint, tmp_path):
    no_head = tmp_path / "no_head"
    out = tmp_path / "out"
    args = ("model=pretrained", f"model.path={tiny_checkpoint}", "method=eagle3", f"method.head={no_head}")
    proc, seconds = run_cli(*args, f"run.out_dir={out}")
    print(f"missing head refused in {seconds:.1f} s:\n{proc.stderr}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"EAGLE head of eagle3 (method.head={no_head}): no such directory" in proc.stderr
    assert "hf download <Hub id> --include config.json --include '*.safetensors'" in proc.stderr
    assert f"--local-dir {no_head}" in proc.stderr and "pip install -U huggingface_hub" in proc.stderr
    assert "target weights" not in proc.stderr and "tokenizer (" not in proc.stderr  # those are present
    assert not (out / "run.json").exists()
    assert seconds < 30  # interpreter start and imports; the tiny target would load in under a second anyway


def test_the_run_resolves_before_load_model(tiny_checkpoint, tmp_path, monkeypatch):
    def load_model(*args, **kwargs):
        raise AssertionError("the target loaded before the missing head was reported")

    monkeypatch.setattr(runner, "load_model", load_model)
    overrides = [
        "model=pretrained",
        f"model.path={tiny_checkpoint}",
        "methods=[eagle3,dflash,pld]",
        f"method.head={tmp_path / 'no_head'}",
        f"method.checkpoint={tmp_path / 'no_drafter'}",
        f"run.out_dir={tmp_path / 'out'}",
        "logger=none",
    ]
    resolved = compose(overrides)
    with pytest.raises(MissingArtefacts) as caught:
        runner.run(validate(resolved), resolved)
    message = str(caught.value)
    assert message.startswith("2 artefact(s) this run needs are missing")
    assert "EAGLE head of eagle3" in message and "block drafter of dflash" in message


def test_hub_ids_offline_with_an_empty_cache_are_all_listed_in_one_message(tmp_path):
    args = ("model=llama31_8b", "methods=[eagle3,pruned,dflash]", "run.skip_memory_check=true")
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_CACHE": str(tmp_path / "hf_home/hub")}
    proc, seconds = run_cli(*args, f"run.out_dir={tmp_path / 'out'}", env=env)
    print(f"refused in {seconds:.1f} s:\n{proc.stderr}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    err = proc.stderr
    assert "4 artefact(s) this run needs are missing" in err
    target = "meta-llama/Llama-3.1-8B-Instruct"
    assert f"target weights (model.path={target}): not in the local Hub cache" in err
    assert f"tokenizer (model.path={target}): not in the local Hub cache" in err
    assert "EAGLE head of eagle3, pruned (method.head=yuhuili/EAGLE3-LLaMA3.1-Instruct-8B)" in err
    assert "block drafter of dflash (method.checkpoint=z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat)" in err
    assert f"hf download {target} --exclude 'original/*'" in err
    assert "hf download yuhuili/EAGLE3-LLaMA3.1-Instruct-8B --include config.json" in err
    assert "hf download z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat --include config.json" in err
    assert f"{target} is gated: accept its licence at https://huggingface.co/{target}" in err  # known gated org
    assert "hf auth login" in err and "HF_TOKEN" in err
    assert "HF_HUB_OFFLINE is set: the Hub was not contacted" in err
    assert str(tmp_path / "hf_home" / "hub") in err


class Gated(GatedRepoError):
    def __init__(self):  # the real one wants an HTTP response; what it says is all resolve reads
        Exception.__init__(self, "403 Client Error: access to this model is restricted")


def test_a_gated_repository_gets_the_login_hint(tmp_path, monkeypatch):
    for variable in hub.OFFLINE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))

    def snapshot_download(repo, local_files_only=False, **kwargs):
        if local_files_only:
            raise LocalEntryNotFoundError(f"{repo} is not cached")
        raise Gated()

    def auth_check(self, repo, **kwargs):
        raise Gated()

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(huggingface_hub.HfApi, "auth_check", auth_check)
    cfg = config("model=pretrained", "model.path=acme/gated-7b", "method=eagle3", "method.head=acme/gated-7b-eagle3")
    with pytest.raises(MissingArtefacts) as caught:
        resolve(cfg)
    message = str(caught.value)
    assert "3 artefact(s)" in message and "gated on the Hub, and this account has no access" in message
    for repo in ("acme/gated-7b", "acme/gated-7b-eagle3"):
        assert f"{repo} is gated: accept its licence at https://huggingface.co/{repo}" in message
    assert "`hf auth login` (or set HF_TOKEN" in message and "OFFLINE" not in message


def test_everything_present_resolves_without_the_network(tiny_checkpoint, offline, monkeypatch):
    cached_head = cache_repo(offline, "acme/tiny-eagle3", {"config.json": "{}", "model.safetensors": ""})
    cfg = config(
        "model=pretrained",
        f"model.path={tiny_checkpoint}",
        "methods=[eagle3,dflash,pld]",
        "method.head=acme/tiny-eagle3",
        "method.checkpoint=heads/smollm2_135m_dflash",  # shipped in the repository
    )
    found = {entry["role"]: entry["path"] for entry in resolve(cfg)}
    assert found == {
        "target weights": str(tiny_checkpoint),
        "tokenizer": str(tiny_checkpoint),
        "EAGLE head of eagle3": str(cached_head),
        "block drafter of dflash": str(ROOT / "heads" / "smollm2_135m_dflash"),
    }
    assert _local_dir("acme/tiny-eagle3") == cached_head  # the loader reads the cache: no download after the target
    assert resolve(config("model=tiny_llama", "methods=[eagle3,dflash]")) == []  # random weights need nothing


def test_incomplete_folders_say_what_they_lack(tiny_checkpoint, tmp_path, offline):
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text("{}")
    (sharded / "model-00001-of-00002.safetensors").write_text("")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    cache_repo(offline, "acme/no-weights", {"config.json": "{}"})
    cfg = config("model=pretrained", f"model.path={sharded}", "method=eagle3", "method.head=acme/no-weights")
    with pytest.raises(MissingArtefacts) as caught:
        resolve(cfg)
    message = str(caught.value)
    assert "lacks 1 of the 2 weight shards model.safetensors.index.json names (model-00002-of-00002" in message
    assert "has no tokenizer files" in message
    assert "has config.json but no weights" in message and "acme/no-weights" in message


def test_a_resolved_run_records_where_its_artefacts_came_from(tiny_checkpoint, tmp_path):
    out = tmp_path / "out"
    args = ("model=pretrained", f"model.path={tiny_checkpoint}", "method=ar", "run.num_prompts=1")
    proc, _ = run_cli(*args, "run.max_new_tokens=2", "run.warmup=false", f"run.out_dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    artefacts = json.loads((out / "run.json").read_text())["artefacts"]
    assert [(a["role"], a["path"]) for a in artefacts] == [
        ("target weights", str(tiny_checkpoint)),
        ("tokenizer", str(tiny_checkpoint)),
    ]
