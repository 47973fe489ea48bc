"""Run directories as pandas tables, for the paper-shaped tables and the figures (graft/report/tables.py,
graft/report/figures.py, notebooks/reproduce_figures.ipynb).

- `method_rows(paths)`: one row per (run, method) from the summaries: model, dataset, method, temperature,
  budget, the headline metrics, the time split and the pruning stages. A comparison gives a row per method
  and one for its baseline (`ar`); a single-method run gives its method's row. `intervals=True` adds each
  ratio's 95% bootstrap interval over prompts (`run_intervals`: summary.json's, else from the records).
- `category_rows(paths)`: one row per (run, method, category or "all", metric) of those intervals.
- `prompt_rows(paths)`: one row per (run, method, prompt): tau, tokens/s, speedup and lossless of that prompt.
- `step_rows(paths)`: one row per verification step from samples.jsonl (accepted length, nodes, stage,
  accepted draft and retrieved nodes, milliseconds), for histograms and the retrieval-by-stage figure.
- `paper_table(rows, ...)`: rows = methods, columns = datasets and their mean, cells "speedup / tau".
- `split_settings(rows)`: rows of runs that would share a cell but differ in a setting, labelled apart.
- `sweep_table(rows, ...)`: a budget / threshold sweep, rows = settings, columns = methods.

Every one of them reads finished runs only (`run_dirs`): a run whose summary.json's `complete` record is there
and verifies (`run_problem`); an unfinished one is named on stderr with why and skipped, or with `partial=True`
used and marked (a `partial` column). Every report tool (tables, plot, export, summarize, compare) decides so here.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pandas as pd

from graft import stats
from graft.metrics import record_sides

METRICS = (
    "tau",
    "speedup_wall",
    "speedup_decode",
    "avg_nodes_per_step",
    "tokens_per_s",
    "retrieval_share",
    "ms_per_step",
)


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
    (graft/runfolder.py: records_problem). Else why not, in a few words: "partial (4 of 10 prompts)" (a run
    going on, killed or failed: it rewrites summary.json after each prompt, without `complete`), or "not
    complete: <what differs>". Summaries from before records were digested hold the plan alone as `complete`
    ({num_prompts, dataset_num_prompts}); their runs wrote it at the end too, and count as finished."""
    from graft.runfolder import records_problem

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
    from graft.runfolder import records_digest

    by_id = {r.get("id"): r for r in records}
    if len(records) != len(ids) or set(by_id) != set(ids):
        return None
    return records_digest([by_id[i] for i in ids])


def _partial_reason(run: Path, summary: dict) -> str:
    from graft.runfolder import holder_text, live_holder

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
            runs = sorted(p.parent for p in path.rglob("summary.json") if (p.parent / "run.json").is_file())
            started = sorted(p.parent for p in path.rglob("run.json") if not (p.parent / "summary.json").exists())
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


def _row(summary: dict, run: Path, method: str) -> dict:
    config = summary.get("method_config") or {}
    split = summary.get("time_split") or {}
    return {
        "run": str(run),
        "model": summary["model"],
        "dataset": summary["dataset"],
        "method": method,
        "temperature": summary.get("temperature", 0.0),
        "budget": config.get("total_tokens"),
        "thresholds": _label(config.get("thresholds")),
        "n_prompts": summary.get("n_prompts"),
        "lossless": summary.get("lossless"),
        **{key: summary.get(key) for key in METRICS},
        "draft_share": split.get("draft"),
        "verify_share": split.get("verify"),
        "other_share": split.get("other"),
        "stages": summary.get("stages"),
        "hardware": hardware_name(summary.get("hardware") or {}),
        **(repeat_columns(summary["repeats"]) if summary.get("repeats") else {}),  # run.repeats > 1 only
    }


def repeat_columns(repeats: dict) -> dict:
    """`repeats` (run.repeats) and each headline ratio's `<metric>_repeats_mean` / `_min` / `_max` over them,
    from a method's summary.json `repeats` (a run of one pass has none: the columns are absent or empty)."""
    columns: dict = {"repeats": repeats.get("R")}
    for metric in stats.METRICS:
        spread = repeats.get(metric) or {}
        columns.update({f"{metric}_repeats_{k}": spread.get(k) for k in ("mean", "min", "max")})
    return columns


