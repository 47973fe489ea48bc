"""Every method config's greedy outputs as a fingerprint (token hash, accept-length hash, tau per prompt), on
tiny_llama, tiny_qwen3 and the embedded model, plus a seeded sampling run on tiny_llama: run before and after a
refactor and diff the two JSON files (behaviour unchanged = identical files).

    python scripts/behaviour_fingerprint.py --out before.json [--models tiny_llama,tiny_qwen3,smollm2_135m]
"""

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import compose, load_tiny, method_yaml  # noqa: E402  the suite's seeded tiny models

from graft.config.experiment import group_options, validate  # noqa: E402
from graft.data.loading import BUILTIN  # noqa: E402
from graft.decode import SamplingConfig, generate  # noqa: E402
from graft.load.models import load_model  # noqa: E402
from graft.registry import build_drafter, method_config  # noqa: E402


def digest(values) -> str:
    return hashlib.sha1(json.dumps(values).encode()).hexdigest()[:12]


def load(name: str):
    if name.startswith("tiny"):
        return load_tiny(f"{name}:packed"), "random"
    cfg = validate(compose([f"model={name}", "logger=none"]))
    return load_model(cfg.model, cfg.hardware, progress=False), None


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
        model, head = load(name)
        runs = [(m, SamplingConfig()) for m in group_options("method")]
        runs += [(m, SamplingConfig(0.9, 0.95)) for m in group_options("method")] if name == "tiny_llama" else []
        for method, sampling in runs:
            raw = dict(method_yaml(method))
            drafter_kwargs = {"draft_head": head, "block_drafter": head} if head else {}
            row = []
            for k in range(args.prompts):
                ids = model.chat.prompt_ids([{"role": "user", "content": BUILTIN[k].turns[0]}])
                drafter = build_drafter(method_config(raw, **drafter_kwargs), model.target)
                generator = None if sampling.greedy else torch.Generator().manual_seed(7 + k)
                out = generate(model.target, drafter, ids, args.tokens, model.stop_ids, sampling, generator)
                row.append([digest(out.new_tokens), digest(out.accept_lengths), round(out.tau or 0, 4)])
            key = f"{name}/{method}" + ("" if sampling.greedy else "@t0.9")
            found[key] = row
            print(key, row, flush=True)
    args.out.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
