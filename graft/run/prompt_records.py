"""samples.jsonl's line of one prompt: each role's conversation as a side record, every method's lossless verdict and
speedup against the baseline, and the answers' scores; and a comparison record seen as one method's."""

from __future__ import annotations

import logging

from graft.data.scoring import score as score_answer
from graft.decode import Generation
from graft.records.metrics import side_totals
from graft.records.writer import token_hash
from graft.run.conversation import Conversation, PromptTooLong, measure_prompt
from graft.run.lossless import compare

log = logging.getLogger(__name__)


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
        "kept_nodes": gen.kept_nodes,
        "draft_ms": ms(gen.draft_s),
        "verify_ms": ms(gen.verify_s),
        "other_ms": ms(gen.other_s),
        "step_info": gen.step_info,
        "step_sources": gen.step_sources,
        "tokens_sha256": token_hash(gen.new_tokens),
        "text": text,
        **({"slot": gen.slot} if gen.slot is not None else {}),
    }


def side_record(conv: Conversation) -> dict:
    turns = [turn_record(g, t) for g, t in zip(conv.turns, conv.texts)]
    return {"turns": turns, "totals": side_totals(turns)}


def method_view(record: dict, name: str) -> dict:
    """A comparison record seen as a single-method record for method `name` (what summarize() reads)."""
    if record.get("status") != "ok":
        return record
    entry = record["methods"][name]
    view = {k: v for k, v in record.items() if k not in ("methods", "score")}
    view.update(method=entry["side"], lossless=entry["lossless"], speedup_wall=entry["speedup_wall"])
    if record.get("score"):
        view["score"] = {"method": record["score"][name], "baseline": record["score"].get("baseline")}
    return view


def outcome(
    conv: Conversation, base: Conversation | None, base_side: dict | None, greedy: bool, model, ulps: int | None
):
    """(side record, lossless verdict, wall speedup) of one method's conversation against the baseline's."""
    side = side_record(conv)
    if base is None or not greedy:
        lossless = {"checked": False, "equal": None, "first_divergence": None}
    else:
        lossless = compare(conv, base, model.target.dtype, ulps)
    b_tps = (base_side or side)["totals"]["tokens_per_s"]
    return side, lossless, side["totals"]["tokens_per_s"] / b_tps if b_tps else None


def repeat_id(prompt_id: str, repeat: int) -> str:
    """The record id of a prompt's `repeat`-th measurement (run.repeats): the prompt's id for the first, so
    run.repeats=1 writes the records it always did, and "<id>#<repeat>" for the later ones."""
    return prompt_id if repeat == 1 else f"{prompt_id}#{repeat}"


def prompt_record(
    model,
    prompt,
    *,
    contenders: dict,
    baseline,
    index: int,
    run_cfg,
    sampling,
    comparison: bool,
    warm=None,
    repeat: int = 1,
    measured: dict | None = None,
    batch: dict | None = None,
) -> dict:
    """One prompt measured for every contender and the baseline, as the line samples.jsonl keeps; a later
    `repeat` (run.repeats) is its own record (repeat_id), naming its prompt, in an order rotated one further.
    `measured`: the prompt's {role: Conversation or PromptTooLong} of a batched group (measure_group), and
    `batch` what the record says of that group."""
    record = {
        "id": repeat_id(prompt.id, repeat),
        "category": prompt.category,
        "index": index,
        "turns": len(prompt.turns),
    }
    if repeat > 1:
        record.update(prompt_id=prompt.id, repeat=repeat)
    if batch is not None:
        record["batch"] = batch
    try:
        order = index + repeat - 1  # each repeat puts every method at another place in the rotation
        if measured is None:
            results = measure_prompt(model, contenders, baseline, prompt, order, run_cfg, sampling, warm)
        else:
            for result in measured.values():
                if isinstance(result, PromptTooLong):
                    raise result
            results = measured
    except PromptTooLong as err:
        log.warning("skipped prompt %s: %s", prompt.id, err)
        return {**record, "status": "skipped", "reason": str(err)}
    base = results.get("baseline")
    base_side = side_record(base) if base is not None else None
    verdicts = {
        name: outcome(results[name], base, base_side, sampling.greedy, model, run_cfg.float_tie_ulps)
        for name in contenders
    }
    record.update(status="ok", baseline=base_side)
    if comparison:
        record["methods"] = {
            name: {"side": side, "lossless": lossless, "speedup_wall": speedup}
            for name, (side, lossless, speedup) in verdicts.items()
        }
    else:
        (name,) = contenders
        side, lossless, speedup = verdicts[name]
        record.update(method=side, lossless=lossless, speedup_wall=speedup)
    if run_cfg.score:
        scored = {role: score_answer(prompt, conv.texts) for role, conv in results.items()}
        record["score"] = scored if comparison else {"method": scored[name], "baseline": scored.get("baseline")}
    return record
