"""The target backend interface: prefill, verify(tree), commit, embed, LM head.

A backend owns the target's weights and its key/value cache (indexed by position, as in gpt-fast):
verifying a tree writes its nodes after the committed prefix, and committing the accepted path moves
those rows down to close the gaps, so no step reallocates the cache. Hidden states are captured only
for the taps a call asks for, so the autoregressive baseline never pays for a drafter's features.

Backends: `HFBackend` (transformers' own forward, any device) and the CPU engine's `LeanBackend`
(graft/cpu/lean.py: a lean forward over the same weights). `graft.load.models.load_model` picks one from the
hardware config. A backend's `ops` (graft/ops.py) are the operations an engine may run faster.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from graft.backends.compiling import capacity_bucket
from graft.backends.padded_rows import padded_rows
from graft.backends.positional_cache import PositionalKVCache
from graft.clock import PhaseClock
from graft.ops import Ops, upload
from graft.tree import DraftTree, Topology, TreeRows, additive_mask, prefix_causal, prefix_tree_masks


@dataclass(frozen=True)
class HiddenTap:
    """A hidden state a drafter asks for: the input or the output of decoder layer `layer`, or the
    final normalised hidden state ("final", the LM head's input; `layer` is ignored)."""

    layer: int
    where: Literal["input", "output", "final"] = "input"


@dataclass
class ForwardOutput:
    logits: Tensor  # [num_positions, vocab] float32
    hidden: (
        Tensor | None
    )  # [num_positions, num_taps * hidden_size], taps concatenated in request order; None without taps
    successors: Tensor | None = None  # [num_positions, k] the top-k next tokens at each prompt position (prefill)


@dataclass
class Segment:
    """One sequence's new positions in a forward over several sequences (graft/batch.py on a ragged backend): `ids`
    written into cache slot `slot` after its `start` cached positions; they see that prefix and, through `mask`,
    each other. A tree, a decode token or a prompt chunk: no padding, so a row costs its own length."""

    slot: int
    start: int
    ids: Tensor  # [n]
    positions: Tensor  # [n]
    # additive [1, 1, n, start + n] or [n, >= start + n] (columns past start + n unread), or None: causal (a one-node
    # tree sees the whole prefix)
    mask: Tensor | None
    logits_rows: int = 0  # logits for the last this many positions only (a prompt chunk: 1); 0: every position

    @property
    def length(self) -> int:
        return self.ids.shape[0]


def tree_segments(slots: list[int], trees: list[DraftTree], *, rows: TreeRows, dtype: torch.dtype) -> list[Segment]:
    """tree_segment for several host trees (rows: their TreeRows), built together: one tensor of every node's id
    and position, one [trees, widest, columns] mask (each segment's a view: its own rows, read up to its own
    start + nodes; the columns after are never read)."""
    sizes, starts = rows.sizes, rows.cache_lens
    ids = (torch.cat([t.tokens for t in trees]) if len(trees) > 1 else trees[0].tokens).clamp_min(0)
    node_starts = upload([start for start, n in zip(starts, sizes) for _ in range(n)], ids.device)
    positions = rows.depth.to(ids.device) + node_starts  # [nodes]
    masks = _tree_masks(rows, dtype, ids.device) if max(sizes) > 1 else None
    segments = []
    for b, (slot, start, n) in enumerate(zip(slots, starts, sizes)):
        lo = rows.offsets[b]
        mask = None if n == 1 else masks[b] if n == masks[b].shape[0] else masks[b][:n]
        segments.append(Segment(slot, start, ids[lo : lo + n], positions[lo : lo + n], mask))
    return segments


def _tree_masks(rows: TreeRows, dtype: torch.dtype, device) -> tuple[Tensor, ...]:
    """Each tree's additive mask [widest, columns] (a view of one tensor): node i of tree b sees the slot's
    committed positions and, after them, its ancestors."""
    sizes, widest = rows.sizes, rows.ancestors.shape[1]
    tree_of = upload([b for b, n in enumerate(sizes) for _ in range(n)], device)
    node_of = upload([i for n in sizes for i in range(n)], device)
    ancestors = torch.zeros(len(sizes), widest, widest, dtype=torch.bool, device=device)
    ancestors[tree_of, node_of] = rows.ancestors.to(device)  # [trees, widest, widest]
    starts = upload(rows.cache_lens, device)
    return prefix_tree_masks(starts, ancestors, max(rows.cache_lens), dtype).unbind(0)


def tree_segment(slot: int, tree: DraftTree, topo: Topology, dtype: torch.dtype) -> Segment:
    """A tree's verification as a segment: every node after the slot's prefix, seeing the prefix and its ancestors."""
    ids = tree.tokens.clamp_min(0)  # an empty slot (-1) is verified as token 0, never accepted
    mask = topo.attention_mask(dtype) if tree.num_nodes > 1 else None
    return Segment(slot, topo.cache_len, ids, topo.position_ids()[0], mask)


def text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


class PromptPrefill:
    """A prompt encoded into the target's current cache one chunk (hardware.prefill_chunk positions) per
    `advance()`: TargetBackend.prefill runs every chunk at once; a batch (graft/batch.py) runs at most one
    chunk's worth of positions between two of its steps, so a newcomer stalls the others one chunk at a time."""

    def __init__(self, target, prompt_ids: list[int], taps=(), all_logits: bool = False, successors_k: int = 0):
        assert target.cache is not None, "call reset() first"
        self.target, self.length, self.taps = target, len(prompt_ids), taps
        self.all_logits, self.successors_k = all_logits, successors_k
        self.ids = upload(prompt_ids, target.input_device).unsqueeze(0)  # [1, prompt]
        self.positions = torch.arange(self.length, device=target.input_device).unsqueeze(0)
        self.chunk = target.prefill_chunk or self.length
        self.next = 0  # the first prompt position not encoded yet
        self.parts: list[ForwardOutput] = []
        self.successors: list[Tensor] = []

    @property
    def done(self) -> bool:
        return self.next >= self.length

    @torch.inference_mode()
    def advance(self, limit: int | None = None) -> int:
        """Encode the next chunk, after the cached prefix, at most `limit` positions of it; returns how many."""
        chunk = self.segment(0, limit)
        part = self.target._run(
            chunk.ids.unsqueeze(0), chunk.positions.unsqueeze(0), chunk.mask, self.taps, chunk.logits_rows
        )
        return self.take(part, chunk.length)

    def segment(self, slot: int, limit: int | None = None) -> Segment:
        """The next chunk (at most `limit` positions) as a segment of cache slot `slot`: a ragged batch runs it in
        its step's forward (graft/batch.py); `take` its output afterwards."""
        lo = self.next
        hi = min(lo + self.chunk, self.length, lo + limit if limit is not None else self.length)
        # later chunks see the cached prefix (compact: no mask, the attention is causal over the cache)
        mask = None if lo == 0 or self.target._compact() else self.target._chunk_mask(hi - lo, lo)
        keep = 0 if self.all_logits or self.successors_k else 1  # else only the last chunk's last logits are used
        return Segment(slot, lo, self.ids[0, lo:hi], self.positions[0, lo:hi], mask, logits_rows=keep)

    def take(self, part: ForwardOutput, encoded: int) -> int:
        """A chunk's forward output, `encoded` positions of the prompt; returns `encoded`."""
        if self.successors_k:
            self.successors.append(part.logits.topk(self.successors_k, dim=-1).indices)  # [chunk, k]
            if not self.all_logits:
                part.logits = part.logits[-1:]
        self.parts.append(part)
        self.next += encoded
        return encoded

    def output(self) -> ForwardOutput:
        """What the whole prompt's prefill gives, once every chunk ran."""
        target, parts = self.target, self.parts
        out = ForwardOutput(
            logits=torch.cat([p.logits for p in parts]) if self.all_logits else parts[-1].logits,
            hidden=None if parts[0].hidden is None else torch.cat([p.hidden for p in parts]),
            successors=torch.cat(self.successors) if self.successors_k else None,
        )
        if target.cache_len != self.length:
            # a model that ignores the cache argument (a transformers release that renamed it) would
            # otherwise fail later, at the first verify, with a shape error that names nothing
            raise RuntimeError(
                f"{target.name}: after prefilling {self.length} tokens the KV cache holds {target.cache_len}; "
                f"the model ignored the cache it was given ({target._cache_hint()})"
            )
        return out


class TargetBackend(ABC):
    """A causal LM seen as: reset(capacity), prefill(prompt), verify(tree), commit(path); embed, lm_head."""

    # whether forward_segments runs: several sequences' trees and prompt chunks in one forward, each row over its
    # own cache slot, no padding (the CPU engine); else a batch verifies padded rows (verify_rows)
    ragged_rows = False
    # whether the forward's attention takes compact masks (graft/layers.py: grouped_sdpa): a tree's [n, n] block with
    # the committed prefix seen unmasked, and no mask for a prompt chunk (causal), instead of [n, S] masks
    compact_masks = False

    def __init__(self, model, tokenizer, name: str = "target"):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.config = text_config(model.config)
        self.num_layers: int = self.config.num_hidden_layers
        self.hidden_size: int = self.config.hidden_size
        self.vocab_size: int = self.config.vocab_size
        self.max_context: int = int(getattr(self.config, "max_position_embeddings", 4096))
        self._embed = model.get_input_embeddings()
        self._lm_head = model.get_output_embeddings()
        # Sharded over several GPUs (device_map), the layers sit on cuda:0..k and the LM head on the last.
        # Drafting happens where the logits appear: trees, draft heads, taps and acceptance all live on the
        # LM head's device (`device`); token ids are moved to the embeddings' (`input_device`).
        self.input_device = self._embed.weight.device
        self.device = self._lm_head.weight.device
        self._drafting_table: Tensor | None = None  # sharded: the embeddings on `device` (drafting_embeddings)
        self.dtype = self._lm_head.weight.dtype
        self.cache_dtype = self.dtype  # the key/value cache's (hardware.cache_dtype; the CPU engine may narrow it)
        self.cache: PositionalKVCache | None = None
        # how the decode loop times its phases (graft/clock.py, hardware.timing): "host", "events" or "sync"
        self.timing = "host"
        # prompt positions per prefill forward (hardware.prefill_chunk): long prompts are encoded in chunks so
        # that no [prompt, prompt] mask or score matrix is built; None encodes the prompt in one forward
        self.prefill_chunk: int | None = None
        # fixed-size trees (hardware.fixed_size_trees): empty slots carry token -1, never accepted
        self.fixed_size_trees = False
        self.tree_bucket = 8  # hardware.tree_bucket: pruned fixed-size trees are verified in buckets of this many
        # hardware.compile: the verify (and decode) forward compiled by torch.compile over a static cache, whose
        # shapes stay fixed for a sequence; "reduce-overhead" replays it as a CUDA graph. None: eager.
        self.compile_mode: str | None = None
        self.compile_backend = "inductor"
        self._compiled = None
        # static caches: positions added to every capacity asked for, so that a drafter proposing small trees
        # (AR: one node) gets the bucket of the largest drafter its run compares, and the two share one buffer
        # (graft/run/conversation.py: sized_for_largest); decode asks for the drafter's own max_nodes
        self.spare_nodes = 0
        self.attention = "unknown"  # which attention kernel the forward uses, for run.json
        self.kernels: dict | None = None  # which product kernels the forward chose, for run.json
        self.devices = sorted({p.device for p in model.parameters()}, key=str)
        self.ops = Ops()  # plain torch; an engine's backend sets its own
        self.full_masks = False  # [n, S] masks even where compact ones would do (to compare: graft/bench/memory.py)

    def phase_clock(self) -> PhaseClock:
        return PhaseClock(self.devices, self.timing, self.device)

    @property
    def sync_timing(self) -> bool:
        return self.timing == "sync"

    @sync_timing.setter
    def sync_timing(self, value: bool) -> None:
        self.timing = "sync" if value else "host"

    # --- what drafters may use --------------------------------------------------------------
    def embed(self, ids: Tensor) -> Tensor:
        """Token embeddings [..., hidden] of the target (drafters share them), on the drafting device."""
        if self.input_device == self.device or type(self._embed) is not torch.nn.Embedding:
            return self._embed(ids.to(self.input_device)).to(self.device)
        return torch.nn.functional.embedding(ids.to(self.device), self.drafting_embeddings())

    def drafting_embeddings(self) -> Tensor:
        """A copy of the embedding table on the LM head's device, made once: drafting embeds there at every
        level without sending ids to the first GPU and the embeddings back (graft/plan/memory.py plans the copy)."""
        if self._drafting_table is None:
            self._drafting_table = self._embed.weight.detach().to(self.device)
        return self._drafting_table

    def lm_head(self, hidden: Tensor) -> Tensor:
        """The target's LM head over final hidden states -> logits (EAGLE-1 heads share it)."""
        return self._lm_head(hidden.to(self.device))

    def check_taps(self, taps: tuple[HiddenTap, ...]) -> None:
        for tap in taps:
            if tap.where != "final" and not 0 <= tap.layer < self.num_layers:
                raise ValueError(f"hidden tap on layer {tap.layer}, but the target has layers 0..{self.num_layers - 1}")

    # --- the sequence -----------------------------------------------------------------------
    @property
    def cache_len(self) -> int:
        return 0 if self.cache is None else self.cache.layers[0].length

    def reset(self, capacity: int) -> None:
        """Start a new sequence with room for `capacity` positions (the cache grows if exceeded). A static
        cache (hardware.compile) is sized in buckets and kept while its bucket fits: a compiled graph is
        specialised to the cache's shape, so sequences of one bucket reuse one graph (and, for CUDA graphs,
        the same buffers)."""
        static = self.compile_mode is not None
        if not static:
            self.cache = PositionalKVCache(self.num_layers, capacity, ops=self.ops, dtype=self.cache_dtype)
            return
        capacity = capacity_bucket(capacity + self.spare_nodes)
        if self.cache is not None and self.cache.static and self.cache.capacity == capacity:
            self.cache.keep(0, None, 0)
        else:
            self.cache = PositionalKVCache(self.num_layers, capacity, static=True, ops=self.ops)

    @torch.inference_mode()
    def prefill(
        self, prompt_ids: list[int], taps: tuple[HiddenTap, ...] = (), all_logits: bool = False, successors_k: int = 0
    ) -> ForwardOutput:
        """Encode the prompt into the cache; logits for the last position (every position with
        `all_logits`), the `taps` hidden states for all positions, and with `successors_k` the top-k
        next tokens at every position (taken chunk by chunk, so no [prompt, vocab] logits are kept)."""
        run = PromptPrefill(self, prompt_ids, taps, all_logits, successors_k)
        while not run.done:
            run.advance()
        return run.output()

    def _compact(self) -> bool:
        """Compact masks for this forward; a static cache keeps [n, capacity] masks that hide its unfilled slots."""
        return self.compact_masks and not self.full_masks and not self.cache.static

    def _chunk_mask(self, n: int, start: int) -> Tensor:
        """[1, 1, n, start + n] additive: a prompt chunk sees the cached prefix and is causal within itself."""
        return additive_mask(prefix_causal(n, start, self.device), self.dtype)

    def _cache_hint(self) -> str:
        return "check the transformers version"

    @torch.inference_mode()
    def verify(self, tree: DraftTree, topo: Topology, taps: tuple[HiddenTap, ...] = ()) -> ForwardOutput:
        """One forward over every tree node, each seeing the cache and its ancestors; the nodes stay in the
        cache until `commit`."""
        ids = tree.tokens.clamp_min(0).unsqueeze(0)  # an empty slot (-1) is verified as token 0, never accepted
        # fixed-size trees (and one-token steps) reuse one compiled graph; other sizes would each compile anew
        compiled = self.fixed_size_trees or ids.shape[1] == 1
        if not self._compact():
            mask = topo.attention_mask(self.dtype)
        else:  # the tree's own block; a lone root sees the whole cache, no mask at all
            mask = topo.tree_mask(self.dtype) if ids.shape[1] > 1 else None
        return self._run(ids, topo.position_ids(), mask, taps, compiled=compiled)

    @torch.inference_mode()
    def verify_rows(
        self, slots, first: int, trees: list[DraftTree], topos: list[Topology], taps=(), width: int | None = None
    ) -> list[ForwardOutput]:
        """One forward over the trees of slots first .. first + len(trees) - 1 of `slots` (graft/backends/slots.py),
        each tree after its own slot's committed prefix and seeing only that prefix and its ancestors. Trees are
        padded to `width` (default: the longest): a padding position is token 0 seeing position 0 alone, written
        past its slot's length, where the next commit or forward overwrites it. Each tree's logits and taps, as
        verify() gives."""
        if len(self.devices) > 1:
            raise ValueError("a batch verifies on one device (not sharded)")
        if self.ragged_rows:  # each tree at its own size: no padding to `width`
            segments = [
                tree_segment(first + row, tree, topo, self.dtype) for row, (tree, topo) in enumerate(zip(trees, topos))
            ]
            return self.forward_segments(slots, segments, taps)
        width, capacity = max([width or 0, *(tree.num_nodes for tree in trees)]), slots.capacity
        for row, topo in enumerate(topos):
            if topo.cache_len + width > capacity:
                raise RuntimeError(f"slot {first + row}: {topo.cache_len} + {width} positions exceed its {capacity}")
        ids, positions, mask, starts = padded_rows(
            trees, topos, width=width, capacity=capacity, dtype=self.dtype, device=self.device
        )
        ids, positions = ids.to(self.input_device), positions.to(self.input_device)
        cache = slots.rows(first, starts)
        # compiled (hardware.compile): the rows' starts are device tensors, so new starts reuse a bucket's graph
        logits, hidden = self._forward_rows(ids, positions, mask, taps, cache, compiled=self.compile_mode is not None)
        return [
            ForwardOutput(
                logits=logits[row, : tree.num_nodes], hidden=None if hidden is None else hidden[row, : tree.num_nodes]
            )
            for row, tree in enumerate(trees)
        ]

    def forward_segments(self, slots, segments: list[Segment], taps=()) -> list[ForwardOutput]:
        """One forward over several sequences' segments (a ragged backend: `ragged_rows`), each written into its
        slot of `slots` (graft/backends/slots.py) after its start; each segment's logits (its `logits_rows` last)
        and taps, as verify() and prefill() give them."""
        raise ValueError(f"{type(self).__name__} verifies a batch as padded rows (verify_rows), not segments")

    def _forward_rows(self, ids, positions, mask, taps, cache, compiled: bool = False) -> tuple[Tensor, Tensor | None]:
        """ids, positions [rows, n]; mask [rows, 1, n, capacity] additive; `cache` the rows' (RowsKVCache);
        `compiled`: through the compiled module. Logits [rows, n, vocab] float32 and taps [rows, n, taps * hidden]
        (None without taps)."""
        raise ValueError(
            f"{type(self).__name__} verifies one sequence at a time; run.batch_size > 1 needs the transformers "
            "forward (hardware.fast_path=none)"
        )

    def _run(self, ids, positions, mask, taps, logits_to_keep: int = 0, compiled: bool = False) -> ForwardOutput:
        """One forward; over a static cache the mask covers every slot (the unfilled ones hidden) and the
        verify forward goes through the compiled module, the prefill's variable chunks stay eager."""
        if not self.cache.static:
            return self._forward(ids, positions, mask, taps, logits_to_keep)
        n, start = ids.shape[1], self.cache_len
        self.cache.reserve(start + n)
        if mask is None:
            mask = self._chunk_mask(n, start)
        hidden_slots = self.cache.capacity - mask.shape[-1]
        mask = torch.nn.functional.pad(mask, (0, hidden_slots), value=torch.finfo(mask.dtype).min)
        out = self._forward(ids, positions, mask, taps, logits_to_keep, compiled=compiled)
        self.cache.advance(n)
        return out

    def _compiled_module(self):
        """The compiled module (hardware.compile), made on its first use: the verify forward's and a batch's
        padded rows' one torch.compile, a graph per shape."""
        if self._compiled is None:
            self._compiled = self._compile()
        return self._compiled

    def _compile(self):
        """The module the compiled forward calls (backends that support hardware.compile override this)."""
        raise ValueError(f"hardware.compile is not supported by {type(self).__name__}")

    @torch.inference_mode()
    def commit(self, committed_len: int, path: list[int], path_index: Tensor | None = None) -> None:
        """Keep the cache up to `committed_len` plus the verified nodes on `path` (root first).

        `path_index` is the same path already on the device, which saves a host-to-device copy."""
        if path == list(range(len(path))):
            rows = None
        else:
            rows = path_index if path_index is not None else torch.tensor(path, dtype=torch.long, device=self.device)
        self.cache.keep(committed_len, rows, len(path))

    @abstractmethod
    def _forward(
        self, ids: Tensor, positions: Tensor, mask: Tensor | None, taps, logits_to_keep: int = 0, compiled: bool = False
    ) -> ForwardOutput:
        """ids, positions [1, n]; mask [1, 1, n, cache + n] additive or None (causal), [1, 1, n, capacity] over a
        static cache, [1, 1, n, n] with compact masks (the cache before the n new positions seen unmasked); `compiled`: through the compiled module (hardware.compile)."""


def concat_taps(captured: dict, taps: tuple[HiddenTap, ...], device: torch.device) -> Tensor | None:
    """[n, taps * hidden] in request order on `device` (taps of a sharded model come from several GPUs),
    or None when nothing was asked for."""
    if not taps:
        return None
    return torch.cat([captured[tap][0].to(device, non_blocking=True) for tap in taps], dim=-1)
