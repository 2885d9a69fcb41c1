"""scripts/bench_under_load.py through a subprocess: the neighbours run while the command does and stop
with it, the command's exit status comes back, and bad input is refused."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

from tests.scripts.runner import run_script

CHILDREN = textwrap.dedent("""
    import os
    def children(ppid):
        out = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    stat = open(f"/proc/{d}/stat").read()
                except OSError:
                    continue
                fields = stat.rsplit(")", 1)[1].split()
                if int(fields[1]) == ppid and fields[0] not in "ZX":
                    out.append(int(d))
        return out
""")


def run(*args: str) -> subprocess.CompletedProcess:
    return run_script("bench_under_load.py", *args, timeout=60)


def test_command_runs_beside_its_neighbours_and_its_status_comes_back(tmp_path):
    child = tmp_path / "child.py"
    child.write_text(CHILDREN + textwrap.dedent("""
        import sys
        others = [p for p in children(os.getppid()) if p != os.getpid()]
        print("neighbours", len(others))
        open(sys.argv[1], "w").write(" ".join(map(str, others)))
        sys.exit(3)
    """))
    pids = tmp_path / "pids"
    res = run("--busy", "0.2", "--idle", "0.1", "--cores", "2", "--", sys.executable, str(child), str(pids))
    assert res.returncode == 3, res.stderr
    assert "neighbours 2" in res.stdout
    time.sleep(0.2)
    for pid in map(int, pids.read_text().split()):   # stopped and reaped with the command
        assert not os.path.exists(f"/proc/{pid}")


def test_bad_input_is_named():
    res = run("--busy", "0", "--", "true")
    assert res.returncode == 2 and "--busy" in res.stderr
    res = run("--busy", "1")
    assert res.returncode == 2 and "no command" in res.stderr
    res = run("--", "no-such-command-here")
    assert res.returncode == 127 and "command not found: no-such-command-here" in res.stderr
