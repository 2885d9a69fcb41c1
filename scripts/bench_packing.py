#!/usr/bin/env python
"""One packed step with rows of mixed lengths on the torch backend: padded vs packed (medians, ratio).

Example::

    python scripts/bench_packing.py --mixes 16x1,15x1+1x16 --reps 30
"""

import sys

from recguide_trt.bench.packing import main

if __name__ == "__main__":
    sys.exit(main())
