"""The options of ``recguide export`` (and ``python -m recguide_trt.engine.export``), apart from the exporter so that
``recguide export --help`` and a bad value answer without importing torch."""

from __future__ import annotations

import argparse

DEFAULT_OPSET = 18
"""ONNX opset of an export unless ``--opset`` says otherwise."""


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``recguide export`` (the CLI wires them; ``main_export`` consumes them)."""
    from ..models.names import MODEL_HELP

    parser.add_argument("--model", default=None, help=MODEL_HELP)
    parser.add_argument("--out", required=True, help="output directory for model.onnx and manifest.json")
    parser.add_argument("--opset", type=int, default=DEFAULT_OPSET)
    parser.add_argument("--max-block", type=int, default=None, help="largest draft block (default: config)")
    parser.add_argument("--block-sizes", type=lambda s: [int(x) for x in s.split(",")], default=None,
                        help="comma-separated draft block sizes (default: powers of two up to --max-block)")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--opt-batch", type=int, default=8)
    parser.add_argument("--max-prefill-batch", type=int, default=8)
    parser.add_argument("--max-prefill-tokens", type=int, default=None)
    parser.add_argument("--no-mismatch-op", action="store_true",
                        help="leave the mismatch prediction as inline standard ops (no recguide:: function)")
