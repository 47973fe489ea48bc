"""Answer quality, so that users see the outputs did not change, not only the tokens.

- GSM8K: exact match of the last number in the answer with the reference's final number.
- HumanEval: pass@1. The answer and the problem's tests run in a separate, throwaway Python process (see
  `humaneval_verdict`): its own session killed as a group at the time limit, resource limits, an empty
  environment, and, where the kernel lets an unprivileged process create namespaces, no network, a read-only
  file system with a private /tmp, and its own process table. A pass means `check(entry_point)` returned.
"""

from __future__ import annotations

import math
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unicodedata
from pathlib import Path
from typing import NamedTuple

from graft.data.prompt import Prompt

# a comma only between groups of three digits (1,000 and 12,345,678; "2,3,5" is three numbers)
_NUMBER = re.compile(r"-?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_MINUSES = str.maketrans({"\u2212": "-", "\ufe63": "-"})  # the minus sign and the small hyphen-minus


def _plain(text: str) -> str:
    """Full-width digits and commas as ASCII (NFKC: "１，０００" is 1,000), typographic minus signs as "-"."""
    return unicodedata.normalize("NFKC", text).translate(_MINUSES)


def normalise_number(text: str) -> str | None:
    cleaned = _plain(text).replace(",", "").replace("$", "").strip().rstrip(".")
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return str(int(value)) if value == int(value) else repr(value)


def last_number(text: str) -> str | None:
    matches = _NUMBER.findall(_plain(text))
    return normalise_number(matches[-1]) if matches else None


def gsm8k_correct(answer: str, reference: str) -> bool:
    predicted = last_number(answer)
    return predicted is not None and predicted == normalise_number(reference)


_FENCE = re.compile(r"```(?:python|py|Python)?\s*\n(.*?)```", re.DOTALL)


def humaneval_program(answer: str, problem: dict) -> str:
    """The program to test: the answer's code if it defines the entry point, else prompt + answer."""
    blocks = _FENCE.findall(answer)
    code = "\n".join(blocks) if blocks else answer
    entry = problem["entry_point"]
    if re.search(rf"^\s*def {re.escape(entry)}\s*\(", code, re.MULTILINE):
        # keep the prompt's imports and helpers, then the model's own definition
        return problem["prompt"] + "\n    pass\n\n" + code
    return problem["prompt"] + code


# --- the sandbox -----------------------------------------------------------------------------------
#
# The child is `python -I -B -c _CHILD entry channel_fd cpu_seconds namespaces`; it reads the program from
# stdin. It runs this script, which sets everything up before a line of the answer runs (so the answer
# cannot undo it), forks the process that runs the answer, and relays that process's exit status.
#
# Why a pass cannot be an early exit: exit status 0 alone proves nothing (`sys.exit(0)`, `os._exit(0)`,
# `unittest.main()` all give it before any test runs). The harness sends a random nonce over a private
# socket only after the child reports there that `check()` returned, and a pass needs stdout to end with
# that nonce and the status to be 0. The nonce is nowhere in the child (not in the program, argv or
# environment) before check() returns, so no exit path of the answer can print it, and printing a
# nonce-like string does not help. Code that deliberately drives the harness's own channel (it can see
# the inherited fd) could forge it; no in-process check can stop that, and it is not what a model writes.
_CHILD = r"""
import ctypes, os, resource, signal, sys, traceback, types

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, AT_RECURSIVE, AT_FDCWD, SYS_MOUNT_SETATTR = 1, 2, 0x8000, -100, 442
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, CAP_VERSION_3 = 1, 24, 38, 0x20080522
libc = ctypes.CDLL(None, use_errno=True)


def call(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, what + ": " + os.strerror(err))


def set_limits(cpu_s):
    # CPU time and address space bound the cost of a runaway answer; small files and no core dumps keep
    # it from filling a disk (stdout is a file, so its size is capped too)
    for name, value in (("RLIMIT_CPU", cpu_s), ("RLIMIT_AS", 2 << 30), ("RLIMIT_FSIZE", 16 << 20), ("RLIMIT_CORE", 0)):
        resource.setrlimit(getattr(resource, name), (value, value))


def enter_namespaces():
    # "user": new network, mount and pid namespaces owned by a new user namespace, which lets an
    # unprivileged process create them; "root": the same without one (root only); None: neither
    uid, gid = os.getuid(), os.getgid()
    try:
        call(libc.unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID), "unshare")
    except OSError:
        if uid != 0:
            return None
        try:
            call(libc.unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID), "unshare")
        except OSError:
            return None
        return "root"
    try:  # keep its own ids inside; unmapped, they would read as 65534 (the namespaces work either way)
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open("/proc/self/" + name, "w") as f:
                f.write(text)
    except OSError:
        pass
    return "user"


class MountAttr(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("attr_set", "attr_clr", "propagation", "userns_fd")]


def read_only_root():
    # every mount read-only (mount_setattr, Linux 5.12+, does the whole tree at once), then fresh small
    # tmpfs at /tmp and /dev/shm for scratch files that vanish with the namespace
    call(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make mounts private")
    attr = MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    call(libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)), "ro")
    call(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, b"size=64m,mode=1777"), "tmpfs /tmp")
    if os.path.isdir("/dev/shm"):
        libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV, b"size=16m,mode=1777")
    os.chdir("/tmp")


def cap_processes():
    # RLIMIT_NPROC does not bind uid 0, even in a user namespace; the pid namespace's own pid_max (Linux
    # 6.14+, 301 the smallest allowed) bounds a fork bomb for root too. Only called in a user namespace:
    # there, on a kernel where pid_max is still global, the write fails instead of changing the host's
    fd = os.open("/proc/sys/kernel/pid_max", os.O_WRONLY)
    try:
        os.write(fd, b"301")
    finally:
        os.close(fd)


def drop_capabilities():
    # with capabilities left (it has all of them in its own user namespace) the answer could remount rw;
    # an empty bounding set keeps them from coming back through exec
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    call(libc.capset(ctypes.byref(Header(CAP_VERSION_3, 0)), (Data * 2)()), "capset")
    call(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def guard_sockets():
    # without a network namespace this is all there is; a Python-level guard that ctypes or a subprocess
    # can get around, so the isolation label says "socket-guard"
    import _socket
    import socket

    def refuse(*args, **kwargs):
        raise OSError("network disabled while scoring")

    socket.socket = socket.create_connection = socket.socketpair = _socket.socket = refuse


def run_answer(program, entry, chan):
    # its own module, not __main__: like OpenAI's harness, an `if __name__ == "__main__":` block in the
    # answer does not run
    module = types.ModuleType("__humaneval__")
    sys.modules[module.__name__] = module
    exec(compile(program, "<humaneval>", "exec"), module.__dict__)
    module.__dict__["check"](module.__dict__[entry])
    os.write(chan, b"checked\n")
    nonce = b""
    while not nonce.endswith(b"\n"):
        more = os.read(chan, 64)
        if not more:
            os._exit(1)
        nonce += more
    try:
        sys.stdout.flush()
    except Exception:
        pass
    os.write(1, nonce.strip())
    os._exit(0)  # before atexit handlers or threads of the answer can write after the nonce


def child(program, entry, chan, labels, userns):
    libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)  # dies with its parent, even if it leaves the process group
    if "netns" in labels and libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) == 0:
        labels.insert(1, "pidns")  # only with its own /proc: the host's shows every process and environ
        if userns:
            try:
                cap_processes()
            except OSError:
                pass
    resource.setrlimit(resource.RLIMIT_NPROC, (16, 16))  # counted per user namespace where there is one
    try:
        drop_capabilities()
    except OSError:
        if "ro-fs" in labels:
            raise
    if "netns" not in labels:
        guard_sockets()
    os.write(chan, ("ready " + "+".join(labels) + "\n").encode())
    run_answer(program, entry, chan)


def main():
    entry, chan, cpu_s, namespaces = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
    program = sys.stdin.buffer.read().decode("utf-8")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # an answer that reads input gets EOF, not a hang
    set_limits(cpu_s)
    labels = ["socket-guard", "rlimits"]
    mode = enter_namespaces() if namespaces else None
    if mode:
        labels = ["netns", "rlimits"]
        try:
            read_only_root()
            labels.insert(1, "ro-fs")
        except OSError:
            pass
    # the first child is pid 1 of the new pid namespace: its exit is reported only once every process in
    # the namespace is gone, so waiting for it waits for them all
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])  # until relay() can handle it
    pid = os.fork()
    if pid == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
        try:
            child(program, entry, chan, labels, mode == "user")
        except BaseException:
            traceback.print_exc()
        os._exit(1)
    os.close(chan)
    relay(pid)


def relay(pid):
    # the harness's SIGTERM at the limit: kill the child (not yet reaped, so the pid is still ours) and go on
    # waiting for it, so that the harness sees this process exit only after the whole namespace has
    signal.signal(signal.SIGTERM, lambda signum, frame: os.kill(pid, signal.SIGKILL))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
    _, status = os.waitpid(pid, 0)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


main()
"""


class Verdict(NamedTuple):
    passed: bool
    isolation: str  # what the child managed to set up, e.g. "netns+pidns+ro-fs+rlimits"; "unknown" if it died first


def humaneval_verdict(answer: str, problem: dict, timeout_s: float = 10.0, *, namespaces: bool = True) -> Verdict:
    """Run the answer against the problem's tests in the sandbox; `namespaces=False` forces the fallback (tests)."""
    program = humaneval_program(answer, problem) + "\n\n" + problem["test"] + "\n"
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="graft_humaneval_") as scratch:
        io, work = Path(scratch, "io"), Path(scratch, "work")
        io.mkdir()
        work.mkdir()
        (io / "program.py").write_text(program, encoding="utf-8")
        parent_end, child_end = socket.socketpair()
        with parent_end, child_end:
            deadline = time.monotonic() + timeout_s
            proc = _spawn(problem["entry_point"], io, work, child_end, timeout_s, namespaces)
            child_end.close()  # the child has its own copy; with ours gone, its exit closes the channel
            try:
                checked, isolation, in_time = _converse(proc, parent_end, nonce, deadline)
            finally:
                _kill_group(proc)
        passed = checked and in_time and proc.returncode == 0 and _ends_with(io / "stdout", nonce)
    return Verdict(passed, isolation)


