"""The device check's report as Markdown tables, from its JSON alone (no torch, so it renders anywhere):

    python -m graft.gpu_check.markdown results/gpu/gpu_check.json   # writes results/gpu/report.md

Parts that were skipped or failed show their reason in the parts table and have no section of their own."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from graft.gpu_check.goals import goal_rows


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
    decode = result.get("decode", {})
    notes = [part.get("reason"), part.get("error"), result.get("truncated"), result.get("reduced_layers")]
    notes += [decode.get("truncated") if isinstance(decode, dict) else None]
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


def per_method(settings: dict, key: str, prefix: str) -> dict[str, dict]:
    """{setting: {method: row}} (settings named `prefix`...) as {method: {setting: row[key]}}."""
    settings = {t: rows for t, rows in settings.items() if t.startswith(prefix)}
    methods = dict.fromkeys(m for rows in settings.values() for m in rows)
    return {m: {t: rows.get(m, {}).get(key) for t, rows in settings.items()} for m in methods}


def host_syncs(out: dict) -> list[str]:
    dispatcher = out.get("dispatcher", {})
    if not dispatcher:
        return []
    rows = {
        setting: {m: f"{r.get('mean')} / {r.get('max')}" for m, r in methods.items()}
        for setting, methods in dispatcher.items()
    }
    lines = ["## Host syncs per decode step (part 3), counted at the dispatcher: mean / worst step", ""]
    lines += by_columns(rows, "model, sampling")
    debug = {
        s: {m: r.get("syncs_per_step") for m, r in methods.items()} for s, methods in out.get("debug_mode", {}).items()
    }
    if debug:
        lines += ["Under torch.cuda.set_sync_debug_mode (per step):", "", *by_columns(debug, "model, sampling")]
    return lines


def goals(parts: dict, device: str = "cuda") -> list[str]:
    rows = [[r["figure"], r["value"], r["goal"], r["result"], r["note"]] for r in goal_rows(parts, device)]
    return ["## Goals (docs/gpu.md)", "", *table(["figure", "value", "goal", "result", "note"], rows)]


def dense(out: dict) -> list[str]:
    if not out.get("verify"):
        return []
    verify = {c: {n: r["median_ms"] for n, r in rows.items()} for c, rows in out["verify"].items()}
    lines = ["## LLaMA-3.1-8B-shaped target (part 4): verify median ms by context and tree nodes", ""]
    lines += by_columns(verify, "context")
    bound = out.get("bound", {})
    if bound:
        lines += [
            f"Weights {bound.get('weight_bytes', 0) / 1e9:.2f} GB; HBM bound {cell(bound.get('hbm_bound_ms'))} ms "
            f"at {cell(bound.get('hbm_gbs'))} GB/s ({bound.get('gpu') or out.get('arch', {}).get('device', 'no GPU')}: "
            f"{bound.get('source')}).",
            "",
        ]
    over = out.get("ratios", {}).get("verify_over_decode")
    if over:
        lines += ["verify(N) / decode:", "", *by_columns(over, "context")]
    decode = out.get("decode", {})
    for key, title in (("step_ms", "whole step ms"), ("overhead_ms_per_step", "loop overhead per step, ms")):
        rows = per_method(decode, key, "temperature_")
        if rows:
            clock = f"clock {decode.get('clock')}, fixed-size trees {cell(decode.get('fixed_size_trees'))}"
            lines += [f"Decode loops, {title} ({clock}):", "", *by_columns(rows, "method")]
    prune = out.get("prune_verify", {})
    if prune:
        over = out.get("ratios", {}).get("prune_verify_over_60", {})
        rows = {n: {"verify median ms": r["median_ms"], "/ verify(60)": over.get(n)} for n, r in prune.items()}
        lines += ["Pruning's kept sizes (verify of a tree cut to N nodes):", "", *by_columns(rows, "kept nodes")]
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
    ratios = out.get("ratios", {})
    measured, bound = ratios.get("verify_over_decode", {}), ratios.get("bytes_over_decode_bytes", {})
    rows = {
        n: {
            "verify median ms": r["median_ms"],
            "experts touched per layer": r.get("experts_touched_per_layer"),
            "verify / decode": measured.get(n),
            "bytes / decode bytes": bound.get(n),
        }
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
    timed = out.get("timed")
    if timed:
        lines += [
            f"After every prompt ran once: {timed['graphs']} graphs compiled and {timed['recordings']} CUDA graphs "
            "recorded in the reruns; in the slice's timed verifies: "
            f"{cell(out.get('verify', {}).get('timed_counts'))}.",
            "",
        ]
    return lines


def sampled(out: dict) -> list[str]:
    if not out.get("methods"):
        return []
    rows = [[m, r.get("draws"), r.get("p_value"), r.get("lossless"), r.get("error")] for m, r in out["methods"].items()]
    title = f"## Lossless when sampling (part 8: {out.get('model')}, temperature 1, top-p {out.get('top_p')})"
    return [title, "", *table(["method", "draws", "chi-square p", "lossless", "error"], rows)]


def batched(out: dict) -> list[str]:
    if not out.get("methods"):
        return []
    ar = out.get("ar_batch1", {})
    rows = {
        m: {
            "syncs mean / worst step": f"{r.get('mean')} / {r.get('max')}",
            "debug mode worst step": r.get("debug_mode_max"),
            "leave / join rounds: worst excess": r.get("leave_join_excess_max"),
            "equal / checked": f"{r['lossless']['equal']} / {r['lossless']['checked']}" if "lossless" in r else None,
            "tokens/s": r.get("tokens_per_s"),
            "/ batch-1 AR": r.get("tokens_per_s_over_ar_batch1"),
            "error": r.get("error"),
        }
        for m, r in out["methods"].items()
    }
    title = (
        f"## Batch of {out.get('batch_size')} (part 9: {out.get('model')}, {out.get('dtype')}, {out.get('prompts')} "
        f"prompts, {out.get('max_new_tokens')} new tokens, greedy)"
    )
    note = f"Batch-1 AR on the same prompts: {cell(ar.get('tokens_per_s'))} tokens/s."
    return [title, "", *by_columns(rows, "method"), note, ""]


def render(report: dict) -> str:
    parts = report.get("parts", {})
    result = {k: p.get("result", {}) for k, p in parts.items()}  # a part cut short keeps what it measured
    rows = [[k, p["name"], p["status"], p.get("seconds"), p.get("budget_s"), note_of(p)] for k, p in parts.items()]
    lines = header(report, result.get("1", {}))
    lines += goals(parts, report.get("device", "cuda"))
    lines += ["## Parts", "", *table(["part", "name", "status", "seconds", "budget s", "note"], rows)]
    lines += lossless(result.get("2", {})) + host_syncs(result.get("3", {})) + dense(result.get("4", {}))
    lines += moe(result.get("5", {}))
    if "6" in parts:
        lines += [f"235B-shaped SpecForge head loads and runs (part 6): {cell(parts['6']['status'] == 'ok')}.", ""]
    lines += compiled(result.get("7", {})) + sampled(result.get("8", {})) + batched(result.get("9", {}))
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
