"""Defects a new user hit, each checked through the ``recguide`` console script (a subprocess)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from recguide_trt.cli import build_parser
from tests.conftest import EMBEDDED, has_embedded
from tests.serving.openai_server import recguide_command

ROOT = Path(__file__).resolve().parents[1]
# The files whose commands are checked: the README and the records moved out of it.
DOC_FILES = [ROOT / "README.md", ROOT / "docs" / "engine.md", ROOT / "docs" / "drafter.md"]


def run(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*recguide_command(), *args], capture_output=True, text=True, timeout=timeout, **kw)


def one_line_error(res: subprocess.CompletedProcess, needle: str) -> None:
    err = res.stderr.strip()
    assert res.returncode != 0, res
    assert "Traceback" not in err, err
    assert needle in err, err
    assert len([line for line in err.splitlines() if line.startswith("error")]) == 1, err


def readme_commands() -> list[list[str]]:
    """Every ``recguide ...`` command line in the code blocks of DOC_FILES (comments and pipes cut)."""
    shell_lines = []
    for path in DOC_FILES:
        fence, continued = None, False
        for line in path.read_text().splitlines():
            if line.startswith("```"):
                fence, continued = None if fence is not None else (line[3:].strip() or "bash"), False
            elif fence in ("bash", "sh", "console"):
                if continued:   # a continued command line
                    shell_lines[-1] = shell_lines[-1][:-1] + " " + line
                else:
                    shell_lines.append(line)
                continued = shell_lines[-1].endswith("\\")
    out = []
    for line in shell_lines:
        lexer = shlex.shlex(line, posix=True, punctuation_chars="&|;")
        lexer.whitespace_split, lexer.commenters = True, "#"
        words: list[str] = []
        for w in [*lexer, "&&"]:
            if w in ("&&", "|", "||", ";"):
                if words and Path(words[0]).name == "recguide":
                    out.append(words[1:])
                words = []
            else:
                words.append(w)
    return out


def test_every_readme_command_parses():
    commands = readme_commands()
    assert {c[0] for c in commands} >= {"generate", "serve", "bench", "export", "triton-repo"}, commands
    for argv in commands:
        try:
            build_parser(argv).parse_args(argv)   # what `recguide` builds for this command line
            build_parser().parse_args(argv)       # every command complete
        except SystemExit as exc:
            pytest.fail(f"README command `recguide {shlex.join(argv)}` does not parse (exit {exc.code})")


LIGHT_COMMANDS = ["generate", "chat", "serve", "bench", "import", "train-drafter", "export", "build-engine",
                  "triton-repo", "profile"]
# Runs `recguide ARGS` (first argument "recguide") or `python scripts/X.py ARGS` in this process, then prints the
# heavy frameworks it imported: the last line is "heavy:" and nothing else when it imported none.
RUN_LIGHT = """
import runpy, sys
target, args = sys.argv[1], sys.argv[2:]
try:
    if target == "recguide":
        from recguide_trt.cli import main
        main(args)
    else:
        sys.argv = [target, *args]
        runpy.run_path(target, run_name="__main__")
except SystemExit:
    pass
