"""Cost profile of the target forward: bandwidth limit, decode step and verify times, per fast path.

    python -m graft.costmodel forward [model=smollm2_135m] [--paths none,transposed,bf16] [--out FILE.json]

Times are medians over repeats of the same verification forward the decode loop runs (a chain of k
tokens on top of a `--context`-token cache, with the 4-D tree mask), after warm-up rounds that are not
timed. All paths are loaded side by side and measured round-robin (alternating order), and the cache is
rolled back after each forward, so every repeat sees the same context.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

TOKEN_COUNTS = [1, 2, 4, 8, 16, 32, 60, 128]


class StreamProbe:
    """Streaming read bandwidth: a large float32 tensor summed. This VM's rate moves by up to 2x between
    minutes (43-80 GB/s seen in one day), so the profile samples it once per round, between the forwards it
    is compared with, and reports the median."""

    def __init__(self, megabytes: int = 1024):
        self.data = torch.ones(megabytes * 2**20 // 4)
        self.data.sum()

    def once(self) -> float:
        start = time.perf_counter()
        self.data.sum()
        return self.data.numel() * 4 / (time.perf_counter() - start) / 1e9


class ComputeProbe:
    """The CPU's float32 FMA rate with every torch thread busy and nothing read from memory (graft/cpu/native's
    fma_rate; None without the native build). Sampled once per round beside the bandwidth, as the clock moves."""

    def __init__(self, iterations: int = 5_000_000):
        from graft.cpu.native import build as native

        self.module = native.load()
        self.iterations = iterations
        if self.module is not None and self.module.fma_rate(self.iterations // 5) <= 0:
            self.module = None  # a build without vector kernels

    def once(self) -> float | None:
        return None if self.module is None else self.module.fma_rate(self.iterations)

    def once_dot(self) -> float | None:
        """bfloat16 G multiply-adds/s through the "dot" panels' vdpbf16ps (AVX512-BF16); None where the build has
        none: the roof of a bfloat16 draft head's products there."""
        rate = 0.0 if self.module is None else getattr(self.module, "dot_rate", lambda _: 0.0)(self.iterations)
        return rate or None


def product_fmas(model) -> int:
    """Multiply-adds per row of a forward's products: every linear's weight once (a tied LM head included);
    attention's are not counted (under 7% of a row's at the profile's context on the embedded model)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def roofline_ms(rows: int, fmas_per_row: int, gfmas: float, bandwidth_limit_ms: float) -> float:
    """The least a forward of `rows` rows can take here: its weights streamed once, or its products at the FMA
    rate, whichever is slower (both overlap at best)."""
    return max(bandwidth_limit_ms, rows * fmas_per_row / (gfmas * 1e9) * 1e3)


def weight_bytes(model, products_bf16: bool = False) -> int:
    """Bytes of the model's parameters; with `products_bf16` (fast_path=packed_bf16) its matrices (the products'
    weights, and the embedding table the tied LM head reads) counted at bfloat16's two bytes."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * (2 if products_bf16 and p.dim() == 2 else p.element_size())
    return total


class VerifyTimer:
    """Times the verification forward of k chain tokens on top of a fixed context, for one target."""

    def __init__(self, target, context: list[int]):
        self.target, self.context = target, context
        target.reset(len(context) + max(TOKEN_COUNTS) + 8)
        target.prefill(context)
        self.committed = target.cache_len

    def chain(self, k: int):
        """The draft verified for k tokens: the context's last token and the k - 1 after its first, and the
        tree's topology on top of the context."""
        from graft.tree import DraftTree, NodeSource, topology

        target, context = self.target, self.context
        if k > 1:
            tree = DraftTree.chain(context[-1], context[1:k], NodeSource.TEST, device=target.device)
        else:
            tree = DraftTree.root_only(context[-1], target.device)
        return tree, topology(tree.parents, self.committed)

    def once(self, k: int) -> float:
        tree, topo = self.chain(k)
        start = time.perf_counter()
        self.target.verify(tree, topo)  # the backend builds the mask: it is part of a verification's cost
        if self.target.device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        self.target.cache.keep(self.committed, None, 0)  # roll back: every repeat sees the same context
        return 1e3 * elapsed

    def logits(self, k: int) -> torch.Tensor:
        """The same verification's logits [k, vocab] (untimed), the cache rolled back after it."""
        logits = self.target.verify(*self.chain(k)).logits.clone()
        self.target.cache.keep(self.committed, None, 0)
        return logits


