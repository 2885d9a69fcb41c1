#!/usr/bin/env python
"""Tune the trtllm-schedule controller's draft_len_schedule on training-split prompts.

Runs the bench's closed-loop sweep of AR and every fixed block (``--policies ar,linearspec``) on
``--workload stdlib-train`` (snippets of the files the embedded model was trained on, never a
benchmark prompt), keeps the fastest fixed policy's draft length per concurrency and writes
``--schedule-out`` (default docs/bench/draft_len_schedule.json), which ``recguide bench`` reads.
Takes every option of ``recguide bench``. Example::

    python scripts/calibrate_draft_len_schedule.py --repeats 3 --requests 8
"""

import sys

from recguide_trt.bench.schedule_calibration import main

if __name__ == "__main__":
    sys.exit(main())
