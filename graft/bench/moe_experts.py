"""Verify time against the experts a tree touches, on a small random Qwen3-MoE on this machine (the figure in
docs/gpu.md, "What a mixture-of-experts target means for the budget"):

    python -m graft.bench moe-experts [--rounds 15]

graft/budget/measure.py `measure_experts`: the experts each layer's router picks by tree size, and a 32-node
verification with the routing pinned to 4 .. 32 experts (32 experts, top-4, 2 layers, hidden 256, expert width
1024, float32, one thread, 128 cached positions). Prints the profile's `moe` entry as JSON.
"""

import json

import torch

from graft.bench import at_least, command_parser
from graft.budget.measure import ContextCache, measure_experts
from graft.gpu_check.measure import harness_target, random_causal_lm

ARCH = dict(
    vocab_size=512,
    hidden_size=256,
    intermediate_size=512,
    moe_intermediate_size=1024,
    num_experts=32,
    num_experts_per_tok=4,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=2048,
    rms_norm_eps=1e-6,
)


def main(argv: list[str] | None = None) -> None:
    parser = command_parser("moe-experts", __doc__)
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds of the pinned sweep (medians)")
    args = parser.parse_args(argv)
    at_least(rounds=(args.rounds, 1))
    torch.set_num_threads(1)
    model = random_causal_lm("qwen3_moe", ARCH, torch.device("cpu"), torch.float32)
    target = harness_target(model, object(), "moe_small")  # no hardware settings: plain forward, host clock
    moe = measure_experts(target, ContextCache(target, 128, 32), [1, 2, 4, 8, 16, 32], repeats=args.rounds)
    print(json.dumps(moe))


if __name__ == "__main__":
    main()
