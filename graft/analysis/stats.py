"""95% intervals over prompts for a run's headline ratios, overall and per category.

The same run moves by 5-20% from hour to hour on shared machines, so a ratio without an interval says little;
and an interval says what it claims only if it covers the true ratio 95% of the time at the number of prompts
it is printed for. Each prompt is one paired observation (the method's side and the shared baseline's side of
the same prompt; a prompt measured in several repeats, run.repeats, is one observation: its repeats pooled).
The ratios:
- speedup_wall: mean tokens/s of the method / mean tokens/s of the baseline (summary.json's speedup_wall);
- speedup_decode: the baseline's decode seconds per committed token / the method's (summary's speedup_decode);
- tau: committed tokens / verification steps of the method (summary's tau).
The point value is the statistic on all prompts, so it equals the summary's figure.

The interval (INTERVAL_METHOD): a t interval on the log of the ratio, its standard error from the delete-one
jackknife over prompts, with n - 1 degrees of freedom: exp(log value +- t * se). It is printed only from
MIN_N_FOR_INTERVAL prompts on; below, a table shows the value and n. Why: the percentile bootstrap this
replaced undercovers at few prompts (about 50% at n = 2, 78% at n = 4, 88% at n = 10 by simulation), and
below 10 prompts any interval's coverage rests on the shape of the data more than a simulation can vouch for;
from 10 on this one covers 94-95% in the simulation. `python -m graft.analysis.stats --coverage` prints the coverage
by n (tests/report/test_stats.py checks 90-99% at n = 10, 20, 40).

The whole run ("all") of a run whose prompts have categories is stratified by category: each jackknife
replicate deletes one prompt and reweights the rest of its category to keep the category's size (the
jackknife's form of resampling prompts within each category, category sizes fixed), the variance sums the
categories' parts, and the degrees of freedom are Satterthwaite's (at most n minus the number of categories;
without it, small categories undercover: 91% at 4 categories of 2-3 prompts); a run with a category of one
prompt is not stratified. Noise between runs of the machine is not in these intervals: run.repeats
measures it (summary.json's `repeats`).
"""

from __future__ import annotations

import numpy as np

from graft.records.metrics import record_sides

METRICS = ("speedup_wall", "speedup_decode", "tau")
CONFIDENCE = 0.95
MIN_N_FOR_INTERVAL = 10  # no interval is printed over fewer prompts (graft/analysis/stats.py's docstring says why)
INTERVAL_METHOD = f"jackknife-t on the log ratio, n >= {MIN_N_FOR_INTERVAL}, all prompts stratified by category"
COLUMNS = ("m_tps", "b_tps", "m_decode", "m_tokens", "m_steps", "b_decode", "b_tokens")


def _total(weights, column):
    """Weighted sums over prompts (the last axis): `weights` (..., R, n) against `column` (..., 1, n)."""
    return (weights * column).sum(axis=-1)


def _speedup_wall(c: dict, w):
    return _total(w, c["m_tps"]) / _total(w, c["b_tps"])


def _speedup_decode(c: dict, w):
    base = _total(w, c["b_decode"]) / _total(w, c["b_tokens"])
    return base / (_total(w, c["m_decode"]) / _total(w, c["m_tokens"]))


def _tau(c: dict, w):
    return _total(w, c["m_tokens"]) / _total(w, c["m_steps"])


# each statistic of prompt weights: equal weights give the summary's figure (a mean is a sum over a count
# that cancels in the ratio); a jackknife replicate or a bootstrap resample is another set of weights
STATISTICS = {"speedup_wall": _speedup_wall, "speedup_decode": _speedup_decode, "tau": _tau}


def prompt_of(record: dict):
    """The prompt a record measured: its id, or for a later repeat (run.repeats) the id of its first pass."""
    return record.get("prompt_id") or record.get("id")


