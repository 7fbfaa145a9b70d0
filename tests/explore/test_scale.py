"""The At-scale core: which settings to simulate, the table of simulations, cancel, reuse, what fits."""

from __future__ import annotations

import threading

import pytest

from ckptlab.errors import SpecError
from ckptlab.explore import scale
from ckptlab.explore.scale import (
    ScaleRequest,
    Setting,
    every_n_choices,
    fits,
    least_recompute_that_fits,
    scale_settings,
    scale_table,
)
from ckptlab.lab.scalejob import ScaleJob
from ckptlab.show.i18n import say

MODEL, SEQ = "tiny-llama", 128  # 6 layers; about a second a simulation on 2 cores
SETTINGS = (Setting(None), Setting(1), Setting(1, offload=True), Setting(2))


@pytest.fixture(scope="module")
def table():
    seen: list[tuple[str, float]] = []
    result = scale_table(
        MODEL, SEQ, 1, "bfloat16", SETTINGS, progress=lambda message, fraction: seen.append((message, fraction))
    )
    return result, seen


def test_distinct_every_n_are_the_divisors_with_1_2_and_the_layer_count():
    assert every_n_choices(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]  # qwen3-8b
    assert every_n_choices(32) == [1, 2, 4, 8, 16, 32]  # llama-3.1-8b
    assert every_n_choices(7) == [1, 2, 7]  # a prime: 2 is still there
    assert every_n_choices(1) == [1]
    assert every_n_choices(5, "all") == [1, 2, 3, 4, 5]


def test_settings_off_first_offload_beside_n1_by_default():
    keys = [setting.key for setting in scale_settings(6)]
    assert keys == ["off", "n=1", "n=1+offload", "n=2", "n=3", "n=6"]
    assert [s.key for s in scale_settings(4, offload="none")] == ["off", "n=1", "n=2", "n=4"]
    every = scale_settings(3, every="all", offload="all")
    assert [s.key for s in every] == ["off", "n=1", "n=1+offload", "n=2", "n=2+offload", "n=3", "n=3+offload"]
    assert len(scale_settings(36, every="all", offload="all")) == 1 + 2 * 36


def test_bad_choices_raise_spec_errors():
    for call in (
        lambda: every_n_choices(0),
        lambda: every_n_choices(4, "some"),
        lambda: scale_settings(4, offload="maybe"),
    ):
        with pytest.raises(SpecError):
            call()


def test_cp_layers_counts_the_checkpointed_layers():
    assert Setting(None).cp_layers(36) == 0
    assert Setting(1).cp_layers(36) == 36
    assert Setting(4).cp_layers(36) == 9
    assert Setting(36).cp_layers(36) == 1


