"""How every figure draws a method, a dataset and an axis: each method keeps one colour and marker in every
figure (`method_style`, keyed by its name: Graft variants in reds and oranges, EAGLE-3 variants in blues, DFlash
in greens, retrieval baselines in purples, from the colour-blind-safe sets of Okabe-Ito and Paul Tol); a name not
listed gets a colour from a hash of the name, never from its position."""

from __future__ import annotations

import hashlib

# name: (colour, marker, label). Order = legend order.
PALETTE = {
    "ar": ("#000000", "*", "Autoregressive"),
    # retrieval only (purples), SAM-Decoding's switch (olive)
    "pld": ("#CC79A7", "P", "PLD"),
    "suffix": ("#AA4499", "X", "Suffix (SuffixDecoding)"),
    "recycling": ("#882255", "h", "Token Recycling"),
    "samd": ("#999933", "d", "SAM-Decoding (on EAGLE-3)"),
    # EAGLE-3 and its trees (blues)
    "eagle3": ("#0072B2", "o", "EAGLE-3"),
    "eagle3_chain": ("#56B4E9", "s", "EAGLE-3 chain"),
    "eagle3_static": ("#332288", "^", "EAGLE-3 static tree"),
    "eagle3_auto": ("#88CCEE", "D", "EAGLE-3, auto budget"),
    "pruned": ("#44AA99", "v", "Pruned EAGLE-3 tree"),
    # Graft and its variants (reds, oranges)
    "graft": ("#D55E00", "o", "Graft"),
    "graft_root": ("#E69F00", "s", "Graft(ROOT)"),
    "graft_noprune": ("#994F00", "^", "Graft w/o prune"),
    "graft_tail": ("#EE3377", "D", "Graft(TAIL)"),
    "graft_refill": ("#A50F15", "P", "Graft + refill"),
    "graft_auto": ("#F4A582", "X", "Graft, auto budget"),
    "dflash_graft": ("#FC8D59", "h", "Graft-DFlash"),
    # DFlash (greens)
    "dflash": ("#117733", "o", "DFlash"),
    "dflash_tree": ("#66BB55", "s", "DFlash tree"),
}
FALLBACK_COLOURS = ("#7F7F7F", "#BCBD22", "#17BECF", "#8C564B", "#9467BD", "#2CA02C", "#1F77B4", "#FF7F0E")
FALLBACK_MARKERS = "os^Dv<>Ph*X"

AXES = {
    "speedup_wall": "Speedup over autoregressive (wall clock, x)",
    "speedup_decode": "Speedup over autoregressive (decode only, x)",
    "tau": "Accepted tokens per step (tau)",
    "avg_nodes_per_step": "Verified nodes per step (root included)",
}
DATASETS = {
    "eagle_mt_bench": "MT-Bench",
    "eagle_humaneval": "HumanEval",
    "eagle_gsm8k": "GSM8K",
    "eagle_alpaca": "Alpaca",
    "eagle_cnndm": "CNN/DM",
    "eagle_natural_questions": "Natural Questions",
    "gsm8k": "GSM8K",
    "spec_bench": "Spec-Bench",
    "builtin": "built-in prompts",
    "builtin_quick": "built-in prompts (quick)",
    "long_synthetic": "long context (synthetic)",
}
STAGE_COLOURS = ("#BBBBBB", "#004488", "#DDAA33", "#BB5566", "#000000")
PUBLISHED = "#555555"  # the paper's figures, in no method's colour
TIME_COLOURS = {"draft_ms": "#DDAA33", "verify_ms": "#004488", "other_ms": "#BBBBBB"}


def method_style(name: str) -> dict:
    """{"color", "marker", "label"} of a method, the same in every figure whatever else is plotted; a name not
    in PALETTE gets a colour and marker from a hash of the name (stable across processes)."""
    if name in PALETTE:
        colour, marker, label = PALETTE[name]
    else:
        digest = int(hashlib.sha256(name.encode()).hexdigest(), 16)
        colour = FALLBACK_COLOURS[digest % len(FALLBACK_COLOURS)]
        marker = FALLBACK_MARKERS[(digest // len(FALLBACK_COLOURS)) % len(FALLBACK_MARKERS)]
        label = name
    return {"color": colour, "marker": marker, "label": label}


def method_order(names) -> list[str]:
    """Methods in legend order: PALETTE's order, then unknown names alphabetically."""
    rank = {name: k for k, name in enumerate(PALETTE)}
    return sorted(set(names), key=lambda n: (rank.get(n, len(rank)), n))


def dataset_label(name: str) -> str:
    return DATASETS.get(name, name)


def hardware_name(hardware: dict) -> str:
    return hardware.get("gpu") or hardware.get("cpu") or hardware.get("device", "?")
