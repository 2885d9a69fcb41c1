"""Benchmark prompts: the standard-library split shared with the training script."""

from __future__ import annotations

from pathlib import Path

from recguide_trt.bench.workloads import heldout_stdlib_files, is_test_source, stdlib_snippets, stdlib_split


def test_test_suites_are_recognised():
    assert is_test_source(Path("test/test_os.py")) and is_test_source(Path("lib2to3/tests/data/x.py"))
    assert is_test_source(Path("idlelib/idle_test/htest.py")) and is_test_source(Path("test_foo.py"))
    assert not is_test_source(Path("unittest/case.py")) and not is_test_source(Path("contest.py"))
    assert not is_test_source(Path("test.py"))   # only directories and test_*.py modules


def test_split_excludes_tests_and_site_packages_and_is_disjoint(tmp_path):
    names = [f"pkg{i}/mod{j}.py" for i in range(10) for j in range(10)]
    names += ["test/test_a.py", "pkg0/tests/b.py", "idlelib/idle_test/c.py", "test_d.py", "site-packages/e.py"]
    for n in names:
        (tmp_path / n).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / n).write_text("def f(x):\n    \"\"\"A function long enough to be a snippet.\"\"\"\n" + "    x += 1\n" * 8)
    train, held = stdlib_split(tmp_path)
    rel = {str(p.relative_to(tmp_path)) for p in train + held}
    assert rel == {n for n in names if n.startswith("pkg") and "/tests/" not in n}
    assert not set(train) & set(held) and held and len(held) < len(train)
    assert stdlib_split(tmp_path) == (train, held) and heldout_stdlib_files(tmp_path) == held
    snippets = stdlib_snippets(3, root=tmp_path)
    assert len(snippets) == 3 and all(s.startswith("def f(x):") for s in snippets)
