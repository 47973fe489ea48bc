"""The equality table of batched decoding: for every model, method and batch size, how many sequences decode
exactly batch-1 AR's tokens on their prompt (greedy), and any divergence judged by the float-tie rule.

    python -m graft.bench batch-lossless [--models tiny_llama,tiny_qwen3,smollm2_135m] [--sizes 1,4,8]
        [--methods ar,pld,eagle3,pruned,graft,graft_auto] [--dataset builtin_quick] [--new-tokens 24]
        [--fast-path packed]

Each model runs on hardware.fast_path (default packed: the CPU engine's ragged rows; none: the transformers
forward's padded rows), batch 1 on the same forward, over the dataset's first turns in its chat template (a
tiny random model's byte tokenizer included), the EAGLE heads and block drafters random. A method decodes the prompts
through graft/batch.py with one drafter per slot, so more prompts than slots means newcomers take freed slots.
A cell reads "8/8 equal", or names the divergences: "7/8 equal, 1 float tie" where the baseline's top-2 gap at
the first differing position is within graft/run/lossless.py's rule, else "1 DIVERGES".
"""

from __future__ import annotations

from collections import deque

from graft.bench import batch_sizes, command_parser


def main(argv: list[str] | None = None) -> None:
    parser = command_parser("batch-lossless", __doc__)
    parser.add_argument("--models", default="tiny_llama,tiny_qwen3,smollm2_135m")
    parser.add_argument("--sizes", default="1,4,8")
    parser.add_argument("--methods", default="ar,pld,eagle3,pruned,graft,graft_auto")
    parser.add_argument("--dataset", default="builtin_quick")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--fast-path", default="packed", help="hardware.fast_path: packed (the engine) or none")
    args = parser.parse_args(argv)
    from graft.schema import ConfigError

    sizes = batch_sizes(args.sizes, least=1, example="1,4,8")
    if args.new_tokens < 1:
        raise ConfigError(f"--new-tokens {args.new_tokens} is not allowed; expected an integer >= 1")
    methods, models = args.methods.split(","), args.models.split(",")
    from graft.config.hydra_setup import group_options

    unknown = sorted(set(methods) - set(group_options("method")) - {"ar"})
    if unknown:
        allowed = ", ".join(["ar", *group_options("method")])
        raise ConfigError(f"--methods {','.join(unknown)}: no such method; allowed: {allowed}")
    rows = {}
    for name in models:
        for method, cells in table_of(name, methods, sizes, args.dataset, args.new_tokens, args.fast_path).items():
            rows[(name, method)] = cells
    print(
        f"Greedy, {args.new_tokens} new tokens, first turns of {args.dataset}, hardware.fast_path={args.fast_path}: "
        "sequences equal to batch-1 AR's"
    )
    print("| model | method | " + " | ".join(f"B={b}" for b in sizes) + " |")
    print("|---|---|" + "---|" * len(sizes))
    for (model, method), cells in rows.items():
        print(f"| {model} | {method} | " + " | ".join(cells) + " |")


def table_of(
    model_name: str, methods: list[str], sizes: list[int], dataset: str, new_tokens: int, fast_path: str = "packed"
) -> dict:
    """{method: one cell per batch size} for one model."""
    from baselines.autoregressive import Autoregressive
    from graft.batch import BatchRequest, generate_batch, slot_capacity
    from graft.config.experiment import validate
    from graft.config.override_checks import compose_checked
    from graft.data.loading import load_prompts
    from graft.decode import SamplingConfig, generate
    from graft.load.models import load_model
    from graft.registry import build_drafter, method_config
    from graft.run.lossless import float_tie

    overrides = [
        f"model={model_name}",
        f"dataset={dataset}",
        "logger=none",
        "hardware=cpu",
        f"hardware.fast_path={fast_path}",
    ]
    cfg = validate(compose_checked(overrides))
    model = load_model(cfg.model, cfg.hardware, progress=False)
    target, greedy = model.target, SamplingConfig()
    prompts = load_prompts(cfg.dataset, cfg.paths.data_root, model.chat)
    ids = [model.chat.prompt_ids([{"role": "user", "content": p.turns[0]}]) for p in prompts]
    stops = model.stop_ids
    ar = [generate(target, Autoregressive(target), p, new_tokens, stops, greedy, record_gaps=True) for p in ids]

    cells = {}
    for method in methods:
        cells[method] = []
        config = None  # composed once per method: each slot's drafter is built from it
        if method != "ar":
            raw = dict(compose_checked([f"method={method}", f"model={model_name}"])["method"])
            config = method_config(raw, draft_head="random", block_drafter="random")
        for batch in sizes:
            drafters = [
                Autoregressive(target) if config is None else build_drafter(config, target, batch) for _ in range(batch)
            ]
            for other in drafters[1:]:
                other.share_with(drafters[0])
            done = {}
            queue = deque(BatchRequest(p, tag=i) for i, p in enumerate(ids))
            capacity = slot_capacity([len(p) for p in ids], new_tokens, max(d.max_nodes() for d in drafters))
            generate_batch(
                target,
                drafters,
                queue,
                new_tokens,
                stops,
                greedy,
                capacity,
                lambda r, g, s, done=done: done.__setitem__(r.tag, g),
            )
            equal = ties = diverged = 0
            for i, base in enumerate(ar):
                got = done[i].new_tokens
                if got == base.new_tokens:
                    equal += 1
                    continue
                at = next(
                    (k for k, (a, b) in enumerate(zip(got, base.new_tokens)) if a != b),
                    min(len(got), len(base.new_tokens)),
                )
                tie = at < len(base.top2_gaps) and float_tie(base.top2_gaps[at], base.top_logits[at], target.dtype)
                ties, diverged = ties + tie, diverged + (not tie)
            cell = f"{equal}/{len(ar)} equal"
            cell += f", {ties} float tie" if ties else ""
            cell += f", {diverged} DIVERGES" if diverged else ""
            cells[method].append(cell)
    return cells


if __name__ == "__main__":
    main()
