"""HumanEval scoring in its sandbox: a pass means check() returned, and hostile answers fail or are contained.

Each hostile answer runs both in the full sandbox (namespaces, where this kernel allows them) and in the
fallback without namespaces; what only the namespaces guarantee is tested only where they were set up (the
verdict says which isolation was used). The GSM8K and older HumanEval cases are in test_datasets.py.
"""

import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from graft.data.prompt import Prompt
from graft.data.scoring import humaneval_passes, humaneval_verdict, score

PROBLEM = {
    "task_id": "HumanEval/square",
    "prompt": 'def square(x):\n    """Return x squared.\n    >>> square(2)\n    4\n    """\n',
    "entry_point": "square",
    "test": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(-3) == 9\n",
}
RIGHT = "    return x * x\n"
WRONG = "    return x + 2\n"  # right for 2, wrong for -3: the check must run to its end to catch it
MODES = [pytest.param(True, id="namespaces"), pytest.param(False, id="fallback")]


def verdict(answer, namespaces=True, timeout_s=10.0):
    return humaneval_verdict(answer, PROBLEM, timeout_s, namespaces=namespaces)


@pytest.fixture(scope="module")
def isolation():
    """What the full sandbox manages on this machine, e.g. "netns+pidns+ro-fs+rlimits"."""
    return verdict(RIGHT).isolation


def need(isolation, part):
    if part not in isolation.split("+"):
        pytest.skip(f"this machine's sandbox is {isolation!r}, without {part}")


