"""One benchmark run: load the target, build the drafters of the compared methods (one, or a comparison's
several) and the autoregressive baseline, then for each prompt run them all in an order that rotates per
prompt, after an untimed warm-up of each; check losslessness against the baseline and write the record.
`method=ar` runs the baseline alone. This module orders the phases; conversation.py, warmup.py, batched.py,
prompt_records.py and summaries.py are their parts."""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from baselines.autoregressive import Autoregressive
from graft.analysis.plots import plot_comparison_pareto
from graft.analysis.stats import INTERVAL_METHOD, intervals
from graft.backends.compiling import compile_counts
from graft.config.schema import ExperimentConfig
from graft.data.loading import BUILT_WITH_TOKENIZER, Prompt, load_prompts
from graft.decode import SamplingConfig
from graft.load.models import LoadedModel, load_model
from graft.load.resolve import resolve as resolve_artefacts
from graft.plan.hardware import check_memory, resolve_hardware
from graft.records.metrics import batch_summary
from graft.records.writer import RunDir, completed_summary, hardware_info, peak_memory, records_digest
from graft.registry import build_drafter
from graft.run.batched import STREAM_FACTOR, batched_hardware, measure_batched, stream_repeats
from graft.run.prompt_records import method_view, prompt_record, repeat_id
from graft.run.provenance import collect as collect_provenance
from graft.run.provenance import commit_hash_of, resumed_update
from graft.run.summaries import add_repeats, summarise
from graft.run.tracking import make_logger
from graft.run.wandb_naming import logged_config, run_tags, sweep_group, task_overrides
from graft.run.warmup import WarmUp

log = logging.getLogger(__name__)


@dataclass
class Progress:
    """The run so far: this selection's records (the earlier ones first), the latest summary of them and the
    figures drawn; what the logger is handed at the end, however the run ends."""

    records: list[dict]
    summary: dict
    figures: list[Path] = field(default_factory=list)


def run(cfg: ExperimentConfig, resolved: dict, experiment: str | None = None) -> dict:
    """A single-method run (today's records: `method`, `baseline` per prompt) or a comparison
    (`methods=[...]`: every method and ONE baseline per prompt; one summary per method and a comparison
    summary)."""
    run_cfg = cfg.run
    sampling = SamplingConfig(temperature=run_cfg.temperature, top_p=run_cfg.top_p)
    plan = {"num_prompts": run_cfg.num_prompts, "dataset_num_prompts": cfg.dataset.num_prompts}
    if run_cfg.repeats > 1:  # (run.repeats=1 keeps the plan, and so the completeness, of runs before repeats)
        plan["repeats"] = run_cfg.repeats
    done = completed_summary(run_cfg.out_dir, resolved, plan)
    if done is not None:
        log.info("%s: already complete for this config; nothing to run", run_cfg.out_dir)
        return done
    if cfg.dataset.source not in BUILT_WITH_TOKENIZER:
        load_prompts(cfg.dataset, cfg.paths.data_root)  # bad dataset input fails before the model loads
    cfg, choice = resolve_hardware(cfg)  # hardware=auto: CUDA (as many GPUs as the plan needs) or the CPU
    log.info(choice.line)
    check_memory(cfg)  # a model this machine cannot hold is refused here, in seconds, with the figures
    artefacts = resolve_artefacts(cfg)  # every missing file named at once, heads fetched, before the target loads
    rundir = RunDir(run_cfg.out_dir, resolved)  # writable, no other config's results, ours alone: before loading
    try:
        return _run_in(
            rundir, cfg, resolved=resolved, experiment=experiment, choice=choice, artefacts=artefacts, plan=plan,
            sampling=sampling,
        )  # fmt: skip
    finally:
        rundir.close()  # the folder's lock let go of, however the run ended