def paired_rows(records: list[dict]) -> dict[str, list[dict]]:
    """{method: one row per finished prompt}: its category and the totals the statistics read, the method's
    side (m_*) beside the baseline's (b_*). A comparison's baseline appears as method `ar`. Where the records
    hold repeats of their prompts (records with `repeat`, run.repeats > 1), a prompt's repeats make one row:
    tokens/s averaged over them, the other totals summed, so the statistics equal those of all records."""
    repeated = any(record.get("repeat") for record in records)
    rows: dict[str, dict] = {}
    for number, record in enumerate(records):
        # a single run's intervals are its method's alone; its own side is the baseline where it ran none (ar)
        comparison = "methods" in record
        sides = record_sides(record, record.get("_method") or "method", baseline="ar" if comparison else None)
        if not sides:
            continue
        key = (record.get("_run"), prompt_of(record)) if repeated else number
        base = record.get("baseline") or next(iter(sides.values()))
        b = base["totals"]
        for name, side in sides.items():
            m = side["totals"]
            row = rows.setdefault(name, {}).setdefault(key, {"category": record.get("category") or "-", "runs": 0})
            row["runs"] += 1
            for column, value in (
                ("m_tps", m["tokens_per_s"]),
                ("b_tps", b["tokens_per_s"]),
                ("m_decode", m["decode_s"]),
                ("m_tokens", m["step_tokens"]),
                ("m_steps", m["steps"]),
                ("b_decode", b["decode_s"]),
                ("b_tokens", b["step_tokens"]),
            ):
                row[column] = row.get(column, 0) + value
    out = {}
    for name, found in rows.items():
        out[name] = []
        for row in found.values():
            runs = row.pop("runs")
            row["m_tps"], row["b_tps"] = row["m_tps"] / runs, row["b_tps"] / runs
            out[name].append(row)
    return out


def _strata(categories) -> np.ndarray | None:
    """Category codes for a stratified jackknife: None for one category, or when a category has one prompt
    (its variance part cannot be estimated)."""
    names, codes = np.unique(np.asarray(categories, dtype=object).astype(str), return_inverse=True)
    if len(names) < 2 or np.bincount(codes).min() < 2:
        return None
    return codes


def jackknife_t(columns: dict, statistic, strata=None, confidence: float = CONFIDENCE):
    """(value, low, high), arrays over the leading axes of `columns` ({name: array (..., n)}, n prompts on
    the last axis): the statistic on all prompts and its t interval on the log scale, the standard error from
    the delete-one jackknife, within `strata` (category codes, each category at least two prompts) where
    given, and Satterthwaite's degrees of freedom. low and high are NaN where a replicate gives no finite
    positive value."""
    from scipy.stats import t as student

    n = next(iter(columns.values())).shape[-1]
    codes = np.zeros(n, dtype=int) if strata is None else np.asarray(strata)
    groups = int(codes.max()) + 1
    size = np.bincount(codes, minlength=groups)[codes].astype(float)  # each prompt's category size
    same = codes[:, None] == codes[None, :]
    # replicate i: prompt i left out, the rest of its category weighted up to keep the category's size
    weights = np.where(same, (size / (size - 1))[:, None], 1.0)
    np.fill_diagonal(weights, 0.0)
    data = {key: np.asarray(value, dtype=float)[..., None, :] for key, value in columns.items()}
    with np.errstate(divide="ignore", invalid="ignore"):
        value = statistic(data, np.ones((1, n)))[..., 0]
        logs = np.log(statistic(data, weights))  # (..., n)
        member = (codes[:, None] == np.arange(groups)[None, :]).astype(float)  # (n, groups)
        means = (logs @ member) / member.sum(axis=0)
        parts = ((size - 1) / size * (logs - means[..., codes]) ** 2) @ member  # each category's variance part
        se = np.sqrt(parts.sum(axis=-1))
        se = np.where(se < 1e-12, 0.0, se)  # identical prompts: no spread, whatever the rounding of the logs
        # Satterthwaite's degrees of freedom (n - 1 for one category; fewer where a few categories dominate)
        sizes = member.sum(axis=0)
        df = parts.sum(axis=-1) ** 2 / ((parts**2) / (sizes - 1)).sum(axis=-1)
        df = np.where(np.isfinite(df), np.minimum(df, n - groups), n - groups)
        q = student.ppf(0.5 + confidence / 2, df)
        low, high = value * np.exp(-q * se), value * np.exp(q * se)
        low, high = np.where(se == 0, value, low), np.where(se == 0, value, high)
    bad = ~(np.isfinite(low) & np.isfinite(high) & (value > 0))
    return value, np.where(bad, np.nan, low), np.where(bad, np.nan, high)