def humaneval_passes(answer: str, problem: dict, timeout_s: float = 10.0) -> bool:
    return humaneval_verdict(answer, problem, timeout_s).passed


def _spawn(entry: str, io: Path, work: Path, chan: socket.socket, timeout_s: float, namespaces: bool):
    args = [entry, str(chan.fileno()), str(math.ceil(timeout_s) + 1), "1" if namespaces else "0"]
    with open(io / "program.py", "rb") as stdin, open(io / "stdout", "wb") as stdout:
        return subprocess.Popen(
            [sys.executable, "-I", "-B", "-c", _CHILD, *args],
            stdin=stdin,
            stdout=stdout,
            stderr=subprocess.DEVNULL,
            cwd=work,  # a scratch directory where there is no mount namespace; the child moves to its /tmp
            env={},  # nothing of the caller's environment (tokens, keys) reaches the answer
            start_new_session=True,  # its own process group, so everything it forks can be killed at once
            pass_fds=(chan.fileno(),),
        )


def _converse(proc: subprocess.Popen, chan: socket.socket, nonce: str, deadline: float) -> tuple[bool, str, bool]:
    """Follow the child until it exits or the time is up: (check() returned, isolation, exited in time).

    The first line the child sends, before any of the answer runs, names its isolation; a later "checked"
    gets the nonce back, once.
    """
    buffer, isolation, checked, listening = b"", "unknown", False, True
    chan.settimeout(0.02)  # also the polling interval for the child's exit
    while not _exited(proc.pid):
        if time.monotonic() >= deadline:
            return checked, isolation, False
        if not listening:
            time.sleep(0.02)
            continue
        try:
            data = chan.recv(4096)
        except TimeoutError:
            continue
        # empty: every copy of the child's end is closed; a long line: the channel is being flooded
        listening = bool(data) and len(buffer) < 1 << 16
        buffer += data
        while listening and b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if isolation == "unknown" and line.startswith(b"ready "):
                isolation = line[len(b"ready ") :].decode("ascii", "replace")
            elif line == b"checked" and isolation != "unknown" and not checked:
                checked = True
                _send(chan, nonce)
    return checked, isolation, True


