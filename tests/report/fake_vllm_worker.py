"""A stand-in for graft/peers/vllm_worker.py that needs no vLLM: the serve protocol with made-up outputs.

AR answers a prompt with the tokens 100 + (sum of the prompt's ids + i) % 50; ngram with the same tokens and
accepted counts 2, 0, 1, 2, 0, 1, ...; eagle3 with the same tokens but its fourth changed, accepted counts 3, 3,
...; a method named in $FAKE_VLLM_REFUSE exits at start-up; after $FAKE_VLLM_DIE_AFTER requests the worker exits.
Every request is appended to $FAKE_VLLM_LOG (method and prompt length). A "conversations" job (throughput) gets
100 tokens/s a sequence of its batch."""

import json
import os
import sys

job = json.loads(sys.stdin.readline())
if job["kind"] == "conversations":  # a made-up throughput: 100 tokens/s a sequence of the batch
    turns = sum(len(c) for c in job["conversations"])
    tokens = turns * job["new_tokens"]
    result = {
        "version": "0.0-fake",
        "seconds": tokens / (100.0 * job["size"]),
        "new_tokens": tokens,
        "sequences": len(job["conversations"]),
        "turns": turns,
        "first_ids_equal": len(job["first_ids"]),
    }
    print("GRAFT_VLLM_RESULT " + json.dumps(result), flush=True)
    sys.exit(0)
method = (job.get("speculative") or {}).get("method", "ar")
if method in os.environ.get("FAKE_VLLM_REFUSE", "").split(","):
    print(f"ValueError: {method} needs a package this environment lacks", file=sys.stderr)
    sys.exit(3)
print("some vLLM log line on stdout")
print("GRAFT_VLLM_READY " + json.dumps({"version": "0.0-fake"}), flush=True)
served, limit = 0, int(os.environ.get("FAKE_VLLM_DIE_AFTER", "0") or 0)
for line in sys.stdin:
    request = json.loads(line)
    if limit and served >= limit:
        print("killed", file=sys.stderr)
        sys.exit(9)
    served += 1
    with open(os.environ["FAKE_VLLM_LOG"], "a") as log:
        log.write(json.dumps({"method": method, "prompt": len(request["prompt_ids"])}) + "\n")
    base = sum(request["prompt_ids"])
    ids = [100 + (base + i) % 50 for i in range(request["max_tokens"])]
    pattern = {"ngram": [2, 0, 1], "eagle3": [3]}.get(method)
    spec, left = None, len(ids) - 1
    if pattern:
        accepted = []
        while left > 0:
            a = min(pattern[len(accepted) % len(pattern)], left - 1)
            accepted.append(a)
            left -= a + 1
        spec = {"per_step_accepted": accepted, "mean_acceptance_length": 1 + sum(accepted) / len(accepted)}
    if method == "eagle3":
        ids[3] += 1
    result = {"ids": ids, "finish_reason": "length", "wall_s": 0.01 * len(ids), "ttft_s": 0.002, "spec": spec}
    print("GRAFT_VLLM_RESULT " + json.dumps(result), flush=True)
