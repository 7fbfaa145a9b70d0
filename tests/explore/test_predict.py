"""Predictions: the formula's count against autograd's saved tensors, calibrated within 10%, never measured."""

from __future__ import annotations

import pytest

from ckptlab import RunSpec, list_presets, simulate
from ckptlab.errors import SpecError
from ckptlab.explore.accuracy import check_predictions
from ckptlab.explore.calibration import calibrate
from ckptlab.explore.predict import architecture, layer_activation_bytes, predict, settings_for
from ckptlab.explore.sweep import SweepSpec, sweep

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

TINY = [preset.name for preset in list_presets() if preset.cpu_ok]
SEQ = 128


@pytest.fixture(scope="module")
def sweeps():
    """A sweep (off, n = 1, 2, 3) of every tiny preset at 128 tokens, measured once."""
    return {
        model: sweep(SweepSpec(model=model, seq_lens=(SEQ,), every_n_layers=(1, 2, 3), repeats=1, warmup=0))
        for model in TINY
    }


@pytest.mark.parametrize("model", TINY)
def test_calibrated_prediction_is_within_10_percent_of_the_measured_resident_memory(model, sweeps):
    checks = check_predictions(sweeps[model])
    assert [check.setting for check in checks] == ["off", "n=1", "n=2", "n=3"]
    for check in checks:
        assert check.calibrated_error is not None
        assert abs(check.calibrated_error) < 0.10, (check.setting, check.calibrated_error)
        print(f"{model} {check.setting}: formula {check.formula_error:+.3%}, calibrated {check.calibrated_error:+.3%}")


@pytest.mark.parametrize("model", TINY)
def test_the_formula_counts_what_autograd_saves_in_a_kept_layer(model, sweeps):
    """The adapted Korthikanti count, term by term, is what a kept layer saves (float32, the CPU)."""
    off = sweeps[model].off_row(SEQ).result
    formula = layer_activation_bytes(architecture(model), SEQ, 1, 4)
    assert formula == pytest.approx(off.layers[1].saved_bytes, rel=0.01)
    # And the whole prediction lands near the measurement without any calibration.
    for check in check_predictions(sweeps[model]):
        assert abs(check.formula_error) < 0.10, (check.setting, check.formula_error)


def test_predictions_never_appear_as_measured(sweeps):
    result = sweeps["tiny-llama"]
    predictions = predict(
        "tiny-llama", seq_len=SEQ, dtype="float32", device="cpu", calibration=result.off_row(SEQ).result
    )
    assert {p.provenance.kind for p in predictions} == {"predicted"}
    assert all(p.provenance.label.startswith("predicted") for p in predictions)
    assert {p.method for p in predictions} == {"formula", "calibrated"}
    # The sweep's rows hold measurements only; the checks keep the two apart, by name.
    assert {row.provenance for row in result.rows} == {"measured-cpu"}
    for row, check in zip(result.rows, check_predictions(result)):
        assert check.measured_after_forward_bytes == row.result.memory.after_forward_bytes
        assert check.measured_provenance == "measured-cpu"


def test_korthikanti_shape_of_the_formula():
    """Resident after the forward: CP layers keep their input, kept layers everything; off keeps most."""
    predictions = {p.every_n_layers: p for p in predict("qwen3-8b", seq_len=4096, dtype="bfloat16", device="cuda")}
    arch = architecture("qwen3-8b")
    layer_input = 4096 * arch.hidden_size * 2
    off, full = predictions[None], predictions[1]
    layer = layer_activation_bytes(arch, 4096, 1, 2)
    assert off.resident_bytes - full.resident_bytes == arch.num_layers * (layer - layer_input)
    assert full.offload_bytes == arch.num_layers * layer_input
    assert (
        off.rerun_extra_bytes == 0 and full.rerun_extra_bytes == layer
    )  # bf16 RMSNorm keeps a float32 copy of the input
    assert 0.8 < full.recompute_fraction < 1.0  # the layers are most of the forward; the head the rest
    assert full.step_ratio == pytest.approx(1 + full.recompute_fraction / 3)
    assert predictions[2].resident_bytes < predictions[3].resident_bytes < off.resident_bytes


def test_offload_moves_the_cp_inputs_off_the_device():
    rows = predict("tiny-llama", seq_len=256, every_n_layers=[2], offload=[False, True], device="cuda")
    plain, offloaded = (p for p in rows if p.every_n_layers == 2)
    assert plain.resident_bytes - offloaded.resident_bytes == plain.offload_bytes == 3 * 256 * 384 * 2


def test_a_layer_nested_in_a_checkpointed_one_keeps_nothing_and_reruns_with_it():
    """Zamba2's shape: L2 inside L1, L4 inside L3. At every_n_layers=2 the keep layers L2 and L4 sit in checkpointed
    parents: they keep no activations, rerun with their parents (the rerun rebuilds them too); the words say so."""
    from dataclasses import replace

    from ckptlab import describe_plan

    flat = architecture("tiny-llama", num_layers=4)
    nested = replace(flat, nested_in=(None, 0, None, 2))
    (plain,), (inside,) = (predict(arch, seq_len=64, every_n_layers=[2])[1:] for arch in (flat, nested))
    layer = layer_activation_bytes(flat, 64, 1, 2)  # 'auto' is bf16, as a simulation reads it
    assert plain.resident_bytes - inside.resident_bytes == 2 * layer  # L2 and L4 kept theirs, unnested
    assert inside.cp_layers == plain.cp_layers == 2  # the flags transformers sets
    assert inside.recompute_fraction == pytest.approx(2 * plain.recompute_fraction)  # four layers rerun, not two
    assert inside.rerun_extra_bytes == plain.rerun_extra_bytes + layer  # L1's rerun rebuilds L2's too
    assert describe_plan(4, 2, nested.nested_in).endswith("L2 reruns inside L1's rerun, L4 reruns inside L3's rerun")


def test_settings_keep_one_of_each_plan():
    assert settings_for(6) == [1, 2, 3, 4, 5, 6]
    assert settings_for(6, [8, 6, 7, 2]) == [8, 2]


def test_calibration_must_be_an_off_run_of_the_same_shape(measured):
    with pytest.raises(SpecError, match="checkpointing off"):
        calibrate(measured(every_n_layers=2))
    with pytest.raises(SpecError, match="same model and shape"):
        predict("tiny-llama", seq_len=256, calibration=measured(every_n_layers=None))


@pytest.mark.parametrize("model", ["tiny-qwen3", "tiny-gpt2"])  # GQA and a float32 softmax; a bf16 softmax
def test_eager_attention_adds_the_a_s_squared_term_as_simulated(model):
    """Eager keeps each layer's probabilities (and, checkpointed, its mask once): the formula's eager minus SDPA
    is the simulation's, to the byte, off and checkpointed."""
    shape = {"seq_len": 128, "batch_size": 2, "dtype": "bfloat16", "device": "cuda"}
    predicted = {
        attention: {
            p.every_n_layers: p.resident_bytes
            for p in predict(model, every_n_layers=[2], **shape, attn_implementation=attention)
        }
        for attention in ("sdpa", "eager")
    }
    for n in (None, 2):
        simulated = {
            attention: simulate(
                RunSpec(model=model, every_n_layers=n, attn_implementation=attention, optimizer="none", **shape)
            ).memory.after_forward_bytes
            for attention in ("sdpa", "eager")
        }
        assert predicted["eager"][n] - predicted["sdpa"][n] == simulated["eager"] - simulated["sdpa"], n
