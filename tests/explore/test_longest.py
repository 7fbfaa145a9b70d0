"""The longest sequence that fits: a search over simulated steps, ending on a length that fits next to one a token
longer that does not (the simulation stubbed with a known peak; the real one is ckptlab.simulate)."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise
from types import SimpleNamespace
from typing import ClassVar

import pytest

from ckptlab import RunSpec
from ckptlab.errors import SpecError
from ckptlab.explore import longest
from ckptlab.explore.longest import check_budget, longest_seq, longest_table
from ckptlab.explore.scale import ScaleRequest
from ckptlab.results import TimelinePoint
from ckptlab.spec import Setting


@pytest.fixture(autouse=True)
def _tensors_only(monkeypatch):
    """The device total stubbed as the tensors' peak (the search's order is what is tested here; that it decides on
    the device total is tests/explore/test_device.py's)."""
    monkeypatch.setattr(longest, "on_gpu", lambda gpu=None: lambda result, budget: SimpleNamespace(device_total=None))


def _stub(bytes_per_token: int, fixed: int, asked: list[int]):
    def simulate(spec: RunSpec):
        asked.append(spec.seq_len)
        quadratic = spec.seq_len**2 // 64  # a little curvature, as attention's or the allocator's
        return SimpleNamespace(
            memory=SimpleNamespace(peak_bytes=fixed + bytes_per_token * spec.seq_len + quadratic, timeline=[])
        )

    return simulate


def test_the_search_ends_one_token_apart_within_few_simulations():
    asked: list[int] = []
    spec = RunSpec(model="tiny-llama", seq_len=128)  # 2,048 positions
    budget = 10_000_000 + 1000 * 1234 + 1234**2 // 64
    found = longest_seq(spec, budget, simulate=_stub(1000, 10_000_000, asked))
    assert (found.seq_len, found.over_seq_len, found.setting) == (1234, 1235, "n=1")
    assert found.peak_bytes <= budget < found.over_peak_bytes and found.simulations == len(set(asked)) <= 12
    assert longest_seq(spec, 10**12, simulate=_stub(1000, 0, [])).seq_len == 2048  # the model's limit fits
    assert longest_seq(spec, 1000, simulate=_stub(1000, 10**6, [])).seq_len == 0  # nothing fits


def _rising(fractions: list[float]) -> bool:
    """A progress bar that never goes back (floating-point rounding aside)."""
    return all(later >= earlier - 1e-9 for earlier, later in pairwise(fractions))


class _FakeTable:
    """Stands for ckptlab.step.table.TableSimulation: a peak of 1,000 bytes a token (n=1: 500) over 10 MB."""

    calls: ClassVar[list[RunSpec]] = []

    def result(self, spec: RunSpec, progress=None):
        self.calls.append(spec)
        per_token = 500 if spec.every_n_layers == 1 else 1000
        return SimpleNamespace(
            spec=spec, memory=SimpleNamespace(peak_bytes=10_000_000 + per_token * spec.seq_len, timeline=[])
        )


def test_a_request_is_searched_per_setting_reusing_what_is_known_and_stop_keeps_the_settings_done(monkeypatch):
    monkeypatch.setattr(longest, "TableSimulation", _FakeTable)
    monkeypatch.setattr(longest, "refuse_over_floor", lambda spec, budget: None)  # made-up peaks, under the real floor
    _FakeTable.calls = []
    request = ScaleRequest("tiny-llama", 64, 1, "bfloat16", (Setting(None), Setting(1), Setting(2)))
    settings = (Setting(None), Setting(1))
    known = {request.spec(Setting(None)): _FakeTable().result(request.spec(Setting(None)))}
    _FakeTable.calls = []
    sent: list = []
    fractions: list[float] = []
    budget = 10_000_000 + 1000 * 700
    table = longest_table(
        request, budget, settings, known=known, on_result=sent.append, progress=lambda m, f: fractions.append(f)
    )
    assert [(row.setting, row.seq_len, row.over_seq_len) for row in table.rows] == [
        ("off", 700, 701),
        ("n=1", 1400, 1401),
    ]
    assert not table.cancelled and table.settings == settings
    assert request.spec(Setting(None)) not in _FakeTable.calls  # the page's 64 tokens, known: reused
    assert table.simulated == len(_FakeTable.calls) == len(sent)
    assert _rising(fractions) and fractions[-1] == 1.0

    _FakeTable.calls = []
    second_begun = lambda: any(spec.every_n_layers == 1 for spec in _FakeTable.calls)  # noqa: E731
    stopped = longest_table(request, budget, settings, cancel=second_begun)  # stopped in n=1's search
    assert stopped.cancelled and [row.setting for row in stopped.rows] == ["off"]


def test_no_budget_is_refused_with_its_own_message():

    for nothing in (0, None, -1, 2.5):
        with pytest.raises(SpecError) as refused:
            check_budget(nothing)
        assert refused.value.key == "longest.no_budget"
    assert "choose a GPU, or a budget in GiB" in str(refused.value)
    from ckptlab.show.wording import app_message

    assert "GPU を選ぶ" in app_message(refused.value, "ja")
    assert check_budget(24 * 2**30) == 24 * 2**30


