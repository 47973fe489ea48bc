"""Prompt sets: `builtin`, the benchmark files (local or Hub), and long-context sets.

`load_prompts` applies, in order: the loader, `dataset.categories`, the prompt-length filters (tokens of
the first turn with the chat template, counted by the target's tokenizer), `dataset.per_category` (the
first N of each category, in the set's order), then `dataset.num_prompts`.
"""

from __future__ import annotations

import logging
import os

from graft.config.schema import DatasetConfig
from graft.data import long_context, sources
from graft.data.builtin import BUILTIN
from graft.data.prompt import DatasetError, Prompt
from graft.hub import from_cwd_or_repo

log = logging.getLogger(__name__)

__all__ = ["BUILT_WITH_TOKENIZER", "BUILTIN", "DatasetError", "Prompt", "load_prompts", "resolve_data_root"]

BUILT_WITH_TOKENIZER = ("longbench", "pg19", "long_synthetic")  # their prompts are cut to token lengths

LOADERS = {
    "builtin": lambda cfg, root, chat: list(BUILTIN),
    "question_jsonl": lambda cfg, root, chat: _question_file(cfg, root),
    "eagle": lambda cfg, root, chat: sources.eagle_questions(cfg, root),
    "mt_bench": lambda cfg, root, chat: sources.mt_bench(cfg, root),
    "humaneval": lambda cfg, root, chat: sources.humaneval(cfg, root),
    "gsm8k": lambda cfg, root, chat: sources.gsm8k(cfg, root),
    "longbench": long_context.longbench,
    "pg19": long_context.pg19,
    "long_synthetic": long_context.long_synthetic,
}


def _question_file(cfg: DatasetConfig, root: str | None) -> list[Prompt]:
    path = sources.local_file(cfg, root)
    if path is None:
        return sources.question_jsonl_from_hub_or_fail(cfg, root)
    return sources.question_jsonl(path, cfg.name)


def resolve_data_root(data_root: str | None) -> str | None:
    """$GRAFT_DATA wins; a relative root is taken from the current directory, else from the repository."""
    data_root = os.environ.get("GRAFT_DATA") or data_root
    if not data_root:
        return None
    return str(from_cwd_or_repo(data_root))


def unique_ids(prompts: list[Prompt]) -> list[Prompt]:
    """Records are keyed by prompt id (resume skips finished ids), so a repeated id would silently drop
    prompts: the second and later prompts with an id get `<id>#<n>`, the same on every run."""
    from dataclasses import replace

    seen: dict[str, int] = {}
    out = []
    for prompt in prompts:
        seen[prompt.id] = seen.get(prompt.id, 0) + 1
        out.append(prompt if seen[prompt.id] == 1 else replace(prompt, id=f"{prompt.id}#{seen[prompt.id]}"))
    return out


def load_prompts(cfg: DatasetConfig, data_root: str | None = None, chat=None) -> list[Prompt]:
    root = resolve_data_root(data_root)
    if cfg.source in BUILT_WITH_TOKENIZER and chat is None:
        raise DatasetError(f"dataset '{cfg.name}' is built with the target's tokenizer; pass a chat formatter")
    prompts = LOADERS[cfg.source](cfg, root, chat)
    if not prompts:
        raise DatasetError(f"dataset '{cfg.name}' has no prompts: its source is empty")
    prompts = unique_ids(prompts)
    if cfg.categories:
        known = sorted({p.category for p in prompts})
        unknown = [c for c in cfg.categories if c not in known]
        if unknown:
            raise DatasetError(f"dataset.categories names {unknown}; categories in '{cfg.name}': {', '.join(known)}")
        prompts = [p for p in prompts if p.category in cfg.categories]
    if (cfg.min_prompt_tokens or cfg.max_prompt_tokens) and chat is not None:
        low, high = cfg.min_prompt_tokens or 0, cfg.max_prompt_tokens or float("inf")
        prompts = [p for p in prompts if low <= len(chat.prompt_ids([{"role": "user", "content": p.turns[0]}])) <= high]
    if cfg.per_category:
        seen: dict[str, int] = {}
        kept = []
        for p in prompts:
            seen[p.category] = seen.get(p.category, 0) + 1
            if seen[p.category] <= cfg.per_category:
                kept.append(p)
        prompts = kept
    if cfg.num_prompts:
        if cfg.num_prompts > len(prompts):
            log.warning(
                "dataset.num_prompts=%d, but '%s' has %d: using %d",
                cfg.num_prompts,
                cfg.name,
                len(prompts),
                len(prompts),
            )
        prompts = prompts[: cfg.num_prompts]
    if not prompts:
        raise DatasetError(
            f"dataset '{cfg.name}': the selection is empty after filtering (categories, prompt-length limits)"
        )
    return prompts
