"""The Lab page's words and numbers (ckptlab.lab.lab_view), without Streamlit: what the page draws is decided here."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

import ckptlab
from ckptlab.fact import Fact
from ckptlab.lab import lab_view
from ckptlab.lab.modelbox import LOCAL, hub_name_problem
from ckptlab.lab.query import LORA_RANK_DEFAULT
from ckptlab.lab.run import LabRun, Measured
from ckptlab.lab.server import ServerPolicy
from ckptlab.show import i18n
from ckptlab.show.labels import event_label
from ckptlab.spec import RunSpec
from ckptlab.step.equivalence import GradientCheck
from ckptlab.units import GIB, MIB

lang = "en"  # the tests read the English words


def test_weights_and_gradients_are_two_copies_at_the_dtypes_width():
    assert lab_view.weights_and_gradients_bytes(GIB, "bfloat16") == 4 * GIB
    assert lab_view.weights_and_gradients_bytes(GIB, "float32") == 8 * GIB
    assert lab_view.weights_and_gradients_bytes(GIB, "auto") == 8 * GIB  # "auto" is float32 on a CPU


def test_widget_values_and_spec_from_widgets_round_trip():
    spec = RunSpec(model="tiny-llama", seq_len=256, batch_size=2, every_n_layers=2, offload=False, lora_rank=4,
                   lora_targets=("q_proj",), optimizer="adamw", repeats=3, warmup=1)  # fmt: skip
    values = lab_view.widget_values(spec, "")
    assert values["lab_model"] == "tiny-llama" and values["lab_ckpt"] and values["lab_targets_for"] == "tiny-llama"
    assert lab_view.spec_from_widgets(values, spec.model, spec.lora_targets) == spec
    off = lab_view.widget_values(RunSpec(every_n_layers=None), "")
    assert not off["lab_ckpt"] and off["lab_n"] == 1 and off["lab_lora_rank"] == LORA_RANK_DEFAULT
    assert off["lab_targets_for"] is None  # "all targets", once the model is read
    # checkpointing off: every_n_layers and offload are not part of the spec, whatever their boxes say
    assert (
        lab_view.spec_from_widgets({**off, "lab_n": 3, "lab_offload": True}, "tiny-llama", None).every_n_layers is None
    )
    assert lab_view.widget_values(spec, "my-model")["lab_model"] == LOCAL


def _measured(reused: bool) -> Measured:
    return Measured(result=None, measured_at=datetime(2026, 1, 1, 12, 30, tzinfo=timezone.utc), reused=reused)  # type: ignore[arg-type]


def test_the_status_label_says_reused_or_measured_and_the_wait():
    reused = LabRun(_measured(True), _measured(True), None, wait_s=0.0, elapsed_s=0.1)
    assert lab_view.status_label(reused, lang) == i18n.t("lab.reused_label", lang, clock=lab_view.clock(reused.run))
    fresh = replace(reused, run=_measured(False), wait_s=2.0, elapsed_s=3.25)
    assert lab_view.status_label(fresh, lang) == "Measured in 3.2 s (waited 2.0 s for the device)"
    assert lab_view.status_label(replace(fresh, wait_s=0.1), lang) == "Measured in 3.2 s"


def test_the_gradient_check_is_loud_only_when_it_differs():
    equal = GradientCheck(loss_equal=True, gradients_compared=7, max_abs_difference=0.0, dropout=0.1)
    assert lab_view.gradients_message(equal, "", lang)[0] == "success"
    kind, text = lab_view.gradients_message(replace(equal, max_abs_difference=1e-3), "", lang)
    assert kind == "error" and "0.001" in text
    assert lab_view.gradients_message(None, "RuntimeError: boom", lang) == (
        "warning",
        i18n.t("lab.grads_failed", lang, error="RuntimeError: boom"),
    )


def test_memory_and_time_deltas_are_grey_within_the_noise():
    assert lab_view.memory_delta(10 * MIB, None, lang) == {}
    assert lab_view.memory_delta(10 * MIB, 10 * MIB + 1000, lang)["delta_color"] == "off"
    assert lab_view.memory_delta(8 * MIB, 10 * MIB, lang) == {
        "delta": i18n.t("lab.mib_vs_off", lang, diff="-2.0"),
        "delta_color": "inverse",
    }
    assert lab_view.time_delta(0.2, None, True, lang) == {}
    assert lab_view.time_delta(0.2, 0.1, True, lang) == {
        "delta": i18n.t("lab.vs_off", lang, diff="+100 ms"),
        "delta_color": "inverse",
    }
    assert lab_view.time_delta(0.2, 0.1, False, lang)["delta"] == i18n.t("lab.noise", lang, diff="+100 ms")
    assert lab_view.time_delta(0.2, 0.1, None, lang)["delta"] == i18n.t("lab.too_few_steps", lang, diff="+100 ms")


@pytest.mark.parametrize(
    ("significant", "key"), [(None, "lab.time_too_few"), (True, "lab.time_significant"), (False, "lab.time_noise")]
)
def test_the_time_sentence_follows_the_verdict(significant, key):
    comparison = SimpleNamespace(step_ratio=1.25, step_significant=significant, peak_ratio=1.0)
    assert lab_view.time_sentence(comparison, 3, lang) == i18n.t(key, lang, change="+25%", min=3)


def test_freed_memory_is_said_only_when_the_peak_did_not_move():
    base, run = SimpleNamespace(after_forward_bytes=30 * MIB), SimpleNamespace(after_forward_bytes=10 * MIB)
    unmoved, lowered = SimpleNamespace(peak_ratio=0.99), SimpleNamespace(peak_ratio=0.5)
    assert lab_view.freed_sentence(run, base, unmoved, lang) == i18n.t("lab.freed_not_peak", lang, mib="20.0")
    assert lab_view.freed_sentence(run, base, lowered, lang) == ""
    assert lab_view.freed_sentence(base, run, unmoved, lang) == ""


def test_problems_are_said_in_the_pages_words_and_lora_needs_a_target():
    info = ckptlab.describe("tiny-llama")
    fine = RunSpec(model="tiny-llama", seq_len=64, device="cpu")
    assert lab_view.problem_with(fine, info, ServerPolicy(), "en") == ("", True)
    problem, on_cpu = lab_view.problem_with(replace(fine, seq_len=0), info, ServerPolicy(), "en")
    assert problem and on_cpu
    no_target = replace(fine, lora_rank=4, lora_targets=())
    assert lab_view.problem_with(no_target, info, ServerPolicy(), "en")[0] != ""


def test_a_typed_hub_name_that_is_no_name_is_shown_as_text():
    problem = hub_name_problem("[sign in](https://evil.example/login)", "en")
    assert "](https" not in problem and "evil" in problem  # escaped: \]\(https\:, never a live link
    assert "[sign in](https://evil.example/login)" in problem.replace("\\", "")


def test_a_real_model_on_the_cpu_is_warned_about_with_a_prediction():
    info = ckptlab.describe("qwen3-8b")
    text = lab_view.cpu_warning(RunSpec(model="qwen3-8b", seq_len=512, dtype="bfloat16"), info, lang)
    assert text.startswith("**qwen3-8b is meant for a GPU.**")
    assert f"{4 * info.num_params / GIB:,.1f} GiB" in text
    assert "Predicted (roofline, this CPU)" in text  # tests/conftest.py's speed, never a benchmark in a test


def test_the_head_line():
    line = lab_view.head_line(RunSpec(model="tiny-llama", seq_len=2048, every_n_layers=2), "en")
    assert line.startswith("**tiny-llama** · seq 2,048 · batch 1")
    # 'auto' says what it is and what it resolved to here (this machine has no GPU in CI; on one: cuda, bfloat16).
    assert " · dtype auto (float32) · device auto (cpu) · " in line or "device auto (cuda)" in line
    fixed = lab_view.head_line(RunSpec(model="tiny-llama", dtype="bfloat16", device="cpu"), "en")
    assert " · dtype bfloat16 · device cpu · " in fixed


def test_the_head_line_names_every_setting_that_differs_from_the_defaults():
    """Issue 58: "dtype auto (float32)" and nothing of bf16, accumulation, eager or the selective policy. Each field
    the head does not say already is named by its widget's label when it is not RunSpec's default, none otherwise."""
    spec = RunSpec(
        model="tiny-llama", mixed_precision="bf16", gradient_accumulation_steps=4, attn_implementation="eager",
        selective="matmuls",
    )  # fmt: skip
    line = lab_view.head_line(spec, lang)
    assert "Mixed precision” = 'bf16' · " in line and line.endswith("“Attention \\(attn\\_implementation\\)” = 'eager'")
    assert lab_view.changed_settings(spec, lang) == [
        "“gradient_accumulation_steps” = 4",
        "“Mixed precision” = 'bf16'",
        "“Selective policy” = 'matmuls'",
        "“Attention (attn_implementation)” = 'eager'",
    ]
    assert "“Precisão mista” = 'bf16'" in lab_view.changed_settings(spec, "pt-BR")
    assert lab_view.changed_settings(RunSpec(model="tiny-llama", every_n_layers=2, lora_rank=4), lang) == []


def test_the_page_warns_of_cpu_autocast_as_the_command_line_does():
    """Issue 58: the CLI warned that mixed precision on the CPU is slow, the page did not; one fact says it for both."""
    spec = RunSpec(model="tiny-llama", mixed_precision="bf16", device="cpu", repeats=3, warmup=1)
    warning = lab_view.autocast_warning(spec, True, "pt-BR")
    assert (
        warning.startswith("Precisão mista bf16 na CPU roda o forward sob o autocast da CPU") and "4 passos" in warning
    )
    assert lab_view.autocast_warning(spec, False, lang) == ""  # on a GPU
    assert lab_view.autocast_warning(replace(spec, mixed_precision="none"), True, lang) == ""


def test_a_folder_that_cannot_be_read_is_a_message(tmp_path):
    info, problem = lab_view.folder_info(str(tmp_path / "missing"), "en")
    assert info is None and problem


def test_file_stems_carry_model_length_and_setting_without_spaces_or_slashes(measured):
    result = measured(every_n_layers=2, offload=False)
    stem = lab_view.file_stem(replace(result, model=replace(result.model, name="/models/my model/")))
    assert stem.startswith("ckptlab-models_my-model-seq128-") and " " not in stem and "/" not in stem


def _lab(run, reference=None) -> LabRun:
    when = datetime(2026, 1, 1, 12, 30, tzinfo=timezone.utc)
    measured_ref = None if reference is None else Measured(reference, when, reused=False)
    return LabRun(Measured(run, when, reused=False), measured_ref, None, wait_s=0.0, elapsed_s=1.0)


def test_the_metrics_come_in_the_pages_order_with_deltas_only_against_checkpointing_off(measured):
    full, off = measured(every_n_layers=1), measured(every_n_layers=None)
    shown = lab_view.metrics(_lab(full, off), lang)
    units = ("MiB", "MiB", "ms", "ms", "MiB", "ms")
    names = ("peak", "resident", "forward", "backward", "baseline", "step")
    assert [metric.label for metric in shown] == [
        i18n.t("lab.metric_unit", lang, metric=i18n.t(f"lab.metric_{name}", lang), unit=unit)
        for name, unit in zip(names, units)
    ]
    # The value is the number alone (st.metric cuts a long value; the label wraps): its unit is in the label.
    assert shown[0].value == f"{full.memory.peak_bytes / MIB:,.1f}" and shown[0].help == i18n.t(
        "lab.metric_peak_help", lang
    )
    assert shown[5].value == f"{full.timing.step_s * 1000:,.0f}"
    resident_change = (full.memory.after_forward_bytes - off.memory.after_forward_bytes) / MIB
    assert shown[1].delta["delta"] == i18n.t(
        "lab.mib_vs_off", lang, diff=f"{resident_change:+,.1f}"
    )  # checkpointing freed it
    assert shown[4].delta == {}  # the baseline is the same memory either way: no delta
    assert all(metric.delta for metric in (shown[0], shown[2], shown[3], shown[5]))
    # Without a reference, or when the run is checkpointing off itself, nothing to compare against.
    assert all(metric.delta == {} for metric in lab_view.metrics(_lab(full), lang))
    assert lab_view.reference_run(_lab(off, off)) is None and lab_view.reference_run(_lab(full, off)) is off
    assert all(metric.delta == {} for metric in lab_view.metrics(_lab(off, off), lang))


def test_the_lines_around_the_metrics_say_the_peak_the_medians_and_a_changed_setting(measured):
    full = measured(every_n_layers=1)
    where = full.memory.peak_where
    assert where.kind  # the probe said where
    assert lab_view.peak_line(full.memory, "ja") == i18n.t("lab.peak_reached", "ja", where=event_label(where, "ja"))
    unknown = replace(full.memory, peak_where=replace(full.memory.peak_where, kind=""))
    assert lab_view.peak_line(unknown, "en") == i18n.t("lab.peak_reached", lang, where="?")
    caption = lab_view.medians_caption(full, "en")
    assert caption == i18n.t("lab.medians", lang, provenance=full.provenance.label, steps=1, warmup=0)
    line = lab_view.settings_changed(full, "en")
    assert "tiny-llama" in line and "128" in line


def test_offload_is_said_once_in_the_box_and_its_notes_are_left_out_of_the_captions(measured):
    offloaded = measured(every_n_layers=2, offload=True)  # on the CPU: asked for, not applied
    kind, text = lab_view.offload_box(offloaded.spec, offloaded, lang)
    assert kind == "info" and text == i18n.t(
        "lab.offload_not_applied",
        lang,
        device=offloaded.device,
        mib=f"{offloaded.memory.offload_bytes / MIB:,.1f}",
        layers=3,
    )
    assert any(note.key == "note.offload_would_move" for note in offloaded.notes)  # the box says it: no caption
    assert lab_view.notes_to_show(offloaded) == []
    another = Fact("note.layers_differ")
    assert lab_view.notes_to_show(replace(offloaded, notes=[*offloaded.notes, another])) == [another]
    plain = measured(every_n_layers=2)
    assert lab_view.offload_box(plain.spec, plain, lang) is None and lab_view.notes_to_show(plain) == plain.notes
    # The widgets ask for offload, the last run did not: nothing was moved, nothing to say about it.
    assert lab_view.offload_box(offloaded.spec, plain, lang) is None
    applied = replace(offloaded, memory=replace(offloaded.memory, offload_applied=True))
    assert lab_view.offload_box(applied.spec, applied, lang) == (
        "success",
        i18n.t("lab.offload_moved", lang, mib=f"{offloaded.memory.offload_bytes / MIB:,.1f}"),
    )


@pytest.mark.slow  # a worker process
def test_a_named_model_is_described_in_the_describing_worker_under_the_servers_cap(tmp_path, monkeypatch):
    # Issue 56: describe() builds the model on the meta device, which a hostile config can make heavy: on a server
    # whose jobs run in workers, the page's thread never builds it; the worker does, under the memory cap.
    from ckptlab.lab import workers
    from ckptlab.model import catalog, presets
    from tests.model.test_folders import config_folder

    folder = str(config_folder(tmp_path, "tiny-llama"))

    def on_the_page(*args, **kwargs):
        raise AssertionError("described on the page's thread")

    monkeypatch.setattr(catalog, "describe", on_the_page)
    asked = {}
    real_run = workers.WorkerPool.run

    def run(pool, target, *args, **kwargs):
        asked.update(kwargs, pool=pool)
        return real_run(pool, target, *args, **kwargs)

    monkeypatch.setattr(workers.WorkerPool, "run", run)
    policy = ServerPolicy(memory_cap_bytes=3 * GIB, run_limit_s=120.0)
    try:
        info, problem = lab_view.folder_info(folder, "en", policy)
        preset = next(facts for facts in presets.stored_facts() if facts.name == "tiny-llama")
        assert (problem, info.name, info.num_layers) == ("", folder, preset.num_layers)
        assert (asked["memory_cap_bytes"], asked["limit_s"]) == (3 * GIB, 120.0)
        assert asked["pool"] is workers.describe_workers()
    finally:
        workers.describe_workers().close()  # its fresh worker too: a later test starts its own
