"""The formula counts what a selective policy keeps: the kept ops' output bytes, checked against a simulation."""

from __future__ import annotations

import pytest

from ckptlab import RunSpec, SpecError, list_presets, predict, simulate

TINY = [preset.name for preset in list_presets() if preset.cpu_ok]


def _predicted(model: str, selective: str, **options):
    rows = predict(model, seq_len=64, dtype="float32", every_n_layers=[1], selective=selective, **options)
    return {row.every_n_layers: row for row in rows}


@pytest.mark.slow
@pytest.mark.parametrize("model", TINY)
@pytest.mark.parametrize("selective", ["attention", "matmuls"])
def test_the_formula_counts_the_bytes_the_simulated_policy_kept(model, selective):
    simulated = simulate(RunSpec(model=model, seq_len=64, dtype="float32", selective=selective, optimizer="none"))
    assert _predicted(model, selective)[1].kept_bytes == sum(layer.kept_bytes for layer in simulated.layers)


def test_what_the_policy_keeps_is_resident_stays_with_offload_and_shortens_the_rerun():
    plain, attention, matmuls = (_predicted("tiny-llama", name) for name in ("none", "attention", "matmuls"))
    assert plain[1].kept_bytes == 0 and plain[None].selective == "none"
    assert attention[1].resident_bytes - plain[1].resident_bytes == attention[1].kept_bytes > 0
    assert attention[None].resident_bytes == plain[None].resident_bytes  # off: nothing to keep
    assert matmuls[1].kept_bytes > attention[1].kept_bytes
    assert plain[1].recompute_fraction > attention[1].recompute_fraction > matmuls[1].recompute_fraction == 0
    offload = _predicted("tiny-llama", "attention", offload=(True,))[1]
    assert offload.resident_bytes == attention[1].resident_bytes - attention[1].offload_bytes  # only inputs move


def test_a_policy_the_formula_does_not_count_is_one_keyed_error():
    with pytest.raises(SpecError) as caught:
        predict("tiny-llama", seq_len=64, selective="torchtitan")
    assert caught.value.key == "predict.selective_not_counted" and "torchtitan" in str(caught.value)
