"""Where a model, head or drafter comes from: a local path or a Hugging Face Hub id; finding it on disk (the
directory given, one shipped in this repository, the Hub cache) and fetching a head or drafter when it is not.
Offline (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE) nothing here touches the network."""

from __future__ import annotations

import json
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# the shipped heads and drafters live in the package (graft/heads; the checkout's heads/ links there), so
# `heads/<name>` is found beside the repository or, in an installed copy, inside the package
PACKAGE = Path(__file__).resolve().parent
CHECKPOINT_FILES = ["config.json", "*.safetensors", "*.bin"]  # what a head or drafter needs from its repository
# any one of these lets AutoTokenizer build the tokenizer (fast, SentencePiece, BPE, WordPiece, Mistral's tekken)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt", "tekken.json")
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def from_cwd_or_repo(path: str) -> Path:
    """A user-given path: as given when it exists (or is absolute), else relative to the repository, where
    the shipped data, heads and cost profiles live."""
    found = Path(path).expanduser()
    return found if found.is_absolute() or found.exists() else REPO / found


def cache_root() -> Path:
    """Where this harness keeps what it builds once per machine: the converted embedded model, the native
    kernels, measured cost profiles ($GRAFT_CACHE, else ~/.cache/graft)."""
    return Path(os.environ.get("GRAFT_CACHE", Path.home() / ".cache" / "graft")).expanduser()


class Unavailable(Exception):
    """A source that cannot be had, in one sentence; `gated` when the Hub refused it for want of access."""

    def __init__(self, problem: str, gated: bool = False):
        super().__init__(problem)
        self.gated = gated


def looks_local(path: str) -> bool:
    """Hub ids are `name` or `org/name`; anything else that is not on disk was meant as a local path."""
    return path.startswith(("/", ".", "~")) or path.count("/") > 1 or "\\" in path


def offline_variable() -> str | None:
    """The variable that switched the Hub off (None: online); huggingface_hub reads its own at import only."""
    for name in OFFLINE_VARIABLES:
        if os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on"):
            return name
    from huggingface_hub import constants

    return "HF_HUB_OFFLINE" if constants.HF_HUB_OFFLINE else None


def hub_cache() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def local_path(source: str) -> Path | None:
    """`source` as a directory on disk (as given, or shipped in this repository or package); None for a Hub id."""
    path = Path(source).expanduser()
    if path.exists():
        return path
    for base in () if path.is_absolute() else (REPO, PACKAGE):
        if (base / path).is_dir():
            return base / path
    if looks_local(source):
        raise Unavailable("no such directory")
    return None


def missing_weights(directory: Path) -> str | None:
    """What a checkpoint folder lacks (config.json, weights, shards its index names), or None."""
    if not directory.is_dir():
        return "not a directory"
    if not (directory / "config.json").is_file():
        return "has no config.json: not a Hugging Face model folder"
    if not any(directory.glob("*.safetensors")) and not any(directory.glob("*.bin")):
        return "has config.json but no weights (*.safetensors or *.bin)"
    for index in directory.glob("*.index.json"):
        try:
            shards = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        except (ValueError, AttributeError, TypeError):  # torn, not UTF-8, or not an index
            return f"has {index.name}, which is not a weight index (JSON with a weight_map); a torn download?"
        absent = [s for s in shards if not (directory / s).is_file()]
        if absent:
            return (
                f"lacks {len(absent)} of the {len(shards)} weight shards {index.name} names ({', '.join(absent[:3])})"
            )
    return None


def missing_tokenizer(directory: Path) -> str | None:
    if any((directory / name).is_file() for name in TOKENIZER_FILES):
        return None
    return f"has no tokenizer files (one of {', '.join(TOKENIZER_FILES)})"


def cached_snapshot(repo: str) -> Path | None:
    """The cached snapshot folder of `repo` (its main revision), without the network; None when not cached."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:  # config.json only: which other files a complete copy holds is checked by missing_* per artefact
        return Path(snapshot_download(repo, allow_patterns=["config.json"], local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError):  # IncompleteSnapshotError included; hub_problem names a bad id
        return None


def hub_problem(err: Exception) -> Unavailable:
    """One sentence for what the Hub client raised."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    if isinstance(err, LocalEntryNotFoundError) and err.__cause__ is not None:  # the network error under it
        err = err.__cause__
    detail = (str(err).strip().splitlines() or [""])[0][:160]
    if isinstance(err, HFValidationError):
        return Unavailable(f"neither a local directory nor a valid Hub id ({detail})")
    if isinstance(err, GatedRepoError):  # a subclass of RepositoryNotFoundError: first
        return Unavailable("gated on the Hub, and this account has no access", gated=True)
    if isinstance(err, RepositoryNotFoundError):
        return Unavailable("no such repository on the Hub (or a private one this account cannot see)")
    return Unavailable(f"the Hub could not be reached ({type(err).__name__}: {detail})")


def cached_checkpoint(repo: str) -> Path | None:
    """A head's or drafter's complete copy in the Hub cache, or None."""
    cached = cached_snapshot(repo)
    return cached if cached is not None and missing_weights(cached) is None else None


def download_checkpoint(repo: str) -> Path:
    """A head's or drafter's files, downloaded now into the Hub cache (never offline)."""
    from huggingface_hub import snapshot_download

    variable = offline_variable()
    if variable:
        raise Unavailable(f"not in the local Hub cache ({hub_cache()}), and {variable} is set")
    try:
        return Path(snapshot_download(repo, allow_patterns=CHECKPOINT_FILES))
    except Exception as err:  # the Hub client raises many types; one sentence is what helps
        raise hub_problem(err) from None


def checkpoint_dir(source: str) -> Path:
    """The directory of a head or drafter named by a local path or a Hub id: the cache before the network."""
    return local_path(source) or cached_checkpoint(source) or download_checkpoint(source)
