"""What the package's commands share: the subcommand picker of `python -m graft.<tool> <command>`, and the one
rule for bad input: a config or file mistake is one line on stderr, `error: ...`, and exit status 2, with no
traceback (run.py, graft/run/cli.py, and every `python -m graft.<tool>`); anything else is a bug and keeps its
traceback."""

from __future__ import annotations

import functools
import sys

# the exceptions that mean bad input, by the module that defines them: looked up in sys.modules, so that
# checking an error imports nothing (an error of a module never imported cannot have been raised)
USER_ERRORS = {
    "graft.schema": ("ConfigError",),
    "graft.data.prompt": ("DatasetError",),
    "graft.draft_models.eagle.checkpoint": (
        "HeadLoadError",
    ),  # BlockLoadError (graft/draft_models/dflash/checkpoint.py) included
    "graft.load.models": ("ModelLoadError",),
    "graft.load.embedded": ("EmbeddedModelError",),
    "graft.records.writer": ("RunDirConflict",),
    "graft.records.reader": ("RecordError",),
}


def is_user_error(err: BaseException) -> bool:
    """A bad config value or input file (USER_ERRORS), or a file that cannot be read or written (an OSError
    naming its file), rather than a bug."""
    for module, names in USER_ERRORS.items():
        defined = sys.modules.get(module)
        if defined is not None and isinstance(err, tuple(getattr(defined, name) for name in names)):
            return True
    return isinstance(err, OSError) and err.filename is not None


def describe(err: BaseException) -> str:
    """The error's message: an OSError as `<reason>: <file>`, anything else as it says itself."""
    if isinstance(err, OSError) and err.filename is not None:
        return f"{err.strerror or err}: {err.filename}"
    return str(err).strip() or type(err).__name__


def fail(err: BaseException | str) -> None:
    """Print `error: <one line>` on stderr and exit 2 (what every command does with bad input)."""
    print(f"error: {err if isinstance(err, str) else describe(err)}", file=sys.stderr)
    sys.exit(2)


def one_line_errors(main):
    """Decorator for a command's entry point (or a Hydra task function): bad input (is_user_error) ends it
    with one line and exit 2, as run.py does; other errors propagate with their traceback."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except Exception as err:
            if not is_user_error(err):
                raise
            fail(err)

    return wrapper


def pick(doc: str, commands: dict[str, tuple], argv: list[str] | None) -> tuple[str, list[str]]:
    """(command, its arguments) from argv; `commands` maps a name to (module, what it does, ...). A bare call
    prints the usage to stderr and exits 2, --help to stdout and exits 0, an unknown name is an error naming the
    known."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        width = max(map(len, commands))
        listing = [f"  {name:<{width}}  {entry[1]}" for name, entry in commands.items()]
        print("\n".join([doc.strip(), "", "commands:", *listing]), file=sys.stdout if argv else sys.stderr)
        sys.exit(0 if argv else 2)
    if argv[0] not in commands:
        fail(f"unknown command {argv[0]!r}; commands: {', '.join(commands)}")
    return argv[0], argv[1:]