def wait_for(condition, seconds=5.0):
    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def tagged_processes(tag):
    """Host processes whose command line carries `tag` (visible from here even inside a pid namespace)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and tag.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


# --- a pass is a completed check -----------------------------------------------------------------------


@pytest.mark.parametrize("namespaces", MODES)
def test_right_answer_passes_and_wrong_fails(namespaces):
    assert verdict(RIGHT, namespaces).passed
    assert verdict("```python\ndef square(x):\n    return x ** 2\n```", namespaces).passed  # a full block
    assert not verdict(WRONG, namespaces).passed
    assert not verdict("    return x *\n", namespaces).passed  # a syntax error


EARLY_EXITS = {
    "sys.exit": WRONG + "import sys\nsys.exit(0)\n",
    "SystemExit": WRONG + "raise SystemExit(0)\n",
    "os._exit": WRONG + "import os\nos._exit(0)\n",
    "exit in candidate": "    import os\n    os._exit(0)\n",
    "unittest.main in __main__": WRONG + 'if __name__ == "__main__":\n    import unittest\n    unittest.main()\n',
    "unittest.main": WRONG + "import unittest\nunittest.main(argv=['x'])\n",
    "fake nonce": WRONG + "import os, secrets\nprint(secrets.token_hex(16), end='', flush=True)\nos._exit(0)\n",
}


@pytest.mark.parametrize("namespaces", MODES)
@pytest.mark.parametrize("answer", EARLY_EXITS.values(), ids=EARLY_EXITS.keys())
def test_exit_before_check_completes_fails(answer, namespaces):
    assert not verdict(answer, namespaces).passed


def test_main_block_does_not_run():
    # as in OpenAI's harness the answer is not __main__, so a demo block neither runs nor spoils a right answer
    answer = RIGHT + 'if __name__ == "__main__":\n    import unittest\n    unittest.main()\n'
    assert verdict(answer).passed


def test_reading_stdin_gets_eof_not_a_hang():
    start = time.monotonic()
    assert not verdict(RIGHT + "line = input()\n", timeout_s=5).passed
    assert time.monotonic() - start < 3


def test_endless_loop_is_stopped_at_the_limit():
    start = time.monotonic()
    assert not verdict("    while True:\n        pass\n", timeout_s=2).passed
    assert time.monotonic() - start < 4


@pytest.mark.parametrize("namespaces", MODES)
def test_memory_limit(namespaces):
    assert not verdict(RIGHT + "hog = bytearray(3 << 30)\n", namespaces).passed


def test_score_records_the_isolation(isolation):
    prompt = Prompt(id="he", category="code", turns=["write square"], meta={"humaneval": PROBLEM})
    result = score(prompt, ["first turn", RIGHT])
    assert result == {"metric": "humaneval_pass@1", "correct": True, "isolation": isolation}
    assert isolation.endswith("rlimits") and isolation != "unknown"
    assert humaneval_passes(RIGHT, PROBLEM) and not humaneval_passes(WRONG, PROBLEM)


# --- what the answer can reach ---------------------------------------------------------------------------


@pytest.mark.parametrize("namespaces", MODES)
def test_environment_is_not_inherited(namespaces, monkeypatch):
    secret = secrets.token_hex(8)
    monkeypatch.setenv("GRAFT_TEST_SECRET", secret)
    # right only when it cannot see the secret, so a pass shows the answer ran and looked
    answer = f"    import os\n    return x * x if {secret!r} not in str(os.environ) else 0\n"
    assert verdict(answer, namespaces).passed


def test_other_processes_environment_is_hidden(isolation):
    need(isolation, "pidns")
    # a process started with the secret: its /proc/<pid>/environ holds it (this test's own would not, as
    # that file shows the environment a process started with)
    secret = secrets.token_hex(8)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env={"GRAFT_TEST_SECRET": secret})
    answer = (
        "    import glob\n"
        "    seen = ''\n"
        "    for path in glob.glob('/proc/[0-9]*/environ'):\n"
        "        try:\n"
        "            seen += open(path, 'rb').read().decode('latin-1')\n"
        "        except OSError:\n"
        "            pass\n"
        f"    return x * x if {secret!r} not in seen else 0\n"
    )
    try:
        assert wait_for(lambda: secret.encode() in Path(f"/proc/{holder.pid}/environ").read_bytes())  # exec is done
        assert verdict(answer).passed
    finally:
        holder.kill()
        holder.wait()


def listener():
    server = socket.create_server(("127.0.0.1", 0))
    server.setblocking(False)
    return server


def accepted_nothing(server):
    try:
        server.accept()[0].close()
    except BlockingIOError:
        return True
    return False


NETWORK = {
    "_socket": "import _socket\ns = _socket.socket()\ns.settimeout(1)\ns.connect(('127.0.0.1', {port}))\n",
    "reload socket": "import importlib, socket\nimportlib.reload(socket)\nsocket.create_connection(('127.0.0.1', {port}), 1)\n",
}


@pytest.mark.parametrize("namespaces", MODES)
@pytest.mark.parametrize("attempt", NETWORK.values(), ids=NETWORK.keys())
def test_network_is_blocked(attempt, namespaces):
    with listener() as server:
        answer = (
            RIGHT
            + "try:\n"
            + "".join("    " + line + "\n" for line in attempt.format(port=server.getsockname()[1]).splitlines())
        )
        verdict(answer + "except Exception:\n    pass\n", namespaces)
        assert accepted_nothing(server)


def test_network_is_blocked_below_python(isolation):
    # a subprocess is not under the Python-level guard of the fallback; only a network namespace stops it
    need(isolation, "netns")
    with listener() as server:
        code = f"import socket; socket.create_connection(('127.0.0.1', {server.getsockname()[1]}), 1)"
        verdict(RIGHT + f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {code!r}])\n")
        assert accepted_nothing(server)


@pytest.mark.parametrize("namespaces", MODES)
def test_relative_writes_stay_in_scratch(namespaces, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = f"graft_pwned_{secrets.token_hex(4)}"
    assert verdict(RIGHT + f"open({name!r}, 'w').write('x')\n", namespaces).passed  # it may write its scratch dir
    assert not (tmp_path / name).exists()


# first try to drop the private /tmp and make the root mount writable again, the whole tree and then "/"
# alone (a host mount that was read-only already is locked so, which defeats the recursive call)
UNDO_MOUNTS = """import ctypes
libc = ctypes.CDLL(None)
class Attr(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("attr_set", "attr_clr", "propagation", "userns_fd")]
attr = Attr(0, 1, 0, 0)
libc.umount2(b"/tmp", 2)
for flags in (0x8000, 0):
    libc.syscall(442, -100, b"/", flags, ctypes.byref(attr), ctypes.sizeof(attr))