def head_level_ms(
    target, source: str | None, dtypes: list[str], context_len: int, repeats: int, warmup: int, nodes: int = 10
) -> dict:
    """One EAGLE draft level as `expand` runs it: `nodes` frontier nodes through the head (attending to a
    `context_len`-position head cache and the tree), the draft LM head, and the per-node top-k; median ms
    per head dtype, on the target's products."""
    from graft.draft_models.eagle.checkpoint import load_head, random_head
    from graft.tree import additive_mask

    results, fmas_per_node = {}, 0
    for dtype in dtypes:
        head = random_head(target) if source in (None, "random") else load_head(source, target)
        # a level runs the decoder layer and the draft LM head (fc runs only when accepted tokens are encoded)
        fmas_per_node = sum(
            m.weight.numel() for name, m in head.named_modules() if isinstance(m, torch.nn.Linear) and name != "fc"
        )
        if head.cfg.kind == "eagle1":  # its logits are the target's LM head's
            fmas_per_node += target.model.get_output_embeddings().weight.numel()
        head = head.to(getattr(torch, dtype)).lean(target.ops)
        cfg, g = head.cfg, torch.Generator().manual_seed(0)
        cache = head.new_cache(context_len + nodes + 8)
        with torch.inference_mode():
            feats = torch.randn(context_len, 3 * cfg.target_hidden_size, generator=g)
            head.step(
                torch.randn(context_len, cfg.hidden_size, generator=g), feats, torch.arange(context_len), None, cache
            )
            committed = cache.length
            allowed = torch.ones(nodes, committed + nodes, dtype=torch.bool)
            allowed[:, committed:] = torch.eye(nodes, dtype=torch.bool)
            mask = additive_mask(allowed, head.fc.weight.dtype)
            embeds, hidden = (
                torch.randn(nodes, cfg.hidden_size, generator=g),
                torch.randn(nodes, cfg.hidden_size, generator=g),
            )
            positions = torch.full((nodes,), committed)
            samples = []
            for index in range(warmup + repeats):
                start = time.perf_counter()
                out = head.step(embeds, hidden, positions, mask, cache)
                head.top_log_probs(out, nodes)
                elapsed = time.perf_counter() - start
                cache.length = committed  # tree levels are scratch, as in expand()
                if index >= warmup:
                    samples.append(1e3 * elapsed)
        results[dtype] = statistics.median(samples)
    return results, fmas_per_node


