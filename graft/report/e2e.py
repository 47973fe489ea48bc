"""The side by side of graft/bench/e2e.py: its systems (transformers `generate`, this project's AR and its
speculative methods, some on a second float target), and its summary of the per-prompt records: tokens/s
per round, ratios to HF generate and to AR, equality with each system's baseline, and where a step's time
goes. `python -m graft.report render` reads the JSON it writes (render.py: side_by_side, step_split).
"""

from __future__ import annotations

import statistics

PYTHON_LOOP = "_python_loop"  # not a method key: the system runs with the target's native loop off
ONEDNN = "_onednn"  # not a method key: the system runs on a second target whose products are oneDNN's
BF16 = "_packed_bf16"  # not a method key: the system runs on a second target, fast_path=packed_bf16
NO_AMX = "_no_amx"  # not a method key: the system runs with graft/cpu/native's AMX tiles off (the dot products)
# trim auto on the packed_bf16 target measures that target's costs at start-up (method.cost_profile=auto)
VARIANTS = {ONEDNN: ("product_kernel", "onednn", "ar/onednn"), BF16: ("fast_path", "packed_bf16", "ar/bf16")}
SYSTEMS = {  # name -> method config and overrides (None: a transformers system)
    "hf_generate": None,
    "hf_prompt_lookup": None,
    # transformers' generate on the model cast to bfloat16 (oneDNN's bfloat16 products: AMX where the CPU has it)
    "hf_generate/bf16": None,
    "ar": ("ar", {}),
    # the target with its products' weights in bfloat16 (hardware.fast_path=packed_bf16: AMX tiles where the CPU
    # has them); its systems are checked against ar/bf16, a different float target from ar's
    "ar/bf16": ("ar", {BF16: True}),
    "graft@8/bf16": ("graft", {"total_tokens": 8, BF16: True}),
    "graft@16/bf16": ("graft", {"total_tokens": 16, BF16: True}),
    "graft@24/bf16": ("graft", {"total_tokens": 24, BF16: True}),
    "graft@32/bf16": ("graft", {"total_tokens": 32, BF16: True}),
    "graft@16/refill/bf16": ("graft", {"total_tokens": 16, "refill": True, BF16: True}),
    "graft@24/refill/bf16": ("graft", {"total_tokens": 24, "refill": True, BF16: True}),
    "graft@32/refill/bf16": ("graft", {"total_tokens": 32, "refill": True, BF16: True}),
    "eagle3@4/bf16": ("eagle3", {"total_tokens": 4, BF16: True}),
    "eagle3@8/bf16": ("eagle3", {"total_tokens": 8, BF16: True}),
    "eagle3@16/bf16": ("eagle3", {"total_tokens": 16, BF16: True}),
    "eagle3@24/bf16": ("eagle3", {"total_tokens": 24, BF16: True}),
    "pld/bf16": ("pld", {BF16: True}),
    "graft@16/recycling+pld/bf16": ("graft", {"total_tokens": 16, "retrieval": ["recycling", "pld"], BF16: True}),
    "graft_auto@16/bf16": ("graft_auto", {"total_tokens": 16, BF16: True}),
    "graft_auto@24/bf16": ("graft_auto", {"total_tokens": 24, BF16: True}),
    "graft_auto@32/bf16": ("graft_auto", {"total_tokens": 32, BF16: True}),
    # before the AMX tiles: the bfloat16 head's products on vdpbf16ps (the float32 target is the same either way)
    "graft@6/refill/no_amx": ("graft", {"total_tokens": 6, "refill": True, NO_AMX: True}),
    "graft@16/no_amx": ("graft", {"total_tokens": 16, NO_AMX: True}),
    "eagle3@4/no_amx": ("eagle3", {"total_tokens": 4, NO_AMX: True}),
    "pld": ("pld", {}),
    "graft@8": ("graft", {"total_tokens": 8}),
    "graft@16": ("graft", {"total_tokens": 16}),
    "eagle3@8": ("eagle3", {"total_tokens": 8}),
    # the dense tree at small budgets: EagleSource drafts only the nodes such a budget can keep (Split.widest_useful)
    "eagle3@4": ("eagle3", {"total_tokens": 4}),
    "eagle3@6": ("eagle3", {"total_tokens": 6}),
    "graft@6": ("graft", {"total_tokens": 6}),
    "graft@4": ("graft", {"total_tokens": 4}),
    # EAGLE-3 at small, shallow dense trees: the settings where drafting costs least here
    "eagle3@6/d3k3": ("eagle3", {"total_tokens": 6, "depth": 3, "top_k": 3}),
    "eagle3@4/d2k2": ("eagle3", {"total_tokens": 4, "depth": 2, "top_k": 2}),
    "eagle3@4/d2k2/bf16_head": ("eagle3", {"total_tokens": 4, "depth": 2, "top_k": 2, "head_dtype": "bfloat16"}),
    # the draft head in bfloat16 (half the bytes per level; the target still verifies in float32), and
    # EAGLE-3's best setting measured on this CPU: a small, shallow dense tree
    "graft@16/bf16_head": ("graft", {"total_tokens": 16, "head_dtype": "bfloat16"}),
    "graft@6/bf16_head": ("graft", {"total_tokens": 6, "head_dtype": "bfloat16"}),
    "graft@8/bf16_head": ("graft", {"total_tokens": 8, "head_dtype": "bfloat16"}),
    "eagle3@6/d3k3/bf16_head": ("eagle3", {"total_tokens": 6, "depth": 3, "top_k": 3, "head_dtype": "bfloat16"}),
    "dflash": ("dflash", {}),
    # Token Recycling's table started from the prefill's top-k at every prompt position (the paper's form)
    "graft@16/prefill_cold_start": ("graft", {"total_tokens": 16, "cold_start": "prefill"}),
    "recycling": ("recycling", {}),
    # the budget Token Recycling leaves unfilled (unknown table entries) filled by prompt lookup after it
    "graft@8/recycling+pld": ("graft", {"total_tokens": 8, "retrieval": ["recycling", "pld"]}),
    "recycling/prefill_cold_start": ("recycling", {"cold_start": "prefill"}),
    # the budget retrieval leaves unfilled given to the draft's next-best candidates (method.refill)
    "graft@8/refill": ("graft", {"total_tokens": 8, "refill": True}),
    "graft@6/refill": ("graft", {"total_tokens": 6, "refill": True}),
    "graft@12/refill": ("graft", {"total_tokens": 12, "refill": True}),
    "graft@8/refill/bf16_head": ("graft", {"total_tokens": 8, "refill": True, "head_dtype": "bfloat16"}),
    # a frontier no wider than the draft can keep (top-k 7 of 8 nodes, 5 of 6): head levels of fewer rows
    "graft@8/k7/refill": ("graft", {"total_tokens": 8, "refill": True, "top_k": 7}),
    "graft@6/k5/refill": ("graft", {"total_tokens": 6, "refill": True, "top_k": 5}),
    # the refilled united tree cut each step to the most expected tokens per ms (trim auto), at most N nodes
    "graft_auto@8": ("graft_auto", {"total_tokens": 8}),
    "graft_auto@12": ("graft_auto", {"total_tokens": 12}),
    "graft_auto@16": ("graft_auto", {"total_tokens": 16}),
    "graft@8/k7": ("graft", {"total_tokens": 8, "top_k": 7}),
    # the target's layer loop in Python (the native C++ loop switched off for this system only)
    "ar/python": ("ar", {PYTHON_LOOP: True}),
    "graft@8/python": ("graft", {"total_tokens": 8, PYTHON_LOOP: True}),
    # the target's products through oneDNN instead of graft/cpu/native's panel kernel (a second target, same weights)
    "ar/onednn": ("ar", {ONEDNN: True}),
    "graft@6/onednn": ("graft", {"total_tokens": 6, ONEDNN: True}),
    "graft@6/bf16_head/onednn": ("graft", {"total_tokens": 6, "head_dtype": "bfloat16", ONEDNN: True}),
    # the head in float32 whatever method.head_dtype=auto picks (bfloat16 on an AVX2 build)
    "graft@6/f32_head": ("graft", {"total_tokens": 6, "head_dtype": "float32"}),
    "graft@8/refill/f32_head": ("graft", {"total_tokens": 8, "refill": True, "head_dtype": "float32"}),
    "eagle3@4/f32_head": ("eagle3", {"total_tokens": 4, "head_dtype": "float32"}),
}


