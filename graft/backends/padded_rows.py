"""The inputs of one padded verification over a batch's trees (TargetBackend.verify_rows, the transformers forward):
ids and positions [rows, width] and an additive mask [rows, 1, width, capacity], built from every tree at once on
the device. Each row's start (its slot's committed length) is a device tensor, so neither the mask's construction
nor the cache's writes read a host value per row: one graph serves every start (hardware.compile at B > 1)."""

from __future__ import annotations

import torch
from torch import Tensor

from graft.ops import upload
from graft.tree import DraftTree, Topology


def padded_rows(
    trees: list[DraftTree], topos: list[Topology], *, width: int, capacity: int, dtype: torch.dtype, device
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(ids, positions [rows, width] int64; mask [rows, 1, width, capacity] additive in `dtype`; starts [rows]).
    Row r holds tree r's nodes, then padding: token 0 at position 0 seeing position 0 alone (a row of -inf would be
    NaN), written past its slot's length, where the next commit or forward overwrites it. A node sees its slot's
    committed prefix (columns below its start) and its ancestors (columns start + j), nothing else."""
    starts = upload([topo.cache_len for topo in topos], device)  # [rows]: one copy up of host lengths
    tokens = torch.stack([_padded(tree.tokens.clamp_min(0), width) for tree in trees])  # [rows, width]
    depth = torch.stack([_padded(topo.depth, width) for topo in topos])  # [rows, width]
    ancestors = torch.stack([_padded(_padded(topo.ancestors, width), width, dim=0) for topo in topos])
    real = torch.stack([_padded(torch.ones_like(tree.tokens, dtype=torch.bool), width) for tree in trees])
    columns = torch.arange(capacity, device=device)  # [capacity]
    offset = columns[None, :] - starts[:, None]  # [rows, capacity]: a column's node index within the row's tree
    in_tree = (offset >= 0) & (offset < width)
    index = offset.clamp(0, width - 1)[:, None, :].expand(-1, width, -1)  # [rows, width, capacity]
    sees_node = ancestors.gather(2, index) & in_tree[:, None, :]
    allowed = (offset < 0)[:, None, :] | sees_node  # the committed prefix, then the row's ancestors
    allowed = torch.where(real[:, :, None], allowed, columns == 0)  # padding sees position 0 alone
    mask = torch.where(allowed, 0.0, torch.finfo(dtype).min).to(dtype)[:, None]
    positions = torch.where(real, depth + starts[:, None], 0)
    return tokens, positions, mask, starts


def _padded(x: Tensor, width: int, dim: int = -1) -> Tensor:
    """x with zeros (False) after its entries along `dim`, to `width`."""
    missing = width - x.shape[dim]
    if missing == 0:
        return x
    pad = [0, missing] if dim == -1 else [0, 0, 0, missing]
    return torch.nn.functional.pad(x, pad)