def repeat_table(rows: pd.DataFrame, metric: str = "speedup_wall", order: list[str] | None = None) -> pd.DataFrame:
    """Rows = methods, columns = datasets, cells "<mean>x (<min>-<max>), R=<repeats>": `metric` over the
    repeats of runs with run.repeats > 1 (the machine's noise between runs, beside the interval over prompts);
    empty where no run repeated."""
    rows = rows[(rows["method"] != "ar") & (rows["repeats"].fillna(1) > 1)] if "repeats" in rows else rows.iloc[:0]
    if rows.empty:
        return pd.DataFrame()
    cells: dict = {}
    for r in rows.itertuples():
        mean, low, high = (getattr(r, f"{metric}_repeats_{k}") for k in ("mean", "min", "max"))
        text = "-" if mean is None or pd.isna(mean) else f"{mean:.2f}x ({low:.2f}-{high:.2f}), R={r.repeats:.0f}"
        cells.setdefault(r.method, {})[r.dataset] = text
    table = pd.DataFrame.from_dict(cells, orient="index").fillna("-")
    methods = [m for m in (order or []) if m in table.index] + [m for m in table.index if m not in (order or [])]
    return table.loc[methods, sorted(table.columns)]


def hardware_name(hardware: dict) -> str | None:
    """The GPU, else the CPU with its vector instructions where recorded ("AMD EPYC, AVX2")."""
    if hardware.get("gpu"):
        return hardware["gpu"]
    cpu = hardware.get("cpu")
    return f"{cpu}, {hardware['cpu_isa']}" if cpu and hardware.get("cpu_isa") else cpu


def _label(value) -> str | None:
    """A list-valued parameter as one hashable table key ("0.5/0.35/0.25")."""
    return None if value is None else "/".join(f"{v:g}" for v in value)


def method_rows(paths, intervals: bool = False, partial: bool = False) -> pd.DataFrame:
    """One row per (run, method); with `intervals`, columns `<metric>_low` / `<metric>_high` too: the 95%
    interval over prompts of speedup_wall, speedup_decode and tau (graft/stats.py; None where the run's
    records give none: fewer than MIN_N_FOR_INTERVAL prompts, or records without per-side totals), and
    `interval_n`, the prompts they are over. Finished runs only, unless `partial`
    (run_dirs); `partial` is True on an unfinished run's rows, and `settings` holds what the row's numbers
    depend on (run_settings), for split_settings."""
    rows = []
    unfinished: dict = {}
    for run in run_dirs(paths, partial, unfinished):
        summary = read_summary(run)
        config = _run_config(run)
        if summary.get("kind") == "comparison":
            first = next(iter(summary["methods"].values()), None)
            if first is None or not first.get("n_prompts"):
                continue
            base = summary["rows"]["ar"]
            baseline = {**first, **base, "time_split": None, "stages": None, "method_config": {"total_tokens": 1}}
            baseline["repeats"] = None  # (the first method's; the baseline's ratios are 1 in every repeat)
            label = "ar (imported)" if summary.get("imported") else "ar"  # graft/report/specbench.py: import
            found = [_row(baseline, run, label)] + [_row(s, run, name) for name, s in summary["methods"].items()]
        elif summary.get("n_prompts"):
            found = [_row(summary, run, summary["method"])]
        else:
            continue
        if summary.get("kind") == "comparison":  # the baseline's numbers depend on no method's config
            own_configs = [None, *(s.get("method_config") for s in summary["methods"].values())]
        else:
            own_configs = [summary.get("method_config")]
        for row, own in zip(found, own_configs):
            row["partial"] = unfinished.get(run, False)
            row["settings"] = json.dumps(run_settings(config, own, row["hardware"]), sort_keys=True, default=str)
        if intervals:
            spread = run_intervals(run, summary, categories=False)
            for row in found:
                overall = (spread.get(row["method"]) or {}).get("all", {})
                for metric in stats.METRICS:
                    entry = overall.get(metric) or {}
                    row[f"{metric}_low"], row[f"{metric}_high"] = entry.get("low"), entry.get("high")
                # the prompts they are over (None where the records give none): "(n=8)" below MIN_N_FOR_INTERVAL
                row["interval_n"] = (overall.get("tau") or {}).get("n")
        rows += found
    return pd.DataFrame(rows)


