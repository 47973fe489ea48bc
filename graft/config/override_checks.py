"""Refusing a bad command line before Hydra composes it (check_overrides): an unknown group option, section or
key, a value Hydra's grammar needs quoted, a sweep without -m, each as one ConfigError line that names it and lists
what is allowed; and what Hydra itself refuses, as one line (compose_checked, hydra_problem).
"""

from __future__ import annotations

import dataclasses

import yaml

from graft.config.comparison import PART_KEYS, baseline_in_methods
from graft.config.experiment import compose
from graft.config.hydra_setup import CONFIG_DIR, GROUPS, compose_prepared, group_options
from graft.config.overrides import names_one_method, prepare_overrides
from graft.config.schema import SECTIONS
from graft.registry import method_config
from graft.schema import ConfigError, require, suggest


def compose_checked(overrides: list[str]) -> dict:
    """compose() for the package's commands (check-lossless, the cost model's): the overrides checked as run.py
    checks them (check_overrides), and whatever Hydra still refuses as one ConfigError line (hydra_problem)."""
    prepared = check_overrides(list(overrides))
    try:
        return compose_prepared(prepared)
    except Exception as err:
        if type(err).__module__.split(".")[0] not in ("hydra", "omegaconf"):
            raise
        raise ConfigError(hydra_problem(err)) from None


def hydra_problem(err: Exception) -> str:
    """What Hydra or OmegaConf said about a config, as one line: its sentences joined, a listing of options
    comma-separated, the cause's first line added; where it searched and indented details left out."""
    parts, skipping = [], False
    cause = str(err.__cause__ or "").strip().splitlines()[:1]
    for line in [*str(err).splitlines(), *cause]:
        if not line.strip() or line.startswith("    "):
            continue
        if line.startswith("\t"):  # an option of the listing above
            if not skipping:
                parts[-1] = f"{parts[-1].rstrip(':')}{':' if parts[-1][-1:] == ':' else ','} {line.strip()}"
            continue
        skipping = line.startswith(("Config search path", "Set the environment variable"))
        if not skipping and line.strip().rstrip(".") not in parts:
            parts.append(line.strip().rstrip("."))
    return "; ".join(parts) or type(err).__name__


HYDRA_VALUE_FLAGS = {  # Hydra's command-line flags whose value is the next argument
    "--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
    "--info", "-i", "--experimental-rerun",
}  # fmt: skip


def check_syntax(argv: list[str]) -> None:
    """Each override as Hydra's grammar reads it: an unquoted ~, a non-ASCII letter or a bracket that Hydra's
    lexer rejects (with a caret under the command line) is one ConfigError naming the override, the character
    and the quoting that passes it on as it was meant."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    after_flag = False
    for arg in argv:
        # Hydra's own flags and the value of those that take one (--cfg job, -cn NAME) are not overrides
        if arg.startswith("-") or after_flag:
            after_flag = arg in HYDRA_VALUE_FLAGS  # not "--cfg=job", which carries its value
            continue
        try:
            parser.parse_overrides([arg])
        except OverrideParseException as err:
            raise ConfigError(_syntax_problem(arg, str(err))) from None


def _syntax_problem(arg: str, message: str) -> str:
    lines = message.splitlines()
    where = ""
    if len(lines) > 1 and lines[1].strip() == "^" and ": " in lines[0]:  # the lexer's caret under the command line
        column = lines[1].index("^") - (lines[0].index(": ") + 2)
        if 0 <= column < len(arg):
            where = f" at {arg[column]!r} (character {column + 1})"
    else:
        where = f" ({lines[0].strip()})" if lines else ""
    key, equals, value = arg.partition("=")
    if not equals:
        return f"the override '{arg}' is not valid Hydra syntax{where}; an override is key=value"
    if "'" in value or '"' in value:
        quoting = "quote the value for Hydra inside the shell's quotes, escaping its own quotes"
    else:
        quoting = f"""quote the value for Hydra, inside the shell's quotes: '{key}="{value}"'"""
    return f"the override '{arg}' is not valid Hydra syntax{where}; {quoting}"


def check_early_values(argv: list[str]) -> None:
    """Values a launcher's config reads while Hydra resolves it, before validate() would see them (the SLURM
    launcher's GPU count reads model.num_gpus): checked here, so a bad one is one line, not Hydra's traceback."""
    for arg in argv:
        key, _, value = arg.partition("=")
        if key.lstrip("+~") == "model.num_gpus":
            for one in value.split(","):
                require(
                    one == "auto" or (one.isdigit() and int(one) >= 1), "model.num_gpus", one, "auto or an integer >= 1"
                )