heavy = sorted(m for m in ("torch", "onnx", "onnxruntime", "uvicorn", "starlette") if m in sys.modules)
print("heavy:", ",".join(heavy))
"""


def run_light(target: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUN_LIGHT, target, *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def heavy_imports(res: subprocess.CompletedProcess) -> str:
    return res.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("argv", [["--help"], ["nonsense"], *([c, "--help"] for c in LIGHT_COMMANDS)],
                         ids=lambda a: " ".join(a))
def test_help_and_bad_commands_import_no_framework(argv):
    # `recguide --help` took 6 s on a loaded 2-core host, all of it `import torch`: help and errors come from
    # the parser, which builds only the command being run.
    res = run_light("recguide", *argv)
    assert "usage: recguide" in res.stdout + res.stderr, res
    assert heavy_imports(res) == "heavy:", res.stdout[-500:]


def test_bad_import_sources_are_named_before_torch_loads(tmp_path):
    """`recguide import` names a missing source, a bad GGUF header or an existing --out before it imports torch."""
    (tmp_path / "exists").mkdir()
    (tmp_path / "bad.gguf").write_bytes(b"GGUF but not really")
    for argv, words in ([[str(tmp_path / "nope.gguf"), "--out", str(tmp_path / "o")], "no such file or directory"],
                        [[str(tmp_path / "bad.gguf"), "--out", str(tmp_path / "o")], "not a readable GGUF file"],
                        [[str(tmp_path / "bad.gguf"), "--out", str(tmp_path / "exists")], "already exists"]):
        res = run_light("recguide", "import", *argv)
        assert words in res.stderr, res
        assert heavy_imports(res) == "heavy:", res.stdout[-500:]


LIGHT_SCRIPTS = ["bench_forward.py", "bench_lookup_rows.py", "bench_packing.py", "bench_prefix_cache.py", "compare_drafter_runs.py", "eval_lookup_keys.py", "eval_overlap_blocks.py", "simulate.py"]


@pytest.mark.parametrize("script", LIGHT_SCRIPTS)
def test_script_help_imports_no_framework(script):
    """These scripts load torch after their arguments are parsed: --help answers in a fraction of a second."""
    res = run_light(str(ROOT / "scripts" / script), "--help")
    assert "usage:" in res.stdout, res
    assert heavy_imports(res) == "heavy:", res.stdout[-500:]


def test_the_engine_and_the_model_config_import_without_torch():
    """`recguide_trt.model` loads its names on first use: the engine, its policies, the simulator, the config, the
    masks and the importers' readers import without torch; the model class brings it."""
    code = ("import sys\n"
            "import recguide_trt.runtime.engine, recguide_trt.bench.simulator, recguide_trt.models.hf_dir\n"
            "from recguide_trt.model import NLDConfig, masks\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "from recguide_trt.model import NLDModel\n"
            "assert 'torch' in sys.modules and NLDModel.__module__ == 'recguide_trt.model.backbone'\n"
            "import recguide_trt.model as m\n"
            "assert set(m.__all__) <= set(dir(m))\n"
            "print('ok')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res


def test_the_package_exports_on_first_use():
    code = ("import sys, recguide_trt as r\n"
            "assert 'torch' not in sys.modules\n"
            "assert r.SamplingParams(max_tokens=3).max_tokens == 3 and 'torch' not in sys.modules\n"
            "from recguide_trt import LLM, EngineConfig, RecGuideConfig, RequestOutput\n"
            "assert 'torch' in sys.modules and LLM.__module__ == 'recguide_trt.api'\n"
            "assert set(r.__all__) <= set(dir(r))\n"
            "try:\n    r.NoSuchName\nexcept AttributeError as exc:\n    print('ok', exc)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "ok module 'recguide_trt' has no attribute 'NoSuchName'" in res.stdout, res


def test_delegated_subcommands_take_their_options(tmp_path):
    for cmd in ("triton-repo", "build-engine"):
        res = run(cmd, "--help", timeout=120)
        assert res.returncode == 0 and "--model" in res.stdout or "--onnx-dir" in res.stdout, res
    res = run("triton-repo", "--model", "tiny", "--out", str(tmp_path / "repo"), timeout=120)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "repo" / "recguide" / "config.pbtxt").is_file()
    res = run("build-engine", "--onnx-dir", str(tmp_path / "none"), timeout=120)
    assert "unrecognized arguments" not in res.stderr
    one_line_error(res, "TensorRT is not installed")


@pytest.mark.skipif(not has_embedded(), reason="embedded model not trained yet")
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_generate_refuses_non_finite_temperature(value):
    one_line_error(run("generate", "x", "--model", "tiny", f"--temperature={value}", "--max-tokens", "2"), "temperature must be a finite")


def test_device_errors_are_one_line():
    import torch

    if not torch.cuda.is_available():
        one_line_error(run("generate", "x", "--device", "cuda", "--max-tokens", "2"), "no CUDA GPU")
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        one_line_error(run("generate", "x", "--backend", "onnxruntime", "--device", "cuda", "--max-tokens", "2"),
                       "CUDAExecutionProvider")
    one_line_error(run("generate", "x", "--device", "tpu"), "unknown device")


def test_serve_refuses_bad_capacity():
    for value in ("0", "-1"):
        one_line_error(run("serve", "--max-num-seqs", value, "--port", "1"), "max_num_seqs must be a positive")


def _damage(ckpt: Path, rel: str, how: str) -> None:
    f = ckpt / rel
    if how == "truncate":
        f.write_bytes(f.read_bytes()[:len(f.read_bytes()) // 2])
    elif how == "empty":
        f.write_bytes(b"")
    elif how == "random":
        f.write_bytes(bytes(range(256)) * 8)
    elif how == "json-garbage":
        f.write_text("{not json")
    elif how == "json-list":
        f.write_text("[1, 2, 3]")
    elif how == "hidden-size":
        cfg = json.loads(f.read_text())
        cfg["hidden_size"] = "256x"
        f.write_text(json.dumps(cfg))


@pytest.mark.skipif(not has_embedded(), reason="embedded model not trained yet")
@pytest.mark.parametrize("rel,how,needle", [
    ("model.safetensors", "truncate", "not a readable safetensors file"),
    ("model.safetensors", "empty", "not a readable safetensors file"),
    ("model.safetensors", "random", "not a readable safetensors file"),
    ("linear_spec_lora/adapter_model.safetensors", "truncate", "not a readable safetensors file"),
    ("tokenizer.json", "json-garbage", "not a valid tokenizer.json"),
    ("linear_spec_lora/adapter_config.json", "json-garbage", "not valid JSON"),
    ("config.json", "hidden-size", "hidden_size must be a non-negative integer"),
    ("config.json", "json-list", "must be a JSON object"),
])
def test_damaged_checkpoint_names_the_file(tmp_path, rel, how, needle):
    ckpt = tmp_path / "ck"
    shutil.copytree(EMBEDDED, ckpt)
    _damage(ckpt, rel, how)
    res = run("generate", "x", "--model", str(ckpt), "--max-tokens", "2")
    one_line_error(res, needle)
    assert str(ckpt / rel) in res.stderr


@pytest.mark.skipif(not has_embedded(), reason="embedded model not trained yet")
def test_profile_stats_exclude_the_warmup(tmp_path):
    res = run("profile", "--model", "tiny", "--requests", "2", "--max-tokens", "4", "--policy", "ar",
              "--out", str(tmp_path / "t.json"))
    assert res.returncode == 0, res.stderr
    stats = json.loads(res.stdout[res.stdout.index("{"):])
    # Two requests decoded together: every step ran at C=2; the warm-up's C=1 steps are not counted.
    assert stats["concurrency_hist"] == {"2": stats["steps"]} and stats["steps"] == 4, stats


def test_one_cache_variable(tmp_path, monkeypatch):
    from recguide_trt.cache import cache_root
    from recguide_trt.engine.export import default_cache_dir

    monkeypatch.delenv("RECGUIDE_CACHE_DIR", raising=False)
    monkeypatch.setenv("RECGUIDE_CACHE", str(tmp_path))
    assert cache_root() == tmp_path and default_cache_dir() == tmp_path / "onnx"
    monkeypatch.delenv("RECGUIDE_CACHE")
    monkeypatch.setenv("RECGUIDE_CACHE_DIR", str(tmp_path / "old"))
    assert default_cache_dir() == tmp_path / "old" / "onnx"


def readme_script_commands() -> list[list[str]]:
    """Every ``python scripts/X.py …`` / ``bash scripts/X.sh …`` command of DOC_FILES: code blocks
    and inline code spans (comments, pipes and redirections cut; the interpreter dropped)."""
    lines = []
    for path in DOC_FILES:
        text = path.read_text()
        lines += [m.group(1) for m in re.finditer(r"`((?:\.venv/bin/)?python3? scripts/[^`]+)`", text)]
        fence = None
        for line in text.splitlines():
            if line.startswith("```"):
                fence = None if fence is not None else (line[3:].strip() or "bash")
            elif fence in ("bash", "sh") and "scripts/" in line:
                lines.append(line)
    out = []
    for line in lines:
        lexer = shlex.shlex(line, posix=True, punctuation_chars="&|;<>")
        lexer.whitespace_split, lexer.commenters = True, "#"
        words = [w for w in lexer]
        for i, w in enumerate(words):
            if w.startswith("scripts/") and w.endswith((".py", ".sh")):
                cmd = [w]
                for arg in words[i + 1:]:
                    if arg in ("&&", "|", "||", ";", ">", "<", "--"):  # after "--": a command the script runs
                        break
                    cmd.append(arg)
                out.append(cmd)
                break
    return out


def test_every_readme_script_command_takes_its_options():
    """Each script the README runs answers --help through a subprocess, and every option the README
    gives it is one the script documents (the class of bug where a documented command rejected its
    own options)."""
    commands = readme_script_commands()
    scripts = {c[0] for c in commands}
    assert {"scripts/bench_concurrency.py", "scripts/bench_peers.py", "scripts/profile_breakdown.py",
            "scripts/run_tests.sh", "scripts/setup_peers.sh"} <= scripts, scripts

    def help_of(script: str) -> str:
        runner = [sys.executable] if script.endswith(".py") else ["bash"]
        res = subprocess.run([*runner, str(ROOT / script), "--help"], capture_output=True, text=True, timeout=120,
                             cwd=ROOT)
        assert res.returncode == 0, (script, res.stderr[-1500:])
        return res.stdout + res.stderr

    # A few at a time: each --help is mostly a Python start and an import, ~2 s of one core.
    wanted = sorted(scripts - {"scripts/run_tests.sh"})  # run_tests.sh is pytest itself
    with ThreadPoolExecutor(max_workers=3) as pool:
        helps = dict(zip(wanted, pool.map(help_of, wanted)))
    for cmd in commands:
        if cmd[0] not in helps:
            continue
        for arg in cmd[1:]:
            if arg.startswith("--"):
                assert arg.split("=")[0] in helps[cmd[0]], f"README runs `{shlex.join(cmd)}`: {arg} is not an option"
