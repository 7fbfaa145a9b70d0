"""A result as a CSV table: one row per layer, each carrying the run's own numbers.

Flat on purpose, so that a spreadsheet can filter and pivot it without joins: the run's
settings and measurements repeat on every layer row. Bytes and seconds stay raw, as in
the JSON (:meth:`ckptlab.RunResult.to_json`).
"""

from __future__ import annotations

import csv
import io
from typing import Any

from ..results import RunResult

RUN_COLUMNS = (
    "model",
    "seq_len",
    "batch_size",
    "every_n_layers",
    "offload",
    "device",
    "dtype",
    "status",
    "provenance",
    "baseline_bytes",
    "after_forward_bytes",
    "peak_bytes",
    "peak_where",
    "offload_bytes",
    "offload_applied",
    "forward_s",
    "backward_s",
    "step_s",
    "repeats",
    "warmup",
)
LAYER_COLUMNS = (
    "layer",
    "module",
    "planned",
    "flag",
    "observed",
    "forward_calls",
    "recompute_calls",
    "saved_bytes",
    "attention_bytes",
    "input_bytes",
)
COLUMNS = LAYER_COLUMNS + RUN_COLUMNS


def run_row(result: RunResult) -> dict[str, Any]:
    """The run's settings and numbers as one flat row (empty cells where it did not fit)."""
    spec, memory, timing = result.spec, result.memory, result.timing
    return {
        "model": result.model.name,
        "seq_len": spec.seq_len,
        "batch_size": spec.batch_size,
        "every_n_layers": "off" if spec.every_n_layers is None else spec.every_n_layers,
        "offload": spec.offload,
        "device": result.device,
        "dtype": result.dtype,
        "status": result.status,
        "provenance": result.provenance.label,
        "baseline_bytes": memory.baseline_bytes if memory else "",
        "after_forward_bytes": memory.after_forward_bytes if memory else "",
        "peak_bytes": memory.peak_bytes if memory else "",
        "peak_where": memory.peak_where.description if memory else "",
        "offload_bytes": memory.offload_bytes if memory else "",
        "offload_applied": memory.offload_applied if memory else "",
        "forward_s": timing.forward_s if timing else "",
        "backward_s": timing.backward_s if timing else "",
        "step_s": timing.step_s if timing else "",
        "repeats": spec.repeats,
        "warmup": spec.warmup,
    }


def layer_rows(result: RunResult) -> list[dict[str, Any]]:
    """One dict per checkpointable layer with the :data:`LAYER_COLUMNS`, in model order."""
    return [
        {
            "layer": layer.name,
            "module": layer.module,
            "planned": layer.planned,
            "flag": layer.enabled,
            "observed": layer.observed,
            "forward_calls": layer.forward_calls,
            "recompute_calls": layer.recompute_calls,
            "saved_bytes": layer.saved_bytes,
            "attention_bytes": layer.attention_bytes,  # of saved_bytes, what the attention kept
            "input_bytes": layer.input_bytes,
        }
        for layer in result.layers
    ]


def result_csv(result: RunResult) -> str:
    """The result as CSV text with a header row.

    Args:
        result: a measured run (a run that did not fit gives one row without layer cells).

    Returns:
        CSV with the columns :data:`COLUMNS`: one row per checkpointable layer, in model order.
    """
    run = run_row(result)
    rows = [{**layer, **run} for layer in layer_rows(result)] or [run]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
