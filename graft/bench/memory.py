"""Peak host memory of long-context verification and prefill, full [n, S] masks against compact ones.

A random-weight Llama (8 query heads over 2 key/value heads, hidden 256) runs through the transformers
backend on the CPU with hardware.attention=graft_sdpa (the compact path; `full_masks` selects the old one).
A 32K-token prompt is prefilled in chunks of 4,096, then one 60-node tree is verified at 32K context.
Measured: the verify() call, and the last prefill chunk from the end of the chunk before; both include
building their masks. Every (variant, meter) runs in a fresh process, so nothing of another's allocations
is reused. Two meters:
- resident: the kernel's resident high-water mark (VmHWM, reset by /proc/self/clear_refs where the stretch
  starts) minus the resident size there. glibc's mmap threshold is pinned (MALLOC_MMAP_THRESHOLD_) so that
  every large tensor is mapped on its own and unmapped when freed, and the resident size follows the live
  tensors rather than a heap that keeps freed blocks. Pages of a zero-filled tensor never written are not
  resident: the full mask counts only partly.
- allocated: the peak of the bytes torch's allocator holds for the tensors made in the stretch (the
  profiler's memory timeline), what a GPU would have to hold.

    python -m graft.bench memory            # both variants, a table
    python -m graft.bench memory --variant full --meter allocated   # one run, its JSON (what the table runs)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from graft.bench import command_parser

CONTEXT = 32768  # prompt tokens; the verification runs at this context
CHUNK = 4096  # prefill chunk; the measured chunk is the last one (prefix 28K)
NODES = 60
LAYERS = 2


def resident_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


class Resident:
    """The resident high-water mark of a stretch of code above the resident size where it started (MB)."""

    def start(self) -> None:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current VmRSS
        self.base = resident_kb("VmRSS")

    def stop(self) -> float:
        return (resident_kb("VmHWM") - self.base) / 1024


class Allocated:
    """The peak of the bytes torch's allocator holds for tensors made in a stretch of code (MB), from the
    profiler's memory timeline: what a GPU would have to hold, where the resident size misses the pages
    of a zero-filled tensor that were never written."""

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.profiler = profile(
            activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
        )
        self.profiler.__enter__()

    def stop(self) -> float:
        import tempfile
        import warnings

        self.profiler.__exit__(None, None, None)
        with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # deprecated for CUDA's snapshots; the CPU has no other
            self.profiler.export_memory_timeline(f"{folder}/timeline.raw.json", device="cpu")
            _, sizes = json.loads(Path(f"{folder}/timeline.raw.json").read_text())  # bytes per category per event
        # the first row holds the tensors made before the stretch (weights, the cache) that it used
        return (max(sum(row) for row in sizes) - sum(sizes[0])) / 2**20 if sizes else 0.0


def run_variant(full_masks: bool, meter: str) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from graft.backends.hf import HFBackend
    from graft.load.models import ByteTokenizer, use_attention
    from graft.tree import DraftTree, topology

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=LAYERS,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=65536,
    )
    model = LlamaForCausalLM(config).eval()
    use_attention(model, "graft_sdpa")
    target = HFBackend(model, ByteTokenizer())
    target.prefill_chunk, target.full_masks = CHUNK, full_masks
    target.reset(CONTEXT + NODES + 4)  # room for the tree: the cache never grows inside a measured forward
    prompt = torch.randint(0, config.vocab_size, (CONTEXT,), generator=torch.Generator().manual_seed(1)).tolist()

    peak, calls, prefill_mb = (Resident() if meter == "resident" else Allocated()), [0], []
    last_chunk = CONTEXT // CHUNK - 1

    def after(module, args, kwargs, output):
        # from the end of the chunk before to the end of the last chunk: its mask is built in between
        if calls[0] == last_chunk - 1:
            peak.start()
        elif calls[0] == last_chunk:
            prefill_mb.append(peak.stop())
        calls[0] += 1

    hook = model.register_forward_hook(after, with_kwargs=True)
    prefilled = target.prefill(prompt).logits[-1]  # [vocab]: the prompt's next token
    hook.remove()

    gen = torch.Generator().manual_seed(2)
    parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, NODES)])
    tree = DraftTree(tokens=torch.randint(0, config.vocab_size, (NODES,), generator=gen), parents=parents)
    topo = topology(parents, target.cache_len)
    peak.start()
    logits = target.verify(tree, topo).logits
    verify_mb = peak.stop()
    return {
        "variant": "full masks" if full_masks else "compact",
        "meter": meter,
        "verify_mb": verify_mb,
        "prefill_mb": prefill_mb[0],
        "tokens": [int(prefilled.argmax()), *logits.argmax(-1).tolist()],
        "logits": torch.cat([prefilled[None, :8], logits[:, :8]]).tolist(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = command_parser("memory", __doc__)
    parser.add_argument("--variant", choices=["full", "compact"], help="run one variant here, print its JSON")
    parser.add_argument("--meter", choices=["resident", "allocated"], default="resident")
    args = parser.parse_args(argv)
    if args.variant:
        print(json.dumps(run_variant(args.variant == "full", args.meter)))
        return
    import torch

    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(64 * 1024), "MALLOC_TRIM_THRESHOLD_": str(128 * 1024)}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    results = {}
    for meter in ("resident", "allocated"):
        for variant in ("full", "compact"):
            command = [sys.executable, "-m", "graft.bench", "memory", "--variant", variant, "--meter", meter]
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            results[variant, meter] = json.loads(done.stdout.strip().splitlines()[-1])
    runs = list(results.values())
    equal = all(r["tokens"] == runs[0]["tokens"] for r in runs)
    gap = max((torch.tensor(r["logits"]) - torch.tensor(runs[0]["logits"])).abs().max().item() for r in runs)
    print(f"tiny Llama, {LAYERS} layers, 8 query / 2 key-value heads, float32, CPU, hardware.attention=graft_sdpa")
    print(f"peak memory in MB above where it started, masks included: one verification of a {NODES}-node tree at")
    print(f"{CONTEXT} context; the {CHUNK}-token prefill chunk after a {CONTEXT - CHUNK}-token prefix. resident: the")
    print("process's resident high-water mark; allocated: torch's allocator (the profiler's memory timeline)")
    header = ["variant", "verify resident", "verify allocated", "chunk resident", "chunk allocated", "tokens equal"]
    print("  ".join(f"{h:>16}" for h in header))
    for variant in ("full", "compact"):
        resident, allocated = results[variant, "resident"], results[variant, "allocated"]
        row = [resident["verify_mb"], allocated["verify_mb"], resident["prefill_mb"], allocated["prefill_mb"]]
        print("  ".join([f"{resident['variant']:>16}", *(f"{v:>16.1f}" for v in row), f"{str(equal):>16}"]))
    print(f"tokens equal in all four runs (the prompt's next token and the tree's {NODES} verified): {equal}")
    print(f"largest logit difference (first 8 logits of each of those positions): {gap:.2e}")


if __name__ == "__main__":
    main()