def _columns(rows: list[dict]) -> dict:
    return {c: np.asarray([r[c] for r in rows], dtype=float) for c in COLUMNS}


def interval(rows: list[dict], metric: str, stratify: bool = False) -> dict:
    """{"value", "low", "high", "n"} of `metric` over `rows`; low and high are None below MIN_N_FOR_INTERVAL
    prompts or where a replicate gives no finite value. `stratify`: within the rows' categories."""
    data = _columns(rows)
    statistic = STATISTICS[metric]
    with np.errstate(divide="ignore", invalid="ignore"):
        value = float(statistic({k: v[None, :] for k, v in data.items()}, np.ones((1, len(rows))))[0])
    out = {"value": value if np.isfinite(value) else None, "low": None, "high": None, "n": len(rows)}
    if len(rows) < MIN_N_FOR_INTERVAL or out["value"] is None:
        return out
    strata = _strata([r["category"] for r in rows]) if stratify else None
    _, low, high = jackknife_t(data, statistic, strata)
    if np.isfinite(low) and np.isfinite(high):
        out["low"], out["high"] = float(low), float(high)
    return out


def intervals(records: list[dict], categories: bool = True) -> dict[str, dict]:
    """{method: {"all": {metric: interval}, "categories": {category: {metric: interval}}}} of a run's records
    (without "categories" unless `categories`); "all" stratified by category."""
    result = {}
    for method, rows in paired_rows(records).items():
        result[method] = {"all": {metric: interval(rows, metric, stratify=True) for metric in METRICS}}
        if not categories:
            continue
        by_category: dict[str, list[dict]] = {}
        for row in rows:
            by_category.setdefault(row["category"], []).append(row)
        result[method]["categories"] = {
            category: {metric: interval(group, metric) for metric in METRICS}
            for category, group in sorted(by_category.items())
        }
    return result


def current(summary: dict) -> bool:
    """Whether summary.json's `intervals` were computed the way this module computes them (older runs
    recorded percentile-bootstrap intervals, printed at any n: those are recomputed, or left out)."""
    return isinstance(summary.get("intervals"), dict) and summary.get("interval_method") == INTERVAL_METHOD


def values_only(spread: dict) -> dict:
    """`spread` with every interval left out (the values and n kept)."""
    return {
        method: {
            "all": {m: {**e, "low": None, "high": None} for m, e in (found.get("all") or {}).items()},
            "categories": {
                c: {m: {**e, "low": None, "high": None} for m, e in metrics.items()}
                for c, metrics in (found.get("categories") or {}).items()
            },
        }
        for method, found in spread.items()
    }


def summary_intervals(summary: dict, records: list[dict], categories: bool = True) -> dict[str, dict]:
    """A run's intervals: summary.json's `intervals` where the run recorded them this way (current()), else
    computed from `records` (those of a single run named by its method)."""
    if current(summary):
        return summary["intervals"]
    if summary.get("kind") != "comparison":
        records = [{**r, "_method": r.get("_method") or summary.get("method") or "method"} for r in records]
    return intervals(records, categories)


def interval_entries(spread: dict[str, dict]):
    """(method, category, metric, interval) of every interval in `spread`, category "all" for the whole run."""
    for method, found in spread.items():
        for category, metrics in {"all": found.get("all") or {}, **(found.get("categories") or {})}.items():
            for metric, entry in metrics.items():
                yield method, category, metric, entry


def shown(entry: dict | None) -> bool:
    """Whether `entry` has an interval to print: bounds, over at least MIN_N_FOR_INTERVAL prompts (summaries
    written before this rule hold intervals over fewer)."""
    return bool(entry) and entry.get("low") is not None and (entry.get("n") or 0) >= MIN_N_FOR_INTERVAL


