#!/usr/bin/env bash
# The project's test command (README, .ci/run): the whole suite in the project's venv.
# Triton tests run against a real tritonserver (nvidia-pytriton); RECGUIDE_REQUIRE_TRITON=1 makes
# a missing server a failure instead of a skip, so a green run means they really ran.
# The Ray Serve tests start a real local Ray cluster; RECGUIDE_REQUIRE_RAY=1 makes a missing ray[serve]
# (the `ray` extra) a failure in the same way.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export RECGUIDE_REQUIRE_TRITON=${RECGUIDE_REQUIRE_TRITON:-1}
export RECGUIDE_REQUIRE_RAY=${RECGUIDE_REQUIRE_RAY:-1}
export RECGUIDE_CACHE=${RECGUIDE_CACHE:-$PWD/.cache/recguide}
"$PY" -m ruff check .
# --durations: every run (CI too) ends with its slowest tests, to keep the suite's time in view.
exec "$PY" -m pytest -q -p no:cacheprovider --durations=15 "$@"
