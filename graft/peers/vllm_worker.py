"""vLLM's side of the peer runner (graft/peers/vllm_runner.py) and of `python -m graft.bench batch --vllm PYTHON`, run by
the Python of vLLM's own environment (`make peers`).

It imports vLLM and the standard library only, never graft: the harness does not depend on vLLM, and vLLM's
environment need not hold the harness. The first line on stdin is a job, {kind, model, dtype, max_model_len,
...}; results are printed as lines that start with GRAFT_VLLM_ (vLLM's own logging may share stdout).

- kind "stream" (the batch bench): {prompts (token ids), new_tokens, size, rounds}; one line {version,
  tokens_per_s (one per round), tokens, outputs (the first round's ids)}. Every request ignores the
  end-of-sequence token, so each decodes exactly new_tokens; one untimed round warms the engine up.
- kind "serve" (the peer runner): {speculative (vLLM's speculative_config, or null), stop_token_ids,
  temperature, seed, enforce_eager}; a line GRAFT_VLLM_READY {version}, then for each request line {prompt_ids, max_tokens}
  one line {ids, finish_reason, wall_s, ttft_s, spec} where spec is the request's own acceptance record
  (vLLM's per-request speculative-decoding metrics, per step), null without speculation.
- kind "conversations" (the peer runner's throughput at a batch size): {conversations (each a list of user
  turns), first_ids (each conversation's first turn as the harness formats it), chat_template, system_prompt,
  size, new_tokens, stop_token_ids}; plain decoding of the whole queue at concurrency `size`, each later turn
  entering when the turn before it ends (its prompt formatted here, with the answer so far), one untimed pass of
  `size` conversations first; one line {version, seconds, new_tokens, sequences, turns, first_ids_equal}.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    # Python puts this file's folder first on the path, so no module beside it may be named vllm
    job = json.loads(sys.stdin.readline())
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: no __main__ guard
    # the CPU build's KV cache takes a fixed share of RAM (its default filled a 24 GiB machine): a few GiB hold
    # every sequence here
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(job.get("kv_cache_gib", 4)))
    kind = job.get("kind", "stream")
    {"stream": stream, "serve": serve, "conversations": conversations}[kind](job)


def batched_engine(job: dict):
    """vLLM's plain engine for `size` sequences at once (the stream and conversations jobs)."""
    from vllm import LLM

    return LLM(
        model=job["model"], dtype=job["dtype"], max_num_seqs=job["size"], max_model_len=job["max_model_len"], seed=0
    )


def stream(job: dict) -> None:
    import vllm
    from vllm import SamplingParams

    llm = batched_engine(job)
    params = SamplingParams(temperature=0.0, max_tokens=job["new_tokens"], ignore_eos=True)
    prompts = [{"prompt_token_ids": ids} for ids in job["prompts"]]
    first = llm.generate(prompts, params, use_tqdm=False)  # untimed: compilation, allocations
    rates = []
    for _ in range(job["rounds"]):
        started = time.perf_counter()
        out = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - started
        rates.append(sum(len(o.outputs[0].token_ids) for o in out) / seconds)
    result = {
        "version": vllm.__version__,
        "tokens_per_s": rates,
        "tokens": sum(len(o.outputs[0].token_ids) for o in first),
        "outputs": [list(o.outputs[0].token_ids) for o in first],
    }
    print("GRAFT_VLLM_RESULT " + json.dumps(result), flush=True)


