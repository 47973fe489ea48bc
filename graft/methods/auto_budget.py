"""budget=auto (beyond the paper): choose each step's tree size from the device's cost profile and the
draft's own confidence, instead of a fixed total_tokens.

After the draft is expanded, keeping the best N - 1 candidates (root included: N nodes) is expected to
commit E(N) = 1 + (sum of the N - 1 largest path probabilities exp(score)) tokens, the head's own estimate
of each node's chance to lie on the accepted path, plus the bonus token. The step then costs
draft + verify(N, context) + overhead(N) milliseconds, from the profile (scripts/cost_profile.py) at
`method.auto_context` cached positions (the draft's own time is measured as it runs), and the split keeps the N that maximises E(N) / cost(N), up to total_tokens. Where a node
costs almost nothing (a GPU) that is the whole budget; where it costs compute (a 2-core CPU) it is a small
tree on uncertain steps and a larger one when the head is confident.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from graft.compose import Split
from graft.config import from_cwd_or_repo
from graft.costmodel import CostProfile
from graft.registry import register
from graft.schema import ConfigError


@dataclass
class AutoParams:
    cost_profile: str | None = None  # a CostProfile JSON of this device and target (scripts/cost_profile.py)
    auto_context: int = 512  # the context length whose verify costs the choice reads (cache positions)


def best_budget(probabilities: Tensor, costs_ms: list[float]) -> int:
    """N in 1..len(costs_ms) maximising (1 + sum of the N - 1 largest probabilities) / costs_ms[N - 1]."""
    top = torch.sort(probabilities, descending=True).values[: len(costs_ms) - 1]  # [<= N_max - 1]
    expected = torch.cat([torch.ones(1, dtype=top.dtype, device=top.device), 1 + torch.cumsum(top, 0)])
    costs = torch.tensor(costs_ms[: expected.shape[0]], dtype=expected.dtype, device=expected.device)
    return int(torch.argmax(expected / costs)) + 1


@register(
    "split", "auto", params=AutoParams, description="per step, the tree size with the most expected tokens per ms"
)
class AutoSplit(Split):
    def __init__(self, params: AutoParams):
        if not params.cost_profile:
            raise ConfigError("split auto needs method.cost_profile=<a cost profile JSON (scripts/cost_profile.py)>")
        path = from_cwd_or_repo(params.cost_profile)  # profiles committed under results/ resolve anywhere
        if not path.is_file():
            raise ConfigError(f"method.cost_profile={params.cost_profile}: no such file")
        self.profile = CostProfile.load(path)
        self.context = params.auto_context
        self.draft_ms = 0.0  # running mean of this drafter's own draft time per step
        self.steps = 0
        self._costs: dict[int, list[float]] = {}

    def start(self) -> None:
        self.started = time.perf_counter()

    def _verify_costs(self, total_tokens: int) -> list[float]:
        """verify(N) + overhead(N) ms for N = 1..total_tokens, computed once per budget."""
        if total_tokens not in self._costs:
            self._costs[total_tokens] = [
                self.profile.verify_ms(n, self.context) + self.profile.overhead_ms(n, accepted=2)  # a tree's path moves
                for n in range(1, total_tokens + 1)
            ]
        return self._costs[total_tokens]

    def keep(self, scores: Tensor, total_tokens: int) -> int:
        drafted = 1e3 * (time.perf_counter() - self.started)
        self.steps += 1
        self.draft_ms += (drafted - self.draft_ms) / self.steps
        costs = [self.draft_ms + c for c in self._verify_costs(total_tokens)]
        return best_budget(scores.float().exp(), costs)

    def levels_needed(self, total_tokens: int) -> int:
        return max(total_tokens - 2, 0)

    def widest_useful(self, total_tokens: int) -> int:
        return max(total_tokens - 1, 1)  # keep() reads the best total_tokens - 1 probabilities: the same values

    def label(self) -> str:
        return "auto"