def check_sweeps(argv: list[str]) -> None:
    """A group option swept with a comma (method=pld,graft) without -m: Hydra refuses it and suggests a list,
    which a group does not take; name the two things the user may have meant."""
    if any(a in ("-m", "--multirun") or a.startswith("--multirun=") for a in argv):
        shown = [a for a in argv if a in ("--cfg", "-c", "--info", "-i") or a.startswith(("--cfg=", "--info="))]
        if shown:  # Hydra: "Only one of --run, --multirun, --cfg, ..." as a traceback
            raise ConfigError(
                f"{shown[0]} shows one run's config, -m runs a sweep: drop -m to see a job's config "
                f"(python run.py {' '.join(a for a in argv if a not in ('-m', '--multirun'))})"
            )
        return
    for arg in argv:
        key, _, value = arg.partition("=")
        key = key.lstrip("+~")
        if key in GROUPS and "," in value and not value.startswith(("[", "'", '"')) and "(" not in value:
            also = f"; to compare methods in one run: methods=[{value}]" if key == "method" else ""
            raise ConfigError(
                f"{arg}: a comma sweeps over {key} options, one run each; add -m (python run.py -m {arg}){also}"
            )


def check_overrides(argv: list[str]) -> list[str]:
    """Fail fast on command-line overrides that name an unknown group option or key; returns argv with
    method keys written as Hydra needs them (method_override), and `methods=null` added when the command
    line names one method (method=...) but no comparison (methods=[...]): a single-method run.

    Hydra would also refuse most of these, but with a stack of composition errors; this names the key
    and lists what is allowed. Sweep syntax (a,b or functions) is checked value by value where possible.
    """
    check_syntax(argv)
    check_sweeps(argv)
    check_early_values(argv)
    methods = [_default_choice("method")]
    for arg in argv:
        if arg.startswith("method=") and "(" not in arg:
            methods = arg.split("=", 1)[1].split(",")
    single = names_one_method(argv)
    method_args, out = [], []
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            out.append(arg)
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+~")
        if key.startswith("hydra"):
            out.append(arg)
            continue
        if key == "methods":
            options = group_options("method")
            for name in value.strip("[]").split(","):
                name = name.strip()
                if name and name != "null" and name not in options:
                    raise ConfigError(
                        f"unknown method '{name}' in methods; available method configs: {', '.join(options)}"
                        + suggest(name, options)
                    )
                if name == "ar":
                    raise ConfigError(baseline_in_methods(value))
            out.append(arg)
            continue
        if "." not in key:
            if key not in GROUPS:
                allowed = [*GROUPS, "methods", *(f"{s}.<key>" for s in (*SECTIONS, "method"))]
                raise ConfigError(
                    f"unknown override '{key}'; allowed: {', '.join(allowed)}" + suggest(key, list(GROUPS))
                )
            if "(" not in value:
                options = group_options(key)
                for option in value.split(","):
                    if option and option != "null" and option not in options:
                        raise ConfigError(
                            f"unknown {key} '{option}'; available {key} configs: {', '.join(options)}"
                            + suggest(option, options)
                        )
            out.append(arg)
            continue
        section, _, field_name = key.partition(".")
        field_name = field_name.split(".")[0]
        if section == "method":
            method_args.append((field_name, value))
            out.append(arg)
            continue
        if section not in SECTIONS:
            allowed = [*SECTIONS, "method"]
            raise ConfigError(
                f"unknown config section '{section}' in '{arg}'; sections: {', '.join(allowed)}"
                + suggest(section, allowed)
            )
        names = [f.name for f in dataclasses.fields(SECTIONS[section])]
        if field_name not in names:
            raise ConfigError(
                f"unknown key '{key}'; allowed keys in {section}: {', '.join(names)}" + suggest(field_name, names)
            )
        out.append(arg)
    if method_args and single:  # in a comparison, validation checks shared keys against the compared methods
        _check_method_keys(methods, method_args)
    return prepare_overrides(out)


def _check_method_keys(methods: list[str], method_args: list[tuple[str, str]]) -> None:
    """Each `method.<key>` names a key of the method as composed (with any part-choosing overrides)."""
    choosing = [f"++method.{k}={v}" for k, v in method_args if k in PART_KEYS]
    if any("," in v for k, v in method_args if k in PART_KEYS):
        return  # a sweep over parts: each job's validation checks its own keys
    for method in methods:
        if method not in group_options("method"):
            continue
        raw = compose([f"method={method}", *choosing])["method"]
        keys = method_config(raw, draft_head="random", block_drafter="random").keys()
        for key, _ in method_args:
            if key not in keys:
                raise ConfigError(
                    f"unknown key 'method.{key}'; allowed keys in method ({method}): {', '.join(keys)}"
                    + suggest(key, keys)
                )


def _default_choice(group: str) -> str | None:
    root = yaml.safe_load((CONFIG_DIR / "config.yaml").read_text())
    for entry in root.get("defaults", []):
        if isinstance(entry, dict) and group in entry:
            return entry[group]
    return None
