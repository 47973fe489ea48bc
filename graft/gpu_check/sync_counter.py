"""Host syncs counted where CUDA counts them: at the dispatcher, on any device.

A GPU step waits for the device whenever a value crosses to the host, and ATen makes some of those crossings
in C++, out of a Python-level counter's sight: indexing with a 0-d tensor calls `item()`, a boolean mask calls
`nonzero` to size its result. `SyncCounter` is a `TorchDispatchMode`: every ATen op of the block passes through
it, so it sees those as they happen on a CPU too. What it counts, by kind:

- `read`: `_local_scalar_dense` (item, int(), float(), bool(), a 0-d index), a copy from a non-CPU device to
  the host, and (Python level, since a CPU tensor's `tolist` / `numpy` / `cpu` dispatch nothing) those calls;
- the ops whose output size depends on data: `nonzero` (`torch.where(cond)`, `argwhere`), `masked_select`,
  `unique*`, `bincount`, `repeat_interleave` without `output_size`, boolean-mask `index` / `index_put`;
- `equal` and `is_nonzero` (a bool back to the host);
- `host tensor`: a tensor made from a Python list (`aten.lift_fresh`: `torch.tensor([...])`, indexing with a
  list) outside `graft.ops.upload`: on CUDA a blocking copy up wherever it meets device tensors (a Python
  scalar, `x[0] = 5`, is filled on the device and not counted);
- `blocking upload`: `torch.tensor(..., device=...)` (Python level: on a CPU the device argument is all
  there is to see), a copy from pageable memory that waits for the stream;
- `upload`: the same inside `graft.ops.upload` (pinned memory, non-blocking: not a sync; counted apart).

`sites` names the first frame in this repository for each event, so a failing count says where.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from graft import ops

aten = torch.ops.aten
ROOT = Path(__file__).resolve().parents[2]

# op overload packet -> kind; every one of them waits for the device on CUDA
SIZED_BY_DATA = {
    aten.nonzero: "nonzero",
    aten.argwhere: "nonzero",
    aten.masked_select: "masked_select",
    aten._unique: "unique",
    aten._unique2: "unique",
    aten.unique_dim: "unique",
    aten.unique_consecutive: "unique",
    aten.unique_dim_consecutive: "unique",
    aten.bincount: "bincount",
    aten.equal: "equal",
    aten.is_nonzero: "is_nonzero",
    aten._local_scalar_dense: "read",
    aten.item: "read",  # what a 0-d index dispatches under inference_mode
}
MASK_INDEXED = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}
PYTHON_READS = ("tolist", "numpy", "cpu")
NOT_SYNCS = ("upload",)  # counted, but not a sync: pinned memory, non_blocking


def _bool_index(indices) -> bool:
    return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices)


class SyncCounter(TorchDispatchMode):
    """Counts, by kind, what would make the host wait for a CUDA device while the block runs."""

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()
        self.sites: collections.Counter = collections.Counter()  # (kind, "path:line") -> count
        self._patched: dict = {}
        self._depth = 0  # Python-level reads inside a dispatched op are the op's business
        self._in_tensor_call = False  # torch.tensor(..., device=...) is counted once, as a blocking upload

    @property
    def syncs(self) -> int:
        return sum(n for kind, n in self.counts.items() if kind not in NOT_SYNCS)

    def _note(self, kind: str) -> None:
        self.counts[kind] += 1
        self.sites[(kind, _site())] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = self._kind(func, args, kwargs)
        if kind is not None:
            self._note(kind)
        self._depth += 1
        try:
            return func(*args, **kwargs)
        finally:
            self._depth -= 1

    def _kind(self, func, args, kwargs) -> str | None:
        packet = func.overloadpacket
        if packet in SIZED_BY_DATA:
            return SIZED_BY_DATA[packet]
        if func is aten.where.default:  # torch.where(cond): nonzero inside
            return "nonzero"
        if packet in MASK_INDEXED and _bool_index(args[1]):
            return "boolean index"
        if packet is aten.repeat_interleave and func is aten.repeat_interleave.Tensor:
            return None if kwargs.get("output_size") is not None else "repeat_interleave"
        if packet is aten.repeat_interleave and isinstance(args[1], torch.Tensor):
            return (
                None
                if kwargs.get("output_size", args[3] if len(args) > 3 else None) is not None
                else "repeat_interleave"
            )
        if packet in (aten._to_copy, aten.to, aten.copy_):
            return self._copy_kind(func, args, kwargs)
        if packet is aten.lift_fresh:
            # a 0-d one is a Python scalar (`x[0] = 5`, which CUDA fills on the device); a list is data to copy up
            if self._in_tensor_call or args[0].dim() == 0:
                return None
            return "upload" if _inside(ops.upload) else "host tensor"
        return None

    @staticmethod
    def _copy_kind(func, args, kwargs) -> str | None:
        if func.overloadpacket is aten.copy_:
            dst, src = args[0], args[1]
            return "read" if dst.device.type == "cpu" and src.device.type != "cpu" else None
        target = kwargs.get("device")
        src = args[0]
        if target is not None and torch.device(target).type == "cpu" and src.device.type != "cpu":
            return "read"
        return None

    def __enter__(self):
        for name in PYTHON_READS:
            original = getattr(torch.Tensor, name)
            self._patched[name] = original
            setattr(torch.Tensor, name, self._python_read(original))
        self._patched["tensor"] = torch.tensor
        torch.tensor = self._tensor_call(torch.tensor)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for name, original in self._patched.items():
                setattr(torch if name == "tensor" else torch.Tensor, name, original)
            self._patched.clear()

    def _python_read(self, original):
        counter = self

        def read(tensor, *args, **kwargs):
            # on a CUDA tensor the copy to the host is dispatched (and counted there)
            if counter._depth == 0 and tensor.device.type == "cpu":
                counter._note("read")
            return original(tensor, *args, **kwargs)

        return read

    def _tensor_call(self, original):
        counter = self

        def tensor(data, *args, **kwargs):
            # a copy from pageable host memory that waits for the stream on CUDA (graft.ops.upload does not)
            if kwargs.get("device") is not None and not _inside(ops.upload, 1):
                counter._note("blocking upload")
            counter._in_tensor_call = True
            try:
                return original(data, *args, **kwargs)
            finally:
                counter._in_tensor_call = False

        return tensor


def _inside(function, skip: int = 2) -> bool:
    frame = sys._getframe(skip)
    while frame is not None:
        if frame.f_code is function.__code__:
            return True
        frame = frame.f_back
    return False


def _site() -> str:
    """The innermost frame in this repository outside this module: where the sync was asked for."""
    frame = sys._getframe(2)
    here = Path(__file__).resolve()
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path.is_absolute() and path != here and ROOT in path.parents and "site-packages" not in path.parts:
            return f"{path.relative_to(ROOT)}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def per_step(generate_once, drafter) -> list[collections.Counter]:
    """What each decode step between the first and the last asked of the host, counted from one propose call to
    the next (a sequence's prefill and its records at the end fall outside): `generate_once()` runs one
    sequence with `drafter`. Each Counter holds the kinds and, under ("site", kind, where), their places."""
    counter = SyncCounter()
    marks: list[collections.Counter] = []
    propose = drafter.propose

    def marked(state):
        marks.append(_snapshot(counter))
        return propose(state)

    drafter.propose = marked
    try:
        with counter:
            generate_once()
    finally:
        del drafter.propose
    return [later - earlier for earlier, later in zip(marks, marks[1:])]


def _snapshot(counter: SyncCounter) -> collections.Counter:
    snap = collections.Counter(counter.counts)
    for (kind, where), n in counter.sites.items():
        snap[("site", kind, where)] = n
    return snap


def syncs_of(step: collections.Counter) -> dict[str, int]:
    """The kinds of a step that wait for the device (upload excluded), with their counts."""
    return {k: n for k, n in step.items() if isinstance(k, str) and k not in NOT_SYNCS and n}


def sites_of(step: collections.Counter) -> dict[str, int]:
    return {f"{kind} at {where}": n for key, n in step.items() if isinstance(key, tuple) for _, kind, where in [key]}


def table(models: list[str], temperatures: list[float], methods: list[str], tokens: int = 40) -> list[str]:
    """Syncs per step (mean and worst step) of each method with the GPU settings on this machine's device (host
    paths off): the rows docs/gpu.md's table is made of."""
    from baselines.autoregressive import Autoregressive
    from graft.config.experiment import compose, validate
    from graft.decode import SamplingConfig, generate
    from graft.load.models import load_model
    from graft.registry import build_drafter, method_config

    ops.Ops.on_host = lambda self, t: False  # the device path: a CPU's host paths read on purpose
    lines = []
    for name in models:
        cfg = validate(
            compose([f"model={name}", "logger=none", "hardware=gpu", "hardware.device=cpu", "hardware.fast_path=none"])
        )
        target = load_model(cfg.model, cfg.hardware, progress=False).target
        torch.set_flush_denormal(True)  # random tiny models drift into subnormals on the CPU (tests/conftest.py)
        for temperature in temperatures:
            for method in methods:
                raw = compose([f"method={method}", "hardware=cpu"])["method"]  # as tests/conftest.py: make_drafter
                drafter = (
                    Autoregressive(target)
                    if method == "ar"
                    else build_drafter(method_config(raw, draft_head="random", block_drafter="random"), target)
                )
                sampling, generator = SamplingConfig(temperature=temperature), torch.Generator().manual_seed(0)

                def once(n, drafter=drafter, sampling=sampling, generator=generator, target=target):
                    return generate(
                        target, drafter, list(range(5, 40)), n, set(), sampling, generator, record_gaps=True
                    )

                once(8)  # lazy setup is not a step
                steps = per_step(lambda: once(tokens), drafter)
                counts = [sum(syncs_of(step).values()) for step in steps]
                kinds: collections.Counter = collections.Counter()
                for step in steps:
                    kinds.update(syncs_of(step))
                lines.append(
                    f"{name} T={temperature:g} {method}: {len(steps)} steps, mean {sum(counts) / len(counts):.2f}, "
                    f"worst {max(counts)}, {dict(kinds)}"
                )
                print(lines[-1], flush=True)
    return lines


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m graft.gpu_check.sync_counter",
        description="Host syncs per decode step, counted at the dispatcher, with the GPU settings on this device.",
    )
    parser.add_argument("--models", default="tiny_llama,tiny_qwen3_moe")
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--methods", default="ar,pld,eagle3,pruned,graft,graft_root,recycling")
    parser.add_argument("--tokens", type=int, default=40, help="new tokens per counted sequence")
    args = parser.parse_args(argv)
    split = lambda text: [part for part in text.split(",") if part]  # noqa: E731
    table(split(args.models), [float(t) for t in split(args.temperatures)], split(args.methods), args.tokens)


if __name__ == "__main__":
    main()