def format_interval(entry: dict | None, unit: str = "x", note_n: bool = False) -> str:
    """ "1.52x [1.41, 1.63]" (or "1.52x" without an interval, "-" without a value); `note_n`: "1.52x (n=4)"
    where the interval is left out for too few prompts."""
    if not entry or entry.get("value") is None:
        return "-"
    text = f"{entry['value']:.2f}{unit}"
    if shown(entry):
        text += f" [{entry['low']:.2f}, {entry['high']:.2f}]"
    elif note_n and entry.get("n") and entry["n"] < MIN_N_FOR_INTERVAL:
        text += f" (n={entry['n']})"
    return text


def ratio_interval(records: list[dict], method: str, over: str) -> dict:
    """{"value", "low", "high", "n"} of `method`'s speedup_wall over `over`'s on the prompts where both
    finished (records of one comparison run, or of several pooled): both share the baseline, so the ratio is
    the mean tokens/s of `method` / that of `over` over the same prompts, with its jackknife-t interval over
    prompts (None below MIN_N_FOR_INTERVAL prompts); stratified by run where the records of several runs
    carry `_run` (each dataset's size fixed). A prompt's repeats (run.repeats) are one prompt."""
    repeated = any(record.get("repeat") for record in records)
    pairs: dict = {}
    for number, record in enumerate(records):
        sides = record_sides(record) if "methods" in record else {}  # the methods of a comparison, and `ar`
        if method in sides and over in sides:
            key = (record.get("_run"), prompt_of(record)) if repeated else number
            pair = pairs.setdefault(key, [record.get("_run"), 0.0, 0.0, 0])
            pair[1] += sides[method]["totals"]["tokens_per_s"]
            pair[2] += sides[over]["totals"]["tokens_per_s"]
            pair[3] += 1
    found = list(pairs.values())
    data = {
        "m_tps": np.asarray([p[1] / p[3] for p in found], dtype=float),
        "b_tps": np.asarray([p[2] / p[3] for p in found], dtype=float),
    }
    with np.errstate(divide="ignore", invalid="ignore"):
        value = float(data["m_tps"].mean() / data["b_tps"].mean()) if found else float("nan")
    out = {"value": value if np.isfinite(value) else None, "low": None, "high": None, "n": len(found)}
    if len(found) < MIN_N_FOR_INTERVAL or out["value"] is None:
        return out
    _, low, high = jackknife_t(data, _speedup_wall, _strata([str(p[0]) for p in found]))
    if np.isfinite(low) and np.isfinite(high):
        out["low"], out["high"] = float(low), float(high)
    return out


# ---- coverage by simulation: `python -m graft.analysis.stats --coverage` prints it, tests/report/test_stats.py checks it ----

SPREAD = {"prompt": 0.1, "baseline": 0.05, "method": 0.3}  # sd of log tokens/s, as in results/cpu_embedded
CATEGORIES = ((1.3, 40.0),)  # (true speedup, baseline tokens/s) of each category simulated
FOUR_CATEGORIES = ((0.7, 30.0), (1.0, 40.0), (1.3, 50.0), (1.9, 60.0))


def simulate(rng, trials: int, n: int, categories=CATEGORIES, spread=SPREAD) -> tuple[dict, np.ndarray, float]:
    """`trials` runs of n prompts, tokens/s of a method and its baseline per prompt, lognormal: for a prompt
    of category h (n split evenly over `categories`, each (r_h, s_h)), log b = log s_h + p + e_b and
    log m = log(r_h s_h) + p + e_m, p ~ N(0, prompt^2) shared by both sides (a prompt fast or slow for
    either), e_b ~ N(0, baseline^2), e_m ~ N(0, method^2) (acceptance varies by prompt), each shifted by
    minus half its variance so that E[b] = s_h and E[m] = r_h s_h exactly. -> ({"m_tps", "b_tps": (trials,
    n)}, each prompt's category code, the truth): the ratio of expectations at these category sizes,
    sum_h n_h r_h s_h / sum_h n_h s_h, which speedup_wall (mean tokens/s over mean tokens/s) estimates."""
    codes = np.arange(n) % len(categories)
    ratio, speed = (np.asarray([c[i] for c in categories])[codes] for i in (0, 1))
    p, b, m = spread["prompt"], spread["baseline"], spread["method"]
    shared = rng.normal(0.0, p, (trials, n))
    base = speed * np.exp(shared + rng.normal(0.0, b, (trials, n)) - (p * p + b * b) / 2)
    method = ratio * speed * np.exp(shared + rng.normal(0.0, m, (trials, n)) - (p * p + m * m) / 2)
    truth = float((ratio * speed).sum() / speed.sum())
    return {"m_tps": method, "b_tps": base}, codes, truth


