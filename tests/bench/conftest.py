"""Fixtures of the bench tests."""

from __future__ import annotations

import pytest

from recguide_trt.model import save_checkpoint
from tests.conftest import random_model, tiny_config


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A tiny random checkpoint (no tokenizer), one per test module."""
    path = tmp_path_factory.mktemp("bench") / "rand"
    save_checkpoint(random_model(tiny_config()), path)
    return path
