"""Core messages in the words of where they are read: a run that did not fit, in the app's languages."""

from __future__ import annotations

from dataclasses import replace

import pytest

import ckptlab
from ckptlab.show.wording import run_message


@pytest.fixture(scope="module")
def did_not_fit():
    spec = ckptlab.RunSpec(model="tiny-llama", seq_len=64, batch_size=3, every_n_layers=2, offload=True)
    ran = ckptlab.simulate(spec)
    english = "Does not fit: tiny-llama at seq_len=64 ... ran out of this machine's memory."
    return replace(ran, status="does_not_fit", memory=None, timing=None, message=english)


def test_a_run_that_did_not_fit_is_worded_from_its_fields_in_each_language(did_not_fit):
    assert run_message(did_not_fit, "en").startswith(
        "Does not fit: tiny-llama at seq_len=64, batch_size=3, n=2+offload"
    )
    for lang in ("en", "pt-BR", "ja"):  # English too: worded from the fields, never from the core's sentence
        shown = run_message(did_not_fit, lang)
        assert shown != did_not_fit.message
        for value in ("tiny-llama", "64", "3", "n=2+offload", did_not_fit.device):
            assert value in shown, (lang, value)


def test_a_run_with_figures_keeps_its_message(did_not_fit):
    ok = replace(did_not_fit, status="ok", message="")
    assert run_message(ok, "ja") == ""
