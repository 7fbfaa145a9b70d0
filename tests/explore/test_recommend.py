"""Recommendation: the fastest row under the budget from a hand-made table; nothing fits; the code runs."""

from __future__ import annotations

import ast
import dataclasses

import pytest
import torch
from transformers import TrainingArguments

from ckptlab import build_model, observed_roles, planned_roles
from ckptlab.errors import SpecError
from ckptlab.explore.budget import GPUS
from ckptlab.explore.recommend import recommend
from ckptlab.explore.sweep import SweepRow
from ckptlab.units import GIB, MIB


def row(n, peak_mib, step_ms, *, seq=1024, offload=False, spread=0.01, offload_mib=0, baseline_mib=100):
    step = step_ms / 1000
    return SweepRow(
        seq_len=seq,
        every_n_layers=n,
        offload=offload,
        status="ok",
        provenance="measured-cuda",
        cp_layers=0 if n is None else max(1, 8 // n),
        baseline_bytes=baseline_mib * MIB,
        after_forward_bytes=(peak_mib - baseline_mib) * MIB // 2,
        peak_bytes=peak_mib * MIB,
        offload_bytes=offload_mib * MIB,
        forward_s=step / 3,
        backward_s=2 * step / 3,
        step_s=step,
        step_min_s=step * (1 - spread),
        step_max_s=step * (1 + spread),
        step_ratio=step_ms / 100,
    )


TABLE = [
    row(None, 1000, 100),  # fastest, too big for 800
    row(8, 900, 104),  # only L1: still too big
    row(4, 780, 110),  # fits 800, fastest of those that do
    row(2, 700, 118),
    row(1, 600, 130, offload_mib=200),
    row(1, 400, 131, offload=True),
]


def test_picks_the_fastest_row_that_fits_with_its_margin():
    rec = recommend(TABLE, 800 * MIB)
    assert rec.fits and rec.row.every_n_layers == 4 and not rec.row.offload
    assert rec.margin_bytes == 20 * MIB
    assert [r.setting for r in rec.fitting] == ["n=4", "n=2", "n=1", "n=1+offload"]
    assert "every_n_layers=4 is the fastest of the 4 measured settings" in rec.reason
    assert "Checkpointing off needs 1,000.0 MiB" in rec.reason
    assert rec.model_code == "model.activation_checkpointing_enable(every_n_layers=4, offload=False)"
    assert '"every_n_layers": 4' in rec.trainer_code


def test_off_is_recommended_when_it_fits():
    rec = recommend(TABLE, 2 * GIB)
    assert rec.row.every_n_layers is None and "leave it off" in rec.reason
    assert rec.model_code == "model.activation_checkpointing_disable()"


def test_offload_wins_only_when_nothing_else_fits():
    rec = recommend(TABLE, 500 * MIB)
    assert rec.row.setting == "n=1+offload"


def test_rows_within_the_noise_are_named():
    rec = recommend([row(4, 700, 110, spread=0.1), row(2, 650, 115, spread=0.1)], 800 * MIB)
    assert rec.row.every_n_layers == 4 and rec.as_fast == ["n=2"]


def test_a_difference_within_the_noise_is_not_ranked_by_time():
    """n=1 is measured 'faster' than n=4, but within the spread: the predicted recompute cost decides, and says so."""
    rec = recommend([row(1, 600, 100, spread=0.2), row(4, 700, 110, spread=0.2)], 800 * MIB)
    assert rec.ranked_by == "predicted" and rec.row.every_n_layers == 4  # 2 of 8 layers rerun, not all 8
    assert rec.recompute["n=4"] < rec.recompute["n=1"]
    assert "not ranked by time" in rec.reason and "predicted recompute cost" in rec.reason


def test_a_measurable_difference_is_ranked_by_time():
    rec = recommend([row(1, 600, 100, spread=0.01), row(4, 700, 130, spread=0.01)], 800 * MIB)
    assert rec.ranked_by == "measured" and rec.row.every_n_layers == 1 and rec.recompute == {}


def test_a_busy_machine_ranks_by_the_prediction_from_the_model(measured):
    """Rows from real runs whose timing says the machine was loaded: the formula's recompute share decides."""
    from ckptlab.explore.sweep import rows_from_results
    from ckptlab.results import TimingResult

    def loaded(result, step):
        timing = TimingResult(
            method="test",
            forward_s=step / 3,
            backward_s=step / 3,
            step_s=step,
            step_samples=[step] * 3,
            load_average=6.0,
            cores=2,
        )
        return dataclasses.replace(result, timing=timing)

    runs = [loaded(measured(every_n_layers=None), 2.0), loaded(measured(every_n_layers=1), 1.0)]
    rows = rows_from_results(runs)
    assert rows[1].step_verdict == "measurable"  # 1.0 s against 2.0 s, ranges apart: yet the load says busy
    rec = recommend(rows, 1 * GIB)
    assert rec.ranked_by == "predicted" and rec.row.every_n_layers is None
    assert rec.recompute["off"] == 0 and rec.recompute["n=1"] > 0
    assert "too busy to time" in rec.reason


def test_nothing_fits_says_what_would():
    measured_short = row(1, 250, 40, seq=256)
    rec = recommend([*TABLE[:5], measured_short], 300 * MIB, seq_len=1024)
    assert not rec.fits and rec.row is None and rec.model_code == ""
    assert "smallest peak, every_n_layers=1, is 600.0 MiB, 300.0 MiB over" in rec.reason
    text = " ".join(rec.suggestions)
    assert "at seq_len=256, every_n_layers=1 fits" in text  # measured
    assert "Offload" in text and "200.0 MiB" in text  # what offload would move (not measured)


def test_nothing_fits_when_even_the_parameters_do_not():
    rec = recommend(TABLE[:5], 150 * MIB)
    assert not rec.fits
    assert any("parameters and their gradients alone" in s for s in rec.suggestions)


def test_shorter_sequence_estimate_without_a_measured_one():
    rec = recommend(TABLE[:5], 500 * MIB)
    assert any("about seq_len=" in s and "estimate" in s for s in rec.suggestions)


def test_gpu_names_and_bad_budgets():
    assert recommend(TABLE, "H100 80 GB").budget_bytes == 80 * GIB == GPUS["A100 80 GB"]
    assert set(GPUS) == {"H100 80 GB", "H200 141 GB", "A100 40 GB", "A100 80 GB", "L4 24 GB", "RTX 4090 24 GB"}
    assert recommend(TABLE, "H100").budget_label == "H100 80 GB"
    assert recommend(TABLE, "a100-40gb").budget_bytes == 40 * GIB
    assert recommend(TABLE, "4090").budget_label == "RTX 4090 24 GB"
    with pytest.raises(SpecError, match="'A100' matches A100 40 GB, A100 80 GB"):
        recommend(TABLE, "A100")
    with pytest.raises(SpecError, match="'TPU v5'"):
        recommend(TABLE, "TPU v5")
    with pytest.raises(SpecError, match="-1"):
        recommend(TABLE, -1)
    with pytest.raises(SpecError, match="seq_len=77"):
        recommend(TABLE, GIB, seq_len=77)


def _trainer_kwargs(source: str) -> dict:
    """The keyword arguments of the ``TrainingArguments(...)`` call in ``source``, as values."""
    call = ast.parse(source).body[0].value
    assert isinstance(call, ast.Call) and call.func.id == "TrainingArguments"
    return {keyword.arg: ast.literal_eval(keyword.value) for keyword in call.keywords}


@pytest.mark.parametrize("budget_mib, expected", [(800, 4), (650, 1), (2000, None)])
def test_the_recommended_lines_run_on_a_tiny_model(budget_mib, expected):
    """The model line sets the flags the plan says; the TrainingArguments keywords, applied as Trainer applies them, too."""
    rec = recommend(TABLE, budget_mib * MIB)
    assert (rec.row.every_n_layers if rec.row else "none") == expected
    model, info = build_model("tiny-qwen3")
    exec(rec.model_code, {"model": model})
    assert observed_roles(model) == planned_roles(info.num_layers, expected)

    kwargs = _trainer_kwargs(rec.trainer_code)
    assert set(kwargs) <= {field.name for field in dataclasses.fields(TrainingArguments)}
    fresh, _ = build_model("tiny-qwen3")
    # transformers 5.24 Trainer._inner_training_loop, "Activate activation checkpointing if needed":
    if kwargs["activation_checkpointing"]:
        options = dict(kwargs.get("activation_checkpointing_kwargs") or {})
        fresh.activation_checkpointing_enable(
            every_n_layers=options.pop("every_n_layers", 1),
            offload=options.pop("offload", False),
            activation_checkpointing_kwargs=options or None,
        )
    assert observed_roles(fresh) == planned_roles(info.num_layers, expected)


def test_the_recommended_training_arguments_run_in_a_trainer(tmp_path):
    """The real thing, where accelerate (which Trainer needs) is installed."""
    pytest.importorskip("accelerate")
    from transformers import Trainer

    rec = recommend(TABLE, 800 * MIB)
    kwargs = {**_trainer_kwargs(rec.trainer_code), "output_dir": str(tmp_path), "max_steps": 1, "report_to": []}
    model, info = build_model("tiny-qwen3")
    dataset = [{"input_ids": torch.arange(16), "labels": torch.arange(16)}]
    trainer = Trainer(model=model, args=TrainingArguments(**kwargs), train_dataset=dataset)
    trainer.train()
    assert observed_roles(trainer.model) == planned_roles(info.num_layers, 4)


def test_a_lora_recommendation_enables_checkpointing_then_wraps_with_peft(measured):
    """The optimizer and LoRA of the measured rows go into the code, and the reason says what the peak counts."""
    from ckptlab.explore.sweep import rows_from_results

    rows = rows_from_results([measured(every_n_layers=None, lora_rank=4, optimizer="sgd")])
    rec = recommend(rows, "H100")
    lines = rec.model_code.splitlines()  # the run's whole box (ckptlab.step.code), executed in tests/step/test_code.py
    disable = lines.index("model.activation_checkpointing_disable()")
    assert (
        disable < lines.index("lora_config = LoraConfig(") < lines.index("model = get_peft_model(model, lora_config)")
    )
    assert "    r=4," in lines and '"q_proj"' in rec.model_code and _trainer_kwargs(rec.trainer_code)["optim"] == "sgd"
    assert rec.model_code.endswith("args = " + rec.trainer_code)  # the box ends with the arguments the JSON carries
    assert "LoRA adapters' gradients" in rec.reason and "the state of sgd" in rec.reason


def test_shorter_sequence_suggestion_skips_rows_a_stopped_sweep_never_timed():
    # A sweep stopped during a length's timing leaves rows measured but untimed (step_s None); sorting
    # them beside timed rows raised TypeError (found by mypy). Untimed rows now come after timed ones.
    untimed = dataclasses.replace(row(1, 400, 60, seq=512), step_s=None, step_min_s=None, step_max_s=None)
    rows = [row(None, 1000, 100, seq=1024), row(1, 900, 130, seq=1024), untimed, row(None, 500, 50, seq=512)]
    rec = recommend(rows, 800 * MIB)
    assert not rec.fits
    assert rec.suggestions[0].startswith("A shorter sequence, measured: at seq_len=512, checkpointing off fits")


def test_a_measured_row_without_a_baseline_is_refused_by_name():
    # The estimate of what would fit starts from the baseline: None there was a TypeError.
    rows = [dataclasses.replace(row(1, 900, 130), baseline_bytes=None)]
    with pytest.raises(SpecError, match=r"n=1 at seq_len=1024 .*no measured baseline"):
        recommend(rows, 800 * MIB)


@pytest.mark.parametrize("lang", ["pt-BR", "ja"])
def test_every_sentence_of_a_recommendation_is_said_in_the_apps_languages(lang):
    """Each reason and piece of advice has its translation, filled with its own params (no English left over)."""
    from ckptlab.show import i18n

    cases = [
        recommend(TABLE, 800 * MIB),  # the fastest that fits; off over
        recommend(TABLE, 2 * GIB),  # off fits
        recommend([row(1, 600, 100, spread=0.2), row(4, 700, 110, spread=0.2)], 800 * MIB),  # within the noise
        recommend([*TABLE[:5], row(1, 250, 40, seq=256)], 300 * MIB, seq_len=1024),  # nothing fits: measured shorter
        recommend(TABLE[:5], 150 * MIB),  # not even the parameters
        recommend(TABLE[:5], 500 * MIB),  # a shorter sequence, estimated
        recommend([dataclasses.replace(row(None, 900, 100), status="does_not_fit", peak_bytes=None)], 800 * MIB),
    ]
    keys = set()
    for rec in cases:
        for message in (*rec.reasons, *rec.advice):
            said = i18n.say(message, lang)
            assert said != i18n.say(message) and "{" not in said, message.key
            keys.add(message.key)
    assert len(keys) >= 10  # the cases reach most sentences


def test_the_recommended_rows_time_verdict_is_its_own_fact_in_every_language():
    from ckptlab.results import Judgement, TimeVerdict
    from ckptlab.show import i18n

    judged = TimeVerdict(ratio=1.1, spread=0.02, samples=5, judgement=Judgement.MEASURABLE)
    table = [dataclasses.replace(r, time_verdict=judged) if r.every_n_layers == 4 else r for r in TABLE]
    rec = recommend(table, 800 * MIB)
    (verdict,) = [reason for reason in rec.reasons if reason.key.startswith("recommend.verdict_")]
    assert verdict.key == "recommend.verdict_measurable" and verdict.params["change"] == "+10%"
    assert "Its step time against checkpointing off: +10% (outside the spread of both runs)." in rec.reason
    assert "+10%" in i18n.say(verdict, "ja") and i18n.say(verdict, "pt-BR") != i18n.say(verdict)
    assert not any(reason.key.startswith("recommend.verdict_") for reason in recommend(TABLE, 800 * MIB).reasons)