PHASES = ("draft", "verify", "other")  # a step's phases, as graft/decode.py times them


def variant(name: str) -> str | None:
    """The second target a system runs on (ONEDNN, BF16), or None: the default fast target."""
    return next((key for key in VARIANTS if SYSTEMS[name] and SYSTEMS[name][1].get(key)), None)


def tau_needed(step_ms: float, ar_ms_per_token: float, ratio: float) -> float:
    """The tokens a step must commit for `ratio` x AR's tokens/s at a step cost of `step_ms` (draft + verify +
    other), AR committing one token every `ar_ms_per_token`: ratio = tau ar_ms_per_token / step_ms."""
    return ratio * step_ms / ar_ms_per_token


def summarise(records: list[dict], names: list[str], tau_for: float | None = None) -> list[dict]:
    """Per system: tokens/s over all prompts of a round, ratios to HF generate and to AR within the round, and
    whether every output equals its baseline's (transformers systems against hf_generate, this project's
    against ar, or against ar/onednn (ar/bf16) for the systems on the oneDNN (packed_bf16) target where it ran,
    hf_generate/bf16 against nothing: a different summation
    order is a different float target). Over several rounds (records' `round`) the medians, and x AR's range.
    With `tau_for`, each of this project's systems' `tau_needed`: the tau that would give it `tau_for` x its
    target's AR at its measured step costs (tau_needed)."""
    rounds = sorted({r.get("round", 0) for r in records})
    rates = []  # per round: system -> tokens/s
    for round_ in rounds:
        taken = [r for r in records if r.get("round", 0) == round_]
        rates.append({n: sum(len(r[n]["tokens"]) for r in taken) / sum(r[n]["seconds"] for r in taken) for n in names})
    rows = []
    for name in names:
        base = "hf_generate" if SYSTEMS[name] is None else "ar"
        if variant(name) is not None and VARIANTS[variant(name)][2] in names:
            base = VARIANTS[variant(name)][2]
        if name == "hf_generate/bf16":
            base = None
        equal = all(r[name]["tokens"] == r[base]["tokens"] for r in records) if base in names else None
        row = {"system": name, "tokens_per_s": statistics.median(rate[name] for rate in rates), "equal": equal}
        if "hf_generate" in names:
            row["x_hf"] = statistics.median(rate[name] / rate["hf_generate"] for rate in rates)
        if "ar" in names:
            per_round = [rate[name] / rate["ar"] for rate in rates]
            row["x_ar"] = statistics.median(per_round)
            if len(rates) > 1:
                row["x_ar_range"] = [min(per_round), max(per_round)]
        own = VARIANTS[variant(name)][2] if variant(name) is not None else "ar"
        if SYSTEMS[name] is not None and own != "ar" and own in names:  # against the AR of its own target
            row["x_own_ar"] = statistics.median(rate[name] / rate[own] for rate in rates)
        if SYSTEMS[name] is not None:
            row.update(step_split([r[name] for r in records]))
            if tau_for and own in names and name != own:
                step_ms = sum(row[f"{phase}_ms"] for phase in PHASES)
                row["tau_needed"] = tau_needed(step_ms, step_split([r[own] for r in records])["ms_per_token"], tau_for)
        rows.append(row)
    return rows


