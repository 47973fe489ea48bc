"""AR's throughput at batch 1 and batched, in one process: the CPU engine at batch 1 (the default) against the
transformers forward at batch 1 and at each batch size (graft/batch.py), interleaved round by round.

    python -m graft.bench batch [--dataset builtin_quick] [--new-tokens 32] [--sizes 4,8] [--rounds 3]

Every system decodes the first turn of every prompt of the dataset, greedy; tokens/s = all new tokens / all
seconds of a round (prefill included, as a batched run counts it). After one untimed round of each system, the
rounds rotate the systems' order; the table gives each system's median over the rounds and its ratio to batch 1
on the same forward.
"""

from __future__ import annotations

import statistics
import time
from collections import deque

from graft.bench import batch_sizes, command_parser


def main(argv: list[str] | None = None) -> None:
    parser = command_parser("batch", __doc__)
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--dataset", default="builtin_quick")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--sizes", default="4,8", help="batch sizes of the transformers forward, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    from graft.schema import ConfigError

    for flag, value in (("--new-tokens", args.new_tokens), ("--rounds", args.rounds)):
        if value < 1:
            raise ConfigError(f"{flag} {value} is not allowed; expected an integer >= 1")
    sizes = batch_sizes(args.sizes, least=2, example="4,8")

    from baselines.autoregressive import Autoregressive
    from graft.batch import BatchRequest, generate_batch, slot_capacity
    from graft.config.experiment import compose_checked, validate
    from graft.data.loading import load_prompts
    from graft.decode import SamplingConfig, generate
    from graft.load.models import load_model

    def loaded(fast_path: str):
        overrides = [f"model={args.model}", f"dataset={args.dataset}", "logger=none", f"hardware.fast_path={fast_path}"]
        cfg = validate(compose_checked(overrides))
        return cfg, load_model(cfg.model, cfg.hardware, progress=False)

    cfg, plain = loaded("none")
    _, engine = loaded("packed")
    prompts = [
        plain.chat.prompt_ids([{"role": "user", "content": p.turns[0]}])
        for p in load_prompts(cfg.dataset, cfg.paths.data_root, plain.chat)
    ]
    greedy, stops = SamplingConfig(), plain.stop_ids

    def alone(model) -> float:
        drafter, started, tokens = Autoregressive(model.target), time.perf_counter(), 0
        for ids in prompts:
            tokens += len(generate(model.target, drafter, ids, args.new_tokens, stops, greedy).new_tokens)
        return tokens / (time.perf_counter() - started)

    def batched(size: int) -> float:
        target, done = plain.target, []
        drafters = [Autoregressive(target) for _ in range(size)]
        queue = deque(BatchRequest(ids) for ids in prompts)
        capacity = slot_capacity([len(p) for p in prompts], args.new_tokens, 1)
        started = time.perf_counter()
        generate_batch(
            target, drafters, queue, args.new_tokens, stops, greedy, capacity, lambda r, g, s: done.append(g)
        )
        return sum(len(g.new_tokens) for g in done) / (time.perf_counter() - started)

    systems = {
        "batch 1, transformers forward": lambda: alone(plain),
        "batch 1, CPU engine": lambda: alone(engine),
        **{f"batch {size}, transformers forward": (lambda size=size: batched(size)) for size in sizes},
    }
    for run in systems.values():  # untimed: first calls, allocations
        run()
    names, found = list(systems), {name: [] for name in systems}
    for round_ in range(args.rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            found[name].append(systems[name]())
    base = statistics.median(found[names[0]])
    print(
        f"AR on {args.model}, {len(prompts)} prompts of {args.dataset} (first turns), {args.new_tokens} new tokens, "
        f"greedy; median of {args.rounds} rounds, prefill included"
    )
    print("| system | tokens/s | vs batch 1, same forward |")
    print("|---|---|---|")
    for name in names:
        median = statistics.median(found[name])
        ratio = f"{median / base:.2f}x" if "transformers" in name else "-"
        print(f"| {name} | {median:.1f} | {ratio} |")


if __name__ == "__main__":
    main()