@pytest.mark.slow  # a real search: about fifteen simulations of tiny-llama
def test_the_longest_sequence_of_tiny_llama_in_a_small_budget_is_a_simulated_step_that_fits(shallower):
    from ckptlab import simulate  # the core, imported by the one test that runs it
    from ckptlab.explore.budget import fit

    # The request's 512 tokens are the search's first guess, near both answers: the fewest simulations. Two of
    # tiny-llama's six layers: the search is the same code at any depth, and its simulations cost less than half
    # (the test 4.8 s against 12.0 s on the quiet machine).
    request = ScaleRequest(shallower("tiny-llama", 2), 512, 1, "bfloat16", (Setting(None), Setting(1)))
    budget = int(0.075 * 2**30)  # the whole model fits at 16 tokens; neither setting reaches its 2,048 positions
    fractions: list[float] = []
    table = longest_table(request, budget, request.settings, progress=lambda message, done: fractions.append(done))
    off, every = table.rows
    for row in table.rows:
        assert row.over_seq_len == row.seq_len + 1
        assert fit(row.peak_bytes, budget).fits and not fit(row.over_peak_bytes, budget).fits
    assert _rising(fractions) and fractions[-1] == 1.0
    assert 16 < off.seq_len < every.seq_len < 2048  # checkpointing every layer buys the longer sequence
    # The search's shared steps (ckptlab.step.table) are the simulation's bytes.
    assert simulate(replace(request.spec(Setting(1)), seq_len=every.seq_len)).memory.peak_bytes == every.peak_bytes


