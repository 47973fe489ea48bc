"""Finished runs as pandas tables, for the paper-shaped tables and the figures (graft/report/tables.py,
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
- runs at several batch sizes: graft/analysis/batch.py (`batch_rows`, `batch_table`).

Every one of them reads finished runs only (graft/records/reader.py: (`run_dirs`): a run whose summary.json's `complete` record is there
and verifies (`run_problem`); an unfinished one is named on stderr with why and skipped, or with `partial=True`
used and marked (a `partial` column). Every report tool (tables, plot, export, summarize, compare) decides so here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from graft.analysis import stats
from graft.records.metrics import record_sides
from graft.records.reader import _run_config, hardware_name, read_summary, run_dirs, run_sides, summary_records

METRICS = (
    "tau",
    "speedup_wall",
    "speedup_decode",
    "avg_nodes_per_step",
    "tokens_per_s",
    "retrieval_share",
    "ms_per_step",
)


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
        "engine": (summary.get("peer") or {}).get("engine", "graft"),  # a peer engine's run (graft/peers)
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


def _label(value) -> str | None:
    """A list-valued parameter as one hashable table key ("0.5/0.35/0.25")."""
    return None if value is None else "/".join(f"{v:g}" for v in value)


def method_rows(paths, intervals: bool = False, partial: bool = False) -> pd.DataFrame:
    """One row per (run, method); with `intervals`, columns `<metric>_low` / `<metric>_high` too: the 95%
    interval over prompts of speedup_wall, speedup_decode and tau (graft/analysis/stats.py; None where the run's
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
            # another system's baseline (graft/report/foreign.py: imported answer files, a peer engine) says whose
            label = summary.get("baseline_label") or ("ar (imported)" if summary.get("imported") else "ar")
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


CELL_KEYS = {"model.name", "run.temperature", "dataset.name", "method.name", "method.total_tokens", "method.thresholds"}
REPEAT_KEYS = {"run.seed"}  # runs that differ only here are repeats of one setting: averaged, their range shown


def run_settings(config: dict, method_config: dict | None, hardware: str | None) -> dict:
    """What one row's numbers depend on, flat ("run.max_new_tokens": 64): the run's result-determining config
    (graft/records/folder.py: result_config) without its method sections, the row's own method config (summary.json's
    `method_config`, as "method.<key>"; none for the baseline) and the hardware it ran on."""
    from graft.records.folder import _flatten, result_config

    flat = {k: v for k, v in _flatten(result_config(config)).items() if k.split(".")[0] not in ("method", "methods")}
    flat.update({f"method.{k}": v for k, v in _flatten(method_config or {}).items()})
    flat["hardware"] = hardware
    return flat


def run_intervals(run: Path, summary: dict | None = None, categories: bool = True) -> dict:
    """{method: {"all": {metric: interval}, "categories": {...}}} of a run (graft/analysis/stats.py): summary.json's
    `intervals` where the run recorded them as graft/analysis/stats.py computes them now, else computed from its
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
    (graft/analysis/stats.py: MIN_N_FOR_INTERVAL); the baseline's ratio (1 by definition) and the mean over datasets
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
    that differ. The `settings` column is replaced by those settings alone, full key names ("run.batch_size=8;
    method.cost_profile_batch=..."), empty where nothing splits the row's cell."""
    if rows.empty or "settings" not in rows:
        return rows, []
    rows = rows.reset_index(drop=True)
    settings = [json.loads(s) if isinstance(s, str) else {} for s in rows["settings"]]
    ignored = CELL_KEYS | REPEAT_KEYS
    labels, notes, split = list(rows["method"]), [], [""] * len(rows)
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
                values = {k: _text(settings[i].get(k)) for k in own}
                split[i] = "; ".join(f"{k}={v}" for k, v in values.items())
                parts = [f"{short[k]}={v}" for k, v in values.items()]
                parts += ["partial"] if unfinished[i] else []
                if parts:
                    labels[i] = f"{method} ({', '.join(parts)})"
        if differ:
            notes.append(
                f"{model}, temperature {temperature:g}: runs that would share a cell differ in "
                f"{', '.join(sorted(differ))}; shown apart, each row labelled with its value."
            )
    rows["method"], rows["settings"] = labels, split
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
