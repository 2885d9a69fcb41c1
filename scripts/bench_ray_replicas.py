#!/usr/bin/env python
"""Throughput of 1 vs 2 RecGuide engine replicas (Ray Serve) on the same closed-loop load, interleaved.

Needs the ``ray`` extra. Example (the README's run)::

    python scripts/bench_ray_replicas.py --rounds 3 --concurrency 16 --requests 64 --max-tokens 128
"""

import sys

from recguide_trt.serving.ray_bench import main

if __name__ == "__main__":
    sys.exit(main())
