"""The sweep: rows equal single runs, the model is built once, cancel keeps rows, offload on the CPU, the CLI."""

from __future__ import annotations

import csv
import io
import json
import threading
from contextlib import contextmanager

import pytest

from ckptlab import load_model
from ckptlab.cli import main
from ckptlab.explore.sweep import SweepSpec, plan_sweep, sweep
from ckptlab.show import i18n

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

# Same shape as conftest.FAST, so rows can be checked against the session's cached single runs.
QUICK = SweepSpec(model="tiny-llama", seq_lens=(128,), repeats=1, warmup=0, optimizer="none")  # as conftest.FAST
# The command line's rows, notes and recommendation are the same code on any model: tiny-bert's 4 layers, the fewest
# operations a step (the default model's rows are the sweep's own, above).
CLI_QUICK = ["--model", "tiny-bert", "--seq-len", "64", "--repeats", "1", "--warmup", "0", "--every-n-layers", "1,3"]


@pytest.fixture(scope="module")
def swept():
    return sweep(QUICK)


def test_rows_are_off_then_every_distinct_setting(swept):
    assert [row.setting for row in swept.rows] == ["off", "n=1", "n=2", "n=3", "n=4", "n=5", "n=6"]
    assert [row.cp_layers for row in swept.rows] == [0, 6, 3, 2, 2, 2, 1]
    assert not swept.cancelled
    assert all(row.status == "ok" and row.provenance == "measured-cpu" for row in swept.rows)
    off = swept.rows[0]
    assert off.after_forward_ratio == off.peak_ratio == off.step_ratio == 1.0
    for row in swept.rows[1:]:
        assert row.after_forward_ratio == row.after_forward_bytes / off.after_forward_bytes
        assert row.step_ratio == row.step_s / off.step_s


def test_rows_equal_single_runs_of_the_same_settings(swept, measured):
    """MemTracker is deterministic on the CPU: one model reused across rows changes no byte."""
    for row in swept.rows:
        single = measured(every_n_layers=row.every_n_layers)  # conftest.FAST with this setting, its own model
        assert row.result.spec == single.spec
        assert row.baseline_bytes == single.memory.baseline_bytes
        assert row.after_forward_bytes == single.memory.after_forward_bytes
        assert row.peak_bytes == single.memory.peak_bytes
        assert row.peak_where == single.memory.peak_where.description
        assert [layer.observed for layer in row.result.layers] == [layer.observed for layer in single.layers]


def test_model_is_built_once_and_each_row_takes_a_turn():
    loads, turns = [], []

    def load(spec):
        loads.append(spec)
        return load_model(spec)

    @contextmanager
    def turn(label):
        turns.append(label)
        yield

    result = sweep(
        SweepSpec(model="tiny-gpt2", seq_lens=(32, 64), every_n_layers=(1,), repeats=1, warmup=0), load=load, turn=turn
    )
    assert len(loads) == 1
    assert [(row.seq_len, row.setting) for row in result.rows] == [(32, "off"), (32, "n=1"), (64, "off"), (64, "n=1")]
    # A turn per row's memory step, and one per length for its interleaved timed rounds.
    assert len(turns) == 6 and turns[0].startswith("row 1 of 4") and turns[2] == "seq 32: 2 settings timed interleaved"


@pytest.mark.parametrize(
    "order, expected",
    [("interleaved", [None, 1, 2] * 3), ("blocks", [None] * 3 + [1] * 3 + [2] * 3)],
)
def test_timed_steps_run_round_by_round(order, expected):
    """A B C A B C: the order of the timed steps, observed through the sweep's callback (no clock involved)."""
    seen = []
    spec = SweepSpec(
        model="tiny-gpt2",
        seq_lens=(32,),
        every_n_layers=(1, 2),
        repeats=3,
        warmup=0,
        optimizer="none",
        timing_order=order,
    )
    result = sweep(spec, on_timed_step=lambda run_spec: seen.append(run_spec.every_n_layers))
    assert seen == expected
    off = result.rows[0]
    for row in result.rows[1:]:
        assert len(row.result.timing.step_samples) == 3
        assert row.step_ratio == row.time_verdict.ratio == row.step_s / off.step_s  # ratio of medians over the rounds
        assert row.step_verdict in ("measurable", "noise") and row.step_verdict == row.time_verdict.judgement.value
    assert off.step_verdict == "" and off.time_verdict is None


def test_cancel_between_rows_keeps_the_rows_measured():
    stop = threading.Event()
    fractions = []

    def progress(message, fraction):
        fractions.append(fraction)
        if i18n.say(message).startswith("row 2 of"):
            stop.set()  # pressed during row 2: row 2 finishes, row 3 never starts

    result = sweep(SweepSpec(model="tiny-gpt2", seq_lens=(32,), repeats=1, warmup=0), progress=progress, cancel=stop)
    assert result.cancelled
    assert [row.setting for row in result.rows] == ["off", "n=1"]
    assert fractions == sorted(fractions) and max(fractions) < 1.0