def _run_config(run: Path) -> dict:
    """run.json's resolved config, or {} where the run has none."""
    try:
        return read_json(Path(run) / "run.json").get("config") or {}
    except RecordError:
        return {}


CELL_KEYS = {"model.name", "run.temperature", "dataset.name", "method.name", "method.total_tokens", "method.thresholds"}
REPEAT_KEYS = {"run.seed"}  # runs that differ only here are repeats of one setting: averaged, their range shown


def run_settings(config: dict, method_config: dict | None, hardware: str | None) -> dict:
    """What one row's numbers depend on, flat ("run.max_new_tokens": 64): the run's result-determining config
    (graft/runfolder.py: result_config) without its method sections, the row's own method config (summary.json's
    `method_config`, as "method.<key>"; none for the baseline) and the hardware it ran on."""
    from graft.runfolder import _flatten, result_config

    flat = {k: v for k, v in _flatten(result_config(config)).items() if k.split(".")[0] not in ("method", "methods")}
    flat.update({f"method.{k}": v for k, v in _flatten(method_config or {}).items()})
    flat["hardware"] = hardware
    return flat


def summary_records(run: Path, summary: dict) -> list[dict]:
    """The records a run's summary was computed from: those of `complete.ids` where the summary names them
    (samples.jsonl may hold an earlier, larger selection)."""
    records = read_records(Path(run))
    ids = (summary.get("complete") or {}).get("ids")
    if ids is not None:
        wanted = set(ids)
        records = [r for r in records if r.get("id") in wanted]
    return records


def run_intervals(run: Path, summary: dict | None = None, categories: bool = True) -> dict:
    """{method: {"all": {metric: interval}, "categories": {...}}} of a run (graft/stats.py): summary.json's
    `intervals` where the run recorded them as graft/stats.py computes them now, else computed from its
    records (only "all" unless `categories`); where the records lack per-side totals, the values that
    summary.json recorded without their intervals ({} where it recorded none)."""
    summary = summary if summary is not None else read_summary(Path(run))
    if stats.current(summary):
        return summary["intervals"]
    records = summary_records(run, summary)
    if not all("totals" in side for r in records for side in record_sides(r).values()):
        # an older run's intervals (another method, printed at any n): their values, no interval
        return stats.values_only(summary.get("intervals") or {})
    return stats.summary_intervals(summary, records, categories)


def category_rows(paths, partial: bool = False) -> pd.DataFrame:
    """One row per (run, method, category, metric) of the 95% bootstrap intervals, category "all" for the
    whole run: model, dataset, temperature, hardware, value, low, high, n (the prompts resampled), partial."""
    rows = []
    unfinished: dict = {}
    for run in run_dirs(paths, partial, unfinished):
        summary = read_summary(run)
        for method, category, metric, entry in stats.interval_entries(run_intervals(run, summary)):
            rows.append(
                {
                    "run": str(run),
                    "model": summary["model"],
                    "dataset": summary["dataset"],
                    "temperature": summary.get("temperature", 0.0),
                    "hardware": hardware_name(summary.get("hardware") or {}),
                    "method": method,
                    "category": category,
                    "metric": metric,
                    **{key: entry.get(key) for key in ("value", "low", "high", "n")},
                    "partial": unfinished.get(run, False),
                }
            )
    return pd.DataFrame(rows)


def run_sides(run: Path):
    """(summary, record, method, side) for every prompt record of one run directory and every side in it
    (the baseline as `ar`)."""
    summary = read_summary(Path(run))
    for record in read_records(Path(run)):
        record["_method"] = summary.get("method")
        for method, side in record_sides(record).items():
            yield summary, record, method, side


