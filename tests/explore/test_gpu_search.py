"""The GPU search: the fewest GPUs, then the least recompute, that fits a per-GPU budget, checked against every pair."""

from __future__ import annotations

import math
import threading

import pytest

from ckptlab.errors import SpecError
from ckptlab.explore import gpu_search
from ckptlab.explore.gpu_search import GpuSearch, cheapest_that_fits
from ckptlab.explore.scale import ScaleRequest, Setting, fits, recompute_cost
from ckptlab.step.simulate import simulate

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

# tiny-bert on 3 of its 4 layers (the shallower fixture), still four plans of distinct recompute (off, CP CP CP,
# CP keep CP, CP keep keep): a simulation costs its operations, and the search's logic is the same whatever the
# model (its code for tiny-llama is the engineer's journey's, tests/app/test_journeys.py).
MODEL, SEQ, LAYERS = "tiny-bert", 64, 3
SETTINGS = (Setting(None), Setting(1), Setting(2), Setting(LAYERS))
COUNTS = (1, 2, 4, 8)


@pytest.fixture(autouse=True)
def _tensors_only(monkeypatch):
    """The device total stubbed as the tensors' peak (the search's order is what is tested here; that the search
    decides on the device total is tests/explore/test_device.py's)."""
    monkeypatch.setattr(gpu_search, "on_gpu", lambda gpu=None: lambda result, budget: result)


@pytest.fixture(scope="module")
def scale(shallower) -> ScaleRequest:
    return ScaleRequest(shallower(MODEL, LAYERS), SEQ, 1, "bfloat16", SETTINGS)


@pytest.fixture(scope="module")
def every_pair(scale):
    """Every (setting, GPUs) simulated: what the search must agree with without simulating it all."""
    return {scale.spec(setting, gpus): simulate(scale.spec(setting, gpus)) for setting in SETTINGS for gpus in COUNTS}


def _brute_force(every_pair, budget: int):
    fitting = [result for result in every_pair.values() if fits(result, budget)]
    if not fitting:
        return None
    return min(fitting, key=lambda r: (r.spec.world_size, recompute_cost(Setting.of(r.spec), LAYERS)))


def _budgets(every_pair) -> list[int]:
    """Every peak, and one byte under it: each edge where the answer can change."""
    peaks = sorted({result.memory.peak_bytes for result in every_pair.values()})
    return sorted({b for peak in peaks for b in (peak, peak - 1)})


def test_per_gpu_memory_does_not_grow_with_the_gpus_under_fsdp(scale, every_pair):
    """The fact the search stands on (for 2 GPUs and more), here on a real simulation."""
    for setting in SETTINGS:
        peaks = [every_pair[scale.spec(setting, gpus)].memory.peak_bytes for gpus in COUNTS if gpus > 1]
        assert peaks == sorted(peaks, reverse=True), (setting, peaks)


def test_the_answer_is_the_fewest_gpus_then_the_least_recompute_at_every_budget(scale, every_pair):
    answers = set()
    for budget in _budgets(every_pair):
        search = cheapest_that_fits(scale, budget, counts=COUNTS, known=every_pair)
        expected = _brute_force(every_pair, budget)
        assert search.result is expected, (budget, search.gpus, search.setting)
        assert search.simulated == 0  # everything was known
        answers.add((search.gpus, search.setting))
    assert {gpus for gpus, _ in answers} == {None, *COUNTS}  # the budgets reach every count, and nothing
    assert len({setting for _, setting in answers}) >= 3  # and several settings


def test_it_simulates_far_fewer_than_every_pair_and_its_answer_fits_when_simulated_again(
    scale, every_pair, monkeypatch
):
    calls = []

    def counted(table, spec, **kwargs):
        calls.append(spec)
        return every_pair[spec]

    monkeypatch.setattr(gpu_search.TableSimulation, "result", counted)
    peaks_at_two = [every_pair[scale.spec(s, 2)].memory.peak_bytes for s in SETTINGS]
    budget = min(peaks_at_two)  # nothing fits one GPU (the optimizer step), the leanest setting fits two
    search = cheapest_that_fits(scale, budget, counts=COUNTS)
    assert search.gpus == 2 and search.fits
    assert search.simulated == len(calls) == len(set(calls))  # nothing simulated twice
    bound = 2 * len(SETTINGS) + (len(COUNTS) - 1) * math.ceil(math.log2(len(COUNTS)))
    assert len(calls) <= bound < len(SETTINGS) * len(COUNTS)
    monkeypatch.undo()
    again = simulate(search.result.spec)  # a fresh simulation of the answer, not the search's copy
    assert again.memory.peak_bytes <= budget
    assert again.spec.world_size == 2 and again.spec.fsdp and again.ranks


def test_one_gpu_wins_when_it_fits_and_off_wins_when_it_fits(scale, every_pair):
    roomy = max(result.memory.peak_bytes for result in every_pair.values())
    search = cheapest_that_fits(scale, roomy, counts=COUNTS, known=every_pair)
    assert (search.gpus, search.setting) == (1, Setting(None))
    assert len(search.tried) == 1


def test_nothing_fits_says_what_comes_closest_at_the_most_gpus(scale, every_pair):
    lowest = min(result.memory.peak_bytes for result in every_pair.values())
    search = cheapest_that_fits(scale, lowest - 1, counts=COUNTS, known=every_pair)
    assert not search.fits and search.code() is None
    closest = search.lowest()
    assert closest.spec.world_size == COUNTS[-1] and closest.memory.peak_bytes == lowest


def test_the_code_of_an_answer_past_one_gpu_launches_and_shards(scale, every_pair):
    budget = min(every_pair[scale.spec(s, 4)].memory.peak_bytes for s in SETTINGS)
    search = cheapest_that_fits(scale, budget, counts=COUNTS, known=every_pair)
    code = search.code()
    n = search.setting.every_n_layers
    assert code.launch == f"torchrun --nproc-per-node {search.gpus} train.py"
    assert code.ckptlab_launch.startswith(
        f"python -m ckptlab run --nproc-per-node {search.gpus} --fsdp --model {scale.model}"
    )
    assert f"activation_checkpointing_enable(every_n_layers={n}, offload=False)" in code.model_code
    assert "fully_shard(model)" in code.model_code and "fsdp=True" in code.trainer_code


def test_stop_and_bad_input(scale):
    stop = threading.Event()
    stop.set()
    search = cheapest_that_fits(scale, 1, counts=COUNTS, cancel=stop)
    assert isinstance(search, GpuSearch) and search.cancelled and not search.fits and not search.tried
    for budget, counts in ((0, COUNTS), (1, ()), (1, (3, 12)), (1, (0,))):
        with pytest.raises(SpecError):
            cheapest_that_fits(scale, budget, counts=counts)
    lora = ScaleRequest(MODEL, SEQ, 1, "bfloat16", SETTINGS, lora_rank=8)
    with pytest.raises(SpecError, match="LoRA"):
        cheapest_that_fits(lora, 1, counts=COUNTS)  # refused before anything is simulated
