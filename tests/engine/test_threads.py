"""The CPU thread / spin policy: its choice for given cores and load, and its measurement with a busy neighbour."""

import subprocess
import sys

import pytest

from graft.cpu.threads import ThreadPolicy, choose, choose_before_torch, measure_busy


@pytest.mark.parametrize(
    "cores, busy, threads, spin",
    [
        (2, 0.0, 2, True),  # idle: one spinning thread per core
        (2, 0.3, 2, True),
        (2, 1.0, 1, False),  # one busy neighbour on two cores: one thread, sleeping workers
        (2, 0.6, 1, False),
        (2, 2.0, 1, False),  # every core busy: still one thread
        (16, 3.2, 13, False),
        (1, 0.0, 1, True),
        (4, 9.0, 1, False),  # more load than cores is capped
    ],
)
def test_policy_for_cores_and_load(cores, busy, threads, spin):
    policy = choose(cores, busy)
    assert (policy.threads, policy.spin) == (threads, spin)
    assert isinstance(policy, ThreadPolicy) and policy.reason


def test_a_busy_neighbour_is_measured_and_turns_spinning_off():
    cores = len(__import__("os").sched_getaffinity(0))
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        import time

        time.sleep(0.3)  # let it start
        cores_busy, load = measure_busy(0.5)
        env = {}
        policy = choose_before_torch(env)
    finally:
        neighbour.kill()
        neighbour.wait()
    assert cores_busy == cores
    assert load >= 0.5, load  # one process spinning is most of a core
    assert not policy.spin and policy.threads <= max(1, cores - 1)
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and env["GOMP_SPINCOUNT"] == "0"


def test_the_users_own_settings_win():
    env = {"GOMP_SPINCOUNT": "5", "THP_MEM_ALLOC_ENABLE": "0"}
    assert choose_before_torch(env) is None and env == {"GOMP_SPINCOUNT": "5", "THP_MEM_ALLOC_ENABLE": "0"}
    fixed = {"GRAFT_THREADS": "fixed"}
    assert choose_before_torch(fixed) is None and fixed["THP_MEM_ALLOC_ENABLE"] == "1"  # huge pages asked anyway


def _thp_mode() -> str | None:
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return None
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else None


@pytest.mark.skipif(_thp_mode() not in ("always", "madvise"), reason="transparent huge pages are off on this kernel")
def test_asked_huge_pages_back_torchs_large_tensors():
    """In a fresh process that asked before torch loaded, a large tensor lands in huge pages; without, in
    madvise mode, it does not."""
    code = (
        "import os, sys; from graft.cpu.threads import prefer_huge_pages, huge_pages_mb\n"
        "os.environ['THP_MEM_ALLOC_ENABLE'] = sys.argv[1]\n"
        "import torch; x = torch.ones(64 << 20, dtype=torch.uint8); print(huge_pages_mb())"
    )
    root = str(__import__("pathlib").Path(__file__).resolve().parents[2])

    def run(flag: str) -> float:
        done = subprocess.run([sys.executable, "-c", code, flag], cwd=root, capture_output=True, text=True, check=True)
        return float(done.stdout)

    assert run("1") >= 32  # most of the 64 MB
    if _thp_mode() == "madvise":
        assert run("0") < 32
