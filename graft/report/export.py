"""Copy finished run directories into a folder to commit: run.json, summary.json, summaries/ and
samples.jsonl.gz (the records without the generated texts; the token hashes stay, gzipped), so tables and
figures can be regenerated from what is committed.

    python -m graft.report export multirun/cpu_embedded results/cpu_embedded/runs
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
from pathlib import Path


def strip_texts(record: dict) -> dict:
    sides = [record.get("baseline"), record.get("method"), *(m["side"] for m in (record.get("methods") or {}).values())]
    for side in filter(None, sides):
        for turn in side["turns"]:
            turn.pop("text", None)
    return record


def export(source: Path, target: Path) -> list[Path]:
    from graft.analysis import run_dirs

    written = []
    for run in run_dirs([source]):
        out = target / run.relative_to(source) if run != source else target
        out.mkdir(parents=True, exist_ok=True)
        for name in ("run.json", "summary.json"):
            shutil.copy(run / name, out / name)
        if (run / "summaries").is_dir():
            shutil.copytree(run / "summaries", out / "summaries", dirs_exist_ok=True)
        lines = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines() if line.strip()]
        text = "".join(json.dumps(strip_texts(r)) + "\n" for r in lines)
        (out / "samples.jsonl.gz").write_bytes(gzip.compress(text.encode(), mtime=0))
        written.append(out)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m graft.report export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    for out in export(args.source, args.target):
        print(out)


if __name__ == "__main__":
    main()
