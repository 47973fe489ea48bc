"""Answer quality, so that users see the outputs did not change, not only the tokens.

- GSM8K: exact match of the last number in the answer with the reference's final number.
- HumanEval: pass@1; the problem's tests run in a separate Python process with a time limit, sockets
  disabled and a scratch working directory.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile

from graft.data.prompt import Prompt

_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?")


def normalise_number(text: str) -> str | None:
    cleaned = text.replace(",", "").replace("$", "").strip().rstrip(".")
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return str(int(value)) if value == int(value) else repr(value)


def last_number(text: str) -> str | None:
    matches = _NUMBER.findall(text)
    return normalise_number(matches[-1]) if matches else None


def gsm8k_correct(answer: str, reference: str) -> bool:
    predicted = last_number(answer)
    return predicted is not None and predicted == normalise_number(reference)


_FENCE = re.compile(r"```(?:python|py|Python)?\s*\n(.*?)```", re.DOTALL)

_SANDBOX_PRELUDE = """
import socket as _socket
def _no_network(*args, **kwargs):
    raise OSError("network disabled while scoring")
_socket.socket = _no_network
_socket.create_connection = _no_network
"""


def humaneval_program(answer: str, problem: dict) -> str:
    """The program to test: the answer's code if it defines the entry point, else prompt + answer."""
    blocks = _FENCE.findall(answer)
    code = "\n".join(blocks) if blocks else answer
    entry = problem["entry_point"]
    if re.search(rf"^\s*def {re.escape(entry)}\s*\(", code, re.MULTILINE):
        # keep the prompt's imports and helpers, then the model's own definition
        return problem["prompt"] + "\n    pass\n\n" + code
    return problem["prompt"] + code


def humaneval_passes(answer: str, problem: dict, timeout_s: float = 10.0) -> bool:
    program = "\n".join(
        [
            _SANDBOX_PRELUDE,
            humaneval_program(answer, problem),
            "",
            problem["test"],
            "",
            f"check({problem['entry_point']})",
            "",
        ]
    )
    with tempfile.TemporaryDirectory() as scratch:
        try:
            result = subprocess.run(
                [sys.executable, "-I", "-c", program], cwd=scratch, capture_output=True, timeout=timeout_s, text=True
            )
        except subprocess.TimeoutExpired:
            return False
    return result.returncode == 0


def score(prompt: Prompt, answers: list[str]) -> dict | None:
    """Score the last turn's answer when the prompt carries a reference; None when it cannot be scored."""
    if not answers:
        return None
    answer = answers[-1]
    if prompt.meta.get("gsm8k_answer") is not None:
        return {"metric": "gsm8k_accuracy", "correct": gsm8k_correct(answer, prompt.meta["gsm8k_answer"])}
    if prompt.meta.get("humaneval"):
        return {"metric": "humaneval_pass@1", "correct": humaneval_passes(answer, prompt.meta["humaneval"])}
    return None
