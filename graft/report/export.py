"""Copy finished run directories into a folder to commit: run.json, summary.json, summaries/ and
samples.jsonl.gz (the records without the generated texts; the token hashes stay, gzipped), so tables and
figures can be regenerated from what is committed.

    python -m graft.report export multirun/cpu_embedded results/cpu_embedded/runs
    python -m graft.report export --format spec-bench multirun/spec_bench answers  # Spec-Bench answer files
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
from pathlib import Path


def strip_texts(record: dict) -> dict:
    sides = [record.get("baseline"), record.get("method"), *(m["side"] for m in (record.get("methods") or {}).values())]
    for side in filter(None, sides):
        for turn in side["turns"]:
            turn.pop("text", None)
    return record


def export(source: Path, target: Path) -> list[Path]:
    """Export every finished run under `source` into `target`, replacing it whole: everything is read and
    checked first, written to a temporary folder beside `target` and renamed only when complete, so a bad
    input or a crash leaves the previous export as it was."""
    from graft.analysis import RecordError, check_export_paths, read_records, read_summary, run_dirs

    source, target = check_export_paths(source, target)
    runs = run_dirs([source])
    checked = []
    for run in runs:
        summary, records = read_summary(run), read_records(run)
        if not (run / "run.json").is_file():
            raise RecordError(f"{run}: lacks run.json")
        ids = [r.get("id") for r in records]
        complete = summary.get("complete")
        if isinstance(complete, dict) and sorted(map(str, ids)) != sorted(map(str, complete.get("ids", []))):
            raise RecordError(f"{run}: samples hold other records than its summary.json was computed from; rerun it")
        checked.append((run, [strip_texts(r) for r in records]))
    partial = target.with_name(f".{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    written = []
    for run, records in checked:
        out = partial / run.relative_to(source) if run != source else partial
        out.mkdir(parents=True, exist_ok=True)
        for name in ("run.json", "summary.json"):
            shutil.copy(run / name, out / name)
        if (run / "summaries").is_dir():
            shutil.copytree(run / "summaries", out / "summaries", dirs_exist_ok=True)
        text = "".join(json.dumps(r) + "\n" for r in records)
        (out / "samples.jsonl.gz").write_bytes(gzip.compress(text.encode(), mtime=0))
        written.append(target / out.relative_to(partial))
    stale = target.with_name(f".{target.name}.old")
    shutil.rmtree(stale, ignore_errors=True)
    if target.exists():
        target.rename(stale)
    partial.rename(target)
    shutil.rmtree(stale, ignore_errors=True)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m graft.report export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument(
        "--format",
        choices=("records", "spec-bench"),
        default="records",
        help="records (default): the run directories without their texts; spec-bench: one Spec-Bench answer file"
        " per method, <target>/<model>-<method>.jsonl and the baseline as <model>-vanilla.jsonl"
        " (graft/report/specbench.py)",
    )
    args = parser.parse_args(argv)
    if args.format == "spec-bench":
        from graft.report.specbench import export_specbench

        written, notes = export_specbench(args.source, args.target)
        for out in written:
            print(out)
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
        return
    for out in export(args.source, args.target):
        print(out)


if __name__ == "__main__":
    main()
