"""Entry point: `python run.py [model=X] [method=Y] [dataset=Z] [run.key=value ...]` (Hydra); the same command as
the installed `graft-run` (graft/run/cli.py, which sets the OpenMP policy before torch loads and finds the configs
in the package: graft/configs, linked from configs/)."""

from graft.run.cli import main

if __name__ == "__main__":
    main()