def _run_in(rundir: RunDir, cfg, *, resolved: dict, experiment, choice, artefacts, plan: dict, sampling) -> dict:
    """The run proper, in its locked folder: load the model and the prompts, describe the hardware, build the
    contenders, measure every prompt not yet recorded, summarise."""
    run_cfg = cfg.run
    model, prompts = load_model_and_prompts(cfg)
    hardware = describe_hardware(model, choice)
    comparison = cfg.methods is not None
    label = "compare" if comparison else cfg.method.name
    meta = run_meta(cfg, model, hardware)
    # at run.batch_size=B a cost-aware method measures its costs at B (graft/methods/auto_budget.py)
    contenders = {m.name: build_drafter(m, model.target, run_cfg.batch_size) for m in cfg.compared}
    provenance = start_folder(rundir, cfg, model, hardware=hardware, artefacts=artefacts)
    only_ar = not comparison and isinstance(contenders[cfg.method.name], Autoregressive)
    baseline = None if only_ar else Autoregressive(model.target)
    repeats, passes = plan_passes(run_cfg, prompts)
    records, todo = still_to_measure(rundir, passes, out_dir=run_cfg.out_dir)
    configs = method_configs(cfg, contenders)
    summaries = functools.partial(summarise, meta=meta, configs=configs, method=cfg.method.name, comparison=comparison)
    progress, failed = Progress(records, summaries(records)), True
    logger = open_logger(
        cfg, resolved, experiment=experiment, label=label, configs=configs, provenance=provenance, hardware=hardware
    )
    try:
        warm = warm_up(model, [baseline, *contenders.values()], todo=todo, run_cfg=run_cfg, sampling=sampling)
        counts = compile_counts()
        bar = tqdm(total=len(todo), desc=f"{label} on {cfg.dataset.name}", unit="prompt", disable=not run_cfg.progress)
        measured = measurements(model, cfg, contenders, baseline=baseline, todo=todo, sampling=sampling, warm=warm)
        record_measured(
            rundir,
            measured,
            progress=progress,
            summaries=summaries,
            logger=logger,
            contenders=contenders,
            comparison=comparison,
            bar=bar,
        )
        bar.close()
        progress.summary["peak_memory"] = peak_memory(model.target.devices)
        record_compiles(rundir, model, progress.summary, warm=warm, counts=counts)
        finish_summary(progress, cfg, plan=plan, passes=passes, repeats=repeats, contenders=contenders)
        write_summaries(rundir, progress, comparison=comparison)
        failed = False
        return progress.summary
    finally:
        logger.finish(progress.summary, progress.records, progress.figures, failed=failed)


def load_model_and_prompts(cfg) -> tuple[LoadedModel, list[Prompt]]:
    """The target, loaded for the hardware a batch runs on, and the run's prompts (the first run.num_prompts)."""
    run_cfg = cfg.run
    hardware_cfg = batched_hardware(cfg.hardware, run_cfg.batch_size)
    model = load_model(cfg.model, hardware_cfg, progress=run_cfg.progress)
    prompts = load_prompts(cfg.dataset, cfg.paths.data_root, model.chat)
    if run_cfg.num_prompts:
        if run_cfg.num_prompts > len(prompts):
            log.warning(
                "run.num_prompts=%d, but %s has %d: running %d",
                run_cfg.num_prompts,
                cfg.dataset.name,
                len(prompts),
                len(prompts),
            )
        prompts = prompts[: run_cfg.num_prompts]
    return model, prompts


def describe_hardware(model: LoadedModel, choice) -> dict:
    """run.json's and the summary's `hardware`: the device, what hardware=auto chose, the timing, compile mode and
    kernels."""
    hardware = hardware_info(str(model.target.device), model.target.attention)
    hardware["choice"] = choice.record()  # what hardware=auto settled on, and why
    hardware["timing"] = model.target.timing
    hardware["compile"] = model.target.compile_mode or "off"
    if model.target.kernels:
        hardware["kernels"] = model.target.kernels
    return hardware


def run_meta(cfg, model: LoadedModel, hardware: dict) -> dict:
    """What every summary of the run says of it: model, method, dataset, hardware and the decoding settings."""
    run_cfg = cfg.run
    return {
        "model": cfg.model.name,
        "method": cfg.method.name,
        "dataset": cfg.dataset.name,
        "hardware": hardware,
        "model_source": model.source,
        "max_new_tokens": run_cfg.max_new_tokens,
        "temperature": run_cfg.temperature,
    }


