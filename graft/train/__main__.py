"""`python -m graft.train eagle3|dflash [Hydra overrides ...]`: train a drafter for a target of this harness.

    python -m graft.train eagle3 [model=smollm2_135m] [train.stage=all] [train.fit.max_minutes=60]
    python -m graft.train dflash [model=smollm2_135m] [train.stage=all] [train.data.conversations=FILE]

eagle3: an EAGLE-3 head (configs/train.yaml, configs/train/eagle3.yaml); dflash: a DFlash-style block drafter
(configs/train_dflash.yaml, configs/train/dflash.yaml). `python -m graft.train eagle3 --help` shows the config.
"""

from __future__ import annotations

import os
import sys

from graft.run.commands import one_line_errors, pick

COMMANDS = {  # trainer -> (module, what it trains)
    "eagle3": ("graft.train.eagle3", "an EAGLE-3 head"),
    "dflash": ("graft.train.dflash", "a DFlash-style block drafter"),
}


def main(argv: list[str] | None = None) -> None:
    command, rest = pick(__doc__, COMMANDS, argv)
    argv = [command, *rest]
    os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
    if command == "eagle3":  # as run.py does, before torch loads libgomp and allocates
        os.environ.setdefault("GOMP_SPINCOUNT", "100000000")
        from graft.cpu.threads import prefer_huge_pages  # imports no torch

        prefer_huge_pages()
    from graft.config.hydra_setup import register_schemas

    if command == "eagle3":
        from graft.train.eagle3 import main as train
    else:
        from graft.train.dflash import main as train
    register_schemas()
    check_train_overrides("train" if command == "eagle3" else "train_dflash", argv[1:])
    sys.argv = [sys.argv[0], *argv[1:]]  # Hydra reads the overrides from sys.argv
    train()


@one_line_errors
def check_train_overrides(config_name: str, overrides: list[str]) -> None:
    """The overrides composed once before Hydra runs the trainer: a syntax error, an unknown key or option is one
    line and exit 2 (graft/run/commands.py), as run.py's, instead of Hydra's dump. Hydra's own flags and hydra.*
    keys are left to Hydra."""
    from hydra import compose, initialize_config_dir

    from graft.config.hydra_setup import CONFIG_DIR
    from graft.config.override_checks import check_syntax, hydra_problem
    from graft.schema import ConfigError

    given = [o for o in overrides if "=" in o and not o.startswith("-") and not o.lstrip("+~").startswith("hydra")]
    check_syntax(given)
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            compose(config_name=config_name, overrides=given)
    except Exception as err:
        if type(err).__module__.split(".")[0] not in ("hydra", "omegaconf"):
            raise
        raise ConfigError(hydra_problem(err)) from None


if __name__ == "__main__":
    main()
