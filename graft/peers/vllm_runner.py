"""vLLM as a peer: the prompts of a comparison decoded by vLLM, written as a run folder beside this harness's runs.

    python -m graft.peers vllm [overrides ...] --out RUN_DIR [--python .peers/vllm/bin/python]
        [--methods ar,ngram,eagle3,dflash] [--k 4] [--dtype auto] [--batch-sizes 1,2,4,8,16,32]

The overrides are run.py's (model=, dataset=, run.num_prompts=, run.max_new_tokens=, run.temperature=): the same
prompts, turns, chat template, stop tokens and limits as `python run.py` with them. Each vLLM method runs in
vLLM's own environment (graft/peers/vllm_worker.py, started with --python; the harness never imports vLLM), one
request at a time, each later turn continuing with that method's own answers, as this harness's runs do. vLLM's
methods: `ar` (the baseline), `ngram` and `suffix` (prompt lookup; suffix needs arctic-inference), `eagle3` with
the model config's EAGLE-3 head (model.draft_head), `dflash` with its block drafter (model.block_drafter, its
block size less one speculative tokens); --k speculative tokens for the others. vLLM drafts chains, not trees.

The run folder (graft/report/foreign.py) is a comparison whose baseline is vLLM's AR, shown as `ar (vllm)`, and
whose rows are `<method> (vllm)`, each against vLLM's own AR; summary.json's `peer` says engine, version, dtype
and each method's speculative settings. Per turn: the new tokens' ids and text, wall and first-token seconds, and
the accepted lengths per step from vLLM's per-request speculative-decoding record, so tau is this harness's tau
(tokens after the first over decoding steps). Each method's turns are recorded as they finish
(`.<RUN_DIR>.progress.jsonl`): run the same command again after an interruption and finished prompts are kept.

--batch-sizes also measures vLLM's AR throughput at each batch size over the stream `run.batch_size=B` decodes
(every conversation, the dataset repeated to at least 4 B of them), so the batch figure (`plot`) draws vLLM's
line beside batched AR's; summary.json's `peer.batch_throughput` holds it.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from graft.schema import ConfigError

WORKER = Path(__file__).with_name("vllm_worker.py")
PEER_METHODS = ("ar", "ngram", "suffix", "eagle3", "dflash")
SUFFIX = " (vllm)"  # ends every peer row's name in tables and figures
STOP_REASONS = {"length": "max_new_tokens", "stop": "stop_token"}


@dataclass
class PeerPlan:
    """What one peer run decodes: the prompts as this harness formats them, and vLLM's settings."""

    python: Path
    model_path: str
    dtype: str
    methods: dict[str, dict | None]  # method -> vLLM's speculative_config (None: plain decoding)
    max_new_tokens: int
    temperature: float
    stop_ids: list[int]
    max_model_len: int
    seed: int = 0
    skipped: dict[str, str] = field(default_factory=dict)  # method -> why vLLM did not run it

    def job(self, method: str) -> dict:
        return {
            "kind": "serve",
            "model": self.model_path,
            "dtype": self.dtype,
            "max_model_len": self.max_model_len,
            "speculative": self.methods[method],
            "stop_token_ids": self.stop_ids,
            "temperature": self.temperature,
            "seed": self.seed,
        }

    def key(self, method: str) -> str:
        """What a method's recorded turns depend on: a progress line of another plan is not reused."""
        settings = {**self.job(method), "max_new_tokens": self.max_new_tokens}
        return hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def speculative_settings(method: str, *, k: int, head: str | None, drafter: str | None) -> dict | None:
    """vLLM's speculative_config for one of PEER_METHODS."""
    from graft.hub import checkpoint_dir

    if method == "ar":
        return None
    if method in ("ngram", "suffix"):
        return {"method": method, "num_speculative_tokens": k}
    if method == "eagle3":
        if not head or head == "random":
            raise ConfigError(f"vLLM's eagle3 needs the model's EAGLE-3 head (model.draft_head={head})")
        return {"method": "eagle3", "model": str(checkpoint_dir(head)), "num_speculative_tokens": k}
    if not drafter or drafter == "random":
        raise ConfigError(f"vLLM's dflash needs the model's block drafter (model.block_drafter={drafter})")
    folder = checkpoint_dir(drafter)
    block = json.loads((folder / "config.json").read_text()).get("block_size", k + 1)
    return {"method": "dflash", "model": str(folder), "num_speculative_tokens": int(block) - 1}


