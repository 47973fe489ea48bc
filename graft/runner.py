"""One benchmark run: load the target, build the method's drafter and the baseline, then for each prompt
run both (interleaved, alternating which goes first) after an untimed warm-up, check losslessness,
and write the record. `method=ar` runs the baseline alone.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from graft.config import ExperimentConfig
from graft.data import BUILT_WITH_TOKENIZER, Prompt, load_prompts
from graft.data.scoring import score as score_answer
from graft.decode import Generation, SamplingConfig, float_tie, generate
from baselines.autoregressive import Autoregressive
from graft.drafter import Drafter
from graft.loggers import make_logger
from graft.metrics import side_totals, summarize
from graft.models import LoadedModel, load_model
from graft.records import RunDir, hardware_info, token_hash
from graft.registry import build_drafter


class PromptTooLong(Exception):
    pass


@dataclass
class Conversation:
    turns: list[Generation]
    texts: list[str]


def run_conversation(
    model: LoadedModel,
    drafter: Drafter,
    prompt: Prompt,
    max_new_tokens: int,
    sampling: SamplingConfig,
    seed: int,
    record_gaps: bool,
) -> Conversation:
    """All turns of one prompt; each later turn sees the model's own earlier answers."""
    messages: list[dict] = []
    turns, texts = [], []
    for number, user_turn in enumerate(prompt.turns):
        messages.append({"role": "user", "content": user_turn})
        ids = model.chat.prompt_ids(messages)
        limit = model.target.max_context - max_new_tokens
        if len(ids) > limit:
            raise PromptTooLong(
                f"turn {number + 1} has {len(ids)} prompt tokens; the model's context {model.target.max_context} "
                f"minus run.max_new_tokens {max_new_tokens} leaves {limit}"
            )
        generator = torch.Generator().manual_seed(seed + zlib.crc32(f"{prompt.id}/{number}".encode()))
        gen = generate(model.target, drafter, ids, max_new_tokens, model.stop_ids, sampling, generator, record_gaps)
        text = model.chat.decode(gen.new_tokens)
        turns.append(gen)
        texts.append(text)
        messages.append({"role": "assistant", "content": text})
    return Conversation(turns, texts)


def turn_record(gen: Generation, text: str) -> dict:
    ms = lambda values: [round(v * 1e3, 3) for v in values]  # noqa: E731
    return {
        "prompt_tokens": gen.prompt_len,
        "new_tokens": len(gen.new_tokens),
        "step_tokens": gen.step_tokens,
        "steps": gen.steps,
        "tau": gen.tau,
        "stop_reason": gen.stop_reason,
        "prefill_s": gen.prefill_s,
        "ttft_s": gen.prefill_s,
        "decode_s": gen.decode_s,
        "wall_s": gen.wall_s,
        "accept_lengths": gen.accept_lengths,
        "nodes": gen.nodes,
        "draft_ms": ms(gen.draft_s),
        "verify_ms": ms(gen.verify_s),
        "other_ms": ms(gen.other_s),
        "step_info": gen.step_info,
        "step_sources": gen.step_sources,
        "tokens_sha256": token_hash(gen.new_tokens),
        "text": text,
    }


def side_record(conv: Conversation) -> dict:
    turns = [turn_record(g, t) for g, t in zip(conv.turns, conv.texts)]
    return {"turns": turns, "totals": side_totals(turns)}


def compare(method: Conversation, baseline: Conversation, dtype: torch.dtype, ulps: int) -> dict:
    """First position where the method's tokens differ from the baseline's, with the baseline's top-2 gap."""
    for turn, (m, b) in enumerate(zip(method.turns, baseline.turns)):
        if m.new_tokens == b.new_tokens:
            continue
        position = next(
            (i for i, (x, y) in enumerate(zip(m.new_tokens, b.new_tokens)) if x != y),
            min(len(m.new_tokens), len(b.new_tokens)),
        )
        gap = b.top2_gaps[position] if position < len(b.top2_gaps) else None
        top = b.top_logits[position] if position < len(b.top_logits) else None
        return {
            "checked": True,
            "equal": False,
            "first_divergence": {
                "turn": turn,
                "position": position,
                "baseline_token": b.new_tokens[position] if position < len(b.new_tokens) else None,
                "method_token": m.new_tokens[position] if position < len(m.new_tokens) else None,
                "baseline_top2_gap": gap,
                "baseline_top_logit": top,
                "float_tie": gap is not None and float_tie(gap, top, dtype, ulps),
            },
        }
    return {"checked": True, "equal": True, "first_divergence": None}


