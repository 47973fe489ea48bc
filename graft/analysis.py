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
- `sweep_table(rows, ...)`: a budget / threshold sweep, rows = settings, columns = methods.
"""

from __future__ import annotations

import gzip
import json
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
    for number, line in enumerate(read_samples(Path(run)).splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise RecordError(f"{run}/samples.jsonl:{number}: torn record; rerun the run to repair it") from None
    return records


def run_dirs(paths) -> list[Path]:
    """Every run directory (a folder with summary.json and run.json) at or below `paths`; a path that does
    not exist or holds no run is a RecordError, so a mistyped path never yields an empty table."""
    found = []
    for path in map(Path, paths):
        if not path.exists():
            raise RecordError(f"{path}: no such file or directory")
        if (path / "summary.json").is_file():
            found.append(path)
            continue
        if not path.is_dir():
            raise RecordError(f"{path}: not a run directory (a folder with summary.json and run.json)")
        runs = sorted(p.parent for p in path.rglob("summary.json") if (p.parent / "run.json").is_file())
        if not runs:
            raise RecordError(f"{path}: no finished runs under it (no folder with summary.json and run.json)")
        found += runs
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
    }


def hardware_name(hardware: dict) -> str | None:
    """The GPU, else the CPU with its vector instructions where recorded ("AMD EPYC, AVX2")."""
    if hardware.get("gpu"):
        return hardware["gpu"]
    cpu = hardware.get("cpu")
    return f"{cpu}, {hardware['cpu_isa']}" if cpu and hardware.get("cpu_isa") else cpu


def _label(value) -> str | None:
    """A list-valued parameter as one hashable table key ("0.5/0.35/0.25")."""
    return None if value is None else "/".join(f"{v:g}" for v in value)


def method_rows(paths, intervals: bool = False) -> pd.DataFrame:
    """One row per (run, method); with `intervals`, columns `<metric>_low` / `<metric>_high` too: the 95%
    bootstrap interval over prompts of speedup_wall, speedup_decode and tau (None where the run's records
    give none: one prompt, or records without per-side totals)."""
    rows = []
    for run in run_dirs(paths):
        summary = read_summary(run)
        if summary.get("kind") == "comparison":
            first = next(iter(summary["methods"].values()), None)
            if first is None or not first.get("n_prompts"):
                continue
            base = summary["rows"]["ar"]
            baseline = {**first, **base, "time_split": None, "stages": None, "method_config": {"total_tokens": 1}}
            found = [_row(baseline, run, "ar")] + [_row(s, run, name) for name, s in summary["methods"].items()]
        elif summary.get("n_prompts"):
            found = [_row(summary, run, summary["method"])]
        else:
            continue
        if intervals:
            spread = run_intervals(run, summary, categories=False)
            for row in found:
                overall = (spread.get(row["method"]) or {}).get("all", {})
                for metric in stats.METRICS:
                    entry = overall.get(metric) or {}
                    row[f"{metric}_low"], row[f"{metric}_high"] = entry.get("low"), entry.get("high")
        rows += found
    return pd.DataFrame(rows)


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
    `intervals` where the run recorded them, else computed from its records (only "all" unless
    `categories`); {} where the records lack per-side totals to resample."""
    summary = summary if summary is not None else read_summary(Path(run))
    if isinstance(summary.get("intervals"), dict):
        return summary["intervals"]
    records = summary_records(run, summary)
    if not all("totals" in side for r in records for side in record_sides(r).values()):
        return {}
    return stats.summary_intervals(summary, records, categories)


def category_rows(paths) -> pd.DataFrame:
    """One row per (run, method, category, metric) of the 95% bootstrap intervals, category "all" for the
    whole run: model, dataset, temperature, hardware, value, low, high, n (the prompts resampled)."""
    rows = []
    for run in run_dirs(paths):
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


def step_rows(paths) -> pd.DataFrame:
    rows = []
    for run in run_dirs(paths):
        for summary, record, method, side in run_sides(run):
            for turn in side["turns"]:
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


def prompt_rows(paths) -> pd.DataFrame:
    """One row per (run, method, finished prompt), the baseline as `ar`: category, tau (step tokens / steps),
    tokens_per_s, speedup_wall and lossless (the prompt's record; None for the baseline)."""
    rows = []
    for run in run_dirs(paths):
        for summary, record, method, side in run_sides(run):
            totals = side.get("totals") or {}
            steps = totals.get("steps", sum(t["steps"] for t in side["turns"]))
            tokens = totals.get("step_tokens", sum(sum(t["accept_lengths"]) for t in side["turns"]))
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
    intervals=True)); the baseline's ratio (1 by definition) and the mean over datasets go without."""
    speed = rows.pivot_table(index="method", columns="dataset", values=metric, aggfunc="mean")
    tau = rows.pivot_table(index="method", columns="dataset", values="tau", aggfunc="mean")
    bounds = {}
    for side in ("low", "high"):
        column = f"{metric}_{side}"
        if column in rows and rows[column].notna().any():
            values = rows.astype({column: float})
            bounds[side] = values.pivot_table(index="method", columns="dataset", values=column, aggfunc="mean")
    speed["mean"], tau["mean"] = speed.mean(axis=1), tau.mean(axis=1)
    methods = [m for m in (order or []) if m in speed.index] + [m for m in speed.index if m not in (order or [])]
    cells = speed.loc[methods].copy().astype(object)
    for method in methods:
        for column in speed.columns:
            s, t = speed.loc[method, column], tau.loc[method, column]
            low, high = (_cell(bounds.get(side), method, column) for side in ("low", "high"))
            spread = "" if low is None or high is None or method == "ar" else f" [{low:.2f}, {high:.2f}]"
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
    stage (the split table)."""
    data = {}
    for r in rows.itertuples():
        stages = r.stages if isinstance(r.stages, dict) else {}
        if stages and all(k == "dense" or k.startswith("check@") for k in stages):
            label = f"{r.method} / {r.dataset}"
            if settings:
                label += f" / {r.budget:.0f} at {r.thresholds}"
            data[label] = stages
    return pd.DataFrame(data).T.fillna(0.0).sort_index(axis=1) if data else pd.DataFrame()
