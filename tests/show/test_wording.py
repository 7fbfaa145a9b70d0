"""Core messages in the words of where they are read: a run that did not fit, in the app's languages."""

from __future__ import annotations

from dataclasses import replace

import pytest

import ckptlab
from ckptlab.fact import Fact
from ckptlab.show.wording import run_message


@pytest.fixture(scope="module")
def did_not_fit():
    spec = ckptlab.RunSpec(model="tiny-llama", seq_len=64, batch_size=3, every_n_layers=2, offload=True)
    ran = ckptlab.simulate(spec)
    params = {"model": "tiny-llama", "seq_len": 64, "batch": 3, "offload": Fact("run.with_offload")}
    setting = Fact("run.setting_every_n", {"n": 2})
    reason = Fact("run.does_not_fit", {**params, "setting": setting, "where": Fact("memory.this_machine")})
    return replace(ran, status="does_not_fit", memory=None, timing=None, reason=reason)


def test_a_run_that_did_not_fit_is_its_reason_worded_in_each_language(did_not_fit):
    english = (
        "Does not fit: tiny-llama at seq_len=64, batch_size=3, every_n_layers=2, offload ran out of this machine's "
        "memory. Try a shorter sequence, a smaller batch, every_n_layers=1, or offload."
    )
    assert did_not_fit.message == run_message(did_not_fit, "en") == english  # the CLI's and the JSON's words
    for lang in ("pt-BR", "ja"):
        shown = run_message(did_not_fit, lang)
        assert shown != english
        for value in ("tiny-llama", "64", "3", "every_n_layers=2", "offload"):
            assert value in shown, (lang, value)
    back = ckptlab.RunResult.from_dict(did_not_fit.to_dict())
    assert back.reason == did_not_fit.reason and back.to_dict()["message"] == english


def test_a_run_with_figures_has_no_message(did_not_fit):
    ok = replace(did_not_fit, status="ok", reason=None)
    assert run_message(ok, "ja") == "" and ok.message == "" and ok.to_dict()["message"] == ""