def test_a_search_whose_parameters_alone_exceed_the_budget_is_refused_at_once(monkeypatch, capsys):
    """The parameter floor over the budget: one line before any simulation, for the CLI's search and the page's."""
    import ckptlab.step.simulate
    import ckptlab.step.table
    from ckptlab.cli import main

    def refuse(*args, **kwargs):
        raise AssertionError("simulated although the parameters alone do not fit")

    monkeypatch.setattr(ckptlab.step.simulate, "simulate", refuse)
    monkeypatch.setattr(ckptlab.step.table.TableSimulation, "result", refuse)
    argv = ["simulate", "--model", "tiny-llama", "--longest-seq", "--every-n-layers", "all", "--budget", "1KiB"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "optimizer state alone take" in err and "budget of 0.000 GiB" in err and err.count("\n") == 1, err
    with pytest.raises(SpecError, match="no sequence length fits"):
        longest_table(ScaleRequest("tiny-llama", 64, 1, "bfloat16", (Setting(1),)), 1024, [Setting(1)])


def _peaks(peak_of, stretches=()):
    """A stubbed simulation whose peak is ``peak_of(seq_len)``, and the lengths it was asked. With ``stretches``
    (phase -> high point by length), its timeline has one stretch per phase, whose highest is the peak."""
    asked: list[int] = []

    def simulate(spec: RunSpec):
        asked.append(spec.seq_len)
        timeline = [
            TimelinePoint(order, phase, phase, None, False, "", 0, high(spec.seq_len))
            for order, (phase, high) in enumerate(dict(stretches).items())
        ]
        return SimpleNamespace(memory=SimpleNamespace(peak_bytes=peak_of(spec.seq_len), timeline=timeline))

    return simulate, asked


def test_a_linear_peak_is_answered_by_its_line_in_four_simulations_as_the_search_before_it():
    """Two lengths give the line, its answer and the next length confirm it: the bracketing search's answer in 4."""
    spec = RunSpec(model="tiny-llama", seq_len=128)  # 2,048 positions
    linear = lambda seq_len: 10_000_000 + 1000 * seq_len  # noqa: E731
    counts = []
    for budget in (10_000_000 + 1000 * 1234 + 999, 10_000_000 + 1000 * 77, 10_000_000 + 1000 * 2047):
        simulate, asked = _peaks(linear)
        by_line = longest_seq(spec, budget, simulate=simulate)
        before = longest_seq(spec, budget, simulate=_peaks(linear)[0], by_line=False)
        assert (by_line.seq_len, by_line.over_seq_len) == (before.seq_len, before.over_seq_len)
        assert by_line.simulations == len(asked) == len(set(asked)) <= 4
        counts.append((by_line.simulations, before.simulations))
    assert all(line <= before for line, before in counts) and counts[0][1] > 4, counts  # 128 up to 2,048: 7 before
    assert longest_seq(spec, 10**12, simulate=_peaks(linear)[0]).simulations == 3  # the limit fits: 128, 256, 2048


def test_a_peak_off_its_line_is_followed_by_lines_then_the_bracketing_search_and_counts_every_simulation():
    """A sliding window that saturates (the peak bends at 600 tokens): the first line misses, the lines through the
    lengths nearest the answer reach it. A peak that curves all along (eager attention's ``s x s`` scores): regula
    falsi's answers creep in from one side, and after MAX_LINES lines the bracketing search halves. Both end where
    the search before the lines ends, in no more simulations."""
    spec = RunSpec(model="tiny-llama", seq_len=128)
    bent = lambda seq_len: 10_000_000 + 3000 * min(seq_len, 600) + 1000 * seq_len  # noqa: E731
    curved = lambda seq_len: 10_000_000 + 1000 * seq_len + 10 * seq_len**2  # noqa: E731
    for peak_of, lines_alone in ((bent, True), (curved, False)):
        budget = peak_of(1500) + 500
        simulate, asked = _peaks(peak_of)
        found = longest_seq(spec, budget, simulate=simulate)
        before = longest_seq(spec, budget, simulate=_peaks(peak_of)[0], by_line=False)
        assert (found.seq_len, found.over_seq_len) == (before.seq_len, before.over_seq_len) == (1500, 1501)
        assert 4 < found.simulations == len(asked) == len(set(asked)) <= before.simulations
        # The first guess, its double and MAX_LINES lines' answers: more means the bracketing search went on.
        assert (found.simulations <= 2 + longest.MAX_LINES) == lines_alone, asked


def test_a_peak_whose_first_lengths_lie_before_its_line_is_answered_by_a_second_line_or_each_stretchs_line():
    """llama-3.2-1b's shape in 24 GiB from 512 tokens: the optimizer step's peak (flat: 8 bytes a token) holds the
    step's up to about 2,400 tokens, the backward's (1.62 MB a token) beyond. The step peak's line through 512 and
    1,024 answers past the model's positions; the next lines, through the lengths nearest the answer, reach it. The
    timeline's stretches give each its own line, whose lowest answer is the length itself."""
    spec = RunSpec(model="llama-3.2-1b", seq_len=512)  # 131,072 positions
    optimizer = lambda seq_len: 10_937_189_200 + 8 * seq_len  # noqa: E731
    backward = lambda seq_len: 7_000_000_000 + 1_620_000 * seq_len  # noqa: E731
    step = lambda seq_len: max(optimizer(seq_len), backward(seq_len))  # noqa: E731
    budget = 24 * 2**30
    before = longest_seq(spec, budget, simulate=_peaks(step)[0], by_line=False)
    assert (before.seq_len, before.over_seq_len) == (11_586, 11_587) and before.simulations == 8
    simulate, asked = _peaks(step)
    by_lines = longest_seq(spec, budget, simulate=simulate)  # the step's peak alone: no timeline
    assert (by_lines.seq_len, by_lines.over_seq_len) == (11_586, 11_587)
    assert by_lines.simulations == len(set(asked)) == 6, asked  # 512, 1,024, the limit, two lines' answers, +1
    simulate, asked = _peaks(step, {"optimizer": optimizer, "backward": backward})
    by_stretch = longest_seq(spec, budget, simulate=simulate)
    assert (by_stretch.seq_len, by_stretch.over_seq_len) == (11_586, 11_587)
    assert asked == [512, 1024, 11_586, 11_587]


def test_the_longest_answer_carries_its_steps_counted_work_and_the_page_says_its_predicted_time():
    """Issue 59: the answer keeps the counted work of the simulated step at its length (not another length's), so
    the At-scale page can say that setting's predicted step time on the GPU."""
    from ckptlab.explore.gpus import GPU_SPECS
    from ckptlab.explore.longest import LongestTable
    from ckptlab.explore.roofline import predict_time
    from ckptlab.lab import at_scale_view
    from ckptlab.step.work import OpCost, StepWork, WorkItem

    def work(seq_len: int) -> StepWork:
        return StepWork((WorkItem("forward", 0, OpCost("aten.add.Tensor", "bfloat16", 0, seq_len * 2**20), 1),))

    stub = _stub(1000, 10_000_000, [])

    def simulate(spec: RunSpec):
        return SimpleNamespace(memory=stub(spec).memory, work=work(spec.seq_len))

    spec = RunSpec(model="tiny-llama", seq_len=128, batch_size=2, every_n_layers=1)
    found = longest_seq(spec, 10_000_000 + 1000 * 1234 + 1234**2 // 64, simulate=simulate)
    assert found.seq_len == 1234 and found.work == work(1234)
    request = ScaleRequest("tiny-llama", 128, 2, "bfloat16", (Setting(1),))
    table = LongestTable(request, found.budget_bytes, (found,), (Setting(1),), False, 0.0, found.simulations)
    h100 = GPU_SPECS["H100 80 GB"]
    seconds = predict_time(work(1234), h100, tokens=1234 * 2).seconds
    said = at_scale_view.longest_verdict(table, found.budget_bytes, "a budget", "en", h100).text
    assert f"Step time: {seconds * 1000:,.1f} ms, predicted (roofline, H100 80 GB)." in said
    assert "Step time" not in at_scale_view.longest_verdict(table, found.budget_bytes, "a budget", "en").text
    from ckptlab.cli.simulate import longest_json

    assert "work" not in longest_json(found) and longest_json(found)["seq_len"] == 1234  # thousands of ops: not in JSON
