"""The device check's plan: the published shapes it builds (in part, with random weights) and the sizes of
every part, FULL on the GPU node and QUICK at tiny shapes (the CPU test)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from graft.config.hydra_setup import CONFIG_DIR

PART_NAMES = {
    1: "environment",
    2: "lossless",
    3: "host_syncs",
    4: "llama8b",
    5: "moe235b_layers",
    6: "head235b",
    7: "compiled",
    8: "lossless_sampled",
    9: "batched",
}
RANDOM_NOTE = "random weights: acceptance and tau are meaningless; only timings, memory and shapes count"


def published_shape(model: str, **extra) -> dict:
    """A model config's declared `shape` (configs/model/<model>.yaml: the published config.json fields the
    memory plan reads) as transformers config fields, plus `extra`. head_dim is left to the config class when
    it is hidden / heads, so that the tiny variants below, which shrink hidden and heads, keep it consistent."""
    import yaml

    shape = yaml.safe_load((CONFIG_DIR / "model" / f"{model}.yaml").read_text())["shape"]
    shape = {k: v for k, v in shape.items() if k != "model_type"}
    if shape.get("head_dim") == shape["hidden_size"] // shape["num_attention_heads"]:
        del shape["head_dim"]
    return {**shape, **extra}


# Published shapes. The 8B and 235B targets are only ever built in part.
LLAMA31_8B = published_shape("llama31_8b", rms_norm_eps=1e-5)
QWEN3_235B = published_shape("qwen3_235b", rms_norm_eps=1e-6)
# SpecForge's configs/qwen3-235B-A22B-eagle3.json (the layout of lmsys/Qwen3-235B-A22B-EAGLE3)
SPECFORGE_235B_HEAD = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 46, 90], "use_aux_hidden_state": True},
    "draft_vocab_size": 32000,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 24576,
    "max_position_embeddings": 40960,
    "model_type": "llama",
    "num_attention_heads": 64,
    "num_hidden_layers": 1,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
    "target_hidden_size": 4096,
}


@dataclass(frozen=True)
class Plan:
    """Sizes of every part: FULL on the GPU node, QUICK at tiny shapes (the CPU test)."""

    # Each part's time budget. A part may run until only the later parts' budgets are left (so seconds an
    # earlier part did not use go to it), and at least for its own budget while the total lasts (so a short
    # total skips the last parts, compile first); the long parts check between their steps. A part with less
    # than half its budget left is skipped, with the reason. FULL's sum (390 s) is what the 8 minutes of
    # scripts/device_check.sh leave the check (tests/gpu/test_gpu_check.py adds them up). Guessed for one H200:
    # no GPU has run it yet. Part 9's 30 s and part 4's 5 s more (dflash's loops, pruning's verify sizes) were
    # taken from parts 2, 3, 5, 7 and 8 (5-10 s each), so the sum stays 390 s.
    part_budget_s: dict = field(
        default_factory=lambda: {
            1: 10,  # environment
            2: 75,  # lossless, greedy: 19 methods x 3 tiny models x 2 dtypes; truncated (and says so) if not done
            3: 25,  # host syncs: 5 methods x 2 tiny models x greedy / temperature 1, counted at the dispatcher
            4: 90,  # 8B-shaped target: the full 32 layers take about 16 GiB and seconds to build on the GPU
            5: 25,  # four 235B-shaped MoE layers (about 19 GiB)
            6: 10,  # the 235B head checkpoint
            7: 85,  # torch.compile: inductor's first compile of each graph is the slow, unpredictable part
            8: 40,  # lossless, sampled: every method's first two tokens at temperature 1 against the target's
            9: 30,  # batch of 8: an 8-layer slice of the 8B shape, 3 methods x (warm-up, counted, timed) runs
        }
    )
    lossless_models: tuple[str, ...] = ("tiny_llama", "tiny_qwen3", "tiny_qwen3_moe")
    lossless_dtypes: tuple[str, ...] = ("float32", "bfloat16")
    lossless_methods: tuple[str, ...] | None = None  # None: every configs/method/*.yaml
    lossless_prompts: int = 2
    lossless_tokens: int = 24
    sync_tokens: tuple[int, int] = (8, 24)  # two generation lengths: their difference excludes the prefill's syncs
    sync_models: tuple[str, ...] = ("tiny_llama", "tiny_qwen3_moe")
    sync_methods: tuple[str, ...] = ("ar", "pld", "eagle3", "pruned", "graft")
    sample_draws: int = 80  # part 8: first-two-token draws per method (a chi-square against the target's own)
    sample_top_p: float = 0.9  # at temperature 1; the nucleus keeps the chi-square's cells few enough to fill
    dense_arch: dict = field(default_factory=lambda: dict(LLAMA31_8B))
    dense_fallback_layers: int = 8  # when the whole model would not fit the time left or the memory
    dense_full_needs_s: float = 45.0  # part 4's own time left below which it builds the fallback's layers
    dense_contexts: tuple[int, ...] = (1024, 8192)
    dense_nodes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 60, 96, 128)
    decode_context: int = 1024
    decode_tokens: int = 64
    decode_methods: tuple[str, ...] = ("ar", "eagle3", "graft", "dflash")  # ar first: the others' steps are over its
    # pruning's kept sizes: a fixed-size tree of 60 cut to its filled nodes in buckets of hardware.tree_bucket = 8
    # (graft/compose.py: ComposedDrafter._bucketed), so the sizes it verifies are multiples of 8 up to 60
    prune_nodes: tuple[int, ...] = (60, 32, 16, 8)
    extend_tokens: int = 8192
    draft_vocab: int = 32000
    moe_arch: dict = field(default_factory=lambda: {**QWEN3_235B, "num_hidden_layers": 4})
    moe_context: int = 1024
    moe_nodes: tuple[int, ...] = (1, 8, 16, 24, 60, 128)
    repeats: int = 10
    warmup: int = 3
    dtype: str = "bfloat16"  # parts 4-6
    hardware: tuple[str, ...] = ()  # overrides of configs/hardware/gpu.yaml
    head235: dict = field(default_factory=lambda: dict(SPECFORGE_235B_HEAD))
    target235: dict = field(default_factory=lambda: dict(QWEN3_235B))
    compile_mode: str = "reduce-overhead"  # part 7: CUDA graphs
    compile_backend: str = "inductor"
    compile_methods: tuple[str, ...] = ("ar", "eagle3", "graft")
    compile_layers: int = 4  # of dense_arch: compile time grows with the layers, the per-layer gain does not
    compile_nodes: tuple[int, ...] = (1, 60)
    # part 9: run.batch_size = batch_size through graft/batch.py, greedy
    batch_size: int = 8
    batch_prompts: int = 12  # of random ids: 8 enter at once, 4 take the slots the first ones leave
    batch_prompt_lens: tuple[int, int] = (16, 48)  # each prompt's length drawn in [low, high)
    batch_tokens: int = 32
    batch_methods: tuple[str, ...] = ("ar", "eagle3", "graft")
    # None: dense_arch with batch_layers of its layers, in `dtype`, with a random EAGLE-3 head (syncs and token
    # equality do not depend on depth; a quarter of the layers builds and runs in a quarter of the time);
    # a name: that tiny model (configs/model) in float32
    batch_model: str | None = None
    batch_layers: int = 8  # at least 4: EAGLE-3's default taps need three distinct layers

    @property
    def total_budget_s(self) -> float:
        return float(sum(self.part_budget_s.values()))


FULL = Plan()
QUICK = replace(
    FULL,
    part_budget_s={1: 30, 2: 120, 3: 60, 4: 120, 5: 60, 6: 30, 7: 180, 8: 60, 9: 60},  # a busy 2-core CPU is slow
    lossless_dtypes=("float32",),
    lossless_methods=("pld", "eagle3", "graft"),
    lossless_prompts=1,
    lossless_tokens=8,
    sync_tokens=(4, 8),
    sync_methods=("ar", "eagle3", "graft"),
    sample_draws=24,
    dense_arch=dict(
        LLAMA31_8B,
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,  # EAGLE-3's default taps need three distinct layers
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    ),
    dense_fallback_layers=4,
    dense_full_needs_s=0.0,
    dense_contexts=(64, 256),
    dense_nodes=(1, 8, 24, 60),
    decode_context=64,
    decode_tokens=8,
    extend_tokens=256,
    draft_vocab=128,
    moe_arch=dict(
        QWEN3_235B,
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_experts=8,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
    ),
    moe_context=64,
    repeats=3,
    warmup=1,
    hardware=("hardware.prefill_chunk=48",),  # tiny prompts still take the chunked prefill path
    compile_mode="default",
    compile_backend="eager",  # dynamo captures the graphs; inductor's code generation would take minutes here
    compile_methods=("ar", "graft"),
    compile_layers=2,
    batch_prompts=10,
    batch_tokens=16,  # graft's fixed-size grafting is slow on a CPU (its device path, vectorised for a GPU)
    batch_model="tiny_llama",
    head235=dict(
        SPECFORGE_235B_HEAD,
        eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": True},
        draft_vocab_size=100,
        head_dim=32,  # != hidden / heads = 16, as in the 235B head
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        target_hidden_size=64,
    ),
    target235=dict(
        QWEN3_235B,
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
    ),
)

# `--device cpu` without --quick: FULL's tree sizes, contexts and goals at QUICK's small shapes (an 8B model
# does not fit this CPU's time), every method lossless in float32; its ratios are the CPU's, not a GPU's
CPU = replace(
    QUICK,
    # part 9: FULL's 12 prompts x 32 tokens; graft's three runs alone take 16 s of this CPU unloaded (its grafting
    # of fixed-size trees is the GPU's vectorised path), several times that on a loaded one
    part_budget_s={1: 20, 2: 150, 3: 90, 4: 200, 5: 40, 6: 20, 7: 120, 8: 60, 9: 120},
    lossless_methods=None,
    lossless_tokens=16,
    sync_methods=FULL.sync_methods,
    sample_draws=40,
    dense_contexts=FULL.dense_contexts,
    dense_nodes=FULL.dense_nodes,
    decode_context=FULL.decode_context,
    decode_tokens=24,
    extend_tokens=1024,
    moe_context=FULL.moe_context,
    moe_nodes=FULL.moe_nodes,
    repeats=3,  # 18 verify cells at up to 8K context: more rounds leave part 4 no time for its decode loops here
    warmup=1,
    batch_prompts=FULL.batch_prompts,
    batch_tokens=FULL.batch_tokens,
)
