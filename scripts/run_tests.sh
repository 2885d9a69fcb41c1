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
# Workers (pytest-xdist): one per core up to 4, each module on one worker (so a module-scoped fixture is
# built once, as in a serial run; not loadgroup: it stops grouping on pytest 9.2, pytest-xdist#1386), and the
# cores split between them. With 2 threads in each of 2 workers on 2 cores, the thread pools' barriers
# waited on descheduled threads and the run was slower than a serial one; at 1 thread each it was 1.3×
# faster (22 vs 29 min on the 2-core AVX2 EPYC, plain load distribution). Thread-count invariance has its own test
# (test_native_backend.py: test_outputs_do_not_depend_on_the_thread_count). RECGUIDE_TEST_WORKERS=0: serial.
CPUS=$(nproc)
WORKERS=${RECGUIDE_TEST_WORKERS:-$(( CPUS < 4 ? CPUS : 4 ))}
if (( WORKERS > 1 )); then
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( CPUS / WORKERS ))}
    PARALLEL=(-n "$WORKERS" --dist loadscope)
else
    PARALLEL=()
fi
"$PY" -m ruff check .
# --durations: every run (CI too) ends with its slowest tests, to keep the suite's time in view.
exec "$PY" -m pytest -q -p no:cacheprovider --durations=15 "${PARALLEL[@]}" "$@"
