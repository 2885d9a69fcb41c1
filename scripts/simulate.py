#!/usr/bin/env python
"""PROJECTION: discrete-event simulation of the closed-loop concurrency sweep at NLD-8B/14B scale.

Runs the runtime's own policies (AR, LinearSpec, RecGuide) against a step-cost model (the B200
draft+verify table of DESIGN.md §3.2, or an H200 roofline) and an acceptance model (parametric,
matching published NLD-8B acceptance, or traces from ``recguide bench --traces``). See
``recguide_trt/bench/simulator.py`` for the formulas. Example::

    python scripts/simulate.py --out results/simulate
    python scripts/simulate.py --cost roofline --model nld-14b --out results/simulate-14b
"""

import sys

from recguide_trt.bench.simulator import main

if __name__ == "__main__":
    sys.exit(main())
