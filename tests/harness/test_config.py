import itertools
from pathlib import Path

import pytest
from conftest import compose

from graft.config.experiment import validate
from graft.config.hydra_setup import group_options
from graft.config.override_checks import check_overrides
from graft.schema import ConfigError

GROUP_NAMES = ["model", "method", "dataset", "logger", "hardware"]


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUP_NAMES for o in group_options(g)])
def test_every_config_file_composes_and_validates(group, option):
    overrides = [f"{group}={option}"]
    if group == "model" and compose(overrides)["model"]["draft_head"] is None:
        with pytest.raises(ConfigError, match="methods=\\[pld\\]"):  # the default comparison drafts with a head
            validate(compose(overrides))
        overrides.append("methods=[pld]")
    cfg = validate(compose(overrides))
    assert getattr(cfg, group).name == option  # a method records its own config name (eagle3_chain, not eagle3)


def test_models_and_methods_compose_in_every_pairing():
    """Every (model, method) pair validates, or is refused naming the file it lacks. Model and method configs
    write only their own sections (no package directives, no interpolations across groups: checked on sample
    pairs against Hydra's own compose), so each pair is assembled from one compose per model and per method
    instead of 266 composes (35 s)."""
    models = {model: compose([f"model={model}"]) for model in group_options("model")}
    methods = {method: compose([f"method={method}"]) for method in group_options("method")}

    def pair(model: str, method: str) -> dict:
        return {**models[model], "method": methods[method]["method"], "methods": methods[method]["methods"]}

    pairs = list(itertools.product(models, methods))
    sample = [(list(models)[i % len(models)], method) for i, method in enumerate(methods)]  # each of both, once
    for model, method in sample:
        assert pair(model, method) == compose([f"model={model}", f"method={method}"]), (model, method)
    keys_of = {method: validate(raw).method.keys() for method, raw in methods.items()}
    for model, method in pairs:
        raw = pair(model, method)
        keys = keys_of[method]
        missing = [  # pretrained (and models without a block drafter): nothing published to default to
            key
            for key, field in (("head", "draft_head"), ("checkpoint", "block_drafter"))
            if key in keys and raw["model"][field] is None
        ]
        if missing:
            with pytest.raises(ConfigError, match=f"method.{missing[0]}"):
                validate(raw)
            continue
        cfg = validate(raw)
        assert cfg.model.name == model and cfg.method.name == method


def test_any_schema_key_can_be_overridden_without_plus():
    cfg = validate(
        compose(["dataset.path=/x.jsonl", "model.system_prompt=hi", "hardware.num_threads=1", "logger.dir=/tmp"])
    )
    assert (cfg.dataset.path, cfg.model.system_prompt, cfg.hardware.num_threads) == ("/x.jsonl", "hi", 1)


@pytest.mark.parametrize("experiment", group_options("experiment"))
def test_every_experiment_composes(experiment):
    validate(compose([f"experiment={experiment}"]))


def test_defaults_are_the_embedded_model_on_builtin_prompts():
    cfg = validate(compose([]))
    assert (cfg.model.name, cfg.dataset.name, cfg.model.source) == ("smollm2_135m", "builtin_quick", "embedded")
    assert [m.name for m in cfg.methods] == ["pld", "eagle3", "pruned", "graft", "graft_auto"]
    assert cfg.run.max_new_tokens == 64


