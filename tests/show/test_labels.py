"""The labels of a setting, a run, a provenance, a meter and an event: one function each, in every language."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from ckptlab.results import Provenance
from ckptlab.show import i18n
from ckptlab.show.labels import (
    event_label,
    method_label,
    provenance_label,
    run_label,
    setting_label,
    short_setting_label,
    training_label,
)
from ckptlab.show.report import setting_name
from ckptlab.spec import RunSpec
from ckptlab.step.probe import region_for
from ckptlab.step.provenance import simulated_provenance

PROVENANCE = Provenance(
    kind="measured-cpu",
    device_name="Intel Xeon, 2 cores",
    torch_version="2.13",
    transformers_version="5.24",
    created_at="2026-01-01T00:00:00Z",
)


@pytest.mark.parametrize("every_n_layers, offload", [(None, False), (2, False), (1, True)])
def test_the_setting_label_is_the_command_lines_words_in_english(every_n_layers, offload):
    assert setting_label(every_n_layers, offload) == setting_name(every_n_layers, offload)
    assert setting_label(every_n_layers, offload, "en") in (
        "checkpointing off",
        f"every_n_layers={every_n_layers}",
        f"every_n_layers={every_n_layers}, offload",
    )


def test_the_setting_label_follows_the_language_and_keeps_the_technical_words():
    assert setting_label(None, False, "ja") == i18n.t("setting.off", "ja") != setting_label(None, False)
    assert "every_n_layers=2" in setting_label(2, False, "pt-BR")
    assert "offload" in setting_label(1, True, "ja")
    assert short_setting_label(None, "pt-BR") == i18n.t("setting.short_off", "pt-BR")
    assert short_setting_label(4) == "n=4"


def test_a_run_is_labelled_by_its_setting_and_says_when_offload_did_not_happen():
    class Run:
        spec = RunSpec(model="tiny-llama", every_n_layers=3, offload=True)
        memory = SimpleNamespace(offload_applied=True)

    assert run_label(Run(), "ja") == setting_label(3, True, "ja")  # type: ignore[arg-type]
    Run.memory.offload_applied = False  # a CPU run: offload asked for, not applied (issue 43)
    for lang in i18n.LANGUAGES:
        label = run_label(Run(), lang)  # type: ignore[arg-type]
        assert label == i18n.t("setting.on_offload_not_applied", lang, n=3) != setting_label(3, True, lang)
        assert "CPU" in label


def test_one_provenance_label_for_a_result_and_for_a_bare_kind():
    assert provenance_label(PROVENANCE) == PROVENANCE.label == "measured on the CPU (Intel Xeon, 2 cores)"
    assert provenance_label(PROVENANCE, "ja") == "CPU で実測 (Intel Xeon, 2 cores)"
    assert provenance_label("measured-cpu") == "measured on the CPU"  # a table row knows only the kind
    for kind in ("measured-cuda", "measured-cpu", "simulated", "predicted"):
        full = provenance_label(replace(PROVENANCE, kind=kind), "pt-BR")  # type: ignore[arg-type]
        # A simulation used no device: it says so (decided on the kind), whatever name it carries.
        device = (
            "(sem GPU; formas de tensores como num dispositivo CUDA)"
            if kind == "simulated"
            else "(Intel Xeon, 2 cores)"
        )
        assert full.startswith(provenance_label(kind, "pt-BR")) and full.endswith(device)


def test_a_simulation_says_where_it_ran_in_the_pages_language():
    simulated = simulated_provenance()  # its "device" is a sentence: no GPU was used
    assert provenance_label(simulated) == "simulated (fake tensors) (no GPU used; tensor shapes as on a CUDA device)"
    for lang in ("pt-BR", "ja"):
        label = provenance_label(simulated, lang)
        assert label.startswith(provenance_label("simulated", lang)) and "no GPU used" not in label


def test_method_event_and_training_labels():
    from ckptlab.results import METHOD_FACTS, SIMULATED_MEMORY_METHOD

    # a method is a key worded in the reader's language: the simulated one too (it fell back to English before)
    assert method_label(SIMULATED_MEMORY_METHOD, "ja") == i18n.t("said.method.memory_simulated", "ja")
    assert all(method_label(method, "pt-BR") != method_label(method, "en") for method in METHOD_FACTS)
    assert method_label("a meter of its own") == "a meter of its own"
    assert event_label(region_for("rerun", 2), "pt-BR") == i18n.t("event.rerun", "pt-BR", n=3)
    assert event_label(region_for("loss")) == i18n.t("event.loss", "en", n="")
    assert training_label(RunSpec(model="tiny-llama", lora_rank=8)) == "AdamW, LoRA rank 8"
    assert training_label(RunSpec(model="tiny-llama", optimizer="sgd")) == "SGD, full fine-tune"
