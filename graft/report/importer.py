"""Other systems' answer files as run folders that `tables` and `plot` read beside this harness's runs:

    python -m graft.report import --format spec-bench data/spec_bench/model_answer --out runs/spec_bench_imported

ANSWER_DIR holds Spec-Bench's or EAGLE's answer files (FastChat JSONL, one answer a line with question_id and
choices[0] holding new_tokens, wall_time and decoding_steps or EAGLE's idxs per turn, and accept_lengths where
recorded), one of them the baseline (its method part `vanilla`, `baseline`, `base` or `ar`, else --baseline). The
run folder is one comparison: the baseline's answers as its baseline, each other file a method named
`<method> (imported)`; summary.json and run.json carry `imported` (the format, the folder, each file's sha256).
graft/report/specbench_import.py (import_specbench) says how each number is read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m graft.report import", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("answers", type=Path, metavar="ANSWER_DIR")
    parser.add_argument("--out", type=Path, required=True, metavar="RUN_DIR", help="a new (or empty) folder")
    parser.add_argument("--format", choices=("spec-bench",), default="spec-bench", help="spec-bench (also EAGLE's)")
    parser.add_argument("--baseline", help="the baseline's answer file (default: the one named vanilla/baseline)")
    parser.add_argument("--model", help="the model's name (default: what the file names share)")
    parser.add_argument(
        "--dataset", help="the dataset's name (default: the folder's, or its parent's for model_answer)"
    )
    parser.add_argument("--temperature", type=float, help="default: from the file names (temp-<t>), else 0")
    args = parser.parse_args(argv)
    from graft.report.specbench_import import import_specbench

    out, notes = import_specbench(
        args.answers, args.out, args.baseline, model=args.model, dataset=args.dataset, temperature=args.temperature
    )
    print(out)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)


if __name__ == "__main__":
    main()
