"""Two builds of graft/cpu/native in one process: the forward of the target with this checkout's build against the
build of `--ref`'s sources, alternating round by round on the same cache, so that the machine's drift
(this VM's memory moved decode steps by up to 20% between processes) hits both alike.

    python -m graft.bench native-ab --ref 78e3b9f [--tokens 1,2,4,8,16] [--contexts 256,1024,4096] [--rounds 15]
        [--out FILE.json]

Times are medians of the verification forward of k chain tokens on top of a context (graft/costmodel/forward.py's
VerifyTimer), after two untimed rounds. The two builds must keep the same panel layout (the weights are packed
once, by this checkout's build); the logits of both are compared bit for bit on every shape timed.
"""

from __future__ import annotations

import ast
import os
import statistics
import subprocess
from pathlib import Path

os.environ.setdefault("GOMP_SPINCOUNT", "100000000")  # as run.py does, before torch loads libgomp
ROOT = Path(__file__).resolve().parents[2]  # the checkout whose git history --ref names
from graft.cpu.threads import prefer_huge_pages  # noqa: E402

prefer_huge_pages()

import torch  # noqa: E402

from graft.bench import at_least, batch_sizes, command_parser  # noqa: E402


def build_at(ref: str, variant: str):
    """graft/cpu/native's sources at git revision `ref`, built once into $GRAFT_CACHE/native_ab/<commit>-<variant>:
    with this checkout's flags for `variant` (the new build's), or with -march=native where the revision has the
    single-file lean_layers.cpp it was built so from."""
    from torch.utils.cpp_extension import load

    from graft.cpu.native import build as native
    from graft.hub import cache_root

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", ref], capture_output=True, text=True, check=True)
    commit = commit.stdout.strip()
    folder, names = sources_at(commit)
    if not names:
        raise SystemExit(f"--ref {ref}: no graft/cpu/native (or graft/native) sources there")
    fields = layer_fields_at(commit, folder)
    if fields != native.LAYER_FIELDS:
        raise SystemExit(
            f"--ref {ref}: its layer loop reads a layer's tensors as {fields}, this checkout's as "
            f"{native.LAYER_FIELDS}: one weights list cannot serve both builds; pick a revision with the same fields"
        )
    single_file = names == ["lean_layers.cpp"]
    directory = cache_root() / "native_ab" / (commit[:12] if single_file else f"{commit[:12]}-{variant}")
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        shown = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{commit}:{folder}/{name}"], capture_output=True, text=True
        )
        (directory / name).write_text(shown.stdout)
    flags = (
        ["-O3", "-march=native", "-fopenmp"] if single_file else [*native.COMMON_FLAGS, *native.VARIANTS[variant].flags]
    )
    module = load(
        name=f"graft_lean_layers_ab_{commit[:12]}" if single_file else f"graft_native_ab_{commit[:12]}_{variant}",
        sources=[str(directory / ("lean_layers.cpp" if single_file else "module.cpp"))],  # module.cpp includes the rest
        extra_cflags=flags,
        extra_ldflags=["-fopenmp"],
        build_directory=str(directory),
    )
    return commit, module


class GlobalPrefetchBuild:
    """A build from before the tile prefetch modes were arguments (they were the process's, set by
    set_tile_prefetch): its lean_layers called with this checkout's arguments, the modes set once from the
    target's products (choose_tile_prefetch gives all of them the same)."""

    def __init__(self, module, prefetch: list[int]):
        self.module = module
        if prefetch and module.tile_prefetch() >= 0:
            module.set_tile_prefetch(prefetch[0] & 3, 0)
            module.set_tile_prefetch(prefetch[0] >> 2 & 3, 1)

    def lean_layers(self, *args):
        return self.module.lean_layers(*args[:-1])  # without the prefetch modes

    def __getattr__(self, name: str):
        return getattr(self.module, name)


def sources_at(commit: str) -> tuple[str, list[str]]:
    """The folder of the native sources at `commit` (graft/native before the CPU engine moved to graft/cpu) and
    their file names (empty where there is none)."""
    for folder in ("graft/cpu/native", "graft/native"):
        listed = subprocess.run(
            ["git", "-C", str(ROOT), "ls-tree", "--name-only", commit, f"{folder}/"], capture_output=True, text=True
        )
        names = [Path(name).name for name in listed.stdout.split() if name.endswith((".cpp", ".h"))]
        if listed.returncode == 0 and names:
            return folder, names
    return "", []


def layer_fields_at(commit: str, folder: str = "graft/cpu/native") -> tuple[str, ...] | None:
    """The native module's LAYER_FIELDS at `commit` (None where its build module has none): build.py, or
    __init__.py before the module moved there."""
    for name in ("build.py", "__init__.py"):
        shown = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{commit}:{folder}/{name}"], capture_output=True, text=True
        )
        if shown.returncode != 0:
            continue
        for node in ast.walk(ast.parse(shown.stdout)):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "LAYER_FIELDS" for t in node.targets):
                return tuple(ast.literal_eval(node.value))
    return None


def main(argv: list[str] | None = None) -> None:
    parser = command_parser("native-ab", __doc__)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=tiny_llama")
    parser.add_argument("--ref", required=True, help="the git revision whose native source is the 'old' build")
    parser.add_argument("--tokens", default="1,2,4,8,16")
    parser.add_argument("--contexts", default="256,1024,4096")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    at_least(rounds=(args.rounds, 1))
    batch_sizes(args.tokens, least=1, example="1,2,4,8,16", flag="--tokens", what="token counts")
    batch_sizes(args.contexts, least=1, example="256,1024,4096", flag="--contexts", what="context lengths")
    known = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{args.ref}^{{commit}}"],
                           capture_output=True, text=True, check=False)  # fmt: skip
    if known.returncode != 0:
        from graft.schema import ConfigError

        raise ConfigError(f"--ref {args.ref}: not a revision of this repository (git rev-parse finds no commit)")

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from graft.config.experiment import validate
    from graft.config.hydra_setup import CONFIG_DIR, register_schemas
    from graft.costmodel.forward import VerifyTimer, write_report
    from graft.load.models import load_model

    register_schemas()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        raw = compose(config_name="config", overrides=[*args.overrides, "run.out_dir=unused", "logger=none"])
    cfg = validate(OmegaConf.to_container(raw, resolve=True))
    target = load_model(cfg.model, cfg.hardware, progress=False).target
    if getattr(target, "lean", None) is None or target.lean.native is None:
        raise SystemExit("the target does not run the native layer loop here (hardware.native, or no compiler)")
    commit, old = build_at(args.ref, target.lean.native.variant())
    if hasattr(old, "set_tile_prefetch"):
        old = GlobalPrefetchBuild(old, target.lean._native_prefetch)
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
