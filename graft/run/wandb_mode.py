"""Which W&B mode a job logs in, and why (one printed line says both): disabled by `logger.mode=disabled`,
WANDB_MODE=disabled or WANDB_DISABLED; else WANDB_MODE=online|offline; else logger.mode=online|offline; else the
`mode` that `wandb offline` / `wandb online` leave in W&B's settings files; else (logger.mode=auto, the default)
online when the user is logged in (WANDB_API_KEY, an entry for the W&B host in ~/.netrc / $NETRC as `wandb login`
writes it, or an api_key in W&B's settings file), offline otherwise (upload later with the printed `wandb sync`
command)."""

from __future__ import annotations

import configparser
import netrc
import os
from pathlib import Path
from urllib.parse import urlsplit

DEFAULT_HOST = "https://api.wandb.ai"


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def settings_files(env=None, cwd: str | Path | None = None) -> list[Path]:
    """W&B's settings files, the global one first: $WANDB_CONFIG_DIR/settings (else ~/.config/wandb/settings),
    then the workspace's ./wandb/settings (which `wandb offline` / `wandb online` may also write)."""
    env = os.environ if env is None else env
    config_dir = env.get("WANDB_CONFIG_DIR")
    global_file = Path(config_dir) / "settings" if config_dir else Path("~/.config/wandb/settings").expanduser()
    return [global_file, Path(cwd or os.getcwd()) / "wandb" / "settings"]


def wandb_settings(env=None, cwd: str | Path | None = None) -> dict[str, tuple[str, Path]]:
    """{key: (value, file)} of the [default] sections of W&B's settings files (the workspace's win)."""
    found: dict[str, tuple[str, Path]] = {}
    for path in settings_files(env, cwd):
        parser = configparser.ConfigParser()
        try:
            parser.read(path)
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
        if parser.has_section("default"):
            found.update({key: (value, path) for key, value in parser.items("default")})
    return found


def netrc_path(env=None) -> Path:
    """The netrc file W&B reads: $NETRC, else ~/.netrc (or ~/_netrc where only that exists)."""
    env = os.environ if env is None else env
    if env.get("NETRC"):
        return Path(env["NETRC"]).expanduser()
    home = Path(env.get("HOME") or Path.home())
    unix, windows = home / ".netrc", home / "_netrc"
    return windows if windows.exists() and not unix.exists() else unix


def wandb_host(env=None, cwd: str | Path | None = None) -> str:
    """The W&B server: $WANDB_BASE_URL, else the settings files' base_url, else api.wandb.ai."""
    env = os.environ if env is None else env
    settings = wandb_settings(env, cwd)
    url = env.get("WANDB_BASE_URL") or settings.get("base_url", (DEFAULT_HOST,))[0]
    return urlsplit(url).netloc or url


def login_source(env=None, cwd: str | Path | None = None) -> str | None:
    """Where W&B would find this user's credentials (a phrase for the mode's line), or None when not logged in.
    Read offline, as `wandb login` leaves them: nothing is verified against the server."""
    env = os.environ if env is None else env
    if env.get("WANDB_API_KEY"):
        return "WANDB_API_KEY is set"
    if env.get("WANDB_IDENTITY_TOKEN_FILE"):
        return "WANDB_IDENTITY_TOKEN_FILE is set"
    host = wandb_host(env, cwd)
    path = netrc_path(env)
    try:
        entry = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        entry = None
    if entry and entry[2]:
        return f"an API key for {host} in {path}"
    settings = wandb_settings(env, cwd)
    if settings.get("api_key", ("",))[0]:
        return f"an API key in {settings['api_key'][1]}"
    return None


def choose_mode(cfg_mode: str = "auto", env=None, cwd: str | Path | None = None) -> tuple[str, str]:
    """(online | offline | disabled, why). Turning logging off always wins; then the environment's WANDB_MODE,
    then logger.mode, then the settings files' mode (`wandb offline`), then whether the user is logged in."""
    env = os.environ if env is None else env
    variable = (env.get("WANDB_MODE") or "").strip().lower()
    variable = {"dryrun": "offline", "run": "online"}.get(variable, variable)
    if cfg_mode == "disabled":
        return "disabled", "logger.mode=disabled"
    if variable == "disabled":
        return "disabled", "WANDB_MODE=disabled"
    if _truthy(env.get("WANDB_DISABLED")):
        return "disabled", "WANDB_DISABLED is set"
    if variable in ("online", "offline"):
        return variable, f"WANDB_MODE={variable}"
    if cfg_mode in ("online", "offline"):
        return cfg_mode, f"logger.mode={cfg_mode}"
    settings = wandb_settings(env, cwd)
    if "mode" in settings:
        value, path = settings["mode"]
        value = {"dryrun": "offline", "run": "online"}.get(value.strip().lower(), value.strip().lower())
        if value in ("online", "offline", "disabled"):
            return value, f"mode = {value} in {path} (`wandb online` clears it)"
    source = login_source(env, cwd)
    if source:
        return "online", f"logged in: {source}"
    host = wandb_host(env, cwd)
    return (
        "offline",
        f"not logged in (no WANDB_API_KEY, no {host} entry in {netrc_path(env)}); `wandb login` to log online",
    )
