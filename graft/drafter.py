"""The drafter protocol every method implements, and the registry that maps method names to drafters.

A method is one file with a `Drafter` subclass and a params dataclass, registered with `@register`, plus
one config under `configs/method/`. The decode loop calls, per sequence:

    reset(prompt)                    once, after prefill
    propose(state) -> DraftTree      before each verification step (the "draft" phase)
    update(step)                     after acceptance, with the verification logits and hidden states

A drafter may leave a small dict in `last_info` during a step; the loop stores it in the step's record.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from torch import Tensor

from graft.acceptance import Acceptance
from graft.target import ForwardOutput, HiddenTap, TargetModel
from graft.tree import DraftTree, TreeAttention


@dataclass
class SequenceState:
    """What a drafter may read: every committed token id (prompt first); the last one is the next root."""

    tokens: list[int]
    prompt_len: int

    @property
    def root(self) -> int:
        return self.tokens[-1]


@dataclass
class PrefillInfo:
    state: SequenceState
    forward: ForwardOutput  # logits of the last prompt position, hidden states of every prompt position


@dataclass
class StepFeedback:
    tree: DraftTree
    attn: TreeAttention
    forward: ForwardOutput  # [num_nodes, vocab] logits and [num_nodes, taps*hidden] hidden states
    acceptance: Acceptance
    state: SequenceState  # already extended with the committed tokens


class Drafter:
    """Base class: proposes nothing, which makes it the autoregressive baseline."""

    name: ClassVar[str] = "ar"
    hidden_taps: tuple[HiddenTap, ...] = ()
    last_info: dict | None = None  # the drafter's own record of the step (e.g. the pruner's stage); the loop collects it

    def __init__(self, target: TargetModel, params: Any = None):
        self.target = target
        self.params = params

    def reset(self, prefill: PrefillInfo) -> None:
        pass

    def propose(self, state: SequenceState) -> DraftTree:
        return DraftTree.root_only(state.root, device=self.target.device)

    def update(self, step: StepFeedback) -> None:
        pass

    def max_nodes(self) -> int:
        """Upper bound on nodes per tree, used to size the cache."""
        return 1


@dataclass
class NoParams:
    pass


@dataclass
class MethodSpec:
    name: str
    drafter: Callable[[TargetModel, Any], Drafter]
    params: type = NoParams
    description: str = ""
    extra: dict = field(default_factory=dict)


METHODS: dict[str, MethodSpec] = {}


def register(name: str, params: type = NoParams, description: str = ""):
    """Class decorator: make a Drafter available as `method=<name>`."""

    def wrap(cls):
        cls.name = name
        METHODS[name] = MethodSpec(name=name, drafter=cls, params=params, description=description)
        return cls

    return wrap


register("ar", description="autoregressive baseline: the same loop with a drafter that proposes nothing")(Drafter)


def build_drafter(name: str, target: TargetModel, params: dict) -> Drafter:
    from graft.config import ConfigError, coerce_dataclass

    _import_methods()
    if name not in METHODS:
        raise ConfigError(f"unknown method '{name}'; available: {', '.join(sorted(METHODS))}")
    spec = METHODS[name]
    typed = coerce_dataclass(spec.params, params, f"method ({name})")
    return spec.drafter(target, typed)


def method_params(name: str) -> list[str]:
    _import_methods()
    return [f.name for f in dataclasses.fields(METHODS[name].params)] if name in METHODS else []


def _import_methods() -> None:
    """Methods live in graft/methods and baselines/; importing them registers them."""
    import baselines  # noqa: F401
    import graft.methods  # noqa: F401
