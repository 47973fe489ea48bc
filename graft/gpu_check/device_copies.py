"""Cross-device copies of a sharded target, counted on a CPU.

A target sharded over k GPUs (hardware=gpu_multi: Accelerate's device_map, its hooks moving every input of a
block to that block's GPU) pays a copy for every tensor that crosses between GPUs. Without GPUs the copies
can still be counted: `simulate_shards` gives the model Accelerate's own hooks over k logical devices
("cpu:0" .. "cpu:k-1", as transformers' balanced map places a model: embeddings first, layers in order, norm and
LM head last), and `DeviceCopies` follows which logical device every tensor is on:

- a tensor's logical device is tagged when it is made: a parameter by the map, a `.to(device)` by its target,
  a factory by its `device=`, anything else by its inputs; and `Tensor.device` reports it, so code that places
  by `x.device` (as transformers and graft do) places on the logical device, exactly as on GPUs;
- a `.to()`, `copy_` or indexed write whose source and destination devices differ is a copy, recorded with the
  first frame outside torch that asked for it; an op whose inputs sit on different devices (an error on GPUs)
  is recorded as a mismatch.

CPU tensors of every logical device share the host's memory, so the model computes what it computes on one
device: the counts are those of the GPU run, the tokens those of the CPU run.
"""

from __future__ import annotations

import sys
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

ROOT = Path(__file__).resolve().parents[2]  # the repository (graft/ is its child)

TAG = "_graft_logical_device"  # the attribute a tensor's logical device index is kept in
COPY_METHODS = {torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.copy_}
WRITES = {torch.Tensor.__setitem__, torch.Tensor.index_copy_, torch.Tensor.index_put_}
FACTORY_DEVICE_KEYWORD = "device"


def logical(index: int) -> torch.device:
    return torch.device("cpu", index)


def tag_of(tensor) -> int | None:
    return getattr(tensor, TAG, None) if isinstance(tensor, torch.Tensor) else None


def set_tag(tensor, index: int | None) -> None:
    if index is not None and isinstance(tensor, torch.Tensor):
        setattr(tensor, TAG, index)


def device_index(device) -> int | None:
    """The logical index a device argument names (cpu:k); None for one without an index."""
    if isinstance(device, (str, torch.device)) and str(device).startswith("cpu"):
        return torch.device(device).index
    return None


def target_index(args, kwargs) -> int | None:
    """Where a `.to(...)` sends its tensor: a device positional or keyword argument, or another tensor's device."""
    for arg in (*args[1:], kwargs.get("device")):
        if isinstance(arg, torch.Tensor):
            return tag_of(arg)
        index = device_index(arg)
        if index is not None:
            return index
    return None


