"""The Hydra side of the config: where its groups live (CONFIG_DIR, inside the package) and their options,
what Hydra needs before it composes them (each group's schema node and the config's resolvers: register_schemas),
and its composition of prepared overrides (compose_prepared).
"""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

from graft.config.schema import SCHEMA_GROUPS, HardwareConfig
from graft.schema import schema_defaults

# the Hydra configs ship inside the package (graft/configs; the repository's configs/ links to it), so an
# installed copy finds them wherever it runs from
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
GROUPS = ("model", "method", "dataset", "logger", "hardware", "experiment")


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def run_label(methods, method_name: str) -> str:
    """A run directory's method part: the method's name, or `compare` for a comparison."""
    return "compare" if methods else method_name


@functools.cache
def hardware_profile(name: str) -> dict:
    """What configs/hardware/<name>.yaml states beyond the schema defaults."""
    raw = yaml.safe_load((CONFIG_DIR / "hardware" / f"{name}.yaml").read_text()) or {}
    raw.pop("defaults", None)
    return raw


def auto_hardware(key: str):
    """`${auto_hardware:<key>}` in configs/hardware/auto.yaml: hardware=auto's value of `key`, gpu.yaml's where
    torch sees a CUDA device, else cpu.yaml's (the schema default where that file states none). The GPU count,
    and with it gpu_multi.yaml's sharding, is settled at start-up (graft/plan/hardware.resolve_hardware)."""
    import torch

    settings = hardware_profile("gpu" if torch.cuda.is_available() else "cpu")
    return settings[key] if key in settings else schema_defaults(HardwareConfig)[key]


def register_schemas() -> None:
    """Store each group's full key set as `<group>/schema`; group YAML files start from it; register the
    config's resolvers."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("run_label", run_label, replace=True)
    OmegaConf.register_new_resolver("auto_hardware", auto_hardware, replace=True)

    store = ConfigStore.instance()
    for group, cls in SCHEMA_GROUPS.items():
        store.store(group=group, name="schema", node=schema_defaults(cls))


def compose_prepared(overrides: list[str]) -> dict:
    """Hydra's composition of overrides already prepared (prepare_overrides), run.out_dir left unset."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    register_schemas()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=overrides)
        with open_dict(cfg):
            cfg.run.out_dir = "unused"
        return OmegaConf.to_container(cfg, resolve=True)
