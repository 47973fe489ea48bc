"""Cost profile of the target forward: bandwidth limit, decode step and verify times, per fast path.

    python scripts/bench_forward.py [model=smollm2_135m] [--paths none,transposed,bf16] [--out FILE.json]

Times are medians over repeats of the same verification forward the decode loop runs (a chain of k
tokens on top of a `--context`-token cache, with the 4-D tree mask), after warm-up runs that are not
timed. The cache is rolled back after each forward, so every repeat sees the same context.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TOKEN_COUNTS = [1, 2, 4, 8, 16, 32, 60, 128]


def measure_bandwidth_gbs(megabytes: int = 1024, repeats: int = 7) -> float:
    """Streaming read bandwidth: a large float32 tensor summed, median over repeats."""
    data = torch.ones(megabytes * 2**20 // 4)
    data.sum()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        times.append(time.perf_counter() - start)
    return data.numel() * 4 / statistics.median(times) / 1e9


def weight_bytes(model) -> int:
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def time_verify(target, context: list[int], k: int, repeats: int, warmup: int) -> float:
    from graft.tree import DraftTree, NodeSource, tree_attention

    target.reset(len(context) + max(TOKEN_COUNTS) + 8)
    target.prefill(context)
    committed = target.cache_len
    tree = DraftTree.chain(context[-1], context[1:k], NodeSource.TEST, device=target.device) if k > 1 else DraftTree.root_only(context[-1], target.device)
    times = []
    for i in range(warmup + repeats):
        attn = tree_attention(tree.parents, committed)
        mask = attn.attention_mask(target.dtype)
        start = time.perf_counter()
        target.verify(tree, attn, mask)
        if target.device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        target.cache.keep(committed, None, 0)
        if i >= warmup:
            times.append(elapsed)
    return 1e3 * statistics.median(times)


def profile(model_cfg, hardware_cfg, path: str, context_len: int, repeats: int, warmup: int) -> dict:
    from graft.models import load_model

    hardware_cfg.fast_path = path
    loaded = load_model(model_cfg, hardware_cfg, progress=False)
    target = loaded.target
    context = (list(range(100, 100 + context_len)) * 2)[:context_len]
    verify = {k: time_verify(target, context, k, repeats, warmup) for k in TOKEN_COUNTS}
    return {"decode_ms": verify[1], "verify_ms": verify, "weight_bytes": weight_bytes(target.model), "dtype": str(target.dtype)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=tiny_llama")
    parser.add_argument("--paths", default="none,transposed,bf16", help="fast paths to profile; the first is 'plain'")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from graft.config import CONFIG_DIR, register_schemas, validate

    register_schemas()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        raw = compose(config_name="config", overrides=[*args.overrides, "run.out_dir=unused", "logger=none"])
    cfg = validate(OmegaConf.to_container(raw, resolve=True))

    bandwidth = measure_bandwidth_gbs()
    paths = args.paths.split(",")
    results = {p: profile(cfg.model, cfg.hardware, p, args.context, args.repeats, args.warmup) for p in paths}
    plain_bytes = results[paths[0]]["weight_bytes"]
    report = {
        "model": cfg.model.name,
        "threads": torch.get_num_threads(),
        "context_tokens": args.context,
        "bandwidth_gbs": bandwidth,
        "weight_bytes": plain_bytes,
        "bandwidth_limit_ms": plain_bytes / (bandwidth * 1e9) * 1e3,
        "plain": results[paths[0]],
        "fast": results[paths[-1]] if len(paths) > 1 else results[paths[0]],
        "paths": results,
    }
    for name, r in results.items():
        r["bandwidth_limit_ms"] = r["weight_bytes"] / (bandwidth * 1e9) * 1e3

    print(f"model {cfg.model.name}, {torch.get_num_threads()} threads, context {args.context} tokens")
    print(f"streaming read bandwidth {bandwidth:.1f} GB/s")
    for name, r in results.items():
        print(f"  {name:>10}: weights {r['weight_bytes'] / 1e6:.0f} MB ({r['dtype']}) -> bandwidth limit {r['bandwidth_limit_ms']:.1f} ms/step")
    header = "tokens " + "".join(f"{name:>12}" for name in results)
    print(header + "   (verify ms, median)")
    for k in TOKEN_COUNTS:
        print(f"{k:>6} " + "".join(f"{results[name]['verify_ms'][k]:>12.1f}" for name in results))
    for name, r in results.items():
        print(f"{name}: decode {r['decode_ms']:.1f} ms = {r['decode_ms'] / r['bandwidth_limit_ms']:.2f}x its bandwidth limit; "
              f"verify(16) = {r['verify_ms'][16] / r['decode_ms']:.2f}x decode")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
