"""Core errors a participant can meet in the app carry a key and params; the app shows them in its language."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest

from ckptlab import RunSpec
from ckptlab.alloc_conf import AllocatorConfig
from ckptlab.errors import CkptlabError
from ckptlab.explore.longest import check_budget
from ckptlab.explore.sweep import SweepSpec
from ckptlab.lab.runqueue import DeviceQueue, SupersededError
from ckptlab.lab.server import ServerPolicy
from ckptlab.model.catalog import describe
from ckptlab.show import i18n
from ckptlab.step.preflight import validate_for_model
from ckptlab.step.selective import check_simulated_selective

PACKAGE = Path(__file__).resolve().parents[1] / "ckptlab"


def _raised(action) -> CkptlabError:
    with pytest.raises(CkptlabError) as caught:
        action()
    return caught.value


def keyed_errors(tmp_path) -> list[CkptlabError]:
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
        RunSpec(attn_implementation="kernels-community/flash-attn"),  # no code from the Hub
        RunSpec(attn_implementation="flash_attention_2"),  # flash-attn is not installed here
    ]
    found = [_raised(spec.validate) for spec in bad_specs]
    found.append(_raised(lambda: validate_for_model(RunSpec(model="tiny-gpt2", seq_len=4096), describe("tiny-gpt2"))))
    found.append(_superseded())
    found.append(_raised(lambda: ServerPolicy().local_folder("/etc")))
    found.append(_raised(lambda: ServerPolicy(models_root=tmp_path).local_folder("../..")))
    policy = ServerPolicy(max_tokens={"*": 100})
    found.append(_raised(lambda: policy.check(RunSpec(seq_len=128), describe("tiny-llama"))))
    found.append(_raised(lambda: ServerPolicy(run_limit_s=1).check_run_time(RunSpec(), cache=None)))
    found += _folder_errors(tmp_path)
    found.append(_raised(lambda: check_simulated_selective(RunSpec(selective="attention", world_size=2, fsdp=True))))
    found.append(_raised(lambda: check_budget(0)))  # the longest sequence with no memory to fit
    found.append(_raised(AllocatorConfig(max_split_size_mb=8).validate))  # under torch's 20 MiB
    found += [
        _raised(SweepSpec(every_n_layers=(1,), **changes).validate)
        for changes in (
            {"policies": ()},
            {"policies": ("attention", "attention")},
            {"policies": ("none",), "selective": "attention"},
        )
    ]
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
    errors = keyed_errors(tmp_path)
    assert all(error.key for error in errors), [str(error) for error in errors if not error.key]
    for error in errors:
        for lang, table in tables.items():
            text = table.get(i18n.ERRORS + error.key)
            assert text, f"{lang}: no translation for errors.{error.key}"
            assert i18n.placeholders(text) <= set(error.params), (lang, error.key)
            shown = i18n.error_text(error, lang)
            assert shown != str(error)  # placeholders: all filled, checked above
        assert i18n.error_text(error, "en") == str(error)  # English is the core's own message


def test_an_exception_that_is_not_the_labs_shows_its_own_message():
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


def _error_calls() -> list[tuple[str, int, ast.Call]]:
    """Every construction of a CkptlabError subclass in the package, the command line's included."""
    import inspect

    from ckptlab import errors
    from ckptlab.lab import runqueue, server, workers
    from ckptlab.step import fsdp

    classes = {
        name
        for module in (errors, runqueue, server, workers, fsdp)
        for name, value in vars(module).items()
        if inspect.isclass(value) and issubclass(value, CkptlabError)
    }
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
                if name in classes and (node.args or node.keywords):
                    found.append((str(path.relative_to(PACKAGE)), node.lineno, node))
    assert len(found) > 100  # the scan sees the lab's errors
    return found


def test_every_error_is_a_key_and_its_params_never_a_sentence_written_where_it_is_raised():
    """An error's words, English included, are ``errors.<key>`` in the locale files: a raise names the key and
    the values, and writes no message of its own."""
    written = [
        f"{path}:{line}"
        for path, line, call in _error_calls()
        if call.args or not any(keyword.arg == "key" for keyword in call.keywords)
    ]
    assert not written, "give these a key= and move their words to errors.<key> in every locale file"


