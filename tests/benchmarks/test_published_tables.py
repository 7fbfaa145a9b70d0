"""The published-tables benchmark's table code, on a tiny row (benchmarks/published_tables.py; the real rows are a script)."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from ckptlab import RunSpec
from ckptlab.explore.reference import PR_48444_ROWS
from ckptlab.units import MIB

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "published_tables.py"
METRICS = {
    "active",
    "allocated",
    "reserved",
    "nvidia-smi",
    "card memory",
}  # card memory: a card whose size a context fits (Unsloth)


@pytest.fixture(scope="module")
def tables():
    spec = importlib.util.spec_from_file_location("published_tables_benchmark", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_a_tiny_row_is_simulated_and_printed_with_its_metric_figure_error_and_why(tables):
    spec = RunSpec(model="tiny-llama", seq_len=64, every_n_layers=None, optimizer="none")
    peak = tables._peak(spec)().num_bytes
    row = tables.PublishedRow(
        "tiny",
        "a test",
        "tiny-llama, 64 tokens",
        "active",
        round(peak * 1.04),  # the lab's figure 3.8% below the "published" one
        tables._peak(spec),
        True,
        lambda lab: "the same setup",
    )
    unlike = replace(row, expressible=False, why=lambda lab: "not expressible: a test")
    done = tables.reproduce([row, unlike])
    assert [item.lab_bytes for item in done] == [peak, peak] and done[0].lab.memory is not None
    assert done[0].error == pytest.approx(1 / 1.04 - 1) and done[0].within
    assert not done[1].within  # a row the lab cannot express never counts, however close
    markdown = tables.table_markdown(done)
    assert "| a test | tiny-llama, 64 tokens | active |" in markdown and "-3.8% (within 5%)" in markdown
    assert "not expressible: a test" in markdown
    text = tables.table_text(done)
    assert "error -3.8%, within 5%" in text and "not like for like" in text


def test_every_table_names_its_source_metric_and_figures(tables):
    rows = [row for build in tables.TABLES.values() for row in build()]  # builds specs, simulates nothing
    assert {row.table for row in rows} == set(tables.TABLES)
    assert all(row.metric in METRICS and row.source and row.published_bytes > 0 for row in rows)
    published = sorted(row.published_bytes for row in rows if row.table == "pr48444")
    table = [round(mib * MIB) for row in PR_48444_ROWS for mib in (row.published_plain_mib, row.published_offload_mib)]
    assert published == sorted(table)
    assert sum(row.expressible for row in rows) >= 2
