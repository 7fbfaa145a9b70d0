"""Core errors a participant can meet in the app carry a key and params; the app shows them in its language."""

from __future__ import annotations

import json

import pytest

from ckptlab import RunSpec
from ckptlab.errors import CkptlabError, RunStoppedError
from ckptlab.lab.runqueue import AlreadyQueuedError, DeviceQueue
from ckptlab.lab.server import ServerPolicy
from ckptlab.model.catalog import describe
from ckptlab.show import i18n
from ckptlab.step.measure import validate_for_model


def _raised(action) -> CkptlabError:
    with pytest.raises(CkptlabError) as caught:
        action()
    return caught.value


def _keyed_errors(tmp_path) -> list[CkptlabError]:
    """One of every keyed error, raised by the code that raises it."""
    bad_specs = [
        RunSpec(seq_len=0),
        RunSpec(warmup=-1),
        RunSpec(dtype="float64"),
        RunSpec(optimizer="lion"),
        RunSpec(lora_rank=0),
        RunSpec(lora_targets=("q_proj",)),
        RunSpec(every_n_layers=0),
        RunSpec(every_n_layers=None, offload=True),
    ]
    found = [_raised(spec.validate) for spec in bad_specs]
    found.append(_raised(lambda: validate_for_model(RunSpec(model="tiny-gpt2", seq_len=4096), describe("tiny-gpt2"))))
    queue = DeviceQueue()
    with queue.turn(owner="me"):
        found.append(_raised(lambda: queue.turn(owner="me").__enter__()))
    found.append(_raised(lambda: ServerPolicy().local_folder("/etc")))
    found.append(_raised(lambda: ServerPolicy(models_root=tmp_path).local_folder("../..")))
    policy = ServerPolicy(max_tokens={"*": 100})
    found.append(_raised(lambda: policy.check(RunSpec(seq_len=128), describe("tiny-llama"), on_cpu=True)))
    return found


def test_every_keyed_error_has_its_translations_with_the_params_it_fills(tmp_path):
    tables = {lang: i18n.messages(lang) for lang in i18n.LANGUAGES if lang != i18n.DEFAULT}
    errors = _keyed_errors(tmp_path)
    assert all(error.key for error in errors), [str(error) for error in errors if not error.key]
    for error in errors:
        for lang, table in tables.items():
            text = table.get(i18n.ERRORS + error.key)
            assert text, f"{lang}: no translation for errors.{error.key}"
            assert i18n.placeholders(text) <= set(error.params), (lang, error.key)
            shown = i18n.error_text(error, lang)
            assert shown != str(error) and "{" not in shown.replace("{'", "")
        assert i18n.error_text(error, "en") == str(error)  # English is the core's own message


def test_an_error_without_a_key_or_translation_shows_its_english():
    assert i18n.error_text(CkptlabError("plain words"), "ja") == "plain words"
    assert i18n.error_text(RunStoppedError("stopped", key="no.such.key"), "pt-BR") == "stopped"
    assert i18n.error_text(ValueError("a bug"), "ja") == "a bug"


def test_a_second_turn_of_one_owner_is_refused_and_others_queue_as_before():
    queue = DeviceQueue()
    with queue.turn(owner="a"):
        with pytest.raises(AlreadyQueuedError):
            queue.turn(owner="a").__enter__()
        assert queue.busy() == (True, 0)  # the refused one left no ticket behind
    with queue.turn(owner="a"):  # once the first turn ended, the same owner may queue again
        pass
    assert json.dumps([turn.label for turn in queue.history()])
