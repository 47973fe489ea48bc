"""What a run shows goes through `logging` (a module logger each: `log = logging.getLogger(__name__)`), so that
each Hydra job's log file keeps it. Hydra configures the handlers per job from configs/hydra/job_logging/graft.yaml:
the console shows each message alone, as print did (a warning as "warning: ..."), and the job's
`<output dir>/<job name>.log` (run.log for `python run.py`) keeps every line with its time, logger and level.

- ConsoleFormatter: the console's format.
- printed(fn, *args): what `fn` prints on stdout, as text (rich's tables at a fixed width, without colours).
- to_log_file(text): a block the console already shows (the end-of-run table) into the log files only.
- to_console(): for entry points outside Hydra (the report and cost-model tools): the package's info lines
  and warnings on stdout, formatted as in a run.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys

LOG_WIDTH = 120  # columns of a table written into a log file


class ConsoleFormatter(logging.Formatter):
    """The message alone, as print showed it; a warning or an error prefixed with its level ("warning: ...")."""

    def __init__(self, fmt: str | None = None, datefmt: str | None = None) -> None:
        super().__init__(fmt or "%(message)s", datefmt)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return text if record.levelno < logging.WARNING else f"{record.levelname.lower()}: {text}"


def printed(fn, *args, width: int = LOG_WIDTH, **kwargs) -> str:
    """What `fn(*args, **kwargs)` prints on stdout, captured: rich renders at `width` columns, as for a file
    (no colours), whatever the terminal is."""
    buffer = io.StringIO()
    changed = {"COLUMNS": str(width), "TTY_COMPATIBLE": "0"}
    saved = {key: os.environ.get(key) for key in changed}
    os.environ.update(changed)
    try:
        with contextlib.redirect_stdout(buffer):
            fn(*args, **kwargs)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return buffer.getvalue()


def to_log_file(text: str, level: int = logging.INFO, name: str = "graft.console") -> None:
    """`text` into the log files of the root logger (the job's .log) and not onto the console, which already
    shows it; nothing where no file is configured."""
    files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    logger = logging.getLogger(name)
    logger.propagate = False
    logger.handlers = files  # those of this job (Hydra configures each job of a sweep anew)
    if files:  # a block of lines starts on a line of its own, below the time and level
        lines = [line.rstrip() for line in text.rstrip("\n").splitlines()]
        logger.log(level, "\n".join(["", *lines] if len(lines) > 1 else lines))


def to_console(level: int = logging.INFO) -> None:
    """Outside a Hydra job nothing configures logging, and an info line would be dropped: show the package's
    lines on stdout as a run does. A no-op where logging is already configured (a run, pytest's capture)."""
    package = logging.getLogger("graft")
    if logging.getLogger().handlers or package.handlers:
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(ConsoleFormatter())
    package.addHandler(handler)
    package.setLevel(level)