def test_every_key_raised_is_worded_in_every_language_with_only_the_params_the_raise_gives():
    """Keyed errors (``errors.``), where they are raised: en, pt-BR and ja word each, filling only its params."""
    tables = {lang: i18n.messages(lang) for lang in i18n.LANGUAGES}
    checked = 0
    for path, line, call in _error_calls():
        keyword = next((k for k in call.keywords if k.arg == "key"), None)
        if keyword is None:
            continue
        spread = any(k.arg is None for k in call.keywords)  # **params: their names are not known here
        params = {k.arg for k in call.keywords if k.arg not in ("key", None)}
        for node in _keys(keyword.value):
            for lang, table in tables.items():
                text = table.get(i18n.ERRORS + node)
                assert text, f"{path}:{line}: {lang} has no {i18n.ERRORS}{node}"
                assert spread or i18n.placeholders(text) <= params, (path, line, lang, node)
            checked += 1
    assert checked > 100


def _fact_calls() -> list[tuple[str, int, ast.Call]]:
    """Every ``Fact(key, params)`` the package writes (the core's facts, and the edge's few)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Fact" and node.args:
                found.append((str(path.relative_to(PACKAGE)), node.lineno, node))
    return found


def test_every_fact_the_code_says_is_worded_in_every_language_with_only_its_params():
    """The scan: each ``Fact`` key in code is ``said.<key>`` in en, pt-BR and ja, and each text fills only
    params the call gives (all of them where the call's dict is written out); no ``said.`` key is left unused."""
    tables = {lang: i18n.messages(lang) for lang in i18n.LANGUAGES}
    used: set[str] = set()
    for path, line, call in _fact_calls():
        given = (
            call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "params"), None)
        )
        params = _params(given)
        keys = _keys(call.args[0])
        assert keys, f"{path}:{line}: a fact's key is a string written in the call"
        for key in keys:
            used.add(i18n.SAID + key)
            for lang, table in tables.items():
                text = table.get(i18n.SAID + key)
                assert text, f"{path}:{line}: {lang} has no {i18n.SAID}{key}"
                assert params is None or i18n.placeholders(text) <= params, (path, line, lang, key)
    assert len(used) > 70
    assert used == {key for key in tables["en"] if key.startswith(i18n.SAID)}, "a said. key no code says"


def _keys(node: ast.expr) -> list[str]:
    """The keys a ``key=`` can give: a string, or either side of ``a if c else b``; none for a key built at run time."""
    if isinstance(node, ast.IfExp):
        return _keys(node.body) + _keys(node.orelse)
    return [node.value] if isinstance(node, ast.Constant) else []


def _params(given: ast.expr | None) -> set[str] | None:
    """The names a fact's params dict fills (None: built at run time, or spread from another dict)."""
    if given is None:
        return set()
    if isinstance(given, ast.Dict):
        names: set[str] = set()
        for key in given.keys:
            if key is None:  # **figures: the names of that dict are not known here
                return None
            names.add(key.value)
        return names
    return None


def test_the_sentence_of_what_a_peak_counts_has_a_translation_for_every_optimizer_and_lora():
    from ckptlab.explore.recommend import counts_message
    from ckptlab.spec import OPTIMIZERS

    for optimizer in OPTIMIZERS:
        for rank in (None, 8):
            message = counts_message(optimizer, rank)
            for lang in ("pt-BR", "ja"):
                assert i18n.say(message, lang) != i18n.say(message), (optimizer, rank, lang)


def test_core_errors_name_no_flag():
    """The core's messages hold no command line (an Option or a Command names it, and each edge words it:
    tests/show/test_error_options.py); only the command line's own errors (``errors.cli.*``) name its flags."""
    for key, text in i18n.messages("en").items():
        if not key.startswith(i18n.ERRORS) or key.startswith(i18n.ERRORS + "cli."):
            continue
        # A list of the presets is the one command line left: no edge words it otherwise yet.
        text = text.replace("(python -m ckptlab models)", "")
        assert " --" not in text and "(--" not in text and "python -m ckptlab" not in text, (key, text[:80])
