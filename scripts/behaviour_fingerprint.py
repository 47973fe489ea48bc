"""Every method config's greedy outputs as a fingerprint (token hash, accept-length hash, tau per prompt), on
tiny_llama, tiny_qwen3 and the embedded model, plus a seeded sampling run on tiny_llama: run before and after a
refactor and diff the two JSON files (behaviour unchanged = identical files).

    python scripts/behaviour_fingerprint.py --out before.json [--models tiny_llama,tiny_qwen3,smollm2_135m]
"""

import argparse
import hashlib
import json
from pathlib import Path

import torch

from graft.config.experiment import compose, validate
from graft.config.hydra_setup import group_options
from graft.data.loading import BUILTIN
from graft.decode import SamplingConfig, generate
from graft.load.models import load_model
from graft.registry import build_drafter, method_config


def digest(values) -> str:
    return hashlib.sha1(json.dumps(values).encode()).hexdigest()[:12]


def load(name: str):
    """The model on the CPU engine, and the drafters' heads: seeded random ones on a tiny model (as the tests
    build them), the shipped ones on the embedded model."""
    tiny = name.startswith("tiny")
    chosen = ["hardware=cpu"] + (["hardware.fast_path=packed"] if tiny else [])
    cfg = validate(compose([f"model={name}", "logger=none", *chosen]))
    model = load_model(cfg.model, cfg.hardware, progress=False)
    torch.set_flush_denormal(True)  # as the tests do: random weights drift into subnormals
    heads = {"draft_head": "random", "block_drafter": "random"} if tiny else {
        "draft_head": cfg.model.draft_head, "block_drafter": cfg.model.block_drafter}  # fmt: skip
    return model, heads


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default="tiny_llama,tiny_qwen3,smollm2_135m")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    torch.manual_seed(0)
    found = {}
    for name in args.models.split(","):
        model, heads = load(name)
        runs = [(m, SamplingConfig()) for m in group_options("method")]
        runs += [(m, SamplingConfig(0.9, 0.95)) for m in group_options("method")] if name == "tiny_llama" else []
        for method, sampling in runs:
            raw = compose([f"method={method}"])["method"]
            row = []
            for k in range(args.prompts):
                ids = model.chat.prompt_ids([{"role": "user", "content": BUILTIN[k].turns[0]}])
                drafter = build_drafter(method_config(raw, **heads), model.target)
                generator = None if sampling.greedy else torch.Generator().manual_seed(7 + k)
                out = generate(model.target, drafter, ids, args.tokens, model.stop_ids, sampling, generator)
                row.append([digest(out.new_tokens), digest(out.accept_lengths), round(out.tau or 0, 4)])
            key = f"{name}/{method}" + ("" if sampling.greedy else "@t0.9")
            found[key] = row
            print(key, row, flush=True)
    args.out.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
