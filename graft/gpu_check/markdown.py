"""The device check's report as Markdown tables, from its JSON alone (no torch, so it renders anywhere):

    python -m graft.gpu_check.markdown results/gpu/gpu_check.json   # writes results/gpu/report.md

Parts that were skipped or failed show their reason in the parts table and have no section of their own."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(header: list, rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows] + [""]


def by_columns(rows: dict[str, dict], first: str) -> list[str]:
    """{row: {column: value}} as a table, the columns in the order the first row gives them."""
    columns = list(next(iter(rows.values()), {}))
    return table([first, *columns], [[name, *(row.get(c) for c in columns)] for name, row in rows.items()])


def note_of(part: dict) -> str:
    result = part.get("result", {})
    notes = [part.get("reason"), part.get("error"), result.get("truncated"), result.get("reduced_layers")]
    return "; ".join(n for n in notes if n)[:300]


def header(report: dict, env: dict) -> list[str]:
    state = "finished" if report.get("finished") else "killed before its last save"
    if report.get("interrupted"):
        state = "stopped by SIGTERM (the time limit)"
    smi = env.get("nvidia_smi") or {}
    return [
        f"# Device check: {env.get('device_name') or report.get('device')}",
        "",
        f"`python -m graft.gpu_check {' '.join(report.get('argv', []))}`, started {report.get('started_utc')}, "
        f"{report.get('elapsed_s')} s of a {report.get('budget_s')} s budget, {state}. "
        "Random weights: acceptance and tau mean nothing; timings, memory and token equality count. "
        "Generated from gpu_check.json by `python -m graft.gpu_check.markdown`.",
        "",
        *table(
            ["GPU", "memory GiB", "driver", "torch", "CUDA", "transformers", "Python"],
            [
                [
                    env.get("device_name"),
                    env.get("memory_total_gib"),
                    smi.get("driver_version"),
                    env.get("torch"),
                    env.get("torch_cuda"),
                    env.get("packages", {}).get("transformers"),
                    env.get("python"),
                ]
            ],
        ),
    ]


def lossless(out: dict) -> list[str]:
    if not out.get("models"):
        return []
    rows = []
    for model, dtypes in out["models"].items():
        for dtype, methods in dtypes.items():
            divergent = [d for row in methods.values() for d in row["divergent"]]
            equal, checked = (sum(r[k] for r in methods.values()) for k in ("equal", "checked"))
            ties = sum(bool(d["float_tie"]) for d in divergent)
            errors = ", ".join(m for m, r in methods.items() if "error" in r) or None
            rows.append([model, dtype, f"{equal} / {checked}", f"{len(divergent)} ({ties} float ties)", errors])
    header = ["model", "dtype", "equal / checked", "divergences", "errors"]
    return ["## Lossless against the baseline (part 2)", "", *table(header, rows)]


def per_method(timings: dict, key: str) -> dict[str, dict]:
    """{timing_x: {method: row}} as {method: {timing_x: row[key]}}."""
    timings = {t: rows for t, rows in timings.items() if t.startswith("timing_")}
    methods = dict.fromkeys(m for rows in timings.values() for m in rows)
    return {m: {t: rows.get(m, {}).get(key) for t, rows in timings.items()} for m in methods}


def host_syncs(out: dict) -> list[str]:
    rows = per_method(out, "syncs_per_step")
    return ["## Host syncs per decode step (part 3)", "", *by_columns(rows, "method")] if rows else []


def dense(out: dict) -> list[str]:
    if not out.get("verify"):
        return []
    verify = {c: {n: r["median_ms"] for n, r in rows.items()} for c, rows in out["verify"].items()}
    lines = ["## LLaMA-3.1-8B-shaped target (part 4): verify median ms by context and tree nodes", ""]
    lines += by_columns(verify, "context")
    overhead = per_method(out.get("decode", {}), "overhead_ms_per_step")
    if overhead:
        lines += [
            "Loop overhead per step, ms (step time less the verify forwards):",
            "",
            *by_columns(overhead, "method"),
        ]
    extend = out.get("extend", {})
    if "head_extend_ms" in extend:
        lines += [
            f"Head extend over {extend['prompt_tokens']} tokens: {cell(extend['head_extend_ms'])} ms, "
            f"peak {cell(extend.get('head_extend_peak_gib'))} GiB.",
            "",
        ]
    return lines


def moe(out: dict) -> list[str]:
    if not out.get("verify"):
        return []
    rows = {
        n: {"verify median ms": r["median_ms"], "experts touched per layer": r.get("experts_touched_per_layer")}
        for n, r in out["verify"].items()
    }
    return ["## Qwen3-235B-A22B-shaped MoE layers (part 5)", "", *by_columns(rows, "tree nodes")]


def compiled(out: dict) -> list[str]:
    if not out.get("methods"):
        return []
    lines = [f"## Compiled path (part 7: {out.get('mode')}, {out.get('backend')})", ""]
    lines += table(
        ["method", "equal / checked", "seconds per prompt", "error"],
        [
            [m, f"{r['equal']} / {r['checked']}", ", ".join(map(str, r["seconds"])), r.get("error")]
            for m, r in out["methods"].items()
        ],
    )
    verify = out.get("verify", {})
    if "eager_over_compiled" in verify:
        rows = {
            n: {
                "eager ms": verify["eager"][n]["median_ms"],
                "compiled ms": verify["compiled"][n]["median_ms"],
                "eager / compiled": ratio,
            }
            for n, ratio in verify["eager_over_compiled"].items()
        }
        lines += by_columns(rows, "tree nodes")
    return lines


def render(report: dict) -> str:
    parts = report.get("parts", {})
    result = {k: p.get("result", {}) for k, p in parts.items()}  # a part cut short keeps what it measured
    rows = [[k, p["name"], p["status"], p.get("seconds"), p.get("budget_s"), note_of(p)] for k, p in parts.items()]
    lines = header(report, result.get("1", {}))
    lines += ["## Parts", "", *table(["part", "name", "status", "seconds", "budget s", "note"], rows)]
    lines += lossless(result.get("2", {})) + host_syncs(result.get("3", {})) + dense(result.get("4", {}))
    lines += moe(result.get("5", {}))
    if "6" in parts:
        lines += [f"235B-shaped SpecForge head loads and runs (part 6): {cell(parts['6']['status'] == 'ok')}.", ""]
    lines += compiled(result.get("7", {}))
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graft.gpu_check.markdown", description=__doc__)
    parser.add_argument("report", type=Path, help="the check's JSON report")
    parser.add_argument("--out", type=Path, help="default: report.md beside the JSON")
    args = parser.parse_args(argv)
    out = args.out or args.report.with_name("report.md")
    out.write_text(render(json.loads(args.report.read_text())))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
