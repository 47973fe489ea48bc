"""Two builds of graft/cpu/native in one process: the forward of the target with this checkout's build against the
build of `--ref`'s lean_layers.cpp, alternating round by round on the same cache, so that the machine's drift
(this VM's memory moved decode steps by up to 20% between processes) hits both alike.

    python scripts/ab_native.py --ref 78e3b9f [--tokens 1,2,4,8,16] [--contexts 256,1024,4096] [--rounds 15]
        [--out FILE.json]

Times are medians of the verification forward of k chain tokens on top of a context (scripts/bench_forward.py's
VerifyTimer), after two untimed rounds. The two builds must keep the same panel layout (the weights are packed
once, by this checkout's build); the logits of both are compared bit for bit on every shape timed.
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("GOMP_SPINCOUNT", "100000000")  # as run.py does, before torch loads libgomp
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from graft.cpu.threads import prefer_huge_pages  # noqa: E402

prefer_huge_pages()

import torch  # noqa: E402


def build_at(ref: str):
    """graft/cpu/native's source at git revision `ref`, built once into $GRAFT_CACHE/native_ab/<commit>."""
    from torch.utils.cpp_extension import load

    from graft.cpu import native
    from graft.embedded import cache_root

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", ref], capture_output=True, text=True, check=True)
    commit = commit.stdout.strip()
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{commit}:graft/cpu/native/lean_layers.cpp"], capture_output=True, text=True
    )
    if source.returncode != 0:
        raise SystemExit(f"--ref {ref}: no graft/cpu/native/lean_layers.cpp there ({source.stderr.strip()})")
    fields = layer_fields_at(commit)
    if fields != native.LAYER_FIELDS:
        raise SystemExit(
            f"--ref {ref}: its layer loop reads a layer's tensors as {fields}, this checkout's as "
            f"{native.LAYER_FIELDS}: one weights list cannot serve both builds; pick a revision with the same fields"
        )
    directory = cache_root() / "native_ab" / commit[:12]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "lean_layers.cpp").write_text(source.stdout)
    return commit, load(
        name=f"graft_lean_layers_ab_{commit[:12]}",
        sources=[str(directory / "lean_layers.cpp")],
        extra_cflags=["-O3", "-march=native", "-fopenmp"],
        extra_ldflags=["-fopenmp"],
        build_directory=str(directory),
    )


def layer_fields_at(commit: str) -> tuple[str, ...] | None:
    """graft/cpu/native's LAYER_FIELDS at `commit` (None where its __init__.py has none)."""
    shown = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{commit}:graft/cpu/native/__init__.py"], capture_output=True, text=True
    )
    if shown.returncode != 0:
        return None
    for node in ast.walk(ast.parse(shown.stdout)):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "LAYER_FIELDS" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=tiny_llama")
    parser.add_argument("--ref", required=True, help="the git revision whose native source is the 'old' build")
    parser.add_argument("--tokens", default="1,2,4,8,16")
    parser.add_argument("--contexts", default="256,1024,4096")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from bench_forward import VerifyTimer, write_report
    from graft.config import CONFIG_DIR, register_schemas, validate
    from graft.models import load_model

    register_schemas()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        raw = compose(config_name="config", overrides=[*args.overrides, "run.out_dir=unused", "logger=none"])
    cfg = validate(OmegaConf.to_container(raw, resolve=True))
    target = load_model(cfg.model, cfg.hardware, progress=False).target
    if getattr(target, "lean", None) is None or target.lean.native is None:
        raise SystemExit("the target does not run the native layer loop here (hardware.native, or no compiler)")
    commit, old = build_at(args.ref)
    builds = {"old": old, "new": target.lean.native}
    tokens = [int(k) for k in args.tokens.split(",")]
    report = {"ref": commit, "model": cfg.model.name, "threads": torch.get_num_threads(), "contexts": {}}
    for context_len in (int(c) for c in args.contexts.split(",")):
        context = [(100 + i) % target.vocab_size for i in range(context_len)]
        timer = VerifyTimer(target, context)
        for k in tokens:  # the same logits, bit for bit
            logits = {}
            for name, module in builds.items():
                target.lean.native = module
                logits[name] = timer.logits(k)
            if not torch.equal(logits["old"], logits["new"]):
                raise SystemExit(f"context {context_len}, {k} tokens: the two builds' logits differ")
        samples = {(name, k): [] for name in builds for k in tokens}
        for round_ in range(args.rounds + 2):
            order = list(builds.items()) if round_ % 2 else list(reversed(builds.items()))
            for name, module in order:
                target.lean.native = module
                for k in tokens:
                    ms = timer.once(k)
                    if round_ >= 2:
                        samples[(name, k)].append(ms)
        target.lean.native = builds["new"]
        row = {str(k): {name: statistics.median(samples[(name, k)]) for name in builds} for k in tokens}  # median ms
        report["contexts"][str(context_len)] = row
        print(
            f"context {context_len}: "
            + "  ".join(
                f"{k}: {r['old']:.2f} -> {r['new']:.2f} ms ({r['new'] / r['old']:.3f})" for k, r in row.items()
            ),
            flush=True,
        )
    print(
        f"verify ms for k tokens, median of {args.rounds} alternating rounds: {args.ref} ({commit[:12]}) -> this checkout"
    )
    write_report(args.out, report)


if __name__ == "__main__":
    main()
