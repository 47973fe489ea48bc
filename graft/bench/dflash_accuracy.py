"""Per-position top-1 accuracy of a block drafter on held-out text and on its training conversations.

    python -m graft.bench dflash-accuracy [--drafter heads/smollm2_135m_dflash] [--prompts 6] [--conversations FILE]

Held-out: the first `--prompts` built-in prompts, each with the target's own greedy 64-token answer (AR);
training: the first `--prompts` conversations of a conversations.jsonl (the prompt and 72 answer tokens).
Every answer position that leaves room for a block is an anchor; position k's accuracy is how often the
drafter's argmax at block position k equals the text's token. The gap between the two rows is what the
drafter memorised rather than learned.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml

from graft.bench import command_parser


def accuracy(target, drafter, taps, sequences, block: int) -> list[float]:
    from graft.draft_models.dflash.train import block_hidden

    hits, count = torch.zeros(block - 1), 0
    for ids, start in sequences:
        target.reset(len(ids) + 8)
        with torch.inference_mode():
            features = target.prefill(ids, taps).hidden
        anchors = torch.arange(start, len(ids) - block)[None]
        with torch.no_grad():
            hidden = block_hidden(drafter, target.embed, features.clone()[None], torch.tensor([ids]), anchors, block)
            predicted = target.lm_head(hidden[0, :, 1:]).argmax(-1)
        truth = torch.stack([torch.tensor(ids[a + 1 : a + block]) for a in anchors[0].tolist()])
        hits += (predicted == truth).float().sum(0)
        count += truth.shape[0]
    return (hits / max(count, 1)).tolist()


def main(argv: list[str] | None = None) -> None:
    parser = command_parser("dflash-accuracy", __doc__)
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--drafter", default="heads/smollm2_135m_dflash")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--conversations", default="outputs/train_dflash/smollm2_135m/conversations.jsonl")
    args = parser.parse_args(argv)

    from baselines.autoregressive import Autoregressive
    from graft.backends.target import HiddenTap
    from graft.config.hydra_setup import CONFIG_DIR
    from graft.config.schema import HardwareConfig, ModelConfig
    from graft.data.loading import BUILTIN
    from graft.decode import generate
    from graft.draft_models.dflash.checkpoint import load_block_drafter
    from graft.load.models import load_model
    from graft.schema import coerce_dataclass

    raw = yaml.safe_load((CONFIG_DIR / "model" / f"{args.model}.yaml").read_text())
    raw.pop("defaults", None)
    model = load_model(coerce_dataclass(ModelConfig, raw, "model"), HardwareConfig(name="cpu", fast_path="packed"))
    target = model.target
    drafter = load_block_drafter(args.drafter, target).float()
    taps = tuple(HiddenTap(i, "output") for i in drafter.cfg.target_layer_ids)
    block = drafter.cfg.block_size
    held = []
    for prompt in BUILTIN[: args.prompts]:
        ids = model.chat.prompt_ids([{"role": "user", "content": prompt.turns[0]}])
        answer = generate(target, Autoregressive(target), ids, 64, model.stop_ids).new_tokens
        held.append((ids + answer, len(ids)))
    print("block position:     " + " ".join(f"{k:>6}" for k in range(1, block)))
    print("held-out (built-in):" + " ".join(f"{a:6.3f}" for a in accuracy(target, drafter, taps, held, block)))
    path = Path(args.conversations)
    if path.is_file():
        convs = [json.loads(line) for line in path.read_text().splitlines()[: args.prompts]]
        seen = [((c["prompt_ids"] + c["answer_ids"])[: len(c["prompt_ids"]) + 72], len(c["prompt_ids"])) for c in convs]
        print("training conversations:" + " ".join(f"{a:6.3f}" for a in accuracy(target, drafter, taps, seen, block)))


if __name__ == "__main__":
    main()