libc.mount(None, b"/", None, 32 | 4096, None)
"""


def test_absolute_writes_are_contained(isolation):
    # the read-only file system with a private /tmp; the fallback cannot stop these (see the README)
    need(isolation, "ro-fs")
    outside = Path(tempfile.mkdtemp(dir="/var/tmp" if os.access("/var/tmp", os.W_OK) else Path.home()))
    targets = [Path(tempfile.gettempdir()) / f"graft_pwned_{secrets.token_hex(4)}", outside / "pwned"]
    try:
        writes = "".join(f"try:\n    open({str(t)!r}, 'w').write('x')\nexcept OSError:\n    pass\n" for t in targets)
        assert verdict(RIGHT + UNDO_MOUNTS + writes).passed
        assert not any(t.exists() for t in targets)
    finally:
        for target in targets:
            target.unlink(missing_ok=True)
        outside.rmdir()


# --- nothing outlives the limit -----------------------------------------------------------------------------


def outliver(marker: Path, tag: str, setsid: str = "") -> str:
    """An answer that forks a helper to write `marker` after the limit, and hangs; `tag` names the helper.

    `setsid`: "helper" or "answer" leaves the process group (and session) first.
    """
    helper = f"import sys, time; time.sleep(3); open({str(marker)!r}, 'w').write('x')"
    return (
        RIGHT
        + "import os, sys, time\n"
        + ("os.setsid()\n" if setsid == "answer" else "")
        + "if os.fork() == 0:\n"
        + ("    os.setsid()\n" if setsid == "helper" else "")
        + f"    os.execv(sys.executable, [sys.executable, '-c', {helper!r}, {tag!r}])\n"
        + "time.sleep(60)\n"
    )


def assert_nothing_outlives(answer, marker, tag, namespaces=True):
    start = time.monotonic()
    assert not verdict(answer, namespaces, timeout_s=2).passed
    try:
        assert tagged_processes(tag) == []
        time.sleep(max(0.0, start + 3.5 - time.monotonic()))  # past the moment the helper would have written
        assert not marker.exists()
    finally:
        for pid in tagged_processes(tag):  # only if the test failed: do not leave the helper behind
            os.kill(pid, 9)


@pytest.mark.parametrize("namespaces", MODES)
def test_forked_helper_is_killed_with_the_group(namespaces, tmp_path):
    tag = f"graft-outliver-{secrets.token_hex(4)}"
    marker = tmp_path / "marker"
    assert_nothing_outlives(outliver(marker, tag), marker, tag, namespaces)


@pytest.mark.parametrize("setsid", ["helper", "answer"])
def test_leaving_the_group_does_not_escape_the_pid_namespace(setsid, isolation, tmp_path):
    # setsid() takes a process out of the group that is killed; the pid namespace still holds the helper,
    # and the answer's process (its init) dies with its parent, which is in the group
    need(isolation, "pidns")
    tag = f"graft-outliver-{secrets.token_hex(4)}"
    marker = tmp_path / "marker"
    assert_nothing_outlives(outliver(marker, tag, setsid), marker, tag)


def test_number_of_processes_is_bounded(isolation):
    # RLIMIT_NPROC binds other users; for root only the pid namespace's own pid_max (Linux 6.14+) does
    need(isolation, "pidns")
    if os.getuid() == 0 and tuple(map(int, os.uname().release.split(".")[:2])) < (6, 14):
        pytest.skip("root on a kernel without a per-namespace pid_max: nothing bounds its processes")
    # right only if fork fails before 1000 children (they sleep, and die with the namespace)
    answer = (
        "    return x * x if BOUNDED else 0\n"
        "import os, time\n"
        "BOUNDED = False\n"
        "for _ in range(1000):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30)\n"
        "            os._exit(0)\n"
        "    except OSError:\n"
        "        BOUNDED = True\n"
        "        break\n"
    )
    assert verdict(answer, timeout_s=20).passed
