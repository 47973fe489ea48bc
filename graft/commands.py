"""The subcommand picker shared by the package's `python -m graft.<tool> <command>` entry points."""

from __future__ import annotations

import sys


def pick(doc: str, commands: dict[str, tuple], argv: list[str] | None) -> tuple[str, list[str]]:
    """(command, its arguments) from argv; `commands` maps a name to (module, what it does, ...). A bare call
    prints the usage to stderr and exits 2, --help to stdout and exits 0, an unknown name exits naming the known."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        width = max(map(len, commands))
        listing = [f"  {name:<{width}}  {entry[1]}" for name, entry in commands.items()]
        print("\n".join([doc.strip(), "", "commands:", *listing]), file=sys.stdout if argv else sys.stderr)
        sys.exit(0 if argv else 2)
    if argv[0] not in commands:
        sys.exit(f"unknown command {argv[0]!r}; commands: {', '.join(commands)}")
    return argv[0], argv[1:]
