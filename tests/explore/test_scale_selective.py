"""Selective policies at scale: simulated beside plain checkpointing, and the fewest-GPUs search tries them."""

from __future__ import annotations

import pytest

from ckptlab.errors import SpecError
from ckptlab.explore.gpu_search import cheapest_that_fits
from ckptlab.explore.scale import ScaleRequest, Setting, fits, recompute_cost, scale_settings, scale_table
from ckptlab.step.simulate import simulate

MODEL, SEQ = "tiny-llama", 512  # 6 layers; long enough that checkpointing lowers the peak
SETTINGS = (Setting(None), Setting(1), Setting(1, selective="attention"), Setting(2))
COUNTS = (1, 2)
REQUEST = ScaleRequest(MODEL, SEQ, 1, "bfloat16", SETTINGS)


def test_policies_are_simulated_beside_plain_checkpointing_at_each_n():
    keys = [setting.key for setting in scale_settings(6, "distinct", "n=1", policies=("none", "attention"))]
    assert keys == ["off", "n=1", "n=1+attention", "n=1+offload", "n=2", "n=2+attention", "n=3", "n=3+attention",
                    "n=6", "n=6+attention"]  # fmt: skip
    assert [s.key for s in scale_settings(6, "distinct", "none")] == ["off", "n=1", "n=2", "n=3", "n=6"]
    with pytest.raises(SpecError, match="keep-all"):
        scale_settings(6, policies=("keep-all",))


def test_a_policy_costs_less_rerun_than_plain_checkpointing_of_the_same_layers():
    order = sorted(
        [Setting(1), Setting(1, selective="attention"), Setting(1, selective="matmuls"), Setting(2), Setting(1, True)],
        key=lambda setting: recompute_cost(setting, 6),
    )
    assert [s.key for s in order] == ["n=2", "n=1+matmuls", "n=1+attention", "n=1", "n=1+offload"]


def _allowed(setting, gpus):
    return gpus == 1 or setting.selective == "none"  # spec.selective_with_fsdp: AdamW's step under FSDP2


@pytest.fixture(scope="module")
def every_pair():
    return {
        REQUEST.spec(s, gpus): simulate(REQUEST.spec(s, gpus)) for s in SETTINGS for gpus in COUNTS if _allowed(s, gpus)
    }


def test_a_policy_simulated_under_fsdp_with_an_optimizer_is_refused_by_name():
    spec = REQUEST.spec(Setting(1, selective="attention"), 2)
    spec.validate()  # a valid spec: real ranks measure it (run --nproc-per-node 2 --fsdp --selective attention)
    with pytest.raises(SpecError) as raised:
        simulate(spec)
    assert raised.value.key == "spec.selective_with_fsdp" and "attention" in str(raised.value)
    with pytest.raises(SpecError, match="cannot be simulated"):
        ScaleRequest(MODEL, SEQ, 1, "bfloat16", SETTINGS, world_size=2).check()
    without_optimizer = ScaleRequest(MODEL, SEQ, 1, "bfloat16", SETTINGS, optimizer="none", world_size=2)
    without_optimizer.check()  # the forward and backward alone are simulated (tests/step/test_selective.py)


@pytest.mark.slow
def test_the_simulated_policy_keeps_what_the_table_says(every_pair):
    table = scale_table(MODEL, SEQ, 1, "bfloat16", SETTINGS[1:3], known=every_pair)
    plain, kept = table.results
    assert plain.spec.selective == "none" and kept.spec.selective == "attention"
    assert kept.provenance.kind == "simulated"
    kept_bytes = sum(layer.kept_bytes for layer in kept.layers if layer.enabled == "CP")
    assert kept_bytes > 0 and kept.memory.after_forward_bytes - plain.memory.after_forward_bytes == kept_bytes
    assert table.result_for(Setting(1, selective="attention")) is kept


@pytest.mark.slow
def test_the_search_tries_the_policies_and_agrees_with_every_pair(every_pair):
    peaks = sorted({result.memory.peak_bytes for result in every_pair.values()})
    answers = set()
    for budget in sorted({b for peak in peaks for b in (peak, peak - 1)}):
        fitting = [result for result in every_pair.values() if fits(result, budget)]
        expected = min(fitting, key=lambda r: (r.spec.world_size, recompute_cost(Setting.of(r.spec), 6)), default=None)
        # decided on the tensors' peak, as `fits` above (the device total's decisions are test_device's)
        search = cheapest_that_fits(
            REQUEST, budget, counts=COUNTS, known=every_pair, device=lambda result, budget: result
        )
        assert search.one_gpu_only == ("n=1+attention",)
        assert (search.result.spec if search.result else None) == (expected.spec if expected else None), budget
        if search.result is not None:
            answers.add(search.setting.key)
            if search.setting.selective != "none":
                code = search.code()
                assert "--selective attention" in code.ckptlab_launch
                assert "create_selective_checkpoint_contexts" in code.model_code
                assert '"context_fn": context_fn' in code.trainer_code
    assert "n=1+attention" in answers  # some budget makes the policy the cheapest that fits
