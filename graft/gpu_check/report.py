"""The device check's report: one JSON file rewritten after every part, the context a part runs in, and
the summary of every part's headline numbers."""

from __future__ import annotations

import gc
import json
import os
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch

from graft.gpu_check.goals import goal_rows
from graft.gpu_check.plan import PART_NAMES, Plan


class SkipPart(Exception):
    """Raised by a part that cannot run here (no CUDA, say); the part is recorded as skipped, with the reason."""


class Interrupted(BaseException):
    """SIGTERM (the `timeout` in device_check.sh): record the part in flight, save, stop."""


def traceback_tail(err: BaseException, lines: int = 12) -> list[str]:
    return "".join(traceback.format_exception(type(err), err, err.__traceback__)).rstrip().splitlines()[-lines:]


class Report:
    """The JSON file, rewritten after every part (and whenever a part calls save), so a run cut short still
    reports. A part that raises is recorded as failed and the next one runs."""

    def __init__(self, path: Path, budget_s: float, header: dict, clock: Callable[[], float] = time.perf_counter):
        self.path, self.budget_s = path, budget_s
        self.clock = clock  # tests pass a fake one: budgets must not depend on how loaded the machine is
        self.started = clock()
        self.part_deadline = self.started + budget_s
        self.data = {
            **header,
            "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "budget_s": budget_s,
            "elapsed_s": 0.0,
            "finished": False,
            "parts": {},
        }

    def elapsed(self) -> float:
        return self.clock() - self.started

    def remaining(self) -> float:
        return self.budget_s - self.elapsed()

    def part_left(self) -> float:
        """Seconds the part in flight may still use."""
        return self.part_deadline - self.clock()

    def save(self) -> None:
        """Write to a temporary file and rename it, so a kill mid-write leaves the previous complete file."""
        self.data["elapsed_s"] = round(self.elapsed(), 2)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)

    def skip(self, number: int, reason: str) -> None:
        self.data["parts"][str(number)] = {
            "name": PART_NAMES.get(number, str(number)),
            "status": "skipped",
            "reason": reason,
        }
        self.save()

    def run(self, number: int, fn: Callable[[dict], None], budget_s: float = 0.0, reserved_s: float = 0.0) -> None:
        """Run one part: `fn(result)` fills `result` as it goes; its status is ok, skipped or failed. It may use
        the time left but `reserved_s` (the later parts' budgets), and at least its own `budget_s` while the
        total lasts; with less than half of that to use, it is skipped."""
        left = self.remaining()
        usable = min(left, max(budget_s, left - reserved_s))
        if usable <= 0 or usable < budget_s / 2:
            self.skip(
                number,
                f"budget: {max(left, 0):.0f} s left of --budget-s {self.budget_s:.0f}, the part's budget is "
                f"{budget_s:.0f} s",
            )
            return
        self.part_deadline = self.clock() + usable
        record: dict = {
            "name": PART_NAMES.get(number, str(number)),
            "status": "running",
            "budget_s": round(usable, 1),
            "result": {},
        }
        self.data["parts"][str(number)] = record
        self.save()
        start = self.clock()
        try:
            fn(record["result"])
            record["status"] = "ok"
        except SkipPart as why:
            record.update(status="skipped", reason=str(why))
        except Interrupted:
            record.update(status="interrupted", reason="SIGTERM (the run's time limit) during this part")
            raise
        except Exception as err:  # a failing part must not stop the others: record what broke
            record.update(status="failed", error=f"{type(err).__name__}: {err}"[:2000], traceback=traceback_tail(err))
            err.__traceback__ = None  # the frames hold the part's models: let them go before the next part
        finally:
            record["seconds"] = round(self.clock() - start, 2)
            release_memory()
            self.save()
        print(f"part {number} {record['name']}: {record['status']} in {record['seconds']:.1f} s", flush=True)

    def finish(self) -> None:
        self.data["finished"] = True
        self.data["summary"] = summarize(self.data["parts"], self.data.get("device", "cuda"))
        self.save()


@dataclass
class Context:
    plan: Plan
    device: torch.device
    quick: bool
    report: Report

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def checkpoint(self) -> None:
        """Save what the part in flight has so far."""
        self.report.save()

    def time_left(self) -> float:
        """Seconds the part in flight may still use (Report.run)."""
        return self.report.part_left()

    @property
    def hardware(self) -> list[str]:
        """configs/hardware/gpu.yaml on either device: the CPU quick mode runs the GPU config's code paths
        (attention kernel, chunked prefill), only on the CPU."""
        return ["hardware=gpu", f"hardware.device={self.device.type}", *self.plan.hardware]


def summarize(parts: dict, device: str = "cuda") -> dict:
    """The headline numbers of every part, for reading the JSON's end first."""
    summary = {"status": {k: p["status"] for k, p in parts.items()}}
    get = lambda k: parts.get(k, {}).get("result", {})  # noqa: E731
    by_temperature = lambda rows, key: {  # noqa: E731
        setting: {method: row.get(key) for method, row in methods.items()}
        for setting, methods in rows.items()
        if setting.startswith("temperature_")
    }
    if "totals" in get("2"):
        summary["lossless"] = get("2")["totals"]
    if get("3").get("dispatcher"):
        summary["syncs_per_step"] = {
            key: {method: row.get("max") for method, row in rows.items()}
            for key, rows in get("3")["dispatcher"].items()
        }
    if get("4").get("verify"):
        verify = get("4")["verify"]
        summary["llama8b_verify_median_ms"] = {
            c: {n: r["median_ms"] for n, r in rows.items()} for c, rows in verify.items()
        }
        summary["llama8b_overhead_ms_per_step"] = by_temperature(get("4").get("decode", {}), "overhead_ms_per_step")
        summary["llama8b_extend_peak_gib"] = get("4").get("extend", {}).get("head_extend_peak_gib")
    if get("5").get("verify"):
        summary["moe_verify_median_ms"] = {n: r["median_ms"] for n, r in get("5")["verify"].items()}
    if "6" in parts:
        summary["head235_loads"] = parts["6"]["status"] == "ok"
    if get("9").get("methods"):
        summary["batch_syncs_per_step"] = {m: r.get("max") for m, r in get("9")["methods"].items()}
        summary["batch_tokens_per_s"] = {
            "ar_batch1": get("9").get("ar_batch1", {}).get("tokens_per_s"),
            **{m: r.get("tokens_per_s") for m, r in get("9")["methods"].items()},
        }
    summary["goals"] = {row["figure"]: [row["value"], row["goal"], row["result"]] for row in goal_rows(parts, device)}
    failed = {
        k: p.get("error") or p.get("reason") for k, p in parts.items() if p["status"] in ("failed", "interrupted")
    }
    if failed:
        summary["failed"] = failed
    return summary


def release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
