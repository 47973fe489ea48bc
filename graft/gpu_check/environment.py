"""Part 1 of the device check: the environment (device, driver, CUDA, versions, memory, SDPA kernels)."""

from __future__ import annotations

import os
import platform
import subprocess
import warnings

import torch

from graft.gpu_check.measure import gib, sync, version_of
from graft.gpu_check.report import Context


def nvidia_smi() -> dict | None:
    query = "name,driver_version,memory.total,clocks.max.sm,power.limit"
    try:
        line = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return dict(zip(query.split(","), (v.strip() for v in line.splitlines()[0].split(",")))) if line else None


def sdpa_probe(device: torch.device, dtype: torch.dtype) -> dict:
    """Which SDPA kernels run here, causal without a mask (prefill) and with an additive mask (the harness's
    tree verification): the enabled flags say what torch may pick, the probe what works."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 8, 64, 64, device=device, dtype=dtype)
    mask = torch.zeros(1, 1, 64, 64, device=device, dtype=dtype)
    out = {}
    for backend in (
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.MATH,
    ):
        row = {}
        for case, kwargs in (("causal", {"is_causal": True}), ("masked", {"attn_mask": mask})):
            try:
                with sdpa_kernel(backend), warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # a refused kernel warns why; the probe records the outcome
                    torch.nn.functional.scaled_dot_product_attention(q, q, q, **kwargs)
                sync(device)
                row[case] = True
            except Exception:  # "no available kernel" and its kin: this kernel does not run this case here
                row[case] = False
        out[backend.name.lower()] = row
    return out


def part_environment(ctx: Context, out: dict) -> None:
    out.update(
        python=platform.python_version(),
        platform=platform.platform(),
        cpu_count=os.cpu_count(),
        cpu_affinity=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        torch_threads=torch.get_num_threads(),
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        packages={
            p: version_of(p) for p in ("transformers", "accelerate", "hydra-core", "omegaconf", "safetensors", "numpy")
        },
        cuda_available=torch.cuda.is_available(),
        device=str(ctx.device),
    )
    sdp = torch.backends.cuda
    out["sdpa_enabled"] = {
        "flash": sdp.flash_sdp_enabled(),
        "mem_efficient": sdp.mem_efficient_sdp_enabled(),
        "math": sdp.math_sdp_enabled(),
        "cudnn": sdp.cudnn_sdp_enabled() if hasattr(sdp, "cudnn_sdp_enabled") else None,
    }
    if ctx.cuda:
        props = torch.cuda.get_device_properties(ctx.device)
        free, total = torch.cuda.mem_get_info(ctx.device)
        out.update(
            device_name=props.name,
            capability=f"{props.major}.{props.minor}",
            multiprocessors=props.multi_processor_count,
            memory_total_gib=gib(total),
            memory_free_gib=gib(free),
            flash_attention_built=getattr(sdp, "is_flash_attention_available", lambda: None)(),
            tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
            nvidia_smi=nvidia_smi(),
        )
    out["sdpa_probe_" + ctx.plan.dtype] = sdpa_probe(ctx.device, getattr(torch, ctx.plan.dtype))
