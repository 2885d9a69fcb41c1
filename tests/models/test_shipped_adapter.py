"""A named model's shipped draft adapter is installed into its cached directory once per adapter version,
and an adapter the user put there is left alone."""

from __future__ import annotations

from recguide_trt.models import names


def _shipped(root, text: str):
    adapter = root / "fake" / "linear_spec_lora"
    adapter.mkdir(parents=True, exist_ok=True)
    (adapter / "adapter_config.json").write_text(text)
    (adapter / "adapter_model.safetensors").write_bytes(b"weights " + text.encode())
    return adapter


def test_installs_updates_and_respects_the_users_own(tmp_path, monkeypatch):
    monkeypatch.setenv("RECGUIDE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(names, "SHIPPED_ADAPTERS", tmp_path / "shipped")
    model = tmp_path / "model"
    model.mkdir()
    _shipped(tmp_path / "shipped", '{"r": 1}')
    names.install_shipped_adapter("fake", model)
    target = model / "linear_spec_lora"
    assert (target / "adapter_config.json").read_text() == '{"r": 1}'
    mark = (target / names.SHIPPED_MARK).read_text()
    names.install_shipped_adapter("fake", model)  # same version: nothing to do
    assert (target / names.SHIPPED_MARK).read_text() == mark

    _shipped(tmp_path / "shipped", '{"r": 2}')  # a new version of the package's adapter replaces the copy
    names.install_shipped_adapter("fake", model)
    assert (target / "adapter_config.json").read_text() == '{"r": 2}'

    (target / names.SHIPPED_MARK).unlink()  # the user's own adapter (no mark) stays
    (target / "adapter_config.json").write_text('{"r": 9}')
    _shipped(tmp_path / "shipped", '{"r": 3}')
    names.install_shipped_adapter("fake", model)
    assert (target / "adapter_config.json").read_text() == '{"r": 9}'

    names.install_shipped_adapter("no-such-model", model)  # nothing shipped: nothing happens
