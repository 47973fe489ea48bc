"""What a run folder holds, read without the harness (the report tools use this, and it never imports the CPU
engine): the part of a config that determines results, the digest of a run's records and whether they are the
ones its summary names, and the folder's lock: one writer at a time (RunLock, `.lock`). graft/records/writer.py opens
and writes run folders with these.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import signal
import socket
import stat
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

log = logging.getLogger("graft.records.writer")  # the run's own lines, as graft/records/writer.py logs them

# Keys that do not change any prompt's result: they may differ between a run and its resumption.
RESUMABLE_KEYS = {
    ("run", "out_dir"),
    ("run", "num_prompts"),
    ("run", "progress"),
    ("dataset", "num_prompts"),
    ("paths", "data_root"),
    ("run", "skip_memory_check"),  # whether the plan was checked does not change the results
    ("run", "repeats"),  # more or fewer passes over the prompts: the finished ones are kept (the plan says which)
}


def _flatten(cfg: dict, prefix: str = "") -> dict[str, object]:
    flat = {}
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def result_config(cfg: dict) -> dict:
    """The part of the config that determines results (logger and resumable keys removed)."""
    kept = {k: dict(v) if isinstance(v, dict) else v for k, v in cfg.items() if k != "logger"}
    for section, key in RESUMABLE_KEYS:
        kept.get(section, {}).pop(key, None)
    return kept


def marked_partial(summary: dict) -> dict:
    """The summary of a run that did not finish, as a copy says so: `partial: true` and no `complete` record, so
    every tool reads it as unfinished (run_problem) and shows it only with --partial."""
    return {**{k: v for k, v in summary.items() if k != "complete"}, "partial": True}


def records_digest(records: list[dict]) -> str:
    """What a summary was computed from: the sha1 of its records, in order, as samples.jsonl holds them."""
    lines = "".join(json.dumps(r, default=float) + "\n" for r in records)
    return hashlib.sha1(lines.encode()).hexdigest()


def records_problem(records: list[dict], ids: list[str], digest: str | None) -> str | None:
    """Why `records` do not hold exactly one record per id of `ids` whose digest (records_digest, in the order
    of `ids`) is `digest`, or None."""
    by_id = {r.get("id"): r for r in records}
    missing = [i for i in ids if i not in by_id]
    if missing:
        return f"{len(missing)} of its {len(ids)} records are missing ({', '.join(map(str, missing[:3]))})"
    if sum(r.get("id") in set(ids) for r in records) != len(ids):
        return "a prompt has more than one record"
    if records_digest([by_id[i] for i in ids]) != digest:
        return "its records differ from those it was computed from"
    return None


LOCK = ".lock"  # in the run folder: which run writes it (not a record: no tool reads or exports it)
HEARTBEAT_S = 60  # a holder refreshes its lock's mtime this often
STALE_AFTER_S = 600  # a lock of another host not refreshed for this long is a dead run's


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _pid_running(pid) -> bool:
    try:
        if int(pid) <= 0:  # os.kill(0 or -n) signals a whole process group: no run's pid
            return False
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # running, as another user
        return True
    except (TypeError, ValueError, OverflowError):
        return False
    try:  # a killed process its parent has not reaped yet is a zombie: gone
        return Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def lock_holder(folder: str | Path) -> dict | None:
    """The run recorded in `folder`'s lock ({pid, host, started, ...}), or None where there is none (or it
    cannot be read)."""
    return RunLock(folder)._read()[1]


def _regular(path: Path) -> bool:
    """A regular file, not followed through a link (reading a FIFO would wait for a writer forever)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def live_holder(folder: str | Path) -> dict | None:
    """The run holding `folder`'s lock while it may still be running (not stale), else None."""
    lock = RunLock(folder)
    _, holder = lock._read()
    return holder if holder is not None and lock._stale(holder) is None else None


def holder_text(holder: dict) -> str:
    return f"pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('started')}"


