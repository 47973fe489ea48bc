"""vLLM's side of `python -m graft.bench batch --vllm PYTHON`, run by that Python (vLLM's own environment).

It imports vLLM and the standard library only, never graft: the harness does not depend on vLLM, and vLLM's
environment need not hold the harness. It reads one JSON job on stdin, {model, dtype, prompts (token ids),
new_tokens, size, rounds, max_model_len}, and prints one JSON line: {version, tokens_per_s: [one per round],
tokens, outputs (the first round's token ids per prompt)}. Every request ignores the end-of-sequence token, so
each decodes exactly new_tokens (as the harness's stream does), greedy; one untimed round warms the engine up.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    job = json.loads(sys.stdin.read())
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: no __main__ guard
    # the CPU build's KV cache takes a fixed share of RAM (its default filled this 24 GiB machine): a few GiB hold
    # every sequence of a stream here
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(job.get("kv_cache_gib", 4)))
    import vllm
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=job["model"],
        dtype=job["dtype"],
        max_num_seqs=job["size"],
        max_model_len=job["max_model_len"],
        seed=0,
    )
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


if __name__ == "__main__":
    main()
