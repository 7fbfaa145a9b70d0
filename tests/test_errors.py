"""Core errors a participant can meet in the app carry a key and params; the app shows them in its language."""

from __future__ import annotations

import threading

import pytest

from ckptlab import RunSpec
from ckptlab.errors import CkptlabError, RunStoppedError
from ckptlab.lab.runqueue import DeviceQueue, SupersededError
from ckptlab.lab.server import ServerPolicy
from ckptlab.model.catalog import describe
from ckptlab.show import i18n
from ckptlab.step.preflight import validate_for_model


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
    found.append(_superseded())
    found.append(_raised(lambda: ServerPolicy().local_folder("/etc")))
    found.append(_raised(lambda: ServerPolicy(models_root=tmp_path).local_folder("../..")))
    policy = ServerPolicy(max_tokens={"*": 100})
    found.append(_raised(lambda: policy.check(RunSpec(seq_len=128), describe("tiny-llama"), on_cpu=True)))
    found += _folder_errors(tmp_path)
    return found


def _folder_errors(tmp_path) -> list[CkptlabError]:
    """The errors a local model folder can give, raised by the lab's own checks of folders made here."""
    import json as jsonlib
    import pickle

    from ckptlab.model import weight_checks
    from tests.model.test_folders import config_folder

    def folder(name: str, text: str):
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text(text)
        return str(path)

    found = [
        _raised(lambda: describe(folder("deep", "[" * 100_000 + "]" * 100_000))),
        _raised(lambda: describe(folder("broken", "{not json"))),
        _raised(lambda: describe(folder("list", "[1, 2]"))),
    ]
    changes = [
        {"num_hidden_layers": 10**9},
        {"hidden_size": -64},
        {"hidden_size": 384, "num_attention_heads": 7},
        {"num_attention_heads": 6, "num_key_value_heads": 4},
    ]
    for index, change in enumerate(changes):
        found.append(
            _raised(lambda change=change, index=index: describe(str(config_folder(tmp_path / f"c{index}", **change))))
        )
    path = str(tmp_path / "c0")
    found.append(weight_checks.weights_error(path, pickle.UnpicklingError("Unsupported GLOBAL os.system")))
    found.append(weight_checks.weights_error(path, RuntimeError("size mismatch: use ignore_mismatched_sizes=True")))
    found.append(weight_checks.weights_error(path, RuntimeError("PytorchStreamReader failed reading zip archive")))
    assert jsonlib.dumps([error.key for error in found])
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
            assert shown != str(error)  # placeholders: all filled, checked above
        assert i18n.error_text(error, "en") == str(error)  # English is the core's own message


def test_an_error_without_a_key_or_translation_shows_its_english():
    assert i18n.error_text(CkptlabError("plain words"), "ja") == "plain words"
    assert i18n.error_text(RunStoppedError("stopped", key="no.such.key"), "pt-BR") == "stopped"
    assert i18n.error_text(ValueError("a bug"), "ja") == "a bug"


def _superseded() -> SupersededError:
    """A session's waiting run, replaced by its newer request (as a Streamlit rerun makes one)."""
    queue = DeviceQueue(poll_s=0.01)
    caught: list[SupersededError] = []

    def older() -> None:
        try:
            with queue.turn(owner="me", label="older"):
                pass
        except SupersededError as error:
            caught.append(error)

    with queue.turn(owner="someone else"):
        first = threading.Thread(target=older)
        first.start()
        while queue.busy() != (True, 1):  # the older request is in line
            first.join(0.01)

        def newer_run() -> None:
            with queue.turn(owner="me", label="newer"):
                pass

        newer = threading.Thread(target=newer_run)
        newer.start()
        first.join()
    newer.join()
    assert [turn.label for turn in queue.history()] == ["", "newer"]  # the newer one ran, the older did not
    return caught[0]


def test_a_sessions_newer_request_replaces_its_waiting_one_and_never_stacks():
    error = _superseded()
    assert isinstance(error, SupersededError) and error.key == "queue.superseded"