def _prompt_keys(run: Path, summary: dict, method: str, record: dict) -> dict:
    """The columns that say whose row it is: run, model, dataset, method, prompt."""
    return {
        "run": str(run),
        "model": summary["model"],
        "dataset": summary["dataset"],
        "method": method,
        "prompt": record["id"],
    }


def step_rows(paths, partial: bool = False) -> pd.DataFrame:
    rows = []
    for run in run_dirs(paths, partial):
        for summary, record, method, side in run_sides(run):
            for turn in side["turns"]:
                if not isinstance(turn.get("nodes"), list):  # imported answer files record no step's tree or times
                    continue
                infos = turn.get("step_info") or [{}] * turn["steps"]
                sources = turn.get("step_sources") or [[0, 0, 0, 0]] * turn["steps"]
                for k in range(turn["steps"]):
                    info = infos[k] if k < len(infos) else {}
                    rows.append(
                        {
                            **_prompt_keys(run, summary, method, record),
                            "accepted": turn["accept_lengths"][k],
                            "nodes": turn["nodes"][k],
                            "stage": info.get("stage"),
                            "draft_nodes": sources[k][0],
                            "retrieved_nodes": sources[k][1],
                            "accepted_draft": sources[k][2],
                            "accepted_retrieved": sources[k][3],
                            "draft_ms": turn["draft_ms"][k],
                            "verify_ms": turn["verify_ms"][k],
                            "other_ms": turn["other_ms"][k],
                        }
                    )
    return pd.DataFrame(rows)


def _verdict(record: dict, method: str) -> dict:
    """The per-prompt speedup and lossless verdict the record keeps for `method` (1.0 and none for the baseline)."""
    if "methods" in record:
        return record["methods"].get(method) or {"speedup_wall": 1.0}  # the baseline, `ar`
    is_baseline = method == "ar" and record.get("baseline")  # (method=ar alone runs no separate baseline)
    return {"speedup_wall": 1.0} if is_baseline else record


def prompt_rows(paths, partial: bool = False) -> pd.DataFrame:
    """One row per (run, method, finished prompt), the baseline as `ar`: category, tau (step tokens / steps),
    tokens_per_s, speedup_wall and lossless (the prompt's record; None for the baseline)."""
    rows = []
    for run in run_dirs(paths, partial):
        for summary, record, method, side in run_sides(run):
            totals = side.get("totals") or {}
            steps = totals["steps"] if "steps" in totals else sum(t["steps"] for t in side["turns"])
            tokens = (
                totals["step_tokens"]
                if "step_tokens" in totals
                else sum(sum(t["accept_lengths"]) for t in side["turns"])
            )
            verdict = _verdict(record, method)
            rows.append(
                {
                    **_prompt_keys(run, summary, method, record),
                    "category": record.get("category"),
                    "tau": tokens / steps if steps else None,
                    "tokens_per_s": totals.get("tokens_per_s"),
                    "speedup_wall": verdict.get("speedup_wall"),
                    "lossless": (verdict.get("lossless") or {}).get("equal"),
                }
            )
    return pd.DataFrame(rows)