def run(cfg: ExperimentConfig, resolved: dict) -> dict:
    run_cfg = cfg.run
    sampling = SamplingConfig(temperature=run_cfg.temperature, top_p=run_cfg.top_p)
    if cfg.dataset.source not in BUILT_WITH_TOKENIZER:
        load_prompts(cfg.dataset, cfg.paths.data_root)  # bad dataset input fails before the model loads
    model = load_model(cfg.model, cfg.hardware, progress=run_cfg.progress)
    prompts = load_prompts(cfg.dataset, cfg.paths.data_root, model.chat)
    if run_cfg.num_prompts:
        prompts = prompts[: run_cfg.num_prompts]
    hardware = hardware_info(str(model.target.device))
    meta = {
        "model": cfg.model.name,
        "method": cfg.method.name,
        "dataset": cfg.dataset.name,
        "hardware": hardware,
        "model_source": model.source,
        "max_new_tokens": run_cfg.max_new_tokens,
        "temperature": run_cfg.temperature,
    }
    rundir = RunDir(run_cfg.out_dir, resolved, meta={"hardware": hardware})
    drafter = build_drafter(cfg.method, model.target)
    baseline = None if isinstance(drafter, Autoregressive) else Autoregressive(model.target)

    records = rundir.finished()
    finished_ids = {r["id"] for r in records}
    todo = [(i, p) for i, p in enumerate(prompts) if p.id not in finished_ids]
    logger = make_logger(cfg.logger, resolved, run_cfg.out_dir)

    if todo and run_cfg.warmup:
        warm = todo[0][1]
        ids = model.chat.prompt_ids([{"role": "user", "content": warm.turns[0]}])[-model.target.max_context // 2 :]
        for d in filter(None, (baseline, drafter)):
            generate(
                model.target, d, ids, run_cfg.warmup_tokens, model.stop_ids, sampling, torch.Generator().manual_seed(0)
            )

    bar = tqdm(todo, desc=f"{cfg.method.name} on {cfg.dataset.name}", unit="prompt", disable=not run_cfg.progress)
    summary = summarize(records, meta)
    for index, prompt in bar:
        record = {"id": prompt.id, "category": prompt.category, "index": index, "turns": len(prompt.turns)}
        try:
            order = (
                [("baseline", baseline), ("method", drafter)]
                if index % 2 == 0
                else [("method", drafter), ("baseline", baseline)]
            )
            results = {}
            for role, d in order:
                if d is not None:
                    results[role] = run_conversation(
                        model,
                        d,
                        prompt,
                        run_cfg.max_new_tokens,
                        sampling,
                        run_cfg.seed,
                        record_gaps=(role == "baseline"),
                    )
        except PromptTooLong as err:
            record.update(status="skipped", reason=str(err))
            tqdm.write(f"skipped prompt {prompt.id}: {err}")
        else:
            method_side = side_record(results["method"])
            base_side = side_record(results["baseline"]) if baseline is not None else None
            if baseline is None or not sampling.greedy:
                lossless = {"checked": False, "equal": None, "first_divergence": None}
            else:
                lossless = compare(results["method"], results["baseline"], model.target.dtype, run_cfg.float_tie_ulps)
            b_tps = (base_side or method_side)["totals"]["tokens_per_s"]
            record.update(
                status="ok",
                method=method_side,
                baseline=base_side,
                lossless=lossless,
                speedup_wall=method_side["totals"]["tokens_per_s"] / b_tps if b_tps else None,
            )
            if run_cfg.score:
                record["score"] = {role: score_answer(prompt, conv.texts) for role, conv in results.items()}
        rundir.append(record)
        records.append(record)
        summary = summarize(records, meta)
        rundir.write_summary(summary)
        logger.log_sample(record, summary)
        bar.set_postfix(tau=f"{summary['tau'] or 0:.2f}", tok_s=f"{summary['tokens_per_s']:.1f}")
    bar.close()
    rundir.write_summary(summary)
    logger.finish(summary)
    return summary