def test_table_simulates_each_setting_in_order(table):
    result, seen = table
    assert result.settings == list(SETTINGS) and not result.cancelled
    assert result.num_layers == 6
    assert all(run.provenance.kind == "simulated" and run.timing is None for run in result.results)
    assert set(result.seconds) == {setting.key for setting in SETTINGS}
    off, full, offload, half = (result.result_for(setting).memory for setting in SETTINGS)
    assert full.after_forward_bytes < half.after_forward_bytes < off.after_forward_bytes
    # offload holds the checkpointed inputs on the host, not on the device.
    assert offload.host_offload_bytes > 0 and full.host_offload_bytes == 0
    assert offload.after_forward_bytes < full.after_forward_bytes
    assert offload.host_offload_bytes == offload.offload_bytes
    fractions = [fraction for _, fraction in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert any(say(message).startswith("n=1+offload: simulating") for message, _ in seen)
    # Each setting's shallow steps counted upwards, whatever their depths (issue 43: "3 of 36 layers", then "2 of 36").
    steps: dict[str, list[tuple[int, int]]] = {}
    for message, _ in seen:
        inner = message.params.get("message") if message.key == "progress.prefixed" else message
        if inner is not None and inner.key == "progress.simulating_some":
            steps.setdefault(say(message.params["prefix"]), []).append((inner.params["step"], inner.params["steps"]))
    assert steps and all([step for step, _ in pairs] == list(range(1, len(pairs) + 1)) for pairs in steps.values())
    assert all(step <= total for pairs in steps.values() for step, total in pairs)


def test_known_results_are_reused_not_simulated_again(table, monkeypatch):
    first, _ = table
    monkeypatch.setattr(scale.TableSimulation, "result", lambda *args, **kwargs: pytest.fail("simulated again"))
    known = {run.spec: run for run in first.results}
    again = scale_table(MODEL, SEQ, 1, "bfloat16", SETTINGS, known=known)
    assert again.results == first.results and again.seconds == {}


def test_cancel_keeps_the_results_so_far(table, monkeypatch):
    first, _ = table
    known = {run.spec: run for run in first.results}
    done: list = []
    partial = scale_table(
        MODEL, SEQ, 1, "bfloat16", SETTINGS, cancel=lambda: len(done) >= 2, known=known, on_result=done.append
    )
    assert partial.cancelled and partial.settings == list(SETTINGS[:2])


def test_a_sequence_beyond_the_positions_fails_before_simulating(monkeypatch):
    monkeypatch.setattr(scale.TableSimulation, "result", lambda *args, **kwargs: pytest.fail("simulated"))
    with pytest.raises(SpecError, match="2048"):
        scale_table(MODEL, 4096, 1, "bfloat16", SETTINGS)
    with pytest.raises(SpecError, match="dtype"):
        scale_table(MODEL, SEQ, 1, "auto", SETTINGS)
    with pytest.raises(SpecError, match="batch_size"):
        scale_table(MODEL, SEQ, 0, "bfloat16", SETTINGS)
    with pytest.raises(SpecError, match="No settings"):
        scale_table(MODEL, SEQ, 1, "bfloat16", [])


def test_fits_and_the_least_recompute_that_fits(table):
    result, _ = table
    peaks = {setting: result.result_for(setting).memory.peak_bytes for setting in SETTINGS}
    everything = max(peaks.values())
    assert all(fits(run, everything) for run in result.results)
    assert Setting.of(least_recompute_that_fits(result, everything).spec) == Setting(None)  # off reruns nothing
    lowest = min(peaks.values())
    assert least_recompute_that_fits(result, lowest - 1) is None
    best = least_recompute_that_fits(result, lowest)
    assert fits(best, lowest) and best.memory.peak_bytes == lowest


def test_the_job_runs_on_a_thread_and_stop_keeps_results(table, monkeypatch):
    first, _ = table
    by_spec = {run.spec: run for run in first.results}
    entered, release = threading.Event(), threading.Event()

    def slow_simulate(table, spec, progress=None):
        entered.set()
        release.wait(5)
        return by_spec[spec]

    monkeypatch.setattr(scale.TableSimulation, "result", slow_simulate)
    job = ScaleJob(ScaleRequest(MODEL, SEQ, 1, "bfloat16", SETTINGS)).start()
    assert entered.wait(10) and job.state().running
    job.stop()  # while the first simulation is in flight: it finishes, no other starts
    release.set()
    job.join(10)
    state = job.state()
    assert not state.running and state.stop_requested and not state.error
    assert state.table.cancelled and state.table.settings == [SETTINGS[0]]


def test_the_job_checks_its_input_before_starting():
    with pytest.raises(SpecError, match="2048"):
        ScaleJob(ScaleRequest(MODEL, 100_000, 1, "bfloat16", SETTINGS))


@pytest.mark.parametrize("raised", ["keyed", "bug"])
def test_a_failed_job_keeps_what_it_simulated_and_the_error_a_page_translates(monkeypatch, raised):
    from ckptlab.errors import RunStoppedError
    from ckptlab.explore import scale

    real = scale.TableSimulation.result
    calls = {"n": 0}

    def second_fails(table, spec, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            if raised == "keyed":
                raise RunStoppedError(key="run.stopped")
            raise ZeroDivisionError("a bug")
        return real(table, spec, **kwargs)

    monkeypatch.setattr(scale.TableSimulation, "result", second_fails)
    job = ScaleJob(ScaleRequest(MODEL, SEQ, 1, "bfloat16", SETTINGS)).start()
    job.join()
    state = job.state()
    assert not state.running and state.table.cancelled and len(state.table.results) == 1
    if raised == "keyed":
        assert state.error == str(RunStoppedError(key="run.stopped")) and state.failure.key == "run.stopped"
    else:
        assert state.error == "ZeroDivisionError: a bug" and state.failure is None


def test_a_job_past_the_servers_time_limit_stops_between_simulations_and_says_so(monkeypatch):
    from ckptlab.explore import scale

    real = scale.TableSimulation.result
    jobs: list[ScaleJob] = []

    def first_uses_up_the_time(table, spec, **kwargs):
        result = real(table, spec, **kwargs)
        jobs[0].limit_s = 0.0  # as if this simulation had taken the whole limit (no wall clock in a test)
        return result

    monkeypatch.setattr(scale.TableSimulation, "result", first_uses_up_the_time)
    jobs.append(ScaleJob(ScaleRequest(MODEL, SEQ, 1, "bfloat16", SETTINGS), limit_s=3600))
    jobs[0].start().join()
    state = jobs[0].state()
    assert len(state.table.results) == 1 and state.table.cancelled  # the one in flight finished, no other started
    assert state.failure.key == "simulation.time_limit" and "this server's limit" in state.error
    assert not state.stop_requested


def test_the_fastest_predicted_setting_that_fits_is_not_the_least_recompute_nor_the_lowest_peak():
    """Issue 59: where time decides, the choice changes. n=2 with offload reruns the fewest layers of those that fit
    and n=1 with offload has the lowest peak, but their copies cross PCIe on the compute stream: n=1, rerunning every
    layer without copies, is the fastest predicted on an H100. Without counted work the choice stays the recompute
    order's."""
    from ckptlab.explore.gpus import GPU_SPECS
    from ckptlab.explore.scale import fastest_that_fits, table_times
    from tests.explore import hand_table

    table = hand_table.table(hand_table.PEAKS)
    h100 = GPU_SPECS["H100 80 GB"]
    by_memory = min((r for r in table.results if fits(r, hand_table.BUDGET)), key=lambda r: r.memory.peak_bytes)
    assert Setting.of(by_memory.spec) == Setting(1, offload=True)
    assert Setting.of(least_recompute_that_fits(table, hand_table.BUDGET).spec) == Setting(2, offload=True)
    choice = fastest_that_fits(table, hand_table.BUDGET, h100)
    assert choice is not None and choice.ranked_by == "time" and Setting.of(choice.result.spec) == Setting(1)
    times = {row.setting: row for row in table_times(table, h100)}
    fitting = (Setting(1), Setting(1, offload=True), Setting(2, offload=True))
    assert choice.time is not None and choice.time.prediction.seconds == times[Setting(1)].prediction.seconds
    assert all(times[Setting(1)].prediction.seconds < times[s].prediction.seconds for s in fitting[1:])
    assert times[Setting(1)].factor_over_off == pytest.approx((2 + 4 + 2) / (2 + 4))  # the rerun of every layer
    assert fastest_that_fits(table, 10 * 2**30, h100) is None  # nothing fits 10 GiB
    untimed = fastest_that_fits(hand_table.table(hand_table.PEAKS, counted=False), hand_table.BUDGET, h100)
    assert untimed is not None and untimed.ranked_by == "recompute" and untimed.time is not None
    assert Setting.of(untimed.result.spec) == Setting(2, offload=True)
    no_gpu = fastest_that_fits(table, hand_table.BUDGET, None)
    assert no_gpu is not None and (no_gpu.ranked_by, no_gpu.time) == ("recompute", None)
