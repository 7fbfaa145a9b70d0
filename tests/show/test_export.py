"""The CSV export: one row per layer, the run's numbers on each."""

from __future__ import annotations

import csv
import io
from dataclasses import replace

import pytest

import ckptlab
from ckptlab.lab.run import run_queued
from ckptlab.show.export import COLUMNS, LAYER_COLUMNS, layer_rows, result_csv

SPEC = ckptlab.RunSpec(model="tiny-llama", seq_len=128, repeats=1, warmup=1, every_n_layers=2)


@pytest.fixture(scope="module")
def result() -> ckptlab.RunResult:
    return run_queued(SPEC).result  # the process-wide cache: shared with the other tests


def _rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_one_row_per_layer_with_the_run_numbers(result):
    rows = _rows(result_csv(result))
    assert len(rows) == result.model.num_layers == 6
    assert list(rows[0]) == list(COLUMNS)
    assert [row["layer"] for row in rows] == [f"L{i}" for i in range(1, 7)]
    assert [row["observed"] for row in rows] == ["CP", "keep"] * 3
    assert [int(row["recompute_calls"]) for row in rows] == [1, 0] * 3
    for row, layer in zip(rows, result.layers):
        assert int(row["saved_bytes"]) == layer.saved_bytes
    assert {row["peak_bytes"] for row in rows} == {str(result.memory.peak_bytes)}
    assert float(rows[0]["step_s"]) == result.timing.step_s
    assert rows[0]["every_n_layers"] == "2" and rows[0]["provenance"] == result.provenance.label


def test_layer_rows_match_the_layer_columns(result):
    rows = layer_rows(result)
    assert [list(row) for row in rows] == [list(LAYER_COLUMNS)] * 6


def test_a_run_that_did_not_fit_gives_one_row_with_its_status(result):
    failed = replace(result, status="does_not_fit", layers=[], memory=None, timing=None)
    rows = _rows(result_csv(failed))
    assert len(rows) == 1
    assert rows[0]["status"] == "does_not_fit" and rows[0]["layer"] == "" and rows[0]["peak_bytes"] == ""


def test_checkpointing_off_is_written_as_off(result):
    rows = _rows(result_csv(replace(result, spec=replace(result.spec, every_n_layers=None))))
    assert rows[0]["every_n_layers"] == "off"
