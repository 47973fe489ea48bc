"""Every artefact a run needs, found before the target loads: the target's weights and tokenizer, the EAGLE
head of every EAGLE-drafting method and the block drafter of every DFlash method. Local directories must hold
their files; Hub ids are looked up in the local Hub cache first. Online, heads and drafters (small) are
downloaded here, before the multi-GB target; the target is only checked to be reachable, as it downloads when
it loads. Offline (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE) the network is never touched: missing is missing.
Whatever is missing is reported in ONE error, each artefact with the command that fetches it."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from graft import hub
from graft.config.schema import ExperimentConfig
from graft.registry import PUBLISHED
from graft.schema import ConfigError

GATED_ORGS = ("meta-llama/",)  # gated whatever the Hub says; offline it cannot say
TARGET_EXCLUDE = ["original/*"]  # Meta's consolidated .pth copy of the weights: transformers never reads it
TOKENIZER_INCLUDE = ["tokenizer*", "*.model", "vocab.*", "merges.txt", "special_tokens_map.json", "tekken.json"]
CLI = "`hf` comes with the huggingface_hub package (pip install -U huggingface_hub)"


class MissingArtefacts(ConfigError):
    """Artefacts the run needs that are neither on disk nor obtainable; the message says how to fetch each."""


@dataclass
class Artefact:
    role: str  # what it is for, e.g. "EAGLE head of eagle3, graft"
    key: str  # the config key that names it
    source: str  # a local directory or a Hub id, as configured
    kind: str  # "weights" (config.json + weights) or "tokenizer"
    fetch_now: bool = False  # a head or drafter: downloaded here when online
    path: Path | None = None  # where it was found
    problem: str | None = None  # what is missing, when something is
    gated: bool = False

    def record(self) -> dict:
        found = str(self.path.absolute()) if self.path else f"Hub: {self.source} (downloads when the target loads)"
        return {"role": self.role, "key": self.key, "source": self.source, "path": found}


def needed(cfg: ExperimentConfig) -> list[Artefact]:
    """What the run will read from disk or the Hub; random and embedded models need nothing."""
    artefacts = []
    if cfg.model.source == "pretrained" and cfg.model.path:  # no path: load_model names the missing key
        artefacts.append(Artefact("target weights", "model.path", cfg.model.path, "weights"))
        artefacts.append(Artefact("tokenizer", "model.path", cfg.model.path, "tokenizer"))
    users: dict[tuple[str, str], list[str]] = {}  # (method key, source) -> the methods drafting with it
    for method in cfg.compared:
        for params in (method.params, *method.parts.values()):
            for key in PUBLISHED:
                source = getattr(params, key, None)
                if source not in (None, "random"):
                    users.setdefault((key, source), []).append(method.name)
    for (key, source), methods in users.items():
        what = "EAGLE head" if key == "head" else "block drafter"
        names = ", ".join(dict.fromkeys(methods))
        artefacts.append(Artefact(f"{what} of {names}", f"method.{key}", source, "weights", fetch_now=True))
    return artefacts


def missing_files(artefact: Artefact, directory: Path) -> str | None:
    return (hub.missing_weights if artefact.kind == "weights" else hub.missing_tokenizer)(directory)


def find(artefact: Artefact, reachable: dict[str, hub.Unavailable | None]) -> None:
    """Fill in where `artefact` is, or what is missing; `reachable` remembers each Hub repo's check."""
    try:
        local = hub.local_path(artefact.source)
        if local is not None:
            artefact.path, artefact.problem = local, missing_files(artefact, local)
            return
        cached = hub.cached_snapshot(artefact.source)
        lacking = missing_files(artefact, cached) if cached is not None else "not in the local Hub cache"
        if lacking is None:
            artefact.path = cached
            return
        if hub.offline_variable():  # report() names the variable once
            artefact.problem = lacking if cached is None else f"the cached copy {cached} {lacking}"
            return
        if artefact.fetch_now:
            artefact.path = hub.download_checkpoint(artefact.source)
            artefact.problem = missing_files(artefact, artefact.path)
            return
        if artefact.source not in reachable:
            reachable[artefact.source] = check_access(artefact.source)
        denied = reachable[artefact.source]
        if denied is not None:
            artefact.problem, artefact.gated = str(denied), denied.gated
    except hub.Unavailable as err:
        artefact.problem, artefact.gated = str(err), err.gated
    except Exception as err:  # e.g. a Hub id the client refuses as malformed
        artefact.problem = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"


def check_access(repo: str) -> hub.Unavailable | None:
    """Whether this account may download `repo` (the target downloads when it loads, not here)."""
    from huggingface_hub import HfApi

    try:
        HfApi().auth_check(repo)
    except Exception as err:  # the Hub client raises many types; hub_problem names them
        return hub.hub_problem(err)
    return None


def fetch_command(artefact: Artefact) -> str:
    """The command that puts `artefact` where the run looks for it."""
    local = hub.looks_local(artefact.source) or Path(artefact.source).expanduser().exists()
    repo = "<Hub id>" if local else artefact.source
    if artefact.kind == "tokenizer":
        patterns = [f"--include {shlex.quote(p)}" for p in TOKENIZER_INCLUDE]
    elif artefact.fetch_now:
        patterns = [f"--include {shlex.quote(p)}" for p in hub.CHECKPOINT_FILES]
    else:
        patterns = [f"--exclude {shlex.quote(p)}" for p in TARGET_EXCLUDE]
    command = " ".join(["hf download", repo, *patterns])
    if local:
        target = shlex.quote(str(Path(artefact.source).expanduser().absolute()))
        return f"{command} --local-dir {target}   (or set {artefact.key}=<Hub id>)"
    return command


def report(missing: list[Artefact]) -> str:
    lines = [f"{len(missing)} artefact(s) this run needs are missing; nothing was loaded:"]
    shown = set()
    for artefact in missing:
        lines.append(f"  - {artefact.role} ({artefact.key}={artefact.source}): {artefact.problem}")
        command = fetch_command(artefact)
        covered = artefact.kind == "tokenizer" and ("weights", artefact.source) in shown
        lines.append(
            "      fetch: the target weights' command above fetches it too" if covered else f"      fetch: {command}"
        )
        shown.add((artefact.kind, artefact.source))
    lines.append(f"{CLI}; without --local-dir it downloads into the Hub cache ({hub.hub_cache()}), where runs look.")
    gated = list(dict.fromkeys(a.source for a in missing if a.gated or a.source.startswith(GATED_ORGS)))
    for repo in gated:
        lines.append(
            f"{repo} is gated: accept its licence at https://huggingface.co/{repo} with your account, then log in "
            "with `hf auth login` (or set HF_TOKEN to a token from https://huggingface.co/settings/tokens)."
        )
    variable = hub.offline_variable()
    if variable:
        lines.append(
            f"{variable} is set: the Hub was not contacted. Run the commands where it can be reached (unset "
            f"{variable}), or copy the files here and pass local directories ({', '.join(sorted({a.key for a in missing}))})."
        )
    return "\n".join(lines)


def resolve(cfg: ExperimentConfig) -> list[dict]:
    """Find every artefact `cfg` needs (downloading heads and drafters when online); raise MissingArtefacts
    naming all that are missing. Returns where each was found, for run.json."""
    artefacts = needed(cfg)
    reachable: dict[str, hub.Unavailable | None] = {}
    for artefact in artefacts:
        find(artefact, reachable)
    missing = [a for a in artefacts if a.problem]
    if missing:
        raise MissingArtefacts(report(missing))
    return [a.record() for a in artefacts]
