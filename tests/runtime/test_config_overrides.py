"""FIELD=VALUE overrides of a config dataclass (``recguide bench --recguide``)."""

from __future__ import annotations

import pytest

from recguide_trt.runtime.config_overrides import apply_overrides
from recguide_trt.runtime.policies.recguide import RecGuideConfig


def test_each_field_type_is_read_from_text():
    base = RecGuideConfig()
    cfg = apply_overrides(base, ["switch_concurrency=3", "lookup=off", "tau=0.25", "flag_rule=threshold",
                                 "candidate-blocks=1,4,8", "lookup_ngrams=2,5", "refresh_steps=64"], "--recguide")
    assert (cfg.switch_concurrency, cfg.lookup, cfg.tau, cfg.flag_rule) == (3, False, 0.25, "threshold")
    assert cfg.candidate_blocks == (1, 4, 8) and cfg.lookup_ngrams == (2, 5) and cfg.refresh_steps == 64
    assert base == RecGuideConfig()                          # a copy: the default is untouched
    assert apply_overrides(cfg, ["switch_concurrency=None", "candidate_blocks=none"], "-x").switch_concurrency is None
    assert apply_overrides(cfg, ["lookup=YES", "lookup=0"], "-x").lookup is False        # the later item wins
    assert apply_overrides(base, None, "-x") is base and apply_overrides(base, [], "-x") is base


@pytest.mark.parametrize("item, message", [
    ("switch_concurrency", "--recguide: expected FIELD=VALUE, got 'switch_concurrency'"),
    ("=3", "expected FIELD=VALUE"),
    ("nope=1", "--recguide: unknown field 'nope'; fields: candidate_blocks, flag_rule"),
    ("switch_concurrency=two", "--recguide switch_concurrency: expected an integer or none, got 'two'"),
    ("refresh_steps=none", "--recguide refresh_steps: expected an integer, got 'none'"),
    ("tau=high", "--recguide tau: expected a number, got 'high'"),
    ("lookup=2", "--recguide lookup: expected true or false, got '2'"),
    ("lookup_ngrams=3", "--recguide lookup_ngrams: expected 2 integers separated by commas, got '3'"),
    ("candidate_blocks=1,x", "--recguide candidate_blocks: expected integers separated by commas or none"),
])
def test_bad_items_name_the_flag_and_the_field(item, message):
    with pytest.raises(ValueError) as exc:
        apply_overrides(RecGuideConfig(), [item], "--recguide")
    assert message in str(exc.value)