def start_folder(rundir: RunDir, cfg, model: LoadedModel, *, hardware: dict, artefacts) -> dict:
    """run.json started with the hardware, the artefacts and the provenance, which it returns; a resumed folder
    keeps its first provenance and adds a different one."""
    provenance = collect_provenance(cfg, model.source, commit_hash_of(model.target))  # one `git status`
    rundir.start({"hardware": hardware, "artefacts": artefacts, "provenance": provenance})
    resumed = resumed_update(json.loads(rundir.run_path.read_text()), provenance)
    if resumed is not None:  # a resumed folder: the first run's provenance stays, a different one is added
        rundir.update_run(resumed)
    return provenance


def plan_passes(run_cfg, prompts: list[Prompt]) -> tuple[int, list[tuple[int, int, Prompt]]]:
    """(the passes over the prompts, every (repeat, index, prompt) of them in the order they run)."""
    # repeat k (run.repeats) of every prompt after repeat k - 1 of all of them, each its own record (repeat_id)
    repeats = stream_repeats(run_cfg.batch_size, len(prompts), run_cfg.repeats)
    if repeats > run_cfg.repeats:
        log.info(
            "run.batch_size=%d: %d prompts repeated %d times, a stream of at least %d x B sequences",
            run_cfg.batch_size, len(prompts), repeats, STREAM_FACTOR,
        )  # fmt: skip
    return repeats, [(k, i, p) for k in range(1, repeats + 1) for i, p in enumerate(prompts)]


def still_to_measure(rundir: RunDir, passes: list, *, out_dir) -> tuple[list[dict], list]:
    """(the folder's records of these passes, the passes not yet recorded)."""
    # the summary describes this command's prompts: records of a larger earlier selection stay in
    # samples.jsonl but are not counted (a rerun with fewer prompts reports those only)
    selected = {repeat_id(p.id, k) for k, _, p in passes}
    earlier = rundir.finished()
    records = [r for r in earlier if r["id"] in selected]
    if len(records) < len(earlier):
        log.info("%d records in %s are outside this selection; not summarised", len(earlier) - len(records), out_dir)
    finished_ids = {r["id"] for r in records}
    return records, [(k, i, p) for k, i, p in passes if repeat_id(p.id, k) not in finished_ids]


def method_configs(cfg, contenders: dict) -> dict[str, dict]:
    """Every compared method's settings, defaults resolved, with what its drafter decided (block size, the batch
    size of its cost profile)."""
    run_cfg = cfg.run
    configs = {m.name: m.flat() for m in cfg.compared}  # every key of each method, defaults resolved
    for name, drafter in contenders.items():  # what a checkpoint decided: the block size actually used
        used = getattr(getattr(drafter, "source", None), "block_size", None)
        if "block_size" in configs[name] and used is not None:
            configs[name]["block_size"] = used
        profiled = cost_profile_batch(drafter)
        if profiled is not None and (profiled > 1 or run_cfg.batch_size > 1):  # batch 1 records what it did
            configs[name]["cost_profile_batch"] = profiled  # the batch size its cost profile was measured at
    return configs


def cost_profile_batch(drafter) -> int | None:
    """The batch size the cost profile of a cost-aware drafter (its split or trim auto) was measured at; None
    for a drafter that reads no profile."""
    parts = (getattr(drafter, "split", None), getattr(drafter, "trim", None))
    profiles = [part.profile for part in parts if getattr(part, "profile", None) is not None]
    return profiles[0].batch if profiles else None


def open_logger(cfg, resolved: dict, *, experiment, label: str, configs: dict, provenance: dict, hardware: dict):
    """The job's experiment logger (graft/run/tracking.py): its W&B run named, grouped, configured and tagged."""
    comparison = cfg.methods is not None
    return make_logger(
        cfg.logger,
        resolved,
        cfg.run.out_dir,
        job_type=label,
        group=sweep_group() or experiment or label,
        overrides=task_overrides(),
        config=logged_config(resolved, configs, provenance, comparison),
        tags=run_tags(cfg.model.name, cfg.dataset.name, hardware),
    )


def warm_up(model: LoadedModel, roles: list, *, todo: list, run_cfg, sampling: SamplingConfig) -> WarmUp:
    """The warm-up of every role (`roles`: the baseline, None where there is none, and the contenders), run now
    where there is a prompt to measure and run.warmup is on."""
    drafters = [d for d in roles if d is not None]
    warm = WarmUp(model, drafters, run_cfg, sampling)
    if todo and run_cfg.warmup:
        warm.start(list({p.id: p for _, _, p in todo}.values()))  # each prompt once, however many repeats
    return warm


