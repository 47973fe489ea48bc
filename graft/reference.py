"""The Graft step written straight, for a reader to start from: greedy, one sequence, on the host, no registry
and no fixed-size path. Each step, as arXiv 2605.20104 states it:

1. draft:    the EAGLE-3 head expands the tree level by level (top-k children of every frontier node, the global
             top-k by cumulative log-probability as the next frontier);
2. prune:    at checkpoints after 0, 1 and 5 levels, the first whose frontier confidence exp(best score) falls
             below its threshold stops drafting and keeps only its share of the budget (8 / 24 / 40 of 60);
3. retrieve: a static rank template rooted at the current token reads the Token-Recycling successor table;
4. graft:    the retrieved nodes join at the root in the room the draft left (a node whose path the draft already
             holds merges and frees its slot);
5. verify and accept: one target forward over the united tree; the longest path the target's argmax agrees with,
             plus its bonus token, is committed; the head encodes it and the table learns every verified node.

`method=graft` computes the same trees and tokens through the composed parts (graft/compose.py), also batched
and on GPUs; tests/core/test_reference.py checks that, step by step.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from graft.backends.target import HiddenTap
from graft.retrieval.recycling import DEFAULT_RANK_PRIOR
from graft.tree import DraftTree, NodeSource, RankTree, additive_mask, prefix_causal, topology

if TYPE_CHECKING:
    from graft.backends.target import TargetBackend
    from graft.draft_models.eagle.head import DraftHead


@dataclass(frozen=True)
class GraftSettings:
    """configs/method/graft.yaml's values (its defaults chain: eagle3, pruned)."""

    budget: int = 60  # nodes verified per step, the root included (method.total_tokens)
    depth: int = 7
    top_k: int = 10
    checkpoints: tuple[int, ...] = (0, 1, 5)  # expansion levels done at each confidence check
    thresholds: tuple[float, ...] = (0.35, 0.25, 0.15)
    draft_tokens: tuple[int, ...] = (8, 24, 40)  # nodes the draft keeps when that check fires (root included) ...
    reference_budget: int = 60  # ... of this budget, scaled to `budget`
    table_k: int = 8  # successors per token in the table
    template_depth: int = 8


@torch.inference_mode()
def generate_graft(target: TargetBackend, head: DraftHead, prompt: list[int], *, max_new_tokens: int, stop_ids,
                   settings: GraftSettings = GraftSettings()) -> tuple[list[int], list[tuple[list, list]]]:  # fmt: skip
    """Greedy decoding with Graft -> (new tokens, each step's verified tree as (tokens, parents))."""
    s, embed, ops = settings, head.embedder(target.embed), target.ops
    taps = tuple(HiddenTap(layer, "input") for layer in head.cfg.layer_ids)  # three target layers feed the head
    target.reset(capacity=len(prompt) + max_new_tokens + s.budget + 8)
    prefill = target.prefill(prompt, taps)
    new = [int(prefill.logits[-1].argmax(-1))]
    cache = head.new_cache(len(prompt) + 1 + 512)
    last = encode(head, cache, embed(torch.tensor(prompt[1:] + new)), prefill.hidden)  # pairs (token t+1, feature t)
    table = {a: [b] + [-1] * (s.table_k - 1) for a, b in zip(prompt, prompt[1:])}  # cold start: the prompt's bigrams
    table[prompt[-1]] = ops.top_k_rows(prefill.logits[-1:], s.table_k)[1][0].tolist()
    template = RankTree.best_first(s.budget, DEFAULT_RANK_PRIOR[: s.table_k], s.template_depth)
    trees = []
    while new[-1] not in stop_ids and len(new) < max_new_tokens:
        tokens, parents = draft_and_prune(head, embed, cache, last, root=new[-1], settings=s)
        tokens, parents = graft_at_root(tokens, parents, read(table, template, new[-1]), room=s.budget - len(tokens))
        trees.append((tokens, parents))
        committed = target.cache_len
        tree = DraftTree.build(torch.tensor(tokens), torch.tensor(parents), NodeSource.DRAFT)
        forward = target.verify(tree, topology(tree.parents, committed, host=True), taps)
        best = ops.top_k_rows(forward.logits, 1)[1][:, 0].tolist()  # the target's token after each node
        path = accepted_path(tokens, parents, best)
        target.commit(committed, path)
        step_tokens = [tokens[i] for i in path[1:]] + [best[path[-1]]]
        last = encode(head, cache, embed(torch.tensor(step_tokens)), forward.hidden[path])
        successors = ops.top_k_rows(forward.logits, s.table_k)[1].tolist()
        for i in sorted(
            range(len(tokens)), key=lambda i: (i in path, i)
        ):  # an accepted node's row wins, then the later
            table[tokens[i]] = successors[i]
        for token in step_tokens[: max_new_tokens - len(new)]:
            new.append(token)
            if token in stop_ids:
                break
    return new, trees


