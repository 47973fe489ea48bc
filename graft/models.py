"""Loading targets: the embedded model, Hugging Face checkpoints (Hub id or local directory), and tiny
random-weight models built from a config for tests. Also the chat formatting shared by all of them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from graft.backends import TargetBackend
from graft.backends.hf import HFBackend
from graft.backends.lean import LeanBackend
from graft.config import ConfigError, HardwareConfig, ModelConfig
from graft.embedded import ensure_smollm2
from graft.fast import apply_fast_path


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


def resolve_device(hardware: HardwareConfig) -> torch.device:
    if hardware.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if hardware.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("hardware.device='cuda' but torch sees no CUDA device; use hardware=cpu")
    return torch.device(hardware.device)


def _dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return getattr(torch, name)


def _random_model(cfg: ModelConfig, dtype: torch.dtype):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM

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


def looks_local(path: str) -> bool:
    """Hub ids are `name` or `org/name`; anything else that is not on disk was meant as a local path."""
    return path.startswith(("/", ".", "~")) or path.count("/") > 1 or "\\" in path


def _pretrained(cfg: ModelConfig, dtype: torch.dtype, device: torch.device):
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
    kwargs = dict(dtype=dtype, attn_implementation=cfg.attn_implementation)
    if cfg.device_map:
        kwargs["device_map"] = cfg.device_map
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except OSError as err:
        where = f"local directory {path}" if local else f"Hugging Face Hub id '{cfg.path}'"
        raise ModelLoadError(
            f"could not load model '{cfg.name}' from the {where}: {str(err).splitlines()[0]}\n"
            "Without Hub access, download the checkpoint elsewhere and pass model.path=/local/dir."
        ) from err
    if not cfg.device_map:
        model = model.to(device)
    return model, tokenizer


def load_model(cfg: ModelConfig, hardware: HardwareConfig, progress: bool = True) -> LoadedModel:
    if hardware.num_threads:
        torch.set_num_threads(hardware.num_threads)
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
        model, tokenizer = _pretrained(cfg, dtype, device)
        source = cfg.path
    if hardware.fast_path == "none":
        target: TargetBackend = HFBackend(model, tokenizer, name=cfg.name)
    else:
        try:
            model, make_linear = apply_fast_path(model, hardware.fast_path)
        except ValueError as err:
            raise ConfigError(str(err)) from err
        target = LeanBackend(model, tokenizer, make_linear, name=cfg.name)
    if cfg.max_context:
        target.max_context = cfg.max_context
    stop_ids = _stop_ids(model, tokenizer, cfg.stop_tokens)
    chat = ChatFormatter(tokenizer, chat_template=cfg.chat_template, system_prompt=cfg.system_prompt)
    return LoadedModel(target=target, chat=chat, stop_ids=stop_ids, source=source)


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