def measurements(model: LoadedModel, cfg, contenders: dict, *, baseline, todo: list, sampling, warm: WarmUp):
    """The records of `todo`, measured as they are asked for: one at a time, or a batched group's as one list."""
    run_cfg, comparison = cfg.run, cfg.methods is not None
    if run_cfg.batch_size > 1:
        return measure_batched(model, cfg, contenders, baseline, todo, sampling, comparison, warm=warm)
    settings = {"run_cfg": run_cfg, "sampling": sampling, "comparison": comparison}
    warm = warm if run_cfg.warmup else None
    return (
        prompt_record(
            model, prompt, contenders=contenders, baseline=baseline, index=index, repeat=repeat, warm=warm, **settings
        )
        for repeat, index, prompt in todo
    )


def record_measured(
    rundir: RunDir, measured, *, progress: Progress, summaries, logger, contenders: dict, comparison: bool, bar: tqdm
) -> None:
    """Each record as it is measured: appended to samples.jsonl, the summary rewritten, the logger shown it."""
    with logging_redirect_tqdm(tqdm_class=tqdm):  # a line logged mid-run is written above the bar
        for written in measured:  # a record, or a batched group's records (written in one go)
            written = written if isinstance(written, list) else [written]
            rundir.append_all(written)
            progress.records.extend(written)
            summary = progress.summary = summaries(progress.records)
            rundir.write_summary(summary)
            for record in written:
                if comparison:
                    for name in contenders:
                        logger.log_sample(method_view(record, name), summary["methods"][name], prefix=f"{name}/")
                else:
                    logger.log_sample(record, summary)
            bar.update(len(written))
            bar.set_postfix(done=len(progress.records))


def record_compiles(rundir: RunDir, model: LoadedModel, summary: dict, *, warm: WarmUp, counts: dict) -> None:
    """Compiled: what compiled at the warm-up and inside the timed runs, in the summary and run.json."""
    if model.target.compile_mode is not None:  # a graph compiled after the warm-up was timed: say so
        compile_info = warm.record({key: value - counts[key] for key, value in compile_counts().items()})
        summary["compile"] = compile_info
        rundir.update_run({"compile": compile_info})


def finish_summary(progress: Progress, cfg, *, plan: dict, passes: list, repeats: int, contenders: dict) -> None:
    """The summary's last parts: the plan it completes, the intervals, a batched run's throughput and the spread
    over repeats."""
    summary, records = progress.summary, progress.records
    run_cfg, comparison = cfg.run, cfg.methods is not None
    # every prompt of this plan is recorded: a rerun skips the job while samples.jsonl still holds these
    ids = [repeat_id(p.id, k) for k, _, p in passes]
    by_id = {r["id"]: r for r in records}
    summary["complete"] = {"plan": plan, "ids": ids, "records_sha1": records_digest([by_id[i] for i in ids])}
    # 95% intervals over these prompts, overall and per category, keyed by method name (graft/analysis/stats.py)
    named = records if comparison else [{**r, "_method": cfg.method.name} for r in records]
    summary["intervals"] = intervals(named)
    summary["interval_method"] = INTERVAL_METHOD
    if run_cfg.batch_size > 1:  # throughput over the whole batch, per-sequence latency, nodes per batched step
        summary["batch"] = {**batch_summary(records, run_cfg.batch_size), "stream_repeats": repeats}
    if repeats > 1:  # each headline ratio per repeat: the machine's noise between runs
        add_repeats(summary, records, repeats, list(contenders) if comparison else None)


def write_summaries(rundir: RunDir, progress: Progress, *, comparison: bool) -> None:
    """summary.json, and a comparison's per-method summaries and Pareto figure."""
    summary = progress.summary
    rundir.write_summary(summary)
    if comparison:
        for name, method_summary in summary["methods"].items():
            rundir.write_json(f"summaries/{name}.json", method_summary)
        if summary["n_prompts"]:
            progress.figures.append(plot_comparison_pareto(summary, rundir.path / "pareto.png"))
