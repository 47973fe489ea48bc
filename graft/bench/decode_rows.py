"""One engine forward of B one-token segments (a batched decode step's verify) against the cached positions each
sequence attends over, beside one segment alone: how much of a batched step is attention, for a cache dtype.

    python -m graft.bench decode-rows [--model smollm2_135m] [--rows 32] [--contexts 10,200,400]
        [--fast-path packed_bf16] [--cache-dtypes float32,bfloat16] [--repeats 10]

Medians of --repeats forwards after 3 untimed ones (LeanForward.rows over SlotCaches; the keys attended are
whatever the cache holds: the cost does not depend on their values).
"""

from __future__ import annotations

import statistics
import time

from graft.bench import batch_sizes, command_parser


def main(argv: list[str] | None = None) -> None:
    parser = command_parser("decode-rows", __doc__)
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--contexts", default="10,200,400", help="cached positions a sequence, comma-separated")
    parser.add_argument("--fast-path", default="packed_bf16")
    parser.add_argument("--cache-dtypes", default="float32,bfloat16")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    from graft.schema import ConfigError

    for flag, value in (("--rows", args.rows), ("--repeats", args.repeats)):
        if value < 1:
            raise ConfigError(f"{flag} {value} is not allowed; expected an integer >= 1")
    contexts = batch_sizes(args.contexts, least=1, example="10,200,400")
    print(f"{args.model}, hardware.fast_path={args.fast_path}: ms per forward, median of {args.repeats}")
    print(f"| cache | cached positions | {args.rows} rows | one row |")
    print("|---|---|---|---|")
    for cache in args.cache_dtypes.split(","):
        for context, many, one in measure(args, cache, contexts):
            print(f"| {cache} | {context} | {many:.1f} | {one:.1f} |")


def measure(args, cache: str, contexts: list[int]) -> list[tuple[int, float, float]]:
    import torch

    from graft.backends.slots import SlotCaches
    from graft.backends.target import Segment
    from graft.config.experiment import validate
    from graft.config.override_checks import compose_checked
    from graft.load.models import load_model

    overrides = [f"model={args.model}", "logger=none", "hardware=cpu", f"hardware.fast_path={args.fast_path}"]
    cfg = validate(compose_checked([*overrides, f"hardware.cache_dtype={cache}"]))
    target = load_model(cfg.model, cfg.hardware, progress=False).target
    slots = SlotCaches(target, args.rows, max(contexts) + 8, ops=target.ops)

    def timed(segments) -> float:
        for _ in range(3):
            target.lean.rows(segments, slots, set())
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            target.lean.rows(segments, slots, set())
            times.append(time.perf_counter() - started)
        return statistics.median(times) * 1e3

    found = []
    with torch.inference_mode():
        for context in contexts:
            segments = [
                Segment(row, context, torch.tensor([100 + row]), torch.tensor([context]), None)
                for row in range(args.rows)
            ]
            found.append((context, timed(segments), timed(segments[:1])))
    return found


if __name__ == "__main__":
    main()
