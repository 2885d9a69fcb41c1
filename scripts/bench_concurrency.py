#!/usr/bin/env python
"""Closed-loop concurrency sweep of AR / LinearSpec / RecGuide (same as ``recguide bench``).

Example (small)::

    python scripts/bench_concurrency.py --concurrency 1,4 --requests 4 --max-tokens 32 --out results/bench-small
"""

import sys

from recguide_trt.bench.sweep import main

if __name__ == "__main__":
    sys.exit(main())
