"""Rewrite the generated tables of results/README.md, and the table files (tables.md, tables.tex, rows.csv,
categories.csv) of every folder beside it, from the committed records, so that no number there is typed by hand
and none trails the code. A folder's tables.md names on its first line the `tables` command that wrote it; that
command is run again. A generated block is

    <!-- generated: <kind> <paths ...> -->
    ...
    <!-- /generated -->

and its kind says what renders it:
- `tables <run or sweep dirs>`: the paper-shaped (or sweep) tables of `python -m graft.report tables`;
- `categories <run or sweep dirs>`: their per-category tables with 95% bootstrap intervals (`tables --by category`);
- `forward_profile <json>`: the verify-time table of `python -m graft.costmodel forward`'s JSON;
- `lossless <json ...>`: the per-method counts of `python -m graft.report check-lossless`'s JSONs;
- `side_by_side <json ...>`: graft/bench/e2e.py's tokens/s tables, side by side;
- `step_split <json>`: where a step's time goes (tau, draft / verify / other ms per step) in one of them;
- `ab_native <json>`: graft/bench/native_ab.py's verify times, the --ref build against this checkout's.

    python -m graft.report render [results/README.md]           # rewrite the blocks
    python -m graft.report render --check [results/README.md]   # exit 1 if a block is stale
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: block paths are relative to it

BLOCK = re.compile(r"(<!-- generated: (?P<spec>[^\n]*?) -->\n)(?P<body>.*?)(<!-- /generated -->)", re.S)


def forward_profile(path: str) -> str:
    profile = json.loads((ROOT / path).read_text())
    paths = profile["paths"]
    names = list(paths)
    sizes = sorted({int(k) for p in paths.values() for k in p["verify_ms"]})
    spread = profile.get("bandwidth_range_gbs")
    sampled = f" (median of samples between the rounds, {spread[0]:.1f}-{spread[1]:.1f})" if spread else ""
    lines = [
        f"Verify time in ms for k tokens (k = 1 is the decode step); {profile['model']}, {profile['threads']} threads, "
        f"context {profile['context_tokens']} tokens; streaming read bandwidth {profile['bandwidth_gbs']:.1f} GB/s{sampled}, so "
        f"reading the {profile['weight_bytes'] / 1e6:.0f} MB of fp32 weights once takes {profile['bandwidth_limit_ms']:.1f} ms.",
        "",
        "| tokens | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    lines += [f"| {k} | " + " | ".join(f"{paths[n]['verify_ms'][str(k)]:.1f}" for n in names) + " |" for k in sizes]
    lines.append("")
    for name in names:
        p = paths[name]
        limit = p.get("bandwidth_limit_ms", profile["bandwidth_limit_ms"])
        ratio8, ratio16 = (
            p["verify_ms"][k] / p["decode_ms"] if k in p["verify_ms"] else float("nan") for k in ("8", "16")
        )
        lines.append(
            f"- `{name}` ({p['dtype'].replace('torch.', '')}{', bfloat16 product weights' if name.startswith('packed_bf16') else ''}): decode {p['decode_ms']:.1f} ms = {p['decode_ms'] / limit:.2f}x "
            f"its bandwidth limit ({limit:.1f} ms); verify(8) = {ratio8:.2f}x, verify(16) = {ratio16:.2f}x decode"
        )
        if "roofline_ms" in p:  # profiles since the compute roof was measured
            lines.append(
                f"  - against its roofline (the slower of that limit and the products' FMAs at "
                f"{profile['fma_rate_gfmas']:.0f} G FMA/s): "
                + ", ".join(
                    f"verify({k}) {p['verify_ms'][k] / p['roofline_ms'][k]:.2f}x ({p['roofline_ms'][k]:.1f} ms)"
                    for k in ("1", "8", "16", "60")
                    if k in p["roofline_ms"]
                )
            )
    levels = profile.get("head_level_ms")
    if levels:
        decode = paths[profile["fast_path"]]["decode_ms"]
        for dtype in ("float32", "bfloat16"):
            if dtype in levels:
                lines.append(
                    f"- EAGLE head, one draft level of {levels['nodes']} nodes ({dtype} head): {levels[dtype]:.2f} ms "
                    f"= 1/{decode / levels[dtype]:.1f} of a `{profile['fast_path']}` decode step"
                )
        if "head_level_compute_limit_ms" in profile:
            lines.append(
                f"  - its products' compute limit: {profile['head_level_compute_limit_ms']:.2f} ms "
                f"({profile['head_level_fmas_per_node'] / 1e6:.2f} M FMAs a node at {profile['fma_rate_gfmas']:.0f} G FMA/s)"
            )
        if profile.get("head_level_dot_limit_ms"):  # AVX512-BF16: the bfloat16 head on the dot panels
            lines.append(
                f"  - a bfloat16 head's products at the bfloat16 dot rate ({profile['dot_rate_gmacs']:.0f} G MAC/s, "
                f"vdpbf16ps): {profile['head_level_dot_limit_ms']:.2f} ms"
            )
    return "\n".join(lines)


def lossless(*paths: str) -> str:
    columns, methods = {}, []
    for path in paths:
        record = json.loads((ROOT / path).read_text())
        for dataset, by_method in record["datasets"].items():
            columns[f"{dataset} ({record['max_new_tokens']} tokens)"] = by_method
            methods += [m for m in by_method if m not in methods]
    lines = ["| method | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for method in methods:
        cells = []
        for by_method in columns.values():
            c = by_method.get(method)
            if c is None:
                cells.append("-")
                continue
            cell = f"{c['equal']}/{c['prompts']} equal"
            if c.get("float_tie"):
                cell += f", {c['float_tie']} float tie"
            if c.get("divergent"):
                cell += f", **{len(c['divergent'])} divergent**"
            cells.append(cell)
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


OWN_AR = {"/bf16": "ar/bf16"}  # a system on bench_e2e's packed_bf16 target -> that target's AR


def own_ar(system: str) -> str | None:
    """The AR run on the same float target as `system` where that is not the default one (bench_e2e's VARIANTS)."""
    if system.startswith("hf_"):
        return None
    return next((ar for suffix, ar in OWN_AR.items() if system.endswith(suffix) and system != ar), None)


def x_own_ar(run: dict, system: str) -> float | None:
    """Median over the rounds of the system's tokens/s over its own target's AR's, from the per-prompt records."""
    base = own_ar(system)
    if base is None or not any(base in record for record in run["records"]):
        return None
    ratios = []
    for round_ in sorted({record.get("round", 0) for record in run["records"]}):
        taken = [record for record in run["records"] if record.get("round", 0) == round_]
        rate = {s: sum(r[s]["n"] for r in taken) / sum(r[s]["seconds"] for r in taken) for s in (system, base)}
        ratios.append(rate[system] / rate[base])
    return statistics.median(ratios)


def side_by_side(*paths: str) -> str:
    """graft/bench/e2e.py's tables, one column group per JSON (before / after); where a run has systems on a
    second float target (packed_bf16), a column of their ratio to that target's own AR."""
    runs = [json.loads((ROOT / p).read_text()) for p in paths]
    systems = []
    for run in runs:
        systems += [row["system"] for row in run["table"] if row["system"] not in systems]
    own = [any(x_own_ar(run, s) is not None for s in systems) for run in runs]
    header = "| system | " + " | ".join(
        f"tokens/s ({Path(p).stem}) | x HF | x AR" + (" | x its AR" if o else "") for p, o in zip(paths, own)
    )
    lines = [header + " |", "|---|" + "".join("---|---|---|" + ("---|" if o else "") for o in own)]
    for system in systems:
        cells = []
        for run, with_own in zip(runs, own):
            row = next((r for r in run["table"] if r["system"] == system), None)
            if row is None:
                cells.append("- | - | -" + (" | -" if with_own else ""))
                continue
            mark = "" if row["equal"] in (True, None) else " (**not equal to its baseline**)"
            ratios = " | ".join(f"{row[k]:.2f}" if k in row else "-" for k in ("x_hf", "x_ar"))
            if "x_ar_range" in row:  # several rounds: medians, and x AR's range over the rounds
                ratios += " ({:.2f}-{:.2f})".format(*row["x_ar_range"])
            if with_own:
                ratio = x_own_ar(run, system)
                ratios += f" | {ratio:.2f}" if ratio is not None else " | -"
            cells.append(f"{row['tokens_per_s']:.1f}{mark} | {ratios}")
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def step_split(path: str) -> str:
    """Where a step's time goes in one graft/bench/e2e.py JSON (systems of this project; runs recorded
    since the per-phase times were added)."""
    run = json.loads((ROOT / path).read_text())
    ratio = run.get("tau_for")  # bench_e2e --tau-for: the tau each system would need for that ratio to its AR
    needed = f" tau for {ratio:g}x its AR |" if ratio else ""
    lines = [
        f"| system | tau | draft ms | verify ms | other ms | ms per token |{needed}",
        "|---|---|---|---|---|---|" + ("---|" if ratio else ""),
    ]
    for row in run["table"]:
        if "tau" in row:
            lines.append(
                f"| {row['system']} | {row['tau']:.2f} | {row['draft_ms']:.2f} | {row['verify_ms']:.2f} | "
                f"{row['other_ms']:.2f} | {row['ms_per_token']:.2f} |"
                + ((f" {row['tau_needed']:.2f} |" if "tau_needed" in row else " - |") if ratio else "")
            )
    return "\n".join(lines)


def ab_native(path: str) -> str:
    """graft/bench/native_ab.py's JSON: verify ms for k tokens per context, the --ref build -> this checkout's."""
    report = json.loads((ROOT / path).read_text())
    tokens = list(next(iter(report["contexts"].values())))
    label = {"1": "1 (decode)"}
    lines = [
        "| context | " + " | ".join(label.get(k, k) for k in tokens) + " |",
        "|---|" + "---|" * len(tokens),
    ]
    for context, row in report["contexts"].items():
        cells = [f"{row[k]['old']:.2f} -> {row[k]['new']:.2f}" for k in tokens]
        lines.append(f"| {int(context):,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def tables(*args: str) -> str:
    """graft/report/tables.py's tables of the run folders; a leading `metric=<name>` picks the ratio (speedup_wall by default)."""
    from graft.report.tables import build

    metric = "speedup_wall"
    if args and args[0].startswith("metric="):
        metric, args = args[0].removeprefix("metric="), args[1:]
    markdown, _, _ = build([str(ROOT / p) for p in args], metric)
    return markdown.strip()


def categories(*args: str) -> str:
    """graft/report/tables.py's per-category tables (95% bootstrap intervals) of the run folders; a leading
    `metric=<name>` picks the ratio."""
    from graft.report.tables import category_tables

    metric = "speedup_wall"
    if args and args[0].startswith("metric="):
        metric, args = args[0].removeprefix("metric="), args[1:]
    markdown, _, _ = category_tables([str(ROOT / p) for p in args], metric)
    return markdown.strip()


RENDERERS = {
    "categories": categories,
    "ab_native": ab_native,
    "tables": tables,
    "forward_profile": forward_profile,
    "lossless": lossless,
    "side_by_side": side_by_side,
    "step_split": step_split,
}


OPEN, CLOSE = "<!-- generated:", "<!-- /generated -->"


def render(text: str, name: str = "README") -> str:
    """`text` with every generated block rewritten; a block that is never closed, of an unknown kind, or
    whose records cannot be read is a RecordError naming its line."""
    from graft.records.reader import RecordError

    inside = None  # where the block being read opened
    for marker in re.finditer(f"(?m)^(?:{re.escape(OPEN)}|{re.escape(CLOSE)})", text):
        line = text.count("\n", 0, marker.start()) + 1
        if marker.group() == OPEN and inside is not None:
            raise RecordError(f"{name}:{inside}: generated block is never closed with {CLOSE}")
        if marker.group() == CLOSE and inside is None:
            raise RecordError(f"{name}:{line}: {CLOSE} without a generated block before it")
        inside = line if marker.group() == OPEN else None
    if inside is not None:
        raise RecordError(f"{name}:{inside}: generated block is never closed with {CLOSE}")

    def one(match: re.Match) -> str:
        kind, *args = match.group("spec").split() or [""]
        where = f"{name}:{text.count(chr(10), 0, match.start()) + 1}"
        if kind not in RENDERERS:
            raise RecordError(f"{where}: unknown generated block kind {kind!r}; known: {', '.join(RENDERERS)}")
        try:
            body = RENDERERS[kind](*args)
        except (OSError, KeyError, ValueError, TypeError) as err:
            detail = err if isinstance(err, RecordError) else f"{type(err).__name__}: {err}"
            raise RecordError(f"{where}: block '{match.group('spec')}': {detail}") from None
        return f"{match.group(1)}{body}\n{match.group(4)}"

    return BLOCK.sub(one, text)


WRITTEN_BY = re.compile(r"<!-- (python -m graft\.report tables .*) --out <this folder> -->\n")
TABLE_FILES = ("tables.md", "tables.tex", "rows.csv", "categories.csv")


def table_folders(readme: Path) -> dict[Path, str]:
    """The folders beside `readme` whose tables.md names the command that wrote it (graft/report/tables.py's first
    line), with that command."""
    found = {}
    for tables_md in sorted(readme.parent.glob("*/tables.md")):
        match = WRITTEN_BY.match(tables_md.read_text())
        if match:
            found[tables_md.parent] = match.group(1)
    return found


def write_tables(command: str, out: Path) -> None:
    """Run a folder's `python -m graft.report tables ...` again into `out`, its paths read from the repository root."""
    import contextlib
    import io
    import shlex

    from graft.report.tables import main as tables_main

    words = shlex.split(command)[4:]
    words = [str(ROOT / w) if not w.startswith("-") and (ROOT / w).exists() else w for w in words]
    with contextlib.redirect_stdout(io.StringIO()):
        tables_main([*words, "--out", str(out)])


def stale_tables(folder: Path, command: str) -> list[str]:
    """The table files of `folder` that differ from what its command writes today from its records."""
    import tempfile

    with tempfile.TemporaryDirectory() as fresh:
        write_tables(command, Path(fresh))
        return [
            name
            for name in TABLE_FILES
            if (folder / name).exists() != (Path(fresh) / name).exists()
            or ((folder / name).exists() and (folder / name).read_bytes() != (Path(fresh) / name).read_bytes())
        ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m graft.report render", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("readme", nargs="?", type=Path, default=ROOT / "results" / "README.md")
    parser.add_argument("--check", action="store_true", help="exit 1 if a block differs from its records")
    args = parser.parse_args(argv)
    text = args.readme.read_text()
    fresh = render(text, str(args.readme))
    blocks = len(BLOCK.findall(text))
    folders = table_folders(args.readme)
    if args.check:
        stale = [f"{folder}/{name}" for folder, command in folders.items() for name in stale_tables(folder, command)]
        stale += [f"{args.readme} (its generated blocks)"] if fresh != text else []
        if stale:
            raise SystemExit(
                f"stale, not what the records give today: {', '.join(stale)}; run python -m graft.report render"
            )
        print(f"{args.readme}: {blocks} generated blocks and the tables of {len(folders)} folders match their records")
        return
    args.readme.write_text(fresh)
    for folder, command in folders.items():
        write_tables(command, folder)
    print(f"{args.readme}: rewrote {blocks} generated blocks and the tables of {len(folders)} folders")


if __name__ == "__main__":
    main()