def paper_table(rows: pd.DataFrame, metric: str = "speedup_wall", order: list[str] | None = None) -> pd.DataFrame:
    """Rows = methods, columns = datasets and `mean`, cells "<speedup>x / <tau>" (one model, one temperature);
    "<speedup>x [<low>, <high>] / <tau>" where `rows` has the speedup's 95% interval (method_rows(...,
    intervals=True)), "<speedup>x (n=<prompts>) / <tau>" where it has too few prompts for one
    (graft/stats.py: MIN_N_FOR_INTERVAL); the baseline's ratio (1 by definition) and the mean over datasets
    go without."""
    speed = rows.pivot_table(index="method", columns="dataset", values=metric, aggfunc="mean")
    tau = rows.pivot_table(index="method", columns="dataset", values="tau", aggfunc="mean")
    bounds = {}
    for side in ("low", "high"):
        column = f"{metric}_{side}"
        if column in rows and rows[column].notna().any():
            values = rows.astype({column: float})
            bounds[side] = values.pivot_table(index="method", columns="dataset", values=column, aggfunc="mean")
    # with intervals asked for, a cell over too few prompts for one says so: "1.52x (n=8) / 2.31"
    few = None
    if "interval_n" in rows and rows["interval_n"].notna().any():
        counts = rows.astype({"interval_n": float})
        few = counts.pivot_table(index="method", columns="dataset", values="interval_n", aggfunc="min")
    speed["mean"], tau["mean"] = speed.mean(axis=1), tau.mean(axis=1)
    methods = [m for m in (order or []) if m in speed.index] + [m for m in speed.index if m not in (order or [])]
    cells = speed.loc[methods].copy().astype(object)
    for method in methods:
        for column in speed.columns:
            s, t = speed.loc[method, column], tau.loc[method, column]
            low, high = (_cell(bounds.get(side), method, column) for side in ("low", "high"))
            spread = "" if low is None or high is None or method == "ar" else f" [{low:.2f}, {high:.2f}]"
            n = _cell(few, method, column)
            if not spread and method != "ar" and n and n < stats.MIN_N_FOR_INTERVAL:
                spread = f" (n={n:.0f})"
            cells.loc[method, column] = "-" if pd.isna(s) else f"{s:.2f}x{spread} / {t:.2f}"
    cells.columns.name = None
    return cells


def _cell(table: pd.DataFrame | None, index: str, column: str) -> float | None:
    """table[index, column], or None where the table, the cell or its value is missing."""
    if table is None or index not in table.index or column not in table.columns:
        return None
    value = table.loc[index, column]
    return None if pd.isna(value) else float(value)


def improvement(
    rows: pd.DataFrame, method: str = "graft", over: str = "eagle3", metric: str = "speedup_wall"
) -> float | None:
    """Relative improvement of `method`'s mean `metric` over `over`'s across datasets (0.1 = +10%)."""
    means = rows.groupby("method")[metric].mean()
    if method not in means or over not in means or not means[over]:
        return None
    return float(means[method] / means[over] - 1)


def is_sweep(rows: pd.DataFrame) -> bool:
    """True when some method ran more than once on a dataset (a budget or threshold sweep), so that a
    paper-shaped table would average different settings."""
    return bool(rows.groupby(["method", "dataset"]).size().max() > 1)


def sweep_table(rows: pd.DataFrame, metric: str = "speedup_wall", order: list[str] | None = None) -> pd.DataFrame:
    """One dataset's sweep: rows = (budget, thresholds), columns = methods, cells "<speedup>x / <tau> /
    <nodes per step>"; the baseline is left out (1.00x by definition). A method without thresholds (EAGLE-3)
    sits in the "-" row of each budget: the mean of its runs in that budget's jobs, which are repeats, with
    their range in brackets (the run-to-run noise of the measurement)."""
    rows = rows[rows["method"] != "ar"].copy()
    rows["thresholds"] = rows["thresholds"].fillna("-")
    methods = [m for m in (order or []) if m in set(rows["method"])]
    methods += sorted(set(rows["method"]) - set(methods))
    cells = {}
    for (budget, thresholds), group in rows.groupby(["budget", "thresholds"]):
        row = {}
        for method in methods:
            runs = group[group["method"] == method]
            if runs.empty:
                row[method] = "-"
                continue
            speed = f"{runs[metric].mean():.2f}x"
            if len(runs) > 1:
                speed += f" ({runs[metric].min():.2f}-{runs[metric].max():.2f})"
            row[method] = f"{speed} / {runs['tau'].mean():.2f} / {runs['avg_nodes_per_step'].mean():.1f}"
        cells[(int(budget), thresholds)] = row
    table = pd.DataFrame.from_dict(cells, orient="index")[methods]
    table.index.names = ["budget", "thresholds"]
    return table


