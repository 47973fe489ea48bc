"""Lossless check of many methods against one greedy baseline per prompt, in one process.

    python -m graft.report check-lossless --methods pld,recycling,graft --datasets builtin,mt_bench \
        --num-prompts 20 --max-new-tokens 64 [--set method.total_tokens=16] --out results/lossless.json

For every prompt the autoregressive baseline runs once (recording its top-2 logit gaps), then every
method runs the same turns; a method's tokens must equal the baseline's, and a divergence is reported
with the baseline's top-2 gap and whether it is a float tie. Speed is not measured here (run.py does
that, with each method's own interleaved baseline); sharing the baseline only saves time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def before_torch() -> None:
    """What the command sets before torch loads (graft.report's __main__ calls it first): OpenMP workers spin as
    run.py has them, W&B stays off, and torch's allocator asks for huge pages."""
    os.environ.setdefault("GOMP_SPINCOUNT", "100000000")
    os.environ.setdefault("WANDB_MODE", "disabled")
    from graft.cpu.threads import prefer_huge_pages  # imports no torch

    prefer_huge_pages()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m graft.report check-lossless",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--methods", required=True)
    parser.add_argument("--datasets", default="builtin")
    parser.add_argument("--num-prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--set", action="append", default=[], help="extra override for every method, e.g. method.total_tokens=16"
    )
    parser.add_argument(
        "--base", action="append", default=[], help="override for the model and hardware, e.g. hardware.num_threads=1"
    )
    parser.add_argument("--out", default="results/lossless_check.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    check_arguments(args)  # before anything loads: one line naming a bad name or count

    from baselines.autoregressive import Autoregressive
    from graft.config.experiment import validate
    from graft.config.override_checks import compose_checked
    from graft.load.models import load_model
    from graft.registry import build_drafter
    from graft.run.logs import to_console

    to_console()  # what loading the model and the prompts says (graft/run/logs.py), as a run shows it

    methods = args.methods.split(",")
    # method=ar: the model and hardware alone, so a model without a draft head does not fail the default comparison
    base_cfg = validate(compose_checked(["method=ar", "logger=none", *args.base]))
    configs = method_configs(methods, args.base, args.set)
    heads = {name: head_of(method) for name, method in configs.items()}
    for name, head in heads.items():
        if head is not None:
            print(f"{name}: draft head {head}")
    model = load_model(base_cfg.model, base_cfg.hardware, progress=False)
    drafters = {name: build_drafter(method, model.target) for name, method in configs.items()}
    baseline = Autoregressive(model.target)
    results = {
        "model": base_cfg.model.name,
        "max_new_tokens": args.max_new_tokens,
        "overrides": args.set,
        "base": args.base,
        "heads": heads,
        "datasets": {},
        "checked": {},
    }
    earlier = _earlier_results(Path(args.out), results, methods)
    for dataset in args.datasets.split(","):
        check_dataset(
            dataset,
            args,
            model=model,
            baseline=baseline,
            drafters=drafters,
            float_tie_ulps=base_cfg.run.float_tie_ulps,
            results=results,
            earlier=earlier,
        )
    lossless = all(len(r["divergent"]) == r["float_tie"] for t in results["datasets"].values() for r in t.values())
    print(f"lossless: {lossless}")
    sys.exit(0 if lossless else 1)


def check_dataset(
    dataset: str,
    args,
    *,
    model,
    baseline,
    drafters: dict,
    float_tie_ulps: float,
    results: dict,
    earlier: dict,
) -> None:
    """Every method on the first prompts of one dataset, into `results` (resumed from `earlier` where it has the
    dataset), saved to args.out after every prompt and printed as a table at the end."""
    from graft.config.experiment import validate
    from graft.config.override_checks import compose_checked
    from graft.data.loading import load_prompts
    from graft.run.conversation import PromptTooLong

    cfg = validate(compose_checked([f"dataset={dataset}", "logger=none"]))
    prompts = load_prompts(cfg.dataset, cfg.paths.data_root, model.chat)[: args.num_prompts]
    table = {name: {"prompts": 0, "equal": 0, "float_tie": 0, "divergent": []} for name in args.methods.split(",")}
    checked = []
    if dataset in earlier["datasets"]:  # resume: keep what an interrupted check already did
        table, checked = earlier["datasets"][dataset], earlier["checked"][dataset]
        print(f"{dataset}: resuming after {len(checked)} prompts checked in {args.out}")
    started = time.time()
    for prompt in prompts:
        if prompt.id in checked:
            continue
        try:
            check_prompt(
                prompt,
                table,
                model=model,
                baseline=baseline,
                drafters=drafters,
                max_new_tokens=args.max_new_tokens,
                float_tie_ulps=float_tie_ulps,
            )
        except PromptTooLong as err:
            print(f"skipped {prompt.id}: {err}")
        checked.append(prompt.id)
        results["datasets"][dataset], results["checked"][dataset] = table, checked
        _save(results, args.out)  # after every prompt: an interrupted check keeps what it did
    results["datasets"][dataset], results["checked"][dataset] = table, checked
    print(f"{dataset}: {len(prompts)} prompts in {time.time() - started:.0f} s")
    for name, row in table.items():
        bad = len(row["divergent"]) - row["float_tie"]
        print(
            f"  {name:14s} equal {row['equal']}/{row['prompts']}  float-tie divergences {row['float_tie']}  other divergences {bad}"
        )
    _save(results, args.out)


def check_prompt(
    prompt, table: dict, *, model, baseline, drafters: dict, max_new_tokens: int, float_tie_ulps: float
) -> None:
    """One prompt: the greedy baseline once (with its top-2 gaps), then every method, each counted in its row of
    `table` as equal, a float tie or another divergence."""
    from graft.decode import SamplingConfig
    from graft.run.conversation import run_conversation
    from graft.run.lossless import compare

    greedy = SamplingConfig()
    base = run_conversation(model, baseline, prompt, max_new_tokens, greedy, 0, record_gaps=True)
    for name, drafter in drafters.items():
        out = run_conversation(model, drafter, prompt, max_new_tokens, greedy, 0, record_gaps=False)
        verdict = compare(out, base, model.target.dtype, float_tie_ulps)
        row = table[name]
        row["prompts"] += 1
        if verdict["equal"]:
            row["equal"] += 1
        elif verdict["first_divergence"]["float_tie"]:
            row["float_tie"] += 1
            row["divergent"].append({"id": prompt.id, **verdict["first_divergence"]})
        else:
            row["divergent"].append({"id": prompt.id, **verdict["first_divergence"]})


def check_arguments(args) -> None:
    """The method and dataset names (config names under configs/) and the counts, before the model loads."""
    from graft.config.hydra_setup import group_options
    from graft.schema import ConfigError, suggest

    for flag, group, names in (("--methods", "method", args.methods), ("--datasets", "dataset", args.datasets)):
        options = group_options(group)
        for name in names.split(","):
            if name not in options:
                raise ConfigError(
                    f"{flag} names {name!r}, which is no {group} config; available: {', '.join(options)}"
                    + suggest(name, options)
                )
    if "ar" in args.methods.split(","):
        raise ConfigError("--methods names ar, the baseline every method is checked against; name the others")
    for flag, value in (("--num-prompts", args.num_prompts), ("--max-new-tokens", args.max_new_tokens)):
        if value < 1:
            raise ConfigError(f"{flag} {value} is not allowed; expected an integer >= 1")


def method_configs(methods: list[str], base: list[str], overrides: list[str]) -> dict:
    """Each method's validated config, composed as run.py composes `method=<name> <base> <overrides>`: the
    one rule for its draft head is the validated config's (method.head if given, else model.draft_head, so
    `--base model.draft_head=random` and `--set method.head=random` both reach every EAGLE method)."""
    from graft.config.experiment import validate
    from graft.config.override_checks import compose_checked

    return {
        name: validate(compose_checked([f"method={name}", "logger=none", *base, *overrides])).method for name in methods
    }


def head_of(method) -> str | None:
    """The draft head a validated method config resolved (None for methods without one)."""
    return next((params.head for params in method.parts.values() if hasattr(params, "head")), None)


def _save(results: dict, out: str) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(results, indent=1))


def _earlier_results(path: Path, fresh: dict, methods: list[str]) -> dict:
    """The datasets a previous run with the same settings wrote to `path` (with the prompt ids it checked);
    nothing when the file is absent or was made with other settings or methods."""
    if not path.exists():
        return {"datasets": {}, "checked": {}}
    old = json.loads(path.read_text())
    # the heads too: a check of other heads (e.g. --base model.draft_head=random) must not resume this one
    same = all(old.get(k) == fresh[k] for k in ("model", "max_new_tokens", "overrides", "base", "heads"))
    usable = {
        d: t for d, t in old.get("datasets", {}).items() if same and list(t) == methods and d in old.get("checked", {})
    }
    return {"datasets": usable, "checked": {d: old["checked"][d] for d in usable}}


if __name__ == "__main__":
    main()
