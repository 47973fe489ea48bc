"""`python -m graft.train eagle3|dflash [Hydra overrides ...]`: train a drafter for a target of this harness.

    python -m graft.train eagle3 [model=smollm2_135m] [train.stage=all] [train.fit.max_minutes=60]
    python -m graft.train dflash [model=smollm2_135m] [train.stage=all] [train.data.conversations=FILE]

eagle3: an EAGLE-3 head (configs/train.yaml, configs/train/eagle3.yaml); dflash: a DFlash-style block drafter
(configs/train_dflash.yaml, configs/train/dflash.yaml). `python -m graft.train eagle3 --help` shows the config.
"""

from __future__ import annotations

import os
import sys

COMMANDS = ("eagle3", "dflash")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        wanted = argv and argv[0] in ("-h", "--help")
        print(__doc__.strip(), file=sys.stdout if wanted else sys.stderr)
        sys.exit(0 if wanted else 2)
    command = argv[0]
    os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
    if command == "eagle3":  # as run.py does, before torch loads libgomp and allocates
        os.environ.setdefault("GOMP_SPINCOUNT", "100000000")
        from graft.cpu.threads import prefer_huge_pages  # imports no torch

        prefer_huge_pages()
    from graft.config import register_schemas

    if command == "eagle3":
        from graft.train.eagle3 import main as train
    else:
        from graft.train.dflash import main as train
    register_schemas()
    sys.argv = [sys.argv[0], *argv[1:]]  # Hydra reads the overrides from sys.argv
    train()


if __name__ == "__main__":
    main()