def parse_methods(text: str) -> list[str]:
    methods = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in methods if m not in PEER_METHODS]
    if unknown or not methods:
        raise ConfigError(
            f"--methods {text!r}: {', '.join(unknown) or 'none given'}; allowed: {', '.join(PEER_METHODS)}"
        )
    return ["ar", *[m for m in methods if m != "ar"]]  # the baseline first: every row is against it


class Worker:
    """One vLLM engine for one method in its own environment: requests in, results out, one JSON line each."""

    def __init__(self, python: Path, job: dict, worker: Path = WORKER):
        self.log = tempfile.TemporaryFile(mode="w+")  # vLLM's own logging, shown where it fails
        self.process = subprocess.Popen(
            [str(python), str(worker)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True
        )
        self._send(job)
        self.version = self._read("GRAFT_VLLM_READY")["version"]

    def _send(self, message: dict) -> None:
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def _read(self, prefix: str) -> dict:
        for line in self.process.stdout:
            if line.startswith(prefix + " "):
                return json.loads(line.split(" ", 1)[1])
        self.process.wait()
        self.log.seek(0)
        raise RuntimeError(f"vLLM's worker ended (exit {self.process.returncode}): {last_lines(self.log.read())}")

    def request(self, prompt_ids: list[int], max_tokens: int) -> dict:
        self._send({"prompt_ids": prompt_ids, "max_tokens": max_tokens})
        return self._read("GRAFT_VLLM_RESULT")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.close()


def peer_turn(result: dict, *, prompt_tokens: int, text: str) -> dict:
    """One turn as this harness records it. The first new token comes from the prefill; every later one from a
    decoding step: a verified draft gives its accepted tokens plus one, a step with no draft (prompt lookup that
    found nothing) one token. vLLM's record lists the drafted steps in order; the undrafted ones follow them."""
    ids = result["ids"]
    decoded = max(len(ids) - 1, 0)
    spec = result.get("spec") or {}
    drafted = [accepted + 1 for accepted in spec.get("per_step_accepted", [])]
    accept_lengths = drafted + [1] * max(decoded - sum(drafted), 0)
    ttft = result.get("ttft_s")
    return {
        "prompt_tokens": prompt_tokens,
        "new_tokens": len(ids),
        "step_tokens": decoded,
        "steps": len(accept_lengths),
        "tau": decoded / len(accept_lengths) if accept_lengths else 0.0,
        "stop_reason": STOP_REASONS.get(result.get("finish_reason"), result.get("finish_reason")),
        "prefill_s": ttft,
        "ttft_s": ttft,
        "decode_s": None if ttft is None else max(result["wall_s"] - ttft, 0.0),
        "wall_s": result["wall_s"],
        "accept_lengths": accept_lengths,
        "vllm_mean_acceptance_length": spec.get("mean_acceptance_length"),
        "token_ids": ids,
        "text": text,
    }


def decode_conversations(worker: Worker, prompts, chat, plan: PeerPlan, done: dict, record) -> None:
    """Every prompt's turns not in `done` ({prompt id: turns}); each later turn continues with the method's own
    answers. `record(prompt id, turns)` keeps a prompt's turns as soon as they are decoded."""
    for prompt in prompts:
        if prompt.id in done:
            continue
        messages, turns = [], []
        for text in prompt.turns:
            messages.append({"role": "user", "content": text})
            ids = chat.prompt_ids(messages)
            if len(ids) + plan.max_new_tokens > plan.max_model_len:
                raise ConfigError(
                    f"{prompt.id}: {len(ids)} prompt tokens and run.max_new_tokens {plan.max_new_tokens} exceed "
                    f"--max-model-len {plan.max_model_len}; raise it"
                )
            result = worker.request(ids, plan.max_new_tokens)
            answer = chat.decode(result["ids"])
            turns.append(peer_turn(result, prompt_tokens=len(ids), text=answer))
            messages.append({"role": "assistant", "content": answer})
        done[prompt.id] = turns
        record(prompt.id, turns)


def first_divergence(ours: list[dict], theirs: list[dict]) -> dict | None:
    for number, (a, b) in enumerate(zip(ours, theirs)):
        if a["token_ids"] != b["token_ids"]:
            same = next((i for i, (x, y) in enumerate(zip(a["token_ids"], b["token_ids"])) if x != y), None)
            return {
                "turn": number,
                "token": same if same is not None else min(len(a["token_ids"]), len(b["token_ids"])),
            }
    return None


def peer_records(prompts, decoded: dict[str, dict[str, list[dict]]]) -> list[dict]:
    """One comparison record per prompt: vLLM's AR the baseline, every other method a row `<method> (vllm)` with
    its token-equality verdict against vLLM's own AR (recorded: vLLM's kernels may part at near ties)."""
    from graft.report.foreign import side_of

    records = []
    for index, prompt in enumerate(prompts):
        base = decoded["ar"][prompt.id]
        baseline = side_of(base)
        entries = {}
        for method, by_prompt in decoded.items():
            if method == "ar":
                continue
            turns = by_prompt[prompt.id]
            side = side_of(turns)
            parted = first_divergence(turns, base)
            b_tps = baseline["totals"]["tokens_per_s"]
            entries[method + SUFFIX] = {
                "side": side,
                "lossless": {"checked": True, "equal": parted is None, "first_divergence": parted},
                "speedup_wall": side["totals"]["tokens_per_s"] / b_tps if b_tps else None,
            }
        records.append(
            {
                "id": prompt.id,
                "category": prompt.category,
                "index": index,
                "turns": len(base),
                "status": "ok",
                "baseline": baseline,
                "methods": entries,
            }
        )
    return records


def plan_peer(cfg, *, python: Path, methods: list[str], k: int, dtype: str, max_model_len: int) -> tuple:
    """(PeerPlan, chat formatter, prompts) of the composed run config `cfg`: what `python run.py` would decode."""
    from graft.data.loading import load_prompts
    from graft.load.models import load_chat

    if k < 1:
        raise ConfigError(f"--k {k} is not allowed; expected an integer >= 1 (speculative tokens a step)")
    if not Path(python).is_file():
        raise ConfigError(f"--python {python}: no such file; expected the python of vLLM's environment (make peers)")
    chat, model_path, stop_ids = load_chat(cfg.model)
    prompts = load_prompts(cfg.dataset, cfg.paths.data_root, chat)
    prompts = prompts[: cfg.run.num_prompts] if cfg.run.num_prompts else prompts
    settings = {
        m: speculative_settings(m, k=k, head=cfg.model.draft_head, drafter=cfg.model.block_drafter) for m in methods
    }
    if dtype == "auto":
        dtype = "float32" if cfg.model.dtype == "auto" else cfg.model.dtype
    plan = PeerPlan(
        python=Path(python),
        model_path=model_path,
        dtype=dtype,
        methods=settings,
        max_new_tokens=cfg.run.max_new_tokens,
        temperature=cfg.run.temperature,
        stop_ids=sorted(stop_ids),
        max_model_len=max_model_len,
        seed=cfg.run.seed,
    )
    return plan, chat, prompts


def run_job(python: Path, job: dict, *, what: str, worker: Path = WORKER) -> dict:
    """One job of the worker's run to its end (kinds stream and conversations): its one result line. A worker
    that fails, or ends without a result, is a RuntimeError naming `what` and the last lines it wrote."""
    done = subprocess.run(
        [str(python), str(worker)], input=json.dumps(job) + "\n", capture_output=True, text=True, check=False
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("GRAFT_VLLM_RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"vLLM {what} failed (exit {done.returncode}): {last_lines(done.stderr or done.stdout)}")
    return json.loads(lines[-1].split(" ", 1)[1])


def last_lines(text: str) -> str:
    """The last three non-empty lines of a worker's output, on one line: what it said as it failed."""
    return " / ".join([line for line in text.strip().splitlines() if line.strip()][-3:]) or "no output"


def throughput_job(plan: PeerPlan, chat, prompts, *, size: int, repeats: int) -> dict:
    """vLLM's AR over the whole dataset as one queue at concurrency `size`, as `run.batch_size=size` streams it
    (graft/run/batched.py: stream_repeats passes over the prompts, every turn of each conversation)."""
    from graft.run.batched import stream_repeats

    queue = [p for _ in range(stream_repeats(size, len(prompts), repeats)) for p in prompts]
    template = chat.chat_template or getattr(chat.tokenizer, "chat_template", None)
    return {
        "kind": "conversations",
        "model": plan.model_path,
        "dtype": plan.dtype,
        "max_model_len": plan.max_model_len,
        "size": size,
        "new_tokens": plan.max_new_tokens,
        "stop_token_ids": plan.stop_ids,
        "chat_template": template,
        "system_prompt": chat.system_prompt,
        "conversations": [p.turns for p in queue],
        "first_ids": [chat.prompt_ids([{"role": "user", "content": p.turns[0]}]) for p in queue],
    }


def batch_throughput(plan: PeerPlan, chat, prompts, *, sizes: list[int], repeats: int, worker: Path) -> list[dict]:
    """vLLM's batched AR at each of `sizes`: tokens/s over a steady stream (a fresh engine a size)."""
    found = []
    for size in sizes:
        job = throughput_job(plan, chat, prompts, size=size, repeats=repeats)
        result = run_job(plan.python, job, what=f"at batch size {size}", worker=worker)
        if result["first_ids_equal"] != result["sequences"]:
            raise RuntimeError(
                f"vLLM's environment formats {result['sequences'] - result['first_ids_equal']} first turns otherwise "
                "than this harness (its tokenizer or chat template differ): its throughput is not of the same prompts"
            )
        found.append({"batch_size": size, "tokens_per_s": result["new_tokens"] / result["seconds"], **result})
        print(f"vLLM AR at batch size {size}: {found[-1]['tokens_per_s']:.1f} tokens/s")
    return found


def run_peer(cfg, plan: PeerPlan, chat, prompts, *, out: Path, worker: Path = WORKER, batch_sizes=()) -> Path:
    """Decode `prompts` with every method of `plan` in vLLM and write the run folder `out`; turns already in the
    progress file for the same settings are kept. A method vLLM refuses is skipped and said so. With
    `batch_sizes`, vLLM's AR throughput at each (batch_throughput) goes into summary.json's `peer`."""
    from graft.report.foreign import write_foreign_run

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out}: exists and is not an empty folder; write the peer run into a new one")
    progress = out.with_name(f".{out.name}.progress.jsonl")
    kept = read_progress(progress)
    decoded, version = {}, None
    out.parent.mkdir(parents=True, exist_ok=True)
    with progress.open("a") as log:
        for method in plan.methods:
            key = plan.key(method)
            done = kept.get(key, {})
            if all(p.id in done for p in prompts):
                decoded[method] = done
                continue

            def record(prompt_id: str, turns: list[dict], key=key, method=method) -> None:
                log.write(json.dumps({"key": key, "method": method, "prompt": prompt_id, "turns": turns}) + "\n")
                log.flush()

            try:
                engine = Worker(plan.python, plan.job(method), worker)
            except RuntimeError as err:
                if method == "ar":
                    raise
                plan.skipped[method] = str(err)
                print(f"note: vLLM did not run {method}: {err}")
                continue
            try:
                version = engine.version
                decode_conversations(engine, prompts, chat, plan, done, record)
            finally:
                engine.close()
            decoded[method] = done
    if len(decoded) < 2:  # before the throughput's minutes are spent
        raise ConfigError(f"vLLM ran no method beside its AR ({'; '.join(plan.skipped.values()) or 'none asked'})")
    throughput = batch_throughput(plan, chat, prompts, sizes=list(batch_sizes), repeats=cfg.run.repeats, worker=worker)
    records = peer_records(prompts, decoded)
    written = write_foreign_run(out, records, suffix=SUFFIX, **peer_folder(cfg, plan, version, throughput, prompts))
    progress.unlink()
    return written


def read_progress(progress: Path) -> dict[str, dict]:
    """{settings key: {prompt id: turns}} of the turns an earlier run of the same folder recorded."""
    kept: dict[str, dict] = {}
    if progress.exists():
        for line in progress.read_text().splitlines():
            entry = json.loads(line) if line.strip() else None
            if entry:
                kept.setdefault(entry["key"], {})[entry["prompt"]] = entry["turns"]
    return kept


def peer_folder(cfg, plan: PeerPlan, version: str | None, throughput: list[dict], prompts) -> dict:
    """write_foreign_run's meta, config and run.json blocks of a peer run: which engine, version, dtype and
    settings each row ran on."""
    from graft.records.writer import hardware_info
    from graft.run.provenance import code

    peer = {
        "engine": "vllm",
        "version": version or "unknown (every method's turns came from the progress file)",
        "dtype": plan.dtype,
        "settings": plan.methods,
        "skipped": plan.skipped,
        "max_model_len": plan.max_model_len,
        "batch": 1,  # the methods' rows; batch_throughput: AR at several batch sizes
        "batch_throughput": throughput,
    }
    hardware = hardware_info("cuda" if _has_gpu() else "cpu")
    meta = {
        "model": cfg.model.name,
        "dataset": cfg.dataset.name,
        "temperature": plan.temperature,
        "hardware": {**hardware, "engine": f"vllm {peer['version']}"},
        "peer": peer,
        "baseline_label": "ar" + SUFFIX,
    }
    config = {
        "peer": peer,
        "model": {"name": cfg.model.name},
        "dataset": {"name": cfg.dataset.name},
        "run": {
            "temperature": plan.temperature,
            "max_new_tokens": plan.max_new_tokens,
            "num_prompts": len(prompts),
            "seed": plan.seed,
        },
    }
    return {"meta": meta, "config": config, "run": {"peer": peer, "provenance": {"code": code()}}}


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()