def test_cancel_as_a_function_before_the_first_row():
    result = sweep(QUICK, cancel=lambda: True)
    assert result.cancelled and result.rows == []


def test_offload_rows_are_skipped_on_the_cpu_and_said_once():
    plan = plan_sweep(SweepSpec(seq_lens=(64, 128), offload="both", device="cpu"))
    assert all(offload is False for _, _, offload, *_ in plan.rows)
    assert [note.key for note in plan.notes].count("note.offload_skipped") == 1
    assert len(plan.rows) == 2 * 7


def test_settings_with_the_same_plan_are_measured_once():
    plan = plan_sweep(SweepSpec(every_n_layers=(6, 8, 2), device="cpu"))
    assert [n for _, n, *_ in plan.rows] == [None, 6, 2]
    (same,) = [note for note in plan.notes if note.key == "note.same_plan"]
    assert same.params == {"dropped": "8", "kept": 6, "layers": 6}
    assert "every_n_layers=8 give the same plan as every_n_layers=6 on 6 layers" in i18n.say(same)


def test_sweep_to_csv_and_json(swept):
    table = list(csv.DictReader(io.StringIO(swept.to_csv())))
    assert [row["setting"] for row in table] == [row.setting for row in swept.rows]
    assert int(table[1]["after_forward_bytes"]) == swept.rows[1].after_forward_bytes
    data = json.loads(swept.to_json())
    assert data["rows"][0]["every_n_layers"] is None and "result" not in data["rows"][0]


# -- command line ---------------------------------------------------------------------------


def test_cli_sweep_json_parses(capsys):
    assert main(["sweep", "--json", *CLI_QUICK, "--budget", "1GiB"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [row["setting"] for row in data["rows"]] == ["off", "n=1", "n=3"]
    assert {p["setting"] for p in data["predictions"]} == {"off", "n=1", "n=3"}
    # One timed step a row cannot tell settings apart: ranked by the predicted recompute cost, off reruns nothing.
    assert all(row["step_verdict"] in ("", "too_few") for row in data["rows"])
    assert data["recommendation"]["ranked_by"] == "predicted" and data["recommendation"]["setting"] == "off"
    assert data["recommendation"]["predicted_recompute"]["off"] == 0


def test_cli_sweep_csv_parses(capsys):
    assert main(["sweep", "--csv", *CLI_QUICK]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [row["setting"] for row in rows] == ["off", "n=1", "n=3"]
    assert all(row["provenance"] == "measured-cpu" for row in rows)


def test_cli_sweep_text_reports_offload_skip_and_predictions(capsys):
    assert main(["sweep", *CLI_QUICK, "--offload", "both", "--gpu", "L4 24 GB"]) == 0
    out = capsys.readouterr().out
    assert "offload rows skipped" in out and "Predicted resident" in out and "Recommendation for L4 24 GB" in out


@pytest.mark.parametrize(
    "args, named",
    [
        (["--seq-len", "0"], "'0'"),
        (["--seq-len", "128,abc"], "'abc'"),
        (["--every-n-layers", "0"], "'0'"),
        (["--every-n-layers", "two"], "'two'"),
        (["--offload", "maybe"], "'maybe'"),
        (["--budget", "lots"], "'lots'"),
        (["--gpu", "TPU"], "'TPU'"),
        (["--seq-len", "100000"], "100000"),
        (["--model", "no-such-model"], "'no-such-model'"),
        (["--no-checkpointing"], "--no-checkpointing"),
    ],
)
def test_cli_sweep_bad_input_exits_2_with_one_message(capsys, args, named):
    assert main(["sweep", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0]
    assert "Traceback" not in captured.err


@pytest.mark.parametrize("lang", ["pt-BR", "ja"])
def test_the_plans_notes_are_said_in_the_apps_languages(lang):
    """The notes a page shows under a sweep carry keys: each is translated and filled, none left in English."""
    from ckptlab.show import i18n

    plans = [
        plan_sweep(SweepSpec(every_n_layers=(6, 8, 2), offload="yes", warmup=2, device="cpu")),
        plan_sweep(SweepSpec(offload="both", device="cpu")),
    ]
    notes = [note for plan in plans for note in plan.notes]
    assert {note.key for note in notes} >= {"note.same_plan", "note.offload_skipped_instead", "note.offload_skipped"}
    for note in notes:
        said = i18n.say(note, lang)
        assert said != i18n.say(note, "en") and "{" not in said, note.key
