"""Which drafted tokens the target keeps.

Words used throughout:
- *accepted* tokens are draft nodes the target agrees with, along one root-to-node path;
- the *bonus* token is the target's own token after the deepest accepted node (under greedy decoding the
  argmax there; under sampling a draw from the residual distribution, which is the *recovered* token when
  a draft was rejected). Every step commits accepted + 1 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from graft.ops import PLAIN, Ops, read_back
from graft.tree import DraftTree, Topology


@dataclass
class Acceptance:
    path: list[int]  # node indices from the root to the deepest accepted node (root included)
    tokens: list[int]  # committed this step: the accepted nodes' tokens, then the bonus token
    path_index: Tensor | None = None  # [len(path)] the same indices on the target's device (no copy back)
    token_ids: Tensor | None = None  # [len(tokens)] the committed tokens on the target's device

    @property
    def num_accepted(self) -> int:
        return len(self.tokens) - 1

    @property
    def index(self) -> Tensor | list[int]:
        """The path for indexing verification outputs: on the device when acceptance left it there."""
        return self.path_index if self.path_index is not None else self.path


def accept(
    trees: list[DraftTree],
    topologies: list[Topology],
    logits: list[Tensor],
    *,
    temperature: float = 0.0,
    top_p: float = 1.0,
    generators: list | None = None,
    ops: Ops = PLAIN,
) -> list[Acceptance]:
    """Which drafted tokens the target keeps, for every tree one step verified (one tree at batch 1): the entry
    point both decoding loops call. logits[i]: [trees[i].num_nodes, vocab]; temperature 0 is greedy
    (accept_greedy's rule), otherwise accept_sampling's, each tree drawing from its own generator.

    On the host, greedy acceptance takes one argmax over every tree's rows and walks each tree in Python; on a
    device every decision stays there until one packed copy for the whole step (its one host sync)."""
    generators = generators or [None] * len(trees)
    on_host = ops.on_host(logits[0])
    if temperature <= 0 and on_host:
        return [_accept_walk(*lists) for lists in _host_lists(trees, logits, ops)]
    if temperature <= 0:
        return read_accepted([greedy_pending(t, a, rows, ops) for t, a, rows in zip(trees, topologies, logits)])
    if on_host:
        return [accept_sampling(t, rows, temperature, top_p, g) for t, rows, g in zip(trees, logits, generators)]
    decided = [
        sampling_pending(t, a, rows, temperature, top_p, g)
        for t, a, rows, g in zip(trees, topologies, logits, generators)
    ]
    return read_accepted(decided)


def _host_lists(trees: list[DraftTree], logits: list[Tensor], ops: Ops) -> list[tuple[list, list, list]]:
    """Per tree (tokens, parents, the target's argmax after each node) as host lists, in one read: one top-1 pass
    over every tree's rows where the logits blocks are consecutive rows of one tensor (a ragged forward's
    segments), else one pass per block."""
    joined = joined_rows(logits)
    if joined is not None:
        best = [ops.top_k_rows(joined, 1)[1][:, 0]]
    else:
        best = [ops.top_k_rows(block, 1)[1][:, 0] for block in logits]
    every = torch.cat([*best, *(t.tokens for t in trees), *(t.parents for t in trees)]).tolist()
    sizes = [t.num_nodes for t in trees]
    out, first, total = [], 0, sum(sizes)
    for n in sizes:
        at = (total + first, 2 * total + first, first)  # tokens, parents, argmax
        out.append(tuple(every[lo : lo + n] for lo in at))
        first += n
    return out


def joined_rows(blocks: list[Tensor]) -> Tensor | None:
    """The blocks [n_b, ...] as one [sum n_b, ...] view where each starts where the previous ends in one
    storage (a ragged forward's segments), else None: no copy either way."""
    first = blocks[0]
    if len(blocks) == 1:
        return first
    adjacent = all(block.is_contiguous() for block in blocks) and all(
        later.data_ptr() == earlier.data_ptr() + earlier.numel() * earlier.element_size()
        and later.shape[1:] == earlier.shape[1:]
        for earlier, later in zip(blocks, blocks[1:])
    )
    rows = sum(block.shape[0] for block in blocks)
    return first.as_strided((rows, *first.shape[1:]), first.stride()) if adjacent else None


def accept_greedy(tree: DraftTree, attn: Topology, logits: Tensor, ops: Ops = PLAIN) -> Acceptance:
    """Longest root path whose every token equals the target's argmax after its parent, plus the bonus; of
    equally deep paths the one ending at the lowest node index.

    logits: [num_nodes, vocab], row i is the target's prediction after node i's path. On a GPU everything
    stays on the device until one packed copy to the host, the step's only sync; where `ops` takes host paths
    on a CPU the few nodes are walked in Python, where a dozen tiny tensor ops cost more than the walk.
    """
    if tree.num_nodes > 1 and ops.on_host(logits):
        return _accept_walk(*_host_lists([tree], [logits], ops)[0])
    if tree.num_nodes > 1:
        return greedy_pending(tree, attn, logits, ops).read()
    best = ops.top_k_rows(logits, 1)[1][:, 0]  # [1] the target's argmax
    root = torch.zeros(1, dtype=torch.long, device=best.device)  # made on the device: no copy up
    return Acceptance(path=[0], tokens=read_back(best), path_index=root, token_ids=best)


def greedy_pending(tree: DraftTree, attn: Topology, logits: Tensor, ops: Ops = PLAIN) -> "PendingAcceptance":
    """accept_greedy's decision left on the device (`read_accepted` reads a batch of them in one copy)."""
    best = ops.top_k_rows(logits, 1)[1][:, 0]  # [num_nodes] the target's argmax after each node
    correct = torch.ones_like(best, dtype=torch.bool)  # [num_nodes]
    correct[1:] = tree.tokens[1:] == best[tree.parents[1:]]
    return _pending(tree, attn, correct, lambda deepest: best.index_select(0, deepest))


@dataclass
class PendingAcceptance:
    """An acceptance decided on the device and not yet read: `packed` holds [depth of the deepest accepted node,
    the path slots (n), their tokens (n), the bonus]; `path` the path slots on the device."""

    tree: DraftTree
    packed: Tensor  # [2 * num_nodes + 2]
    path: Tensor  # [num_nodes + 1]: the path's node indices by depth (slot n: the off-path nodes' spare)

    def read(self) -> Acceptance:
        return self.unpack(read_back(self.packed))

    def unpack(self, host: list[int]) -> Acceptance:
        n = self.tree.num_nodes
        length = host[0] + 1
        tokens = host[1 + n + 1 : 1 + n + length] + [host[-1]]
        token_ids = torch.cat([self.tree.tokens[self.path[1:length]], self.packed[-1:]])
        return Acceptance(path=host[1 : 1 + length], tokens=tokens, path_index=self.path[:length], token_ids=token_ids)


def read_accepted(pending: list[PendingAcceptance]) -> list[Acceptance]:
    """Every pending acceptance of a batched step read back in one packed copy: the step's one sync on a GPU."""
    host = read_back(torch.cat([p.packed for p in pending]))
    accepted, start = [], 0
    for p in pending:
        accepted.append(p.unpack(host[start : start + len(p.packed)]))
        start += len(p.packed)
    return accepted


def _pending(tree: DraftTree, attn: Topology, agrees: Tensor, bonus_at) -> PendingAcceptance:
    """The deepest node whose path agrees all the way (`agrees` [num_nodes]: node i's own token is kept, given
    its parent's), its path and the bonus token `bonus_at(deepest [1])` -> [1], packed on the device.

    Every index here is a [1] tensor used through index_select: a 0-d tensor used as an index makes ATen call
    item() (a sync on CUDA) before the op runs."""
    n, device = tree.num_nodes, tree.tokens.device
    on_agreeing_path = ~(attn.ancestors & ~agrees.unsqueeze(0)).any(1)  # [num_nodes]
    deepest = torch.argmax(torch.where(on_agreeing_path, attn.depth, -1)).view(1)  # [1]
    on_path = attn.ancestors.index_select(0, deepest)[0]  # [num_nodes]
    slot = torch.where(on_path, attn.depth, n)  # [num_nodes]; off-path nodes -> spare slot n
    path = torch.zeros(n + 1, dtype=torch.long, device=device).scatter_(0, slot, torch.arange(n, device=device))
    bonus = bonus_at(deepest)  # [1]
    packed = torch.cat([attn.depth.index_select(0, deepest), path[:n], tree.tokens[path[:n]], bonus])
    return PendingAcceptance(tree, packed, path)


def _accept_walk(tokens: list[int], parents: list[int], best: list[int]) -> Acceptance:
    """accept_greedy on the host, `best` the target's argmax after each node: one pass in topological order
    (parents first). The path and tokens stay host lists (`index` is the list)."""
    n = len(tokens)
    depth, on_path, deepest = [0] * n, [True] + [False] * (n - 1), 0
    for i in range(1, n):
        parent = parents[i]
        depth[i] = depth[parent] + 1
        on_path[i] = on_path[parent] and tokens[i] == best[parent]
        if on_path[i] and depth[i] > depth[deepest]:
            deepest = i
    path = [deepest]
    while path[-1] != 0:
        path.append(parents[path[-1]])
    path.reverse()
    return Acceptance(path=path, tokens=[tokens[i] for i in path[1:]] + [best[deepest]])


def target_distribution(logits: Tensor, temperature: float, top_p: float = 1.0) -> Tensor:
    """The distribution the target samples from: softmax(logits / T), restricted to the top-p nucleus."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)  # always keeps the top token
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def accept_sampling(
    tree: DraftTree,
    logits: Tensor,
    temperature: float,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    renormalize: bool = True,
) -> Acceptance:
    """Multi-draft recursive rejection sampling over a tree with deterministic (point-mass) proposals.

    At a node with target distribution p, its children are tried in index order: child token x is accepted
    with probability p(x); on rejection x is removed from p and p is renormalised (the residual). When every
    child is rejected the bonus token is drawn from the residual. The committed tokens are therefore
    distributed exactly as the target's own samples, whatever the tree. `renormalize=False` breaks the
    rule on purpose; tests use it to show that the distribution check can fail.
    """
    probs = target_distribution(logits, temperature, top_p).cpu()  # [num_nodes, vocab]
    tokens = tree.tokens.tolist()
    parents = tree.parents.tolist()
    children: dict[int, list[int]] = {}
    for node in range(1, len(parents)):
        children.setdefault(parents[node], []).append(node)

    node, path, committed = 0, [0], []
    while True:
        residual = probs[node].clone()
        chosen = None
        for child in children.get(node, ()):
            token = tokens[child]
            if token < 0:  # an empty slot of a fixed-size tree
                continue
            p_token = float(residual[token])
            if p_token <= 0.0:
                continue
            if float(torch.rand((), generator=generator)) < p_token:
                chosen = child
                break
            residual[token] = 0.0
            if renormalize:
                residual /= residual.sum()
        if chosen is None:
            bonus = int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
            committed.append(bonus)
            break
        path.append(chosen)
        committed.append(tokens[chosen])
        node = chosen
    return Acceptance(path=path, tokens=committed)


def accept_sampling_on_device(*args, **kwargs) -> Acceptance:
    """accept_sampling's rule drawn on the device and read back in one packed copy (`sampling_pending`)."""
    return sampling_pending(*args, **kwargs).read()


def sampling_pending(
    tree: DraftTree,
    attn: Topology,
    logits: Tensor,
    temperature: float,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    renormalize: bool = True,
) -> PendingAcceptance:
    """accept_sampling's rule with every draw made at once on the device, left there to be read in one copy.

    Child c of node i, tried once its earlier siblings were rejected, is accepted with probability
    p_i(x_c) / (1 - the mass of its earlier siblings' distinct tokens): the host walk's renormalised residual
    in closed form (a token repeating an earlier sibling's has none left). Every node draws its uniform; a
    node's kept child is its first accepted one, so the walk from the root meets exactly the draws the host
    walk would make, and draws it never reaches change nothing. The bonus token at the deepest kept node is
    drawn from its residual (its children's tokens removed) as argmax(residual / Exp(1)), with no host read.
    """
    probs = target_distribution(logits, temperature, top_p)  # [num_nodes, vocab]
    n, device = tree.num_nodes, logits.device
    tokens, parents = tree.tokens, tree.parents
    index = torch.arange(n, device=device)
    child = (tokens >= 0) & (index > 0)  # [num_nodes] a filled slot below the root
    token = tokens.clamp_min(0)
    p_self = probs[parents.clamp_min(0), token]  # [num_nodes] the parent's probability of the node's token
    earlier_sibling = (parents[:, None] == parents[None, :]) & (index[None, :] < index[:, None])  # [n, n]
    earlier_sibling &= child[None, :] & child[:, None]
    first = child & ~(earlier_sibling & (tokens[:, None] == tokens[None, :])).any(1)
    if renormalize:
        removed = (earlier_sibling & first[None, :]).to(probs.dtype) @ p_self  # [num_nodes]
        chance = p_self / (1.0 - removed).clamp_min(torch.finfo(probs.dtype).tiny)
    else:  # the broken rule tests use to show the distribution check can fail
        chance = p_self
    accepted = first & (torch.rand(n, generator=generator, device=device) < chance)  # [num_nodes]
    offered = (parents[None, :] == index[:, None]) & accepted[None, :]  # [n, n]: node i's accepted children
    kept_child = torch.where(offered, index[None, :], n).min(1).values  # [num_nodes]; n: none accepted
    agrees = kept_child[parents.clamp_min(0)] == index
    agrees[0] = True

    def bonus_at(deepest: Tensor) -> Tensor:
        row = probs.index_select(0, deepest)[0]  # [vocab]
        rejected = (child & (parents == deepest)).to(row.dtype)  # every child of the deepest node was rejected
        residual = torch.where(torch.zeros_like(row).index_put_((token,), rejected, accumulate=True) > 0, 0.0, row)
        residual = torch.where(residual.sum() > 0, residual, row)
        noise = torch.empty_like(row).exponential_(generator=generator)
        return (residual / noise).argmax().view(1)

    return _pending(tree, attn, agrees, bonus_at)


def device_generator(generator: torch.Generator | None, device: torch.device) -> torch.Generator | None:
    """A generator on `device` for the device-side draws, seeded from `generator` (the run's, on the host), so a
    seeded run stays reproducible; `generator` itself where it already lives there."""
    if generator is None or generator.device == torch.device(device):
        return generator
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))  # a host draw: no device sync
    return torch.Generator(device=device).manual_seed(seed)


def sample_token(
    logits: Tensor, temperature: float, top_p: float, generator: torch.Generator | None, *, ops: Ops = PLAIN
) -> int:
    """One token from the target's distribution (temperature 0 means argmax): one host read."""
    if temperature <= 0:
        return int(logits.argmax(-1))
    if not ops.on_host(logits):  # the draw on the device, one value read back (the whole row copied was 0.6 MB)
        noise = torch.empty_like(logits, dtype=torch.float32).exponential_(generator=generator)
        return int((target_distribution(logits, temperature, top_p) / noise).argmax(-1))
    probs = target_distribution(logits, temperature, top_p).cpu()
    return int(torch.multinomial(probs, 1, generator=generator))
