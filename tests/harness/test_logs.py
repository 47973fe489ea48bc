"""A run's console lines go through `logging` (graft/run/logs.py): the console shows each message alone, and the
Hydra job's .log in the run's folder keeps them with their times, the end-of-run table included."""

import io
import logging
import re

from rich.console import Console
from rich.table import Table
from test_cli import run_cli

from graft.run.logs import ConsoleFormatter, printed, to_log_file


def test_a_run_writes_its_console_lines_and_table_into_the_job_log(tmp_path):
    out = tmp_path / "ar"
    args = ["model=tiny_llama", "method=ar", "logger=none", "hardware=cpu", "run.num_prompts=1"]
    proc = run_cli(*args, "run.max_new_tokens=4", f"run.out_dir={out}")
    # the console: the message alone, as print showed it
    assert any(line.startswith("hardware=cpu -> cpu") for line in proc.stdout.splitlines()), proc.stdout
    (log,) = out.glob("*.log")  # Hydra's job log (run.log), beside .hydra/ in run.out_dir
    text = log.read_text()
    assert re.search(r"^\[[0-9-]+ [0-9:,]+\]\[graft\.run\.runner\]\[INFO\] - hardware=cpu -> cpu", text, re.M), text
    assert "ar on tiny_llama / builtin_quick" in text  # the results table: its title, its header, its rows
    assert re.search(r"┃ metric +┃ +value ┃ definition", text), text
    assert re.search(r"│ speedup_wall +│ +1\.000x │", text), text
    assert f"records: {out}/samples.jsonl" in text
    assert "\x1b[" not in text  # no terminal colours in the file


def test_the_console_shows_the_message_and_a_warning_says_so():
    formatter = ConsoleFormatter()
    record = logging.LogRecord("graft.x", logging.INFO, __file__, 1, "%d prompts", (3,), None)
    assert formatter.format(record) == "3 prompts"
    record = logging.LogRecord("graft.x", logging.WARNING, __file__, 1, "torn line", None, None)
    assert formatter.format(record) == "warning: torn line"


def test_a_table_goes_to_the_log_files_only(tmp_path, caplog):
    def show(title: str) -> None:
        table = Table(title=title)
        table.add_column("metric")
        table.add_column("value", justify="right")
        table.add_row("tau", "2.50")
        Console().print(table)

    text = printed(show, "m / d")
    assert "m / d" in text and "tau" in text and "2.50" in text and "\x1b[" not in text
    caplog.set_level(logging.INFO)  # as a Hydra job's root logger
    root = logging.getLogger()
    file_handler = logging.FileHandler(tmp_path / "job.log")
    file_handler.setFormatter(logging.Formatter("[%(levelname)s] - %(message)s"))
    console = logging.StreamHandler(io.StringIO())
    root.addHandler(file_handler)
    root.addHandler(console)
    try:
        to_log_file(text)
    finally:
        root.removeHandler(file_handler)
        root.removeHandler(console)
        file_handler.close()
    logged = (tmp_path / "job.log").read_text()
    assert logged.startswith("[INFO] - \n") and "│ tau    │  2.50 │" in logged  # the table from its own line
    assert console.stream.getvalue() == ""  # the console already showed it