@pytest.mark.parametrize(
    "argv,needles",
    [
        (["model=llama9"], ["unknown model 'llama9'", "smollm2_135m", "tiny_llama"]),
        (["method=graftt"], ["unknown method 'graftt'", "pld"]),
        (["dataset=nope"], ["unknown dataset 'nope'", "builtin"]),
        (["run.max_new_tokn=3"], ["run.max_new_tokn", "max_new_tokens", "did you mean"]),
        (["method=pld", "method.ngram=2"], ["method.ngram", "max_ngram"]),
        (["modle=tiny_llama"], ["unknown override 'modle'", "did you mean 'model'"]),
        (["foo.bar=1"], ["unknown config section 'foo'"]),
        (["run.out_dir=~/x"], ["at '~' (character 13)", """'run.out_dir="~/x"'"""]),
        (["model.system_prompt=ça"], ["at 'ç'", """'model.system_prompt="ça"'"""]),
        (["methods=[ar]"], ["lists ar, the autoregressive baseline", "methods=[pld]"]),
    ],
)
def test_bad_overrides_name_the_key_and_what_is_allowed(argv, needles):
    with pytest.raises(ConfigError) as err:
        check_overrides(argv)
    for needle in needles:
        assert needle in str(err.value)


def test_a_quoted_home_in_the_output_folder_is_expanded():
    """Hydra keeps a quoted ~ as it is, and the run would write into ./~/x: run.out_dir expands it, as a shell
    does; the folder Hydra writes its own files to follows."""
    home = str(Path("~").expanduser())
    out = check_overrides(['run.out_dir="~/x"'])
    assert f'run.out_dir="{home}/x"' in out and f'hydra.run.dir="{home}/x"' in out
    assert check_overrides(["run.out_dir=a b"])[-1] == "hydra.run.dir=a b"  # spaces: Hydra's grammar takes them


def test_hydra_errors_become_one_line():
    """What Hydra says about a composition, without its search path and with the cause (hydra_problem)."""
    from graft.config.override_checks import compose_checked

    with pytest.raises(ConfigError) as err:
        compose_checked(["model=tiny_llama", "model.arch_config.foo=1"])  # a key of a mapping Hydra keeps closed
    assert "Key 'foo' is not in struct" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "mutate,needles",
    [
        (lambda c: c["model"].update(dtype="flaot32"), ["model.dtype='flaot32'", "float32", "bfloat16"]),
        (lambda c: c["run"].update(max_new_tokens=0), ["run.max_new_tokens=0", ">= 1"]),
        (lambda c: c["run"].update(temperature="hot"), ["run.temperature", "number"]),
        (lambda c: c["run"].update(extra=1), ["unknown key 'extra' in run", "max_new_tokens"]),
        (lambda c: c["method"].update(num_pred_tokens=0), ["num_pred_tokens must be >= 1"]),
        (lambda c: c["logger"].update(mode="sometimes"), ["logger.mode='sometimes'", "offline"]),
        (
            lambda c: c["hardware"].update(fast_path="none", cache_dtype="bfloat16"),
            ["hardware.cache_dtype='bfloat16'", "auto with hardware.fast_path=none", "packed_bf16"],
        ),
        (lambda c: c["hardware"].update(cache_dtype="fp8"), ["hardware.cache_dtype='fp8'", "bfloat16"]),
    ],
)
def test_bad_values_in_a_composed_config(mutate, needles):
    cfg = compose(["method=pld"])
    mutate(cfg)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    for needle in needles:
        assert needle in str(err.value)


def test_vicuna_template_renders_fastchat_v1_1():
    import jinja2

    template = compose(["model=vicuna_7b"])["model"]["chat_template"]
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    text = jinja2.Template(template).render(messages=messages, bos_token="<s>", add_generation_prompt=True)
    assert text == (
        "<s>A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
        "detailed, and polite answers to the user's questions. USER: Hi ASSISTANT: Hello!</s>USER: Bye ASSISTANT:"
    )


def test_hydras_flags_and_their_values_are_not_read_as_overrides():
    from graft.config.override_checks import check_syntax
    from graft.schema import ConfigError

    check_syntax(["--cfg", "job", "-cn", "config", "--info", "defaults", "--cfg=job", "method=graft"])
    with pytest.raises(ConfigError, match="character 13"):  # an override after the flags is still checked
        check_syntax(["--cfg", "job", "run.out_dir=~/x"])