def serve(job: dict) -> None:
    """One request at a time (batch 1, as the harness's runs decode), each timed alone."""
    import vllm
    from vllm import LLM, SamplingParams

    speculative = job.get("speculative")
    llm = LLM(
        model=job["model"],
        dtype=job["dtype"],
        max_num_seqs=1,
        max_model_len=job["max_model_len"],
        seed=job.get("seed", 0),
        enable_prefix_caching=False,  # every turn's prefill paid in full, as the harness pays it
        enforce_eager=job.get("enforce_eager", False),  # no compilation: a quicker start where only tokens count
        speculative_config=speculative,
        per_request_spec_decode_metrics="detailed" if speculative else "none",
        disable_log_stats=False,  # the requests' first-token times
    )
    print("GRAFT_VLLM_READY " + json.dumps({"version": vllm.__version__}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        params = SamplingParams(
            temperature=job.get("temperature", 0.0),
            max_tokens=request["max_tokens"],
            stop_token_ids=job.get("stop_token_ids") or None,
            seed=job.get("seed", 0),
        )
        started = time.perf_counter()
        (out,) = llm.generate([{"prompt_token_ids": request["prompt_ids"]}], params, use_tqdm=False)
        wall = time.perf_counter() - started
        completion = out.outputs[0]
        metrics = getattr(out, "metrics", None)
        ttft = getattr(metrics, "first_token_latency", None) or None
        spec = getattr(completion, "spec_decode_metrics", None)
        result = {
            "ids": list(completion.token_ids),
            "finish_reason": completion.finish_reason,
            "wall_s": wall,
            "ttft_s": ttft,
            "spec": None if spec is None else spec.to_dict(),
        }
        print("GRAFT_VLLM_RESULT " + json.dumps(result), flush=True)


def conversations(job: dict) -> None:
    """Continuous batching of whole conversations: at most `size` turns decoding at once, a turn's successor
    queued as soon as it ends; throughput = every new token over the seconds of the whole queue."""
    import vllm
    from vllm import SamplingParams

    llm = batched_engine(job)
    tokenizer = llm.get_tokenizer()
    params = SamplingParams(temperature=0.0, max_tokens=job["new_tokens"], stop_token_ids=job["stop_token_ids"] or None)

    def prompt_ids(messages: list[dict]) -> list[int]:
        if job.get("system_prompt"):
            messages = [{"role": "system", "content": job["system_prompt"]}, *messages]
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, chat_template=job.get("chat_template")
        )
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    first_equal = sum(
        prompt_ids([{"role": "user", "content": turns[0]}]) == ids
        for turns, ids in zip(job["conversations"], job["first_ids"])
    )

    def run(queue: list[list[str]]) -> tuple[int, int]:
        engine, waiting, live, tokens, turns = llm.llm_engine, list(enumerate(queue)), {}, 0, 0

        def start(number: int, messages: list[dict]) -> None:
            request = f"{number}:{len(messages)}"  # one id a turn: a conversation's turns never share one
            live[request] = messages
            engine.add_request(request, {"prompt_token_ids": prompt_ids(messages)}, params)

        while waiting and len(live) < job["size"]:
            number, turns_ = waiting.pop(0)
            start(number, [{"role": "user", "content": turns_[0]}])
        while engine.has_unfinished_requests():
            for out in engine.step():
                if not out.finished:
                    continue
                messages = live.pop(out.request_id)
                tokens, turns = tokens + len(out.outputs[0].token_ids), turns + 1
                number = int(out.request_id.split(":")[0])
                messages = [*messages, {"role": "assistant", "content": out.outputs[0].text}]
                done_turns = sum(m["role"] == "assistant" for m in messages)
                if done_turns < len(queue[number]):
                    start(number, [*messages, {"role": "user", "content": queue[number][done_turns]}])
                elif waiting:
                    following, turns_ = waiting.pop(0)
                    start(following, [{"role": "user", "content": turns_[0]}])
        return tokens, turns

    run(job["conversations"][: job["size"]])  # untimed: compilation, allocations
    started = time.perf_counter()
    tokens, turns = run(job["conversations"])
    result = {
        "version": vllm.__version__,
        "seconds": time.perf_counter() - started,
        "new_tokens": tokens,
        "sequences": len(job["conversations"]),
        "turns": turns,
        "first_ids_equal": first_equal,
    }
    print("GRAFT_VLLM_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
