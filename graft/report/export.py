"""Copy finished run directories into a folder to commit: run.json, summary.json, summaries/ and
samples.jsonl.gz (the records without the generated texts; the token hashes stay, gzipped), so tables and
figures can be regenerated from what is committed.

    python -m graft.report export multirun/cpu_embedded results/cpu_embedded/runs
    python -m graft.report export --format spec-bench multirun/spec_bench answers  # Spec-Bench answer files

Finished runs only: an unfinished one is named on stderr and skipped, or with `--partial` exported with
`partial: true` in its summary.json (and no `complete`). An exported run still verifies: its `complete` record's
sha1 is recomputed over the records as exported (without texts), the run's own kept as `source_records_sha1`.
A target that holds anything is refused unless `--replace`; then only what this export writes is replaced (in
each run folder it exports: run.json, summary.json, samples.jsonl.gz, summaries/), nothing else there.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
from pathlib import Path


def strip_texts(record: dict) -> dict:
    sides = [record.get("baseline"), record.get("method"), *(m["side"] for m in (record.get("methods") or {}).values())]
    for side in filter(None, sides):
        for turn in side["turns"]:
            turn.pop("text", None)
    return record


EXPORTED = ("run.json", "summary.json", "samples.jsonl.gz")  # and summaries/: what export writes in a run folder


def exported_summary(summary: dict, records: list[dict], unfinished: bool) -> dict | None:
    """The summary.json to write beside `records` (as exported), or None to copy the run's own: an unfinished
    run's marked `partial: true` (a `complete` that does not verify dropped); a finished run's `complete`
    sha1 recomputed over the exported records (the run's own kept as `source_records_sha1`), so that the
    export verifies as the run did."""
    from graft.records.folder import marked_partial, records_digest

    if unfinished:
        return marked_partial(summary)
    complete = summary.get("complete")
    if not isinstance(complete, dict) or complete.get("ids") is None or not complete.get("records_sha1"):
        return None  # the plan alone (a summary from before the digest): nothing to recompute
    by_id = {r.get("id"): r for r in records}
    source = complete.get("source_records_sha1", complete["records_sha1"])
    digest = records_digest([by_id[i] for i in complete["ids"]])
    return {**summary, "complete": {**complete, "records_sha1": digest, "source_records_sha1": source}}


def export(source: Path, target: Path, partial: bool = False, replace: bool = False) -> list[Path]:
    """Export every finished run under `source` (with `partial`, unfinished ones too) into `target`, each at its
    path relative to `source`. Everything is read and checked first, then written into a temporary folder beside
    `target`, then each file moved into place, so a bad input leaves `target` as it was. A `target` that holds
    anything is refused unless `replace`, which replaces only what this export writes (EXPORTED and summaries/ in
    the run folders it exports); nothing else in `target` is touched."""
    from graft.records.reader import RecordError, check_export_paths, read_records, read_summary, run_dirs

    source, target = check_export_paths(source, target)
    unfinished: dict = {}
    runs = run_dirs([source], partial, unfinished)
    checked = []
    for run in runs:
        summary, records = read_summary(run), read_records(run)
        if not (run / "run.json").is_file():
            raise RecordError(f"{run}: lacks run.json")
        ids = [r.get("id") for r in records]
        complete = summary.get("complete")
        if (
            not unfinished.get(run)
            and isinstance(complete, dict)
            and sorted(map(str, ids)) != sorted(map(str, complete.get("ids", ids)))
        ):
            raise RecordError(f"{run}: samples hold other records than its summary.json was computed from; rerun it")
        stripped = [strip_texts(r) for r in records]
        checked.append((run, stripped, exported_summary(summary, stripped, unfinished.get(run, False))))
    if target.exists() and not target.is_dir():
        raise RecordError(f"{target}: is a file, expected a folder to export into")
    if target.is_dir() and any(target.iterdir()) and not replace:
        raise RecordError(
            f"{target}: is not empty; pass --replace to replace the run folders this export writes there "
            "(nothing else in it is touched), or export into an empty folder"
        )
    place = {run: run.relative_to(source) for run, _, _ in checked}
    if target.is_dir() and any(p == Path(".") for p in place.values()) and _holds_runs_below(target):
        # one run folder exported into a tree of exports: at the tree's root it would hide every run below it
        # from the tools (a folder with summary.json is read as one run), so it goes where the tree keeps runs
        place = {run: Path(source.name) if p == Path(".") else p for run, p in place.items()}
    for run, _, _ in checked:
        shadow = target / place[run] / "samples.jsonl"
        if shadow.exists():  # the tools would read it, not the exported samples.jsonl.gz
            raise RecordError(f"{shadow}: would be read instead of the exported samples.jsonl.gz; move it away")
    staging = target.with_name(f".{target.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    written = []
    for run, records, summary in checked:
        out = staging / place[run]
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(run / "run.json", out / "run.json")
        if summary is None:
            shutil.copy(run / "summary.json", out / "summary.json")
        else:
            (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        if (run / "summaries").is_dir():
            shutil.copytree(run / "summaries", out / "summaries", dirs_exist_ok=True)
        text = "".join(json.dumps(r) + "\n" for r in records)
        (out / "samples.jsonl.gz").write_bytes(gzip.compress(text.encode(), mtime=0))
    for run, _, _ in checked:  # into place: each file whole; only what this export writes is replaced
        out, dest = staging / place[run], target / place[run]
        dest.mkdir(parents=True, exist_ok=True)
        for name in EXPORTED:
            os.replace(out / name, dest / name)
        if (dest / "summaries").is_dir():
            shutil.rmtree(dest / "summaries")
        if (out / "summaries").is_dir():
            os.replace(out / "summaries", dest / "summaries")
        written.append(dest)
    shutil.rmtree(staging, ignore_errors=True)
    return written


def _holds_runs_below(folder: Path) -> bool:
    """Run folders (summary.json beside run.json) below `folder`, not at it, found as the tools find them."""
    from graft.records.reader import folders_below

    return any(
        f != folder and (f / "summary.json").exists() and (f / "run.json").is_file() for f in folders_below(folder)
    )


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
    parser.add_argument(
        "--partial", action="store_true", help="also unfinished runs (marked partial: true in their summary.json)"
    )
    parser.add_argument(
        "--replace",
        action="store_true",
        help="export into a target that holds files: replace what this export writes there, nothing else",
    )
    args = parser.parse_args(argv)
    if args.format == "spec-bench":
        from graft.report.specbench_export import export_specbench

        written, notes = export_specbench(args.source, args.target, args.partial, args.replace)
        for out in written:
            print(out)
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
        return
    for out in export(args.source, args.target, args.partial, args.replace):
        print(out)


if __name__ == "__main__":
    main()