def percentile_bootstrap(columns: dict, statistic, rng, resamples: int = 1000, chunk: int = 50):
    """(low, high) over the leading axis of `columns` (trials, n): the 95% percentile bootstrap over prompts
    that this module printed before (resampled prompts as multinomial weights), for the comparison."""
    trials, n = next(iter(columns.values())).shape
    lows, highs = [], []
    for start in range(0, trials, chunk):
        part = {k: v[start : start + chunk, None, :] for k, v in columns.items()}
        weights = rng.multinomial(n, np.full(n, 1.0 / n), size=(len(part["m_tps"]), resamples))
        with np.errstate(divide="ignore", invalid="ignore"):
            values = statistic(part, weights)
        lows.append(np.quantile(values, (1 - CONFIDENCE) / 2, axis=-1))
        highs.append(np.quantile(values, (1 + CONFIDENCE) / 2, axis=-1))
    return np.concatenate(lows), np.concatenate(highs)


def coverage(n: int, method: str = "printed", trials: int = 400, seed: int = 0, categories=CATEGORIES):
    """Share of `trials` simulated runs of n prompts (simulate()) whose speedup_wall interval covers the true
    ratio; None where no interval is printed. method: "printed" (this module's: jackknife-t from
    MIN_N_FOR_INTERVAL prompts, stratified by category where there are several, as "all" is) or
    "percentile" (the bootstrap printed before, at any n >= 2, unstratified)."""
    rng = np.random.default_rng(seed)
    columns, codes, truth = simulate(rng, trials, n, categories)
    if method == "percentile":
        low, high = percentile_bootstrap(columns, _speedup_wall, rng)
    elif n < MIN_N_FOR_INTERVAL:
        return None
    else:
        _, low, high = jackknife_t(columns, _speedup_wall, _strata(codes) if len(categories) > 1 else None)
    return float(np.mean((low <= truth) & (truth <= high)))


def coverage_table(sizes=(2, 4, 8, 10, 16, 20, 40), trials: int = 2000) -> str:
    """Markdown: the simulated coverage of the nominal 95% speedup_wall interval by number of prompts."""
    lines = [
        f"Coverage of the nominal 95% speedup_wall interval, {trials} simulated runs per cell (graft/analysis/stats.py: "
        f"simulate; sd of log tokens/s: {SPREAD}); new intervals are printed from n = {MIN_N_FOR_INTERVAL}.",
        "",
        "| n | old: percentile bootstrap | new: jackknife-t | new, stratified over 4 categories |",
        "|---|---|---|---|",
    ]
    cell = lambda value: "not printed" if value is None else f"{value:.1%}"  # noqa: E731
    for n in sizes:
        old = coverage(n, "percentile", trials)
        new = coverage(n, "printed", trials)
        strata = coverage(n, "printed", trials, categories=FOUR_CATEGORIES) if n >= 2 * len(FOUR_CATEGORIES) else None
        lines.append(f"| {n} | {cell(old)} | {cell(new)} | {cell(strata)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m graft.analysis.stats", description=__doc__)
    parser.add_argument("--coverage", action="store_true", help="print the simulated coverage by number of prompts")
    parser.add_argument("--trials", type=int, default=2000)
    args = parser.parse_args()
    if args.trials < 1:
        parser.exit(2, f"error: --trials {args.trials} is not allowed; expected an integer >= 1\n")
    if args.coverage:
        print(coverage_table(trials=args.trials))
    else:
        parser.print_help()