def step_split(runs: list[dict]) -> dict:
    """Over a system's runs: tokens per step (tau, the first token from the prefill excluded), the mean
    milliseconds per step of each phase, and the decode milliseconds per token (prefill excluded)."""
    steps = sum(run["phases"]["steps"] for run in runs)
    step_tokens = sum(len(run["tokens"]) - 1 for run in runs)
    decode_s = sum(run["seconds"] - run["phases"]["prefill_s"] for run in runs)
    split = {f"{phase}_ms": 1e3 * sum(run["phases"][f"{phase}_s"] for run in runs) / max(steps, 1) for phase in PHASES}
    return {"tau": step_tokens / max(steps, 1), **split, "ms_per_token": 1e3 * decode_s / max(step_tokens, 1)}


def print_tables(table: list[dict], repeats: int, tau_for: float | None) -> None:
    """The summary as two Markdown tables: tokens/s and ratios, then where a step's time goes."""
    print("tokens/s = new tokens / generation seconds (prefill included), summed over prompts")
    if repeats > 1:
        print(f"medians over {repeats} rounds; x AR's range over the rounds in brackets")
    print("x its target's AR: against ar/bf16 (ar/onednn) for the systems on that target, where it ran")
    print("| system | tokens/s | x HF generate | x this project's AR | x its target's AR | equal to its baseline |")
    print("|---|---|---|---|---|---|")
    for row in table:
        spread = row.get("x_ar_range")
        spread = f" [{spread[0]:.2f}-{spread[1]:.2f}]" if spread else ""
        own = f"{row['x_own_ar']:.2f}" if "x_own_ar" in row else "-"
        print(
            f"| {row['system']} | {row['tokens_per_s']:.1f} | {row.get('x_hf', float('nan')):.2f} | "
            f"{row.get('x_ar', float('nan')):.2f}{spread} | {own} | {row['equal']} |"
        )
    print("\nwhere a step's time goes (means per step; tau = tokens per step after the first, graft/decode.py)")
    needed = f" tau for {tau_for:g}x its AR |" if tau_for else ""
    print(f"| system | tau | draft ms | verify ms | other ms | ms per token |{needed}")
    print("|---|---|---|---|---|---|" + ("---|" if needed else ""))
    for row in table:
        if "tau" in row:
            print(
                f"| {row['system']} | {row['tau']:.2f} | {row['draft_ms']:.2f} | {row['verify_ms']:.2f} | "
                f"{row['other_ms']:.2f} | {row['ms_per_token']:.2f} |"
                + (f" {row['tau_needed']:.2f} |" if needed and "tau_needed" in row else " - |" if needed else "")
            )


def stored_records(records: list[dict]) -> list[dict]:
    """The per-prompt records as the JSON keeps them: each system's token count, seconds and phases."""
    kept = ("prompt", "prompt_tokens", "round")
    return [
        {
            k: v if k in kept else {"n": len(v["tokens"]), "seconds": v["seconds"], "phases": v["phases"]}
            for k, v in r.items()
        }
        for r in records
    ]
