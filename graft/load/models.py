"""Loading targets: the embedded model, Hugging Face checkpoints (Hub id or local directory), and tiny
random-weight models built from a config for tests. Also the chat formatting shared by all of them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from graft.backends.hf import HFBackend
from graft.backends.target import TargetBackend
from graft.config.schema import HardwareConfig, ModelConfig
from graft.cpu.lean import LeanBackend
from graft.cpu.products import ATTENTION_NAME, apply_fast_path, register_attention
from graft.hub import looks_local
from graft.load.embedded import ensure_smollm2
from graft.plan.hardware import resolve_device
from graft.schema import ConfigError


class ModelLoadError(RuntimeError):
    pass


class ByteTokenizer:
    """A dependency-free tokenizer for random-weight test models: one id per UTF-8 byte plus specials."""

    BOS, EOS, USER, ASSISTANT, SYSTEM = 256, 257, 258, 259, 260
    vocab_size = 261
    eos_token_id = EOS
    chat_template = None
    _roles = {"user": USER, "assistant": ASSISTANT, "system": SYSTEM}

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        data = bytes(i for i in ids if i < 256)
        return data.decode("utf-8", errors="replace")

    def render_chat(self, messages: list[dict]) -> list[int]:
        ids = [self.BOS]
        for message in messages:
            ids += [self._roles[message["role"]], *self.encode(message["content"]), self.EOS]
        return ids + [self.ASSISTANT]


@dataclass
class ChatFormatter:
    """Turns a conversation into prompt token ids with the tokenizer's chat template (or the model config's)."""

    tokenizer: object
    chat_template: str | None = None
    system_prompt: str | None = None

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        if self.system_prompt and (not messages or messages[0]["role"] != "system"):
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        if isinstance(self.tokenizer, ByteTokenizer):
            return self.tokenizer.render_chat(messages)
        template = self.chat_template or getattr(self.tokenizer, "chat_template", None)
        if not template:
            raise ConfigError("the tokenizer has no chat template; name one in the model config (model.chat_template)")
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, chat_template=template
        )
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode(self, text: str) -> list[int]:
        if isinstance(self.tokenizer, ByteTokenizer):
            return self.tokenizer.encode(text)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


@dataclass
class LoadedModel:
    target: TargetBackend
    chat: ChatFormatter
    stop_ids: set[int]
    source: str  # where the weights came from


def _dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return getattr(torch, name)


def _random_model(cfg: ModelConfig, dtype: torch.dtype):
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    classes = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
        "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
    }
    if cfg.architecture not in classes:
        raise ConfigError(f"model.architecture={cfg.architecture!r}; allowed for random models: {', '.join(classes)}")
    config_cls, model_cls = classes[cfg.architecture]
    config = config_cls(**cfg.arch_config)
    if config.vocab_size < ByteTokenizer.vocab_size:
        raise ConfigError(f"model.arch_config.vocab_size={config.vocab_size} must be >= {ByteTokenizer.vocab_size}")
    torch.manual_seed(cfg.seed)
    model = model_cls(config)
    return model.to(dtype)


def _pretrained(cfg: ModelConfig, hardware: HardwareConfig, dtype: torch.dtype, device: torch.device):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not cfg.path:
        raise ConfigError(
            f"model '{cfg.name}' has source 'pretrained' but no model.path (a Hub id or a local directory)"
        )
    path = os.path.expanduser(cfg.path)
    local = Path(path).exists()
    if not local and looks_local(cfg.path):
        raise ModelLoadError(
            f"model.path={cfg.path}: no such directory. Point model.path at a local checkpoint or use a Hub id."
        )
    if local and Path(path).is_dir() and not (Path(path) / "config.json").is_file():
        raise ModelLoadError(
            f"model.path={cfg.path} has no config.json: not a Hugging Face model folder "
            "(it needs config.json, the weights and the tokenizer files)"
        )
    kwargs = dict(dtype=dtype, attn_implementation=cfg.attn_implementation, **placement(cfg, hardware, device))
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except Exception as err:  # ValueError: a folder without a model or tokenizer in it; SafetensorError: torn weights
        if not isinstance(err, (OSError, ValueError)) and type(err).__name__ != "SafetensorError":
            raise
        where = f"local directory {path}" if local else f"Hugging Face Hub id '{cfg.path}'"
        detail = (str(err).strip().splitlines() or [type(err).__name__])[0]
        if type(err).__name__ == "SafetensorError" and local:  # its message names no file: the weights are these
            files = sorted(p.name for p in Path(path).glob("*.safetensors"))
            detail = f"{', '.join(files)} not readable as safetensors ({detail}; a torn or partial download?)"
        raise ModelLoadError(
            f"could not load model '{cfg.name}' from the {where}: {detail}\n"
            "Without Hub access, download the checkpoint elsewhere and pass model.path=/local/dir."
        ) from err
    if "device_map" in kwargs:
        check_no_offload(getattr(model, "hf_device_map", {}), cfg.name)
    elif "tp_plan" not in kwargs:
        model = model.to(device)
    return model, tokenizer


def placement(cfg: ModelConfig, hardware: HardwareConfig, device: torch.device) -> dict:
    """from_pretrained's placement arguments: one device, a planned device_map over the node's GPUs with
    max_memory per GPU, or a tensor-parallel plan under torchrun."""
    if hardware.tensor_parallel:
        if "WORLD_SIZE" not in os.environ:
            raise ConfigError(
                "hardware.tensor_parallel=true runs one process per GPU: start it with "
                "`torchrun --nproc-per-node=<GPUs> run.py ...`"
            )
        return {"tp_plan": "auto"}
    device_map = hardware.device_map or cfg.device_map
    if not device_map:
        return {}
    if device.type == "cuda" and device_map == "auto":
        # the first model.num_gpus GPUs (graft/plan/hardware.resolve_hardware settles "auto" from the memory plan)
        gpus = torch.cuda.device_count() if cfg.num_gpus == "auto" else cfg.num_gpus
        if torch.cuda.device_count() < gpus:
            raise ConfigError(
                f"model={cfg.name} needs model.num_gpus={cfg.num_gpus} GPUs; torch sees {torch.cuda.device_count()}"
            )
        # no "cpu" entry: a model that does not fit is refused below instead of running from host memory
        budget = {
            i: int(torch.cuda.get_device_properties(i).total_memory * hardware.gpu_memory_fraction) for i in range(gpus)
        }
        return {"device_map": "auto", "max_memory": budget}
    return {"device_map": device_map}


def check_no_offload(device_map: dict, name: str) -> None:
    """Refuse a plan that put layers on the CPU or disk: it would run, slowly, and bias every speedup."""
    offloaded = sorted(module for module, where in device_map.items() if str(where) in ("cpu", "disk"))
    if offloaded and any(str(where) not in ("cpu", "disk") for where in device_map.values()):
        raise ModelLoadError(
            f"model={name} does not fit the GPUs: {len(offloaded)} modules were placed on the CPU or disk "
            f"({', '.join(offloaded[:4])}{', ...' if len(offloaded) > 4 else ''}). Use more GPUs, the FP8 "
            "variant (model.fp8_path), or raise hardware.gpu_memory_fraction."
        )


def load_model(cfg: ModelConfig, hardware: HardwareConfig, progress: bool = True) -> LoadedModel:
    from graft.cpu import threads

    threads.apply(hardware.num_threads)
    device = resolve_device(hardware)
    dtype = _dtype(cfg.dtype, device)
    if cfg.source == "random":
        model, tokenizer, source = (
            _random_model(cfg, dtype).to(device),
            ByteTokenizer(),
            f"random weights, seed {cfg.seed}",
        )
    elif cfg.source == "embedded":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = ensure_smollm2(progress=progress)
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=cfg.attn_implementation).to(
            device
        )
        source = str(path)
    else:
        model, tokenizer = _pretrained(cfg, hardware, dtype, device)
        source = cfg.path
    if hardware.attention:
        use_attention(model, hardware.attention)
    if hardware.fast_path == "none":
        target: TargetBackend = HFBackend(model, tokenizer, name=cfg.name)
    else:
        try:
            model, make_linear = apply_fast_path(model, hardware.fast_path)
        except ValueError as err:
            raise ConfigError(str(err)) from err
        try:
            target = LeanBackend(
                model,
                tokenizer,
                make_linear,
                name=cfg.name,
                one_row_kernel=hardware.one_row_kernel,
                native_mode=hardware.native,
                product_kernel=hardware.product_kernel,
            )
        except ValueError as err:
            raise ConfigError(str(err)) from err
        if hardware.cache_dtype != "auto":
            target.cache_dtype = getattr(torch, hardware.cache_dtype)
    if cfg.max_context:
        target.max_context = cfg.max_context
    target.prefill_chunk = hardware.prefill_chunk
    target.fixed_size_trees = hardware.fixed_size_trees
    target.tree_bucket = hardware.tree_bucket
    target.compile_mode = None if hardware.compile == "off" else hardware.compile
    target.compile_backend = hardware.compile_backend
    target.timing = {"sync": "sync", "async": "host"}.get(
        hardware.timing, "events" if device.type == "cuda" else "host"
    )
    stop_ids = _stop_ids(model, tokenizer, cfg.stop_tokens)
    chat = ChatFormatter(tokenizer, chat_template=cfg.chat_template, system_prompt=cfg.system_prompt)
    return LoadedModel(target=target, chat=chat, stop_ids=stop_ids, source=source)


def load_chat(cfg: ModelConfig, progress: bool = False) -> tuple[ChatFormatter, str, set[int]]:
    """The model's chat formatting, where its weights live and its stop ids, without loading the weights: what a
    peer engine (graft/peers) needs to decode the same prompts as this harness."""
    from transformers import AutoTokenizer, GenerationConfig

    if cfg.source == "random":
        raise ConfigError(
            f"model={cfg.name} has random weights, built in this process; a peer engine needs a checkpoint"
        )
    path = str(ensure_smollm2(progress=progress)) if cfg.source == "embedded" else os.path.expanduser(cfg.path or "")
    if not path:
        raise ConfigError(f"model '{cfg.name}' has no model.path (a Hub id or a local directory)")
    tokenizer = AutoTokenizer.from_pretrained(path)
    try:
        generation = GenerationConfig.from_pretrained(path)
    except OSError:  # a checkpoint without generation_config.json: the tokenizer's end token alone
        generation = None
    holder = type("Holder", (), {"generation_config": generation})()
    stop_ids = _stop_ids(holder, tokenizer, cfg.stop_tokens)
    return ChatFormatter(tokenizer, chat_template=cfg.chat_template, system_prompt=cfg.system_prompt), path, stop_ids


def use_attention(model, name: str) -> None:
    """Switch transformers' attention kernel after loading (it is looked up at every forward)."""
    from transformers import AttentionInterface

    if name == ATTENTION_NAME:
        register_attention()
    allowed = ["eager", *AttentionInterface._global_mapping]
    if name not in allowed:
        raise ConfigError(f"hardware.attention={name!r}; allowed: {', '.join(sorted(allowed))}")
    model.config._attn_implementation = name


def _stop_ids(model, tokenizer, extra: list[str]) -> set[int]:
    ids: set[int] = set()
    for source in (
        getattr(tokenizer, "eos_token_id", None),
        getattr(getattr(model, "generation_config", None), "eos_token_id", None),
    ):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(source)
    for token in extra:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is None or token_id == getattr(tokenizer, "unk_token_id", -1):
            raise ConfigError(f"model.stop_tokens names '{token}', which the tokenizer does not know")
        ids.add(token_id)
    return ids
