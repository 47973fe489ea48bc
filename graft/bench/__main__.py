"""`python -m graft.bench <command> [arguments]`: measurements of this machine (`<command> --help` for each).

python -m graft.bench e2e [--new-tokens 128] [--repeats 3]         # transformers generate beside this harness
python -m graft.bench compile --out results/compile/cpu.json       # hardware.compile against eager
python -m graft.bench memory                                       # peak memory of long-context verification
python -m graft.bench dflash-accuracy [--drafter heads/...]        # a block drafter's per-position accuracy
python -m graft.bench native-ab --ref REV                          # two builds of the native kernels, A/B
python -m graft.bench moe-experts [--rounds 15]                    # verify time against the experts a tree touches
python -m graft.bench batch [--sizes 1,8,32] [--vllm PYTHON]       # AR's throughput against B, beside vLLM
python -m graft.bench batch-lossless [--sizes 1,4,8]               # batched tokens against batch-1 AR's
python -m graft.bench batch-ops [--sizes 1,8,16]                   # ATen ops, padding and reads per batched step
python -m graft.bench decode-rows [--rows 32]                      # a batched decode forward against the context
"""

from __future__ import annotations

import importlib

from graft.run.commands import one_line_errors, pick

COMMANDS = {  # command -> (module, what it measures)
    "e2e": ("graft.bench.e2e", "transformers generate and this harness side by side, every output checked"),
    "compile": ("graft.bench.compile", "hardware.compile against eager: verify times and decode loops"),
    "memory": ("graft.bench.memory", "peak memory of 32K-context verification and prefill, full against compact masks"),
    "dflash-accuracy": ("graft.bench.dflash_accuracy", "a block drafter's per-position top-1 accuracy"),
    "native-ab": ("graft.bench.native_ab", "this checkout's native kernels against another commit's, in one process"),
    "moe-experts": ("graft.bench.moe_experts", "MoE verify time against the experts a tree touches"),
    "batch": ("graft.bench.batch", "AR's throughput against the batch size, beside batch 1 and vLLM"),
    "batch-lossless": (
        "graft.bench.batch_lossless",
        "each method's batched tokens against batch-1 AR's, per model and B",
    ),
    "batch-ops": ("graft.bench.batch_ops", "ATen ops, positions per node and host reads per batched step"),
    "decode-rows": ("graft.bench.decode_rows", "one forward of B one-token segments against each one's context"),
}


@one_line_errors  # bad input is one line and exit 2, as in run.py
def main(argv: list[str] | None = None) -> None:
    command, rest = pick(__doc__, COMMANDS, argv)
    importlib.import_module(COMMANDS[command][0]).main(rest)


if __name__ == "__main__":
    main()