def _send(chan: socket.socket, nonce: str) -> None:
    try:
        chan.sendall(nonce.encode() + b"\n")
    except OSError:
        pass  # the child is gone; it fails for want of the nonce


def _exited(pid: int) -> bool:
    # WNOWAIT leaves the exited leader a zombie, so its process-group id stays valid for _kill_group
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _kill_group(proc: subprocess.Popen) -> None:
    """Stop the child and everything it started, then reap it.

    SIGTERM first: the bootstrap kills the answer's process and waits for it, which, with a pid namespace,
    means every process the answer started is gone, even one that left the process group. Then SIGKILL to
    the group for what is left where there is no pid namespace, or if the bootstrap did not stop in time.
    The leader is not reaped until the end, so neither its pid nor its group id can be someone else's.
    """
    if not _exited(proc.pid):
        os.kill(proc.pid, signal.SIGTERM)
        end = time.monotonic() + 5.0
        while not _exited(proc.pid) and time.monotonic() < end:
            time.sleep(0.01)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        proc.wait()
        return
    proc.wait()
    # SIGKILL takes effect asynchronously: wait (briefly) for the group to be empty, so that nothing the
    # answer started still runs when scoring returns. Signal 0 only probes, so a reused id costs nothing.
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        try:
            os.killpg(proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.01)


def _ends_with(path: Path, nonce: str) -> bool:
    expected = nonce.encode()
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - len(expected)))
        return f.read() == expected


def score(prompt: Prompt, answers: list[str]) -> dict | None:
    """Score the last turn's answer when the prompt carries a reference; None when it cannot be scored."""
    if not answers:
        return None
    answer = answers[-1]
    if prompt.meta.get("gsm8k_answer") is not None:
        return {"metric": "gsm8k_accuracy", "correct": gsm8k_correct(answer, prompt.meta["gsm8k_answer"])}
    if prompt.meta.get("humaneval"):
        verdict = humaneval_verdict(answer, prompt.meta["humaneval"])
        return {"metric": "humaneval_pass@1", "correct": verdict.passed, "isolation": verdict.isolation}
    return None
