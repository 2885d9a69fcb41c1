"""The paired-modes timing loop shared by bench_logprobs.py and bench_sampling.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from recguide_trt.bench.paired_modes import policy_list, run_interleaved


def test_modes_alternate_which_goes_first_and_every_cell_is_checked(capsys):
    calls, checked = [], []

    def run(groups, policy, mode):
        calls.append((policy, mode))
        return 0.5, [SimpleNamespace(token_ids=[1] * (4 if mode == "a" else 2)) for g in groups for _ in g]

    cases = {"batch 1": [[[5]], [[6]]], "batch 2": [[[5], [6]]]}
    tok_s = run_interleaved(cases, ["ar", "recguide"], ["a", "b"], 2, run,
                            lambda rnd, case, policy, got: checked.append((rnd, case, policy, sorted(got))))
    assert len(calls) == 2 * 2 * 2 * 2 and len(checked) == 2 * 2 * 2
    firsts = [calls[i][1] for i in range(0, len(calls), 2)]
    assert firsts.count("a") == firsts.count("b")                   # each mode goes first half the time
    assert [f for f, c in zip(firsts, checked) if c[1:3] == ("batch 1", "ar")] == ["b", "a"]  # flips per round
    assert tok_s[("batch 2", "ar", "a")] == [16.0, 16.0] and tok_s[("batch 1", "recguide", "b")] == [8.0, 8.0]
    assert "round 1, batch 2, recguide: a 16.0 tok/s, b 8.0 tok/s" in capsys.readouterr().out


def test_policy_list():
    assert policy_list(" ar, recguide ,", "x.py") == ["ar", "recguide"]
    with pytest.raises(SystemExit, match=r"x.py: --policies: unknown \['medusa'\]"):
        policy_list("ar,medusa", "x.py")
    with pytest.raises(SystemExit, match="none given"):
        policy_list(" , ", "x.py")
