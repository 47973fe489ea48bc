"""A run folder read back: its records and summary, and which runs every tool may use.

`run_dirs(paths)` is the one rule of every report tool (tables, plot, export, summarize, compare, the cost
model's project): a run counts when its summary.json's `complete` record is there and verifies (`run_problem`);
an unfinished one is named on stderr with why and skipped, or with `partial=True` used and marked.
`read_records`, `read_summary` and `run_sides` give a run's prompts, its summary and every (prompt, method)
side; graft/records/writer.py writes what they read.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path

from graft.records.metrics import record_sides


class RecordError(ValueError):
    """A record a report tool cannot use (missing, torn, not a run); the message names the file."""


def read_json(path) -> dict:
    """A JSON object from `path`, or a RecordError naming the file and what is wrong with it."""
    path = Path(path)
    if path.is_dir():
        raise RecordError(f"{path}: is a directory, expected a JSON file")
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise RecordError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        where = f" at line {err.lineno} column {err.colno}" if isinstance(err, json.JSONDecodeError) else ""
        raise RecordError(f"{path}: not valid JSON{where} (torn?); rerun or re-export that run") from None
    if not isinstance(data, dict):
        raise RecordError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def read_samples(run: Path) -> str:
    """A run's samples.jsonl, or the gzipped copy that `python -m graft.report export` commits."""
    plain, packed = run / "samples.jsonl", run / "samples.jsonl.gz"
    if plain.is_file():
        return plain.read_text()
    if not packed.is_file():
        raise RecordError(f"{run}: has neither samples.jsonl nor samples.jsonl.gz")
    try:
        return gzip.decompress(packed.read_bytes()).decode()
    except (OSError, EOFError, UnicodeDecodeError) as err:
        raise RecordError(f"{packed}: not a whole gzip file ({err}); re-export that run") from None


def read_records(run: Path) -> list[dict]:
    """The prompt records of a run, each line checked: a torn line is a RecordError naming file and line."""
    records = []
    lines = read_samples(Path(run)).splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines) and _unfinished(Path(run)):  # a killed run's last line: its prompt reruns
                break
            raise RecordError(f"{run}/samples.jsonl:{number}: torn record; rerun the run to repair it") from None
    return records


def _unfinished(run: Path) -> bool:
    """True when the run's summary.json is missing or has no `complete` record (a run still going, or killed)."""
    try:
        return not (read_json(run / "summary.json").get("complete"))
    except RecordError:
        return True


def planned_prompts(run: Path) -> int | None:
    """The prompts a run's config asks for (the smaller of run.num_prompts and dataset.num_prompts), or None
    where it asks for the whole dataset (or run.json does not say)."""
    try:
        config = read_json(Path(run) / "run.json").get("config") or {}
    except RecordError:
        return None
    sizes = [(config.get(section) or {}).get("num_prompts") for section in ("run", "dataset")]
    sizes = [n for n in sizes if isinstance(n, int) and n > 0]
    return min(sizes) if sizes else None


def run_problem(run: Path, summary: dict | None = None) -> str | None:
    """None when `run` finished: summary.json's `complete` record (written once every prompt of the plan was
    recorded) is there and verifies, every id it names recorded once and their records' sha1 the one it names
    (graft/records/folder.py: records_problem). Else why not, in a few words: "partial (4 of 10 prompts)" (a run
    going on, killed or failed: it rewrites summary.json after each prompt, without `complete`), or "not
    complete: <what differs>". Summaries from before records were digested hold the plan alone as `complete`
    ({num_prompts, dataset_num_prompts}); their runs wrote it at the end too, and count as finished."""
    from graft.records.folder import records_problem

    run = Path(run)
    summary = summary if summary is not None else read_summary(run)
    complete = summary.get("complete")
    if not isinstance(complete, dict) or not complete:
        return _partial_reason(run, summary)
    ids, digest = complete.get("ids"), complete.get("records_sha1")
    if ids is None and digest is None:
        return None  # a summary from before the digest: the plan alone
    if not (run / "samples.jsonl").is_file() and not (run / "samples.jsonl.gz").is_file():
        return "not complete: its samples.jsonl is missing"
    records, ids = read_records(run), list(ids or [])
    if digest is None:  # ids alone: each recorded once
        records = [r for r in records if r.get("id") in set(ids)]
        digest = records_digest_of(records, ids)
    problem = records_problem(records, ids, digest)
    return f"not complete: {problem}" if problem else None


def records_digest_of(records: list[dict], ids: list) -> str | None:
    """The digest of `records` in the order of `ids` when each id has exactly one, else None."""
    from graft.records.folder import records_digest

    by_id = {r.get("id"): r for r in records}
    if len(records) != len(ids) or set(by_id) != set(ids):
        return None
    return records_digest([by_id[i] for i in ids])


def _partial_reason(run: Path, summary: dict) -> str:
    from graft.records.folder import holder_text, live_holder

    done = (summary.get("n_prompts") or 0) + (summary.get("n_skipped") or 0)
    planned = planned_prompts(run)
    reason = f"partial ({done} of {planned} prompts)" if planned else f"partial ({done} prompts, no `complete` record)"
    holder = live_holder(run)
    if holder:
        reason += f", being written by {holder_text(holder)}"
    if (run / "failed.json").is_file():
        reason += ", failed (failed.json)"
    return reason


_TOLD: set[str] = set()  # the lines already printed about unfinished runs (a tool reads its runs more than once)


def _tell(line: str) -> None:
    if line not in _TOLD:
        _TOLD.add(line)
        print(line, file=sys.stderr)