def profile(model_cfg, hardware_cfg, paths: list[str], context_len: int, repeats: int, warmup: int) -> dict:
    """All paths loaded side by side and measured round-robin, so machine noise hits them alike."""
    from graft.load.models import load_model

    timers, info = {}, {}
    for path in paths:
        # "packed@transposed": one-row kernel forced; "packed/python": the Python layer loop (and oneDNN);
        # "packed/onednn", "packed/panel": the product kernel forced
        base, *flags = path.split("/")
        hardware_cfg.fast_path, _, one_row = base.partition("@")
        hardware_cfg.one_row_kernel = one_row or "auto"
        hardware_cfg.native = "off" if "python" in flags else "auto"
        hardware_cfg.product_kernel = next((f for f in flags if f in ("onednn", "panel")), "auto")
        target = load_model(model_cfg, hardware_cfg, progress=False).target
        context = [(100 + i) % target.vocab_size for i in range(context_len)]
        timers[path] = VerifyTimer(target, context)
        info[path] = {
            "weight_bytes": weight_bytes(target.model, hardware_cfg.fast_path == "packed_bf16"),
            "product_fmas": product_fmas(target.model),
            "dtype": str(target.dtype),
            "kernels": target.kernels,
        }
    samples = {p: {k: [] for k in TOKEN_COUNTS} for p in paths}
    probe, bandwidths = StreamProbe(), []
    compute, rates, dot_rates = ComputeProbe(), [], []
    for round_ in range(warmup + repeats):
        for path in paths:  # untimed: a timed forward follows a forward, as in a decode loop, not the probes' stream
            timers[path].once(1)
        for k in TOKEN_COUNTS:
            for path in paths if round_ % 2 == 0 else reversed(paths):
                ms = timers[path].once(k)
                if round_ >= warmup:
                    samples[path][k].append(ms)
        gbs, rate, dot = probe.once(), compute.once(), compute.once_dot()
        if round_ >= warmup:
            bandwidths.append(gbs)
            if rate is not None:
                rates.append(rate)
            if dot is not None:
                dot_rates.append(dot)
    for path in paths:
        verify = {k: statistics.median(v) for k, v in samples[path].items()}
        info[path].update(decode_ms=verify[1], verify_ms=verify)
    return info, bandwidths, rates, dot_rates


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m graft.costmodel forward",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=tiny_llama")
    parser.add_argument(
        "--paths",
        default="none,transposed,bf16",
        help="fast paths to profile; the first is 'plain'; path@kernel forces the one-row kernel (packed@transposed), "
        "path/python runs the Python layer loop instead of the native one, and oneDNN's products (packed/python), "
        "path/onednn and path/panel force the product kernel (packed/onednn)",
    )
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--head-level", action="store_true", help="also time one EAGLE draft level of 10 nodes")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)

    from graft.config.experiment import validate
    from graft.config.override_checks import compose_checked

    cfg = validate(compose_checked([*args.overrides, "logger=none"]))  # bad overrides: one line (graft/run/commands.py)

    paths = args.paths.split(",")
    selected = cfg.hardware.fast_path  # read before profile() sets each path's on the config
    results, bandwidths, rates, dot_rates = profile(
        cfg.model, cfg.hardware, paths, args.context, args.repeats, args.warmup
    )
    head_levels, head_fmas = None, None
    if args.head_level:
        head_levels, head_fmas = measure_head_levels(cfg, args.context, args.repeats, args.warmup)
    report = build_report(
        cfg.model.name,
        results,
        paths=paths,
        selected=selected,
        context=args.context,
        bandwidths=bandwidths,
        rates=rates,
        dot_rates=dot_rates,
        head_levels=head_levels,
        head_fmas=head_fmas,
    )
    print_report(report, bandwidths=bandwidths, rates=rates, head_levels=head_levels)
    write_report(args.out, report)


def measure_head_levels(cfg, context: int, repeats: int, warmup: int) -> tuple[dict, int]:
    """head_level_ms on the target loaded with the packed fast path, at ten times the profile's repeats."""
    from graft.load.models import load_model

    cfg.hardware.fast_path, cfg.hardware.one_row_kernel, cfg.hardware.native = "packed", "auto", "auto"
    cfg.hardware.product_kernel = "auto"
    target = load_model(cfg.model, cfg.hardware, progress=False).target
    return head_level_ms(target, cfg.model.draft_head, ["float32", "bfloat16"], context, 10 * repeats, 3 * warmup)


def build_report(
    model: str,
    results: dict,
    *,
    paths: list[str],
    selected: str,
    context: int,
    bandwidths: list[float],
    rates: list[float],
    dot_rates: list[float],
    head_levels: dict | None,
    head_fmas: int | None,
) -> dict:
    """The profile's report: the machine's rates (medians of the samples), each path's times, and each path's
    bandwidth limit and roofline added to its entry of `results`."""
    bandwidth = statistics.median(bandwidths)
    gfmas = statistics.median(rates) if rates else None
    dot_gmacs = statistics.median(dot_rates) if dot_rates else None
    plain_bytes = results[paths[0]]["weight_bytes"]
    # "fast" is the path the hardware config selects (the CPU default), when it was profiled
    fast = selected if selected in results else paths[-1]
    report = {
        "model": model,
        "threads": torch.get_num_threads(),
        "context_tokens": context,
        "bandwidth_gbs": bandwidth,
        "bandwidth_range_gbs": [min(bandwidths), max(bandwidths)],
        "weight_bytes": plain_bytes,
        "bandwidth_limit_ms": plain_bytes / (bandwidth * 1e9) * 1e3,
        "fma_rate_gfmas": gfmas,
        "fma_rate_range_gfmas": [min(rates), max(rates)] if rates else None,
        "dot_rate_gmacs": dot_gmacs,
        "plain": results[paths[0]],
        "fast_path": fast,
        "fast": results[fast],
        "paths": results,
    }
    if head_levels:
        report["head_level_ms"] = {"nodes": 10, "context_tokens": context, **head_levels}
        if gfmas:
            report["head_level_fmas_per_node"] = head_fmas
            report["head_level_compute_limit_ms"] = 10 * head_fmas / (gfmas * 1e9) * 1e3
        if dot_gmacs:  # a bfloat16 head on the dot panels: its products' roof at the vdpbf16ps rate
            report["head_level_dot_limit_ms"] = 10 * head_fmas / (dot_gmacs * 1e9) * 1e3
    params = plain_bytes // 4 if results[paths[0]]["dtype"] == "torch.float32" else plain_bytes // 2
    for name, r in results.items():
        # the bytes one decode step must stream: every parameter once, in the path's dtype
        streamed = (
            r["weight_bytes"] if name.startswith("packed_bf16") else params * (2 if "bfloat16" in r["dtype"] else 4)
        )
        r["bandwidth_limit_ms"] = streamed / (bandwidth * 1e9) * 1e3
        if gfmas and not name.startswith("packed_bf16"):  # bfloat16 products: no float32 FMA roof (AMX or dot)
            r["roofline_ms"] = {
                k: roofline_ms(k, r["product_fmas"], gfmas, r["bandwidth_limit_ms"]) for k in TOKEN_COUNTS
            }
    return report