def _flock(fd: int) -> bool:
    """An exclusive flock on `fd` without waiting: False when another open file holds it; True also where the
    file system has no flock (the pid and heartbeat rules still hold)."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        pass
    return True


class LockHeld(RuntimeError):
    """Another run holds the folder (the message names it)."""


class RunLock:
    """One writer per run folder: `.lock`, created exclusively (O_CREAT | O_EXCL), holds its run's pid, host,
    boot and start time; the run keeps it flock'ed and refreshes its mtime every minute. A second run is refused
    (LockHeld, one line naming the holder). A lock whose run is gone is taken over with a warning: on this
    host, its pid is not running (or the host restarted since); from another host (a shared file system), it
    was not refreshed for 10 minutes, or it names this process's own SLURM job (a requeue). Taking over flocks the old file first, so two runs never both take it.
    `release` (RunDir.close, and at exit) removes it."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder) / LOCK
        self.fd: int | None = None
        self._stop = threading.Event()
        self._sigterm = None  # the SIGTERM handler this lock installed, if any

    def acquire(self) -> None:
        deadline = time.monotonic() + 15
        while self.fd is None:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                if not _regular(self.path) and os.path.lexists(self.path):
                    raise LockHeld(
                        f"run.out_dir={self.path.parent} holds {self.path}, which is not a regular file (no run "
                        "writes one there); remove it, or use another run.out_dir"
                    ) from None
                raw, holder = self._read()
                stale = self._stale(holder)
                if stale is None and (holder is not None or time.monotonic() > deadline):
                    raise LockHeld(self._refusal(holder)) from None
                if stale is not None and self._take_over(raw, holder, stale):
                    break
                if time.monotonic() > deadline:
                    raise LockHeld(self._refusal(holder)) from None
                time.sleep(0.05)  # being created this instant, or another run took it first: look again
                continue
            _flock(fd)  # a new file: nobody else holds it
            self.fd = fd
            self._write()
        atexit.register(self.release)
        self._release_on_sigterm()
        threading.Thread(target=self._heartbeat, name="run-lock-heartbeat", daemon=True).start()

    def _release_on_sigterm(self) -> None:
        """SLURM's time limit, scancel and a requeue end a run with SIGTERM, whose default ends Python without its
        atexit hooks: the lock would stay and a requeued run on another node wait 10 minutes. Where SIGTERM still
        has its default, it now lets go of the lock and exits 143 through the normal unwinding (records already
        written stay); a handler someone else installed (submitit's) is left alone."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return

        def ended(signum, frame) -> None:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            self.release()
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, ended)
        self._sigterm = ended

    def _read(self) -> tuple[str | None, dict | None]:
        if not _regular(self.path):  # a FIFO would block the read forever; a folder or link is no run's lock
            return None, None
        try:
            raw = self.path.read_text()
        except OSError:
            return None, None
        try:
            holder = json.loads(raw)
        except ValueError:
            return raw, None
        return raw, holder if isinstance(holder, dict) else None

    def _age(self) -> float | None:
        try:
            return time.time() - self.path.stat().st_mtime
        except OSError:
            return None

    def _stale(self, holder: dict | None) -> str | None:
        """Why the run that holds the lock is gone, or None while it may be running."""
        age = self._age()
        if holder is None:  # empty or torn: a run creating it this instant, or one that died doing so
            return f"unreadable and {age:.0f} s old" if age is not None and age > 10 else None
        if holder.get("host") == socket.gethostname():
            if holder.get("boot") and _boot_id() and holder["boot"] != _boot_id():
                return "its host has restarted since"
            return None if _pid_running(holder.get("pid")) else f"pid {holder.get('pid')} is not running"
        job = os.environ.get("SLURM_JOB_ID")
        if job and holder.get("slurm_job") == job:  # SLURM never runs one job twice: this is its requeue
            return f"this is SLURM job {job} again (requeued), on another node"
        if age is not None and age > STALE_AFTER_S:
            return f"not refreshed for {age / 60:.0f} minutes"
        return None

    def _take_over(self, raw: str | None, holder: dict | None, why: str) -> bool:
        """The stale lock made ours in place, under its flock; False when it changed or another run got there
        first (then the caller looks again)."""
        try:
            fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            return False  # released meanwhile: create it afresh
        try:
            held_by_us = _flock(fd) and os.fstat(fd).st_ino == os.stat(self.path).st_ino
            if held_by_us:
                with open(fd, closefd=False) as f:
                    held_by_us = f.read() == raw
        except OSError:
            held_by_us = False
        if not held_by_us:
            os.close(fd)
            return False
        self.fd = fd
        self._write()
        who = holder_text(holder) if holder else "unknown"
        log.warning("%s: taking over the lock of a run that is gone (%s: %s)", self.path.parent, who, why)
        return True

    def _write(self) -> None:
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": _now(), "boot": _boot_id()}
        if os.environ.get("SLURM_JOB_ID"):
            holder["slurm_job"] = os.environ["SLURM_JOB_ID"]
        data = json.dumps(holder).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)
        os.fsync(self.fd)

    def _refusal(self, holder: dict | None) -> str:
        who = f"another run ({holder_text(holder)})" if holder else f"another run ({self.path} is unreadable)"
        return (
            f"run.out_dir={self.path.parent} is being written by {who}; wait for it to end or use another "
            f"run.out_dir (if that run is gone, remove {self.path})"
        )

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            fd = self.fd
            if fd is None:
                return
            try:
                os.utime(fd)
            except OSError:
                pass

    def release(self) -> None:
        """Remove the lock (only while it is still this run's file) and let go of it."""
        fd, self.fd = self.fd, None
        if fd is None:
            return
        self._stop.set()
        atexit.unregister(self.release)
        if self._sigterm is not None and threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGTERM) is self._sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
            self._sigterm = None
        try:
            if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                self.path.unlink()
        except OSError:
            pass
        os.close(fd)