def run_use(
    run: Path, partial: bool = False, summary: dict | None = None, lines: list | None = None
) -> tuple[bool, bool]:
    """(whether a tool uses `run`, whether it is unfinished). A finished run is used; an unfinished one is named
    on stderr with why (or in `lines`, where given, for the caller to print), and used (marked partial) only
    with `partial`."""
    problem = run_problem(Path(run), summary)
    if problem is None:
        return True, False
    line = f"{run}: {problem}; " + ("shown, marked partial" if partial else "skipped (pass --partial to show it)")
    if lines is None:
        _tell(line)
    else:
        lines.append(line)
    return partial, True


def none_finished(what: str, lines: list[str], partial: bool) -> RecordError:
    """The error of a tool that found runs, none of them finished: one line, the first's reason in it."""
    more = f" (and {len(lines) - 1} more unfinished)" if len(lines) > 1 else ""
    first = lines[0].split("; skipped")[0] if lines else "none"
    return RecordError(
        f"{what}: no finished runs under it: {first}{more}" + ("" if partial else "; pass --partial to show them")
    )


def run_dirs(paths, partial: bool = False, unfinished: dict | None = None) -> list[Path]:
    """Every run directory (a folder with summary.json and run.json) at or below `paths` that a tool uses:
    finished ones (run_problem), and with `partial` unfinished ones too; the others are named on stderr, one
    line each, and skipped. `unfinished`, where given, gets {run: whether it is unfinished}. A path that does
    not exist or holds no run is a RecordError, and so is finding only unfinished runs, so a mistyped path never
    yields an empty table."""
    found, lines = [], []
    for path in map(Path, paths):
        if not path.exists():
            raise RecordError(f"{path}: no such file or directory")
        if (path / "summary.json").is_file():
            runs = [path]
        elif not path.is_dir():
            raise RecordError(f"{path}: not a run directory (a folder with summary.json and run.json)")
        else:
            folders = folders_below(path)
            runs = [f for f in folders if (f / "summary.json").exists() and (f / "run.json").is_file()]
            started = [f for f in folders if (f / "run.json").is_file() and not (f / "summary.json").exists()]
            for run in started:  # started, but no prompt recorded yet (summary.json is written after each one)
                planned = planned_prompts(run)
                lines.append(
                    f"{run}: partial (0{f' of {planned}' if planned else ''} prompts, no summary.json yet); skipped"
                )
            if not runs and not started:
                raise RecordError(f"{path}: no finished runs under it (no folder with summary.json and run.json)")
        for run in runs:
            use, partly = run_use(run, partial, lines=lines)
            if unfinished is not None:
                unfinished[run] = partly
            found += [run] if use else []
    if not found:  # one line: the error, naming the first unfinished run and why
        raise none_finished(", ".join(map(str, paths)), lines, partial)
    for line in lines:
        _tell(line)
    return list(dict.fromkeys(found))


def folders_below(path: Path) -> list[Path]:
    """`path` and every folder below it, in path order, following links to folders (a run linked into a results
    tree is read like one copied there), each real folder once."""
    seen, found = set(), []
    for top, folders, _ in os.walk(path, followlinks=True):
        real = os.path.realpath(top)
        if real in seen:  # a link back up the tree, or a second link to one folder
            folders[:] = []
            continue
        seen.add(real)
        found.append(Path(top))
    return sorted(found)


def check_export_paths(source, target) -> tuple[Path, Path]:
    """(source, target) as paths, once the source exists and neither lies inside the other."""
    source, target = Path(source), Path(target)
    if not source.exists():
        raise RecordError(f"{source}: no such file or directory")
    a, b = source.resolve(), target.resolve()
    if a == b or a in b.parents or b in a.parents:
        raise RecordError(f"source {source} and target {target} overlap; export into a folder outside the runs")
    return source, target


def read_summary(run: Path) -> dict:
    """A run's summary.json, checked for the keys every table reads."""
    summary = read_json(Path(run) / "summary.json")
    missing = [key for key in ("model", "dataset") if key not in summary]
    if missing:
        raise RecordError(f"{run}/summary.json: lacks {', '.join(missing)}; is it a run's summary?")
    return summary


def hardware_name(hardware: dict) -> str | None:
    """The GPU, else the CPU with its vector instructions where recorded ("AMD EPYC, AVX2")."""
    if hardware.get("gpu"):
        return hardware["gpu"]
    cpu = hardware.get("cpu")
    return f"{cpu}, {hardware['cpu_isa']}" if cpu and hardware.get("cpu_isa") else cpu


def _run_config(run: Path) -> dict:
    """run.json's resolved config, or {} where the run has none."""
    try:
        return read_json(Path(run) / "run.json").get("config") or {}
    except RecordError:
        return {}


def summary_records(run: Path, summary: dict) -> list[dict]:
    """The records a run's summary was computed from: those of `complete.ids` where the summary names them
    (samples.jsonl may hold an earlier, larger selection)."""
    records = read_records(Path(run))
    ids = (summary.get("complete") or {}).get("ids")
    if ids is not None:
        wanted = set(ids)
        records = [r for r in records if r.get("id") in wanted]
    return records


def run_sides(run: Path):
    """(summary, record, method, side) for every prompt record of one run directory and every side in it
    (the baseline as `ar`)."""
    summary = read_summary(Path(run))
    for record in read_records(Path(run)):
        record["_method"] = summary.get("method")
        for method, side in record_sides(record).items():
            yield summary, record, method, side