def caller() -> str:
    """file:function of the first frame outside torch and this module: who asked for the copy."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if "/torch/" not in path and not path.endswith("device_copies.py"):
            short = path.split("site-packages/")[-1]
            if Path(path).is_relative_to(ROOT):  # this repository's files by their path in it, wherever it is cloned
                short = str(Path(path).relative_to(ROOT))
            return f"{short}:{frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


@dataclass
class Tally:
    copies: Counter = field(default_factory=Counter)  # (caller, source, destination, shape) -> count
    mismatches: Counter = field(default_factory=Counter)  # (function, caller) -> count

    @property
    def total(self) -> int:
        return sum(self.copies.values())

    def by_caller(self) -> Counter:
        grouped = Counter()
        for (who, *_), count in self.copies.items():
            grouped[who] += count
        return grouped


class DeviceCopies(TorchFunctionMode):
    """Tags tensors with their logical device and counts the copies between devices (see the module's text).
    `counting` False: tags are kept but nothing is counted (the prefill, say)."""

    def __init__(self):
        super().__init__()
        self.tally = Tally()
        self.counting = True

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        out = func(*args, **kwargs)
        if func is torch.Tensor.to and self._stays(args, kwargs, out):
            return args[0]  # as on GPUs: a move to the device a tensor is on returns it, no copy
        if func in COPY_METHODS:
            self._copy(func, args, kwargs, out)
            return out
        tags = {tag_of(t) for t in inputs if t.dim() > 0} - {None}
        if func in WRITES and len(tags) > 1:
            self._count(tag_of(inputs[-1]), tag_of(args[0]), inputs[-1])  # values written from another device
        elif len(tags) > 1 and self.counting:
            self.tally.mismatches[(getattr(func, "__name__", str(func)), caller())] += 1
        made_on = device_index(kwargs.get(FACTORY_DEVICE_KEYWORD))
        tag = made_on if made_on is not None else next((tag_of(t) for t in inputs if tag_of(t) is not None), None)
        for result in tree_flatten(out)[0]:
            if isinstance(result, torch.Tensor) and tag_of(result) is None:
                set_tag(result, tag)
        return out

    @staticmethod
    def _stays(args, kwargs, out) -> bool:
        source, destination = tag_of(args[0]), target_index(args, kwargs)
        return source is not None and source == destination and out.dtype == args[0].dtype

    def _copy(self, func, args, kwargs, out) -> None:
        source = tag_of(args[0])
        if func is torch.Tensor.copy_:  # dst.copy_(src)
            self._count(tag_of(args[1]), source, args[1])
            return
        destination = target_index(args, kwargs)
        if destination is None:  # a dtype change: stays where it is
            set_tag(out, source)
            return
        self._count(source, destination, args[0])
        if out is not args[0]:
            setattr(out, TAG, destination)

    def _count(self, source: int | None, destination: int | None, tensor) -> None:
        if self.counting and None not in (source, destination) and source != destination:
            self.tally.copies[(caller(), source, destination, tuple(tensor.shape))] += 1


@contextmanager
def logical_devices():
    """`Tensor.device` reports a tagged tensor's logical device (cpu:k) while inside; torch's own elsewhere."""
    if "device" in torch.Tensor.__dict__:  # already inside
        yield
        return
    original = torch._C.TensorBase.device

    def device(self):
        index = getattr(self, TAG, None)
        return original.__get__(self) if index is None else logical(index)

    torch.Tensor.device = property(device)
    try:
        yield
    finally:
        del torch.Tensor.device  # torch.Tensor inherits TensorBase's again


# --- a model over k logical devices --------------------------------------------------------------------


def balanced_map(model, shards: int) -> dict[str, int]:
    """Module name -> logical device, as transformers' balanced device_map places a decoder-only model: the
    embeddings (and rotary table) on the first, the layers in order (the first devices taking one more where
    they do not divide), the final norm and the LM head on the last."""
    from graft.backends.hf import decoder_of
    from graft.plan.placement import layer_split

    decoder = decoder_of(model)
    prefix = next(name for name, module in model.named_modules() if module is decoder)
    placement = {f"{prefix}.embed_tokens": 0}
    if hasattr(decoder, "rotary_emb"):
        placement[f"{prefix}.rotary_emb"] = 0
    layer = 0
    for index, count in enumerate(layer_split(len(decoder.layers), shards)):
        for _ in range(count):
            placement[f"{prefix}.layers.{layer}"] = index
            layer += 1
    placement[f"{prefix}.norm"] = shards - 1
    placement["lm_head"] = shards - 1
    return placement


def simulate_shards(model, shards: int) -> dict[str, int]:
    """Give `model` Accelerate's hooks over `shards` logical devices (accelerate.dispatch_model, as
    from_pretrained(device_map=...) does; the weights stay where they are, tagged with their device)."""
    import accelerate
    import accelerate.hooks

    placement = balanced_map(model, shards)
    keep_in_place = accelerate.hooks.set_module_tensor_to_device
    accelerate.hooks.set_module_tensor_to_device = lambda *args, **kwargs: None  # CPU memory serves every device
    try:
        accelerate.dispatch_model(model, {name: logical(index) for name, index in placement.items()})
    finally:
        accelerate.hooks.set_module_tensor_to_device = keep_in_place
    for name, index in placement.items():
        module = model.get_submodule(name)
        for tensor in (*module.parameters(), *module.buffers()):
            set_tag(tensor, index)
    return placement


# --- per decode step ------------------------------------------------------------------------------------

PROMPT = [40 + (7 * i) % 200 for i in range(48)]  # token ids any tiny model's vocabulary holds


@dataclass
class StepCopies:
    method: str
    steps: int
    tally: Tally
    tokens: list[int]

    @property
    def per_step(self) -> float:
        return self.tally.total / max(self.steps, 1)


def sharded_target(model: str, shards: int, layers: int):
    """A tiny random target (graft's config `model=<model>`, `layers` decoder layers) over `shards` logical
    devices, seen through the transformers backend. Call inside logical_devices()."""
    from graft.backends.hf import HFBackend
    from graft.config.experiment import compose, validate
    from graft.load.models import load_model

    overrides = [f"model={model}", "hardware=cpu_plain", "logger=none"]
    cfg = validate(compose([*overrides, f"model.arch_config.num_hidden_layers={layers}"]))
    loaded = load_model(cfg.model, cfg.hardware, progress=False)
    simulate_shards(loaded.target.model, shards)
    return HFBackend(loaded.target.model, loaded.target.tokenizer), cfg


def reference_branch(reference: list[int], prompt_len: int):
    """A drafter whose tree puts the reference continuation under a wrong first child (root -> [wrong, ref 1] ->
    ref 2 -> ...): every step accepts a path that is not the tree's first rows, so the commit moves KV rows
    (random-weight drafters rarely get a token accepted)."""
    from graft.drafter import Drafter, Proposal
    from graft.tree import DraftTree, NodeSource

    class ReferenceBranch(Drafter):
        def max_nodes(self) -> int:
            return 8

        def propose(self, state) -> Proposal:
            done = len(state.tokens) - prompt_len
            truth = reference[done : done + 6]
            wrong = (truth[0] + 1) % self.target.vocab_size if truth else 0
            tokens = [state.root, wrong, *truth]
            parents = [-1, 0, *([0] if truth else []), *range(2, len(tokens) - 1)]
            device = self.target.device
            sources = torch.full((len(tokens),), int(NodeSource.TEST), dtype=torch.int8, device=device)
            tree = DraftTree(torch.tensor(tokens, device=device), torch.tensor(parents, device=device), sources=sources)
            return Proposal(tree)

    return ReferenceBranch


def count_step_copies(
    method: str, model: str = "tiny_llama", shards: int = 4, layers: int = 8, new_tokens: int = 24, target=None
) -> StepCopies:
    """Copies between devices per decode step of `method` (greedy; "reference": `reference_branch` over AR's
    tokens) on a `shards`-way sharded tiny target: the prefill and the drafter's set-up left out, every step
    after counted."""
    from graft.config.experiment import compose, validate
    from graft.decode import generate
    from graft.registry import build_drafter

    with logical_devices():
        target = target or sharded_target(model, shards, layers)[0]
        if method == "reference":
            reference = count_step_copies("ar", model, shards, layers, new_tokens, target).tokens
            drafter = reference_branch(reference, len(PROMPT))(target)
        else:
            cfg = validate(compose([f"model={model}", f"method={method}", "hardware=cpu_plain", "logger=none"]))
            drafter = build_drafter(cfg.compared[0], target)
        mode = DeviceCopies()
        mode.counting = False
        propose = drafter.propose

        def counted(state):
            mode.counting = True  # from the first step on
            return propose(state)

        drafter.propose = counted
        with mode, torch.inference_mode():
            generation = generate(target, drafter, PROMPT, new_tokens, stop_ids=set())
    return StepCopies(method, len(generation.accept_lengths), mode.tally, generation.new_tokens)


def main(argv: list[str]) -> None:
    """python -m graft.gpu_check.device_copies <model> <method>...: copies per decode step of each method, by who asked."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m graft.gpu_check.device_copies", description=main.__doc__)
    parser.add_argument("model", help="a model config, e.g. tiny_llama")
    parser.add_argument("methods", nargs="+", help="method configs, e.g. ar pld eagle3 graft")
    args = parser.parse_args(argv)
    model, methods = args.model, args.methods
    for method in methods:
        result = count_step_copies(method, model=model)
        mismatches = sum(result.tally.mismatches.values())
        print(
            f"{model} {method}: {result.per_step:.1f} copies a step over {result.steps} steps, {mismatches} mismatches"
        )
        for who, count in result.tally.by_caller().most_common():
            print(f"    {who}: {count}")


if __name__ == "__main__":
    main(sys.argv[1:])