def encode(head: DraftHead, cache, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """The head over n new (token, target feature) pairs after its cache, causal -> its output at the last [H]."""
    n, start = embeds.shape[0], cache.length
    mask = additive_mask(prefix_causal(n, start), head.fc.weight.dtype) if n > 1 else None
    return head.step(embeds, features, torch.arange(start, start + n), mask, cache)[-1]


def draft_and_prune(head: DraftHead, embed, cache, last: torch.Tensor, *, root: int, settings: GraftSettings):
    """EAGLE-3's dynamic tree, stopped at the first confidence checkpoint that fires -> (tokens, parents): the
    best-scoring candidates the split keeps, in candidate order (parents first)."""
    s, k, committed = settings, settings.top_k, cache.length
    values, ids, d2t = head.top_log_probs(last[None], k)
    to_target = (lambda i: i + d2t[i]) if d2t is not None else (lambda i: i)  # noqa: E731  a head's own vocabulary
    scores, frontier, hidden = values[0], to_target(ids[0]), last.expand(k, -1)  # [k] each; [k, H]
    candidates, candidate_scores, parent_of = [frontier], [scores], [0] * k  # parent: 0 the root, else 1 + candidate
    flat, sees = torch.arange(k), torch.eye(k, dtype=torch.bool)  # each frontier node's candidate; its tree entries
    keep = s.budget
    for level in range(s.depth):
        if level in s.checkpoints:
            check = s.checkpoints.index(level)
            if math.exp(float(scores.max())) < s.thresholds[check]:  # unsure: stop, keep this check's share
                share = round(s.draft_tokens[check] * s.budget / s.reference_budget)
                keep = min(s.budget, max(2, share))
                break
        allowed = torch.cat([torch.ones(k, committed, dtype=torch.bool), sees], 1)  # the sequence and its ancestors
        positions = torch.full((k,), committed + level)
        out = head.step(embed(frontier), hidden, positions, additive_mask(allowed, head.fc.weight.dtype), cache)
        values, ids, _ = head.top_log_probs(out, k)  # [k, k]
        cumulative = (values + scores[:, None]).view(-1)  # [k * k]
        order = torch.sort(cumulative, descending=True, stable=True).indices[:k]  # ties: the earlier first
        candidates.append(to_target(ids.view(-1)))
        candidate_scores.append(cumulative)
        parent_of += [1 + f for f in flat.tolist() for _ in range(k)]
        scores, frontier, hidden = cumulative[order], to_target(ids.view(-1))[order], out[order // k]
        flat = order + k + level * k * k
        sees = torch.cat([sees[order // k], torch.eye(k, dtype=torch.bool)], 1)
    cache.keep(committed, None, 0)  # the tree levels were scratch
    every, tokens = torch.cat(candidate_scores), torch.cat(candidates)
    chosen = sorted(torch.sort(every, descending=True, stable=True).indices[: min(keep - 1, len(every))].tolist())
    parents = [0 if parent_of[c] == 0 else bisect.bisect_left(chosen, parent_of[c] - 1) + 1 for c in chosen]
    return [root] + tokens[chosen].tolist(), [-1] + parents


def read(table: dict, template: RankTree, anchor: int) -> tuple[list[int], list[int]]:
    """The template rooted at `anchor`: node i takes the rank-i successor of its parent's token (-1: unknown)."""
    tokens, parents, ranks = [anchor], template.parents.tolist(), template.ranks.tolist()
    for i in range(1, len(parents)):
        above = tokens[parents[i]]
        tokens.append(table.get(above, [-1] * (ranks[i] + 1))[ranks[i]] if above >= 0 else -1)
    return tokens, parents


def graft_at_root(tokens: list[int], parents: list[int], retrieved: tuple[list, list], *, room: int):
    """The retrieved subtree joined at the root, in its order, within `room` new nodes. A retrieved node whose
    path from the root spells a draft node's path is that node; an unknown one is skipped with its subtree."""
    paths, node_at = [(tokens[0],)], {}
    for i in range(1, len(tokens)):
        paths.append(paths[parents[i]] + (tokens[i],))
        node_at.setdefault(paths[i], i)
    r_tokens, r_parents = retrieved
    r_paths, place = [paths[0]], [0]  # each retrieved node's path and its node in the united tree (-1: none)
    tokens, parents = list(tokens), list(parents)
    for i in range(1, len(r_tokens)):
        r_paths.append(r_paths[r_parents[i]] + (r_tokens[i],))
        if r_tokens[i] < 0 or place[r_parents[i]] < 0:  # unknown, or below a node not in the tree
            place.append(-1)
        elif r_paths[i] in node_at:
            place.append(node_at[r_paths[i]])
        elif room > 0:
            place.append(len(tokens))
            tokens.append(r_tokens[i])
            parents.append(place[r_parents[i]])
            room -= 1
        else:
            place.append(-1)
    return tokens, parents


def accepted_path(tokens: list[int], parents: list[int], best: list[int]) -> list[int]:
    """The deepest node whose every token equals the target's argmax after its parent (the lowest index of equally
    deep ones), and its ancestors, root first."""
    depth, agrees, deepest = [0] * len(tokens), [True] + [False] * (len(tokens) - 1), 0
    for i in range(1, len(tokens)):
        depth[i] = depth[parents[i]] + 1
        agrees[i] = agrees[parents[i]] and tokens[i] == best[parents[i]]
        if agrees[i] and depth[i] > depth[deepest]:
            deepest = i
    path = [deepest]
    while path[-1] != 0:
        path.append(parents[path[-1]])
    return path[::-1]
