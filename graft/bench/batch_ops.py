"""What a batched step costs the host, per method and batch size: ATen ops per step (counted at the dispatcher,
graft/gpu_check/sync_counter.py's way), positions the verify forward computed per real tree node, and host
reads per step (the sync counter's syncs), on a tiny model.

    python -m graft.bench batch-ops [--model tiny_llama] [--fast-path packed] [--sizes 1,8,16] [--methods ...]

Each point decodes 2 B prompts (random tokens, lengths 8 to 12) at concurrency B, 24 new tokens, greedy; the
figures are medians over the steps in which all B slots decode and no prompt chunk rides along. Ops per step
growing by a factor near B means the step runs per slot; near 1, once for the batch.
"""

from __future__ import annotations

import statistics

from graft.bench import batch_sizes, command_parser


def main(argv: list[str] | None = None) -> None:
    parser = command_parser("batch-ops", __doc__)
    parser.add_argument("--model", default="tiny_llama")
    parser.add_argument("--fast-path", default="packed", help="hardware.fast_path (none: the transformers forward)")
    parser.add_argument("--sizes", default="1,8,16", help="batch sizes, comma-separated")
    parser.add_argument("--methods", default="ar,pld,eagle3,pruned,graft,dflash")
    args = parser.parse_args(argv)
    sizes = batch_sizes(args.sizes, least=1, example="1,8,16")
    from graft.config.hydra_setup import group_options
    from graft.schema import ConfigError

    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in group_options("method")]
    if unknown:
        raise ConfigError(f"--methods: unknown {unknown}; choose from {', '.join(group_options('method'))}")
    target = _target(args.model, args.fast_path)
    print(f"{args.model} on hardware.fast_path={args.fast_path}: medians over the steps with every slot decoding")
    print("| method | B | ATen ops / step | vs B = 1 | positions / node | host reads / step |")
    print("|---|---|---|---|---|---|")
    for method in methods:
        first = None
        for size in sizes:
            found = measure(target, method, size)
            first = first or found["ops"]
            print(
                f"| {method} | {size} | {found['ops']:.0f} | {found['ops'] / first:.1f}x | "
                f"{found['positions']:.2f} | {found['reads']:.0f} |"
            )


def _target(model: str, fast_path: str):
    import torch

    from graft.config.experiment import validate
    from graft.config.override_checks import compose_checked
    from graft.load.models import load_model

    cfg = validate(compose_checked([f"model={model}", "logger=none", f"hardware.fast_path={fast_path}"]))
    loaded = load_model(cfg.model, cfg.hardware, progress=False)
    torch.set_flush_denormal(True)  # random tiny models drift into subnormals on the CPU (tests/conftest.py)
    return loaded.target


def measure(target, method: str, size: int, new_tokens: int = 24) -> dict:
    """Median ATen ops, positions per node and host reads over the full steps of one batch of 2 `size` prompts."""
    from collections import deque

    import torch

    from graft import batch as batching
    from graft.batch import BatchRequest, generate_batch, slot_capacity
    from graft.config.experiment import compose
    from graft.decode import SamplingConfig
    from graft.gpu_check.sync_counter import SyncCounter
    from graft.registry import build_drafter, method_config

    raw = dict(compose([f"method={method}"])["method"])
    drafters = [
        build_drafter(method_config(raw, draft_head="random", block_drafter="random"), target) for _ in range(size)
    ]
    for other in drafters[1:]:
        other.share_with(drafters[0])
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 200, (8 + i % 5,), generator=generator).tolist() for i in range(2 * size)]
    found, step = [], batching._Run.step

    def counted(run, live, filling):
        with OpCounter() as ops, SyncCounter() as syncs:
            out = step(run, live, filling)
        if len(out["slots"]) == size and not out["prefill"]:
            found.append((ops.count, out["positions"] / out["nodes"], syncs.syncs))
        return out

    batching._Run.step = counted
    try:
        queue = deque(BatchRequest(ids) for ids in prompts)
        capacity = slot_capacity([len(p) for p in prompts], new_tokens, drafters[0].max_nodes())
        generate_batch(target, drafters, queue, new_tokens, set(), SamplingConfig(), capacity, lambda *a: None)
    finally:
        batching._Run.step = step
    if not found:
        return {"ops": float("nan"), "positions": float("nan"), "reads": float("nan")}
    ops, positions, reads = zip(*found)
    return {"ops": statistics.median(ops), "positions": statistics.median(positions), "reads": statistics.median(reads)}


def OpCounter():
    """A TorchDispatchMode counting every ATen op dispatched inside it (`.count`)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += 1
            return func(*args, **(kwargs or {}))

    return Counter()


if __name__ == "__main__":
    main()