def _text(value) -> str:
    if isinstance(value, list):
        return "/".join(_text(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _cell_key(value):
    return None if value is None or (isinstance(value, float) and pd.isna(value)) else value


def split_settings(rows: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """`rows` (method_rows) relabelled so that no table cell averages runs of different settings: where runs
    that would share a cell (model, temperature, dataset, method, budget, thresholds) differ in a setting their
    numbers depend on (run_settings; not the seed, REPEAT_KEYS: those are repeats), every row of that method
    gets the values it ran with, `method` = "graft (max_new_tokens=64)"; an unfinished run's rows are marked
    "(partial)" the same way. Returns the rows and, per model and temperature, one line naming the settings
    that differ."""
    if rows.empty or "settings" not in rows:
        return rows, []
    rows = rows.reset_index(drop=True)
    settings = [json.loads(s) if isinstance(s, str) else {} for s in rows["settings"]]
    ignored = CELL_KEYS | REPEAT_KEYS
    labels, notes = list(rows["method"]), []
    unfinished = list(rows["partial"].fillna(False).astype(bool)) if "partial" in rows else [False] * len(rows)
    for (model, temperature), group in rows.groupby(["model", "temperature"], dropna=False):
        cells: dict[tuple, list[int]] = {}
        for i, r in group.iterrows():
            key = (r["dataset"], r["method"], _cell_key(r["budget"]), _cell_key(r["thresholds"]))
            cells.setdefault(key, []).append(i)
        differ = set()
        for members in cells.values():
            keys = set().union(*(settings[i] for i in members)) - ignored
            differ |= {k for k in keys if len({_text(settings[i].get(k)) for i in members}) > 1}
        for method, mine in group.groupby("method").groups.items():
            own = sorted(k for k in differ if len({_text(settings[i].get(k)) for i in mine}) > 1)
            short = {k: k.rsplit(".", 1)[-1] for k in own}
            short = {k: k if list(short.values()).count(v) > 1 else v for k, v in short.items()}
            for i in mine:
                parts = [f"{short[k]}={_text(settings[i].get(k))}" for k in own]
                parts += ["partial"] if unfinished[i] else []
                if parts:
                    labels[i] = f"{method} ({', '.join(parts)})"
        if differ:
            notes.append(
                f"{model}, temperature {temperature:g}: runs that would share a cell differ in "
                f"{', '.join(sorted(differ))}; shown apart, each row labelled with its value."
            )
    rows["method"] = labels
    return rows, notes


def best_settings(rows: pd.DataFrame, metric: str = "speedup_wall") -> pd.DataFrame:
    """Each method's best (budget, thresholds) by `metric` (repeats of a setting averaged), per dataset."""
    rows = rows[rows["method"] != "ar"].copy()
    rows["thresholds"] = rows["thresholds"].fillna("-")
    keys = ["dataset", "method", "budget", "thresholds"]
    means = rows.groupby(keys)[[metric, "tau", "avg_nodes_per_step"]].mean().reset_index()
    best = means.loc[means.groupby(["dataset", "method"])[metric].idxmax()]
    return best[[*keys, metric, "tau", "avg_nodes_per_step"]].reset_index(drop=True)


def stage_table(rows: pd.DataFrame, settings: bool = False) -> pd.DataFrame:
    """Share of steps per confidence-checkpoint stage (`check@<levels>`, or `dense` when none fired), per
    method and dataset (and budget / thresholds when `settings`), for the methods that split the budget by
    stage (the split table); the model and the temperature lead each row's label where `rows` hold several."""
    data = {}
    models, temperatures = rows["model"].nunique() > 1, rows["temperature"].nunique() > 1
    for r in rows.itertuples():
        stages = r.stages if isinstance(r.stages, dict) else {}
        if stages and all(k == "dense" or k.startswith("check@") for k in stages):
            label = f"{r.method} / {r.dataset}"
            if temperatures:
                label = f"t={r.temperature:g} / {label}"
            if models:
                label = f"{r.model} / {label}"
            if settings:
                label += f" / {r.budget:.0f} at {r.thresholds or '-'}"
            data[label] = stages
    return pd.DataFrame(data).T.fillna(0.0).sort_index(axis=1) if data else pd.DataFrame()
