"""Docs that cannot rot: every repository path that README.md, results/README.md and docs/ name exists (or, named
at a revision as `REV:path`, existed there), and every `python -m` command they name answers `--help`.

What is not a repository path: a placeholder (`<name>`, `*`, `{a,b}`), what a command writes (after `--out`,
`out_dir=`, `->`, `export SOURCE`), another project's file (after its `owner/name`), and the two files the README's "add a method"
walk-through has the reader create."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from conftest import ROOT

DOCS = [ROOT / "README.md", ROOT / "results" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# a path starts at a top-level folder the repository tracks (not outputs/ or multirun/, which runs write) or is one
# of its top-level files
TRACKED = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
TOP = sorted({name.split("/")[0] for name in TRACKED if "/" in name})
PATH = re.compile(
    r"(?<![\w./:^-])(?:(?P<rev>[0-9a-f]{7,40}\^?):)?(?P<path>(?:%s)/[\w./<>*{}=,@-]*|README\.md|Makefile|run\.py|"
    r"pyproject\.toml)" % "|".join(map(re.escape, TOP))
)
WRITTEN = re.compile(r"(--out\s+|out_dir=|->\s*|export\s+(--\S+\s+)*\S+\s+)$")  # precedes a path a command writes
OTHER_PROJECT = re.compile(r"[\w-]+/[\w.-]+ `$")  # "sgl-project/SpecForge `configs/...`"
WALK_THROUGH = {"graft/methods/last_seen.py", "configs/method/graft_last_seen.yaml"}  # README: add a method
COMMAND = re.compile(r"python -m (graft(?:\.\w+)+)((?: [a-z][a-z0-9-]*)?)")


def named_paths(docs):
    """(doc, line number, revision or None, path) of every repository path `docs` name."""
    for doc in docs:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for match in PATH.finditer(line):
                path = match["path"].rstrip(".,:;)")
                before = line[: match.start()]
                if re.search(r"[<>*{}]", path) or WRITTEN.search(before) or OTHER_PROJECT.search(before):
                    continue
                if path not in WALK_THROUGH:
                    yield doc, number, match["rev"], path


def dangling(docs) -> tuple[int, list[str]]:
    """How many paths `docs` name, and "doc:line: path" of those that do not exist (at their revision, for
    `REV:path`; those are skipped in a shallow clone, which lacks the history)."""
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True)
    history = shallow.returncode == 0 and shallow.stdout.strip() == "false"
    found, missing = 0, []
    for doc, number, rev, path in named_paths(docs):
        found += 1
        if rev is None:
            ok = (ROOT / path).exists() or (doc.parent / path).exists()
        elif history:  # a record results/ no longer holds, named where git keeps it
            ok = (
                subprocess.run(["git", "cat-file", "-e", f"{rev}:{path}"], cwd=ROOT, capture_output=True).returncode
                == 0
            )
        else:
            continue
        if not ok:
            where = doc.relative_to(ROOT) if doc.is_relative_to(ROOT) else doc.name
            missing.append(f"{where}:{number}: {rev + ':' if rev else ''}{path}")
    return found, missing


def test_every_path_the_docs_name_exists():
    found, missing = dangling(DOCS)
    assert found > 100  # the scan reads the docs at all
    assert not missing, "\n".join(missing)


def test_the_scan_catches_a_dangling_path(tmp_path):
    """Negative control: a file that is not there, a record at a revision that never held it; not what a command
    writes."""
    doc = tmp_path / "bad.md"
    doc.write_text(
        "`graft/no_such_module.py`, `c205136^:results/no_such.json`, `--out results/x.json`, `graft/ops.py`\n"
    )
    found, missing = dangling([doc])
    assert found == 3
    assert missing == ["bad.md:1: graft/no_such_module.py", "bad.md:1: c205136^:results/no_such.json"]


def named_commands() -> list[list[str]]:
    """Each distinct `python -m graft.<module> [subcommand]` the docs name, as argv after `-m`."""
    commands = set()
    for doc in DOCS:
        for match in COMMAND.finditer(doc.read_text()):
            commands.add((match[1], *match[2].split()))
    return sorted(list(c) for c in commands)


@pytest.mark.slow
def test_every_command_the_docs_name_answers_help(tmp_path):
    """Each command's `--help`, in one driver start-up (tests/bad_inputs.py); with it, as the negative control, a
    subcommand no tool has, which must fail."""
    commands = named_commands()
    assert ["graft.report", "tables"] in commands and ["graft.analysis.stats"] in commands
    commands.append(["graft.report", "no-such-command"])
    cases = [{"id": " ".join(c), "tool": f"module:{c[0]}", "args": [*c[1:], "--help"]} for c in commands]
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "bad_inputs.py"), str(tmp_path / "cases.json"), str(tmp_path / "r.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "r.json").read_text())
    answered = {name for name, r in results.items() if r["code"] == 0 and r["stdout"].strip()}  # its help, exit 0
    assert set(results) - answered == {"graft.report no-such-command"}, json.dumps(results, indent=1)[-3000:]
