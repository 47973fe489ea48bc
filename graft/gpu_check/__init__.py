"""Device check: what the harness does on a bare single-GPU node, in one JSON file, within a time budget.

    python -m graft.gpu_check --out $OUT/gpu_check.json              # on the GPU node (scripts/device_check.sh)
    python -m graft.gpu_check --device cpu --quick --out /tmp/q.json   # the same code at tiny shapes (its test)

Parts (`--parts 1,2,...`; each timed):
1. environment: device, driver, CUDA, library versions, memory, which SDPA kernels run (with and without a mask);
2. lossless, greedy: every configs/method/*.yaml against the autoregressive baseline on the tiny random models,
   in float32 and bfloat16 (a divergence records whether the baseline's top-2 gap there is a float tie);
3. host syncs per decode step of ar, pld, eagle3, pruned and graft with the GPU settings, greedy and at
   temperature 1, on tiny_llama and tiny_qwen3_moe: counted at the dispatcher (sync_counter.py, any device)
   and on CUDA under torch.cuda.set_sync_debug_mode("warn");
4. a LLaMA-3.1-8B-shaped target with an EAGLE-3-shaped head: decode time against the HBM bound (weight bytes
   over graft/costmodel/bound.py's bandwidth for the GPU), verify(N) / decode for N in 1..128 at 1K and 8K
   context, verify at pruning's kept sizes (60, 32, 16, 8 nodes), ar / eagle3 / graft / dflash loops greedy and
   at temperature 1 on the events clock (whole steps over AR's), the head's extend peak memory;
5. a few Qwen3-235B-A22B-shaped MoE layers: verify time, verify(N) / decode and experts touched per tree size,
   beside the bytes bound of those experts;
6. a 235B-shaped SpecForge EAGLE-3 head checkpoint (head_dim 128 != hidden / heads) loads and runs;
7. hardware.compile (torch.compile over static caches; CUDA graphs with reduce-overhead): ar, eagle3 and graft
   against the eager baseline on tiny_llama, the graphs compiled and CUDA graphs recorded once every prompt ran
   (the goal: none), and an 8B-shaped slice's decode against its HBM bound, eager and compiled;
8. lossless, sampled: every method's first two tokens at temperature 1 against the target's own distribution
   (a chi-square) on tiny_llama;
9. a batch of 8 (graft/batch.py: generate_batch), greedy, ar / eagle3 / graft on an 8-layer slice of the 8B
   shape (tiny_llama with --quick or on a CPU): host syncs per batched step (dispatcher, and on CUDA sync debug
   mode), every sequence's tokens against batch-1 AR's, tokens/s over batch-1 AR's.

Each part writes its figures under `ratios`; goals.py sets them beside the goals of docs/gpu.md, pass or
fail, printed at the end and first in the Markdown report. `--device cpu` without --quick runs the plan's
CPU sizes (plan.py: the GPU run's tree sizes and contexts at small shapes).

All weights are random (the node has no network): acceptance and tau mean nothing; timings, memory and
token equality are what count. The JSON is rewritten after every part and inside the long ones, so a run
cut short (a timeout, an out-of-memory kill) still reports; a failing part records its error and the
traceback's last lines, and the next part runs. Each part has its own time budget (plan.py), the long
parts stopping early when it is spent, saying so; `--budget-s` caps their sum, and a part that would not fit
is skipped with the reason. `python -m graft.gpu_check.markdown <json>` writes the report's tables (report.md).

Modules: plan.py (the shapes, sizes and time budgets of every part, FULL, CPU and QUICK), report.py (the JSON
report, a part's context, the summary), goals.py (the goals), markdown.py (the tables), measure.py (timing and model helpers the parts
share), one module per part or two (environment, lossless, syncs, dense, moe, compiled, batched), and __main__.py (the
command).
"""