def print_report(report: dict, *, bandwidths: list[float], rates: list[float], head_levels: dict | None) -> None:
    """The report as the console shows it: the machine's rates, then each path's verify times against its roofs,
    then the draft level's."""
    results, bandwidth, gfmas = report["paths"], report["bandwidth_gbs"], report["fma_rate_gfmas"]
    dot_gmacs, fast = report["dot_rate_gmacs"], report["fast_path"]
    print(f"model {report['model']}, {torch.get_num_threads()} threads, context {report['context_tokens']} tokens")
    print(
        f"streaming read bandwidth {bandwidth:.1f} GB/s (median of {len(bandwidths)} samples between the rounds, "
        f"{min(bandwidths):.1f}-{max(bandwidths):.1f})"
    )
    if gfmas:
        print(
            f"float32 FMA rate, every thread busy on registers only: {gfmas:.1f} G FMA/s (median of "
            f"{len(rates)} samples, {min(rates):.1f}-{max(rates):.1f}); a forward's roofline = max(bandwidth limit, "
            "rows x its products' FMAs / that rate)"
        )
    if dot_gmacs:
        print(f"bfloat16 dot products (vdpbf16ps), every thread busy on registers only: {dot_gmacs:.1f} G MAC/s")
    for name, r in results.items():
        print(
            f"  {name:>10}: {r['dtype']}, parameters streamed once per step -> bandwidth limit {r['bandwidth_limit_ms']:.1f} ms/step"
        )
    header = "tokens " + "".join(f"{name:>12}" for name in results)
    print(header + "   (verify ms, median)")
    for k in TOKEN_COUNTS:
        print(f"{k:>6} " + "".join(f"{results[name]['verify_ms'][k]:>12.1f}" for name in results))
    for name, r in results.items():
        print(
            f"{name}: decode {r['decode_ms']:.1f} ms = {r['decode_ms'] / r['bandwidth_limit_ms']:.2f}x its bandwidth limit; "
            f"verify(16) = {r['verify_ms'][16] / r['decode_ms']:.2f}x decode"
        )
        if "roofline_ms" in r:
            print(
                f"  {name} against its roofline (verify ms / roofline ms): "
                + ", ".join(f"{k}: {r['verify_ms'][k] / r['roofline_ms'][k]:.2f}x" for k in TOKEN_COUNTS)
            )
    if head_levels:
        decode = results[fast]["decode_ms"]
        for dtype, ms in head_levels.items():
            print(
                f"EAGLE head, one draft level of 10 nodes ({dtype}): {ms:.2f} ms = 1/{decode / ms:.1f} of a decode step ({fast})"
            )
        if "head_level_compute_limit_ms" in report:
            print(
                f"  its products' compute limit: {report['head_level_compute_limit_ms']:.2f} ms "
                f"({report['head_level_fmas_per_node'] / 1e6:.2f} M FMAs a node)"
            )
        if "head_level_dot_limit_ms" in report:
            print(f"  a bfloat16 head's products at the dot rate: {report['head_level_dot_limit_ms']:.2f} ms")


def write_report(path: Path | None, report: dict) -> None:
    """The report as JSON at `path` (folders made), where one was asked for."""
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2))
        print(f"wrote {path}")
