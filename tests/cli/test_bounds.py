"""Every bound of a run refused with one message and exit status 2, before anything heavy starts (README, "Limits")."""

from __future__ import annotations

import contextlib
import json

import pytest

import ckptlab
from ckptlab.cli import main
from ckptlab.errors import CkptlabError, SpecError
from ckptlab.explore.sweep_spec import MAX_SWEEP_LENGTHS

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(autouse=True)
def nothing_is_built(monkeypatch):
    """A bound is checked before any model is built or step runs: building one fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was built before the bound was checked")

    monkeypatch.setattr(ckptlab.model.catalog, "instantiate", refuse)
    monkeypatch.setattr(ckptlab.model.catalog.AutoModelForCausalLM, "from_pretrained", refuse)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["run", "--repeats", "1000000000"], "at most 1,000"),
        (["run", "--warmup", "100000000"], "at most 100"),
        (["run", "--seed", "99999999999999999999999"], "at most 4,294,966,271"),
        (["run", "--seed", "-1"], "whole number >= 0"),
        (["run", "--batch-size", "9223372036854775807"], "at most 16,777,216"),
        (["run", "--batch-size", "100000", "--seq-len", "16"], "nothing was built"),
        (["run", "--nproc-per-node", "64", "--fsdp"], "--oversubscribe"),
        (["simulate", "--budget-gib", "nan"], "finite number of GiB"),
        (["simulate", "--budget-gib", "inf"], "finite number of GiB"),
        (["simulate", "--budget-gib", "-1"], "finite number of GiB"),
        (["simulate", "--budget", "0.5"], "--budget '0.5' is 0.5 bytes, less than one byte"),  # not a budget of 0
        (["simulate", "--budget", "0.0001KiB"], "--budget '0.0001KiB' is 0.1024 bytes, less than one byte"),
        (["sweep", "--seq-len", ",".join(str(16 + i) for i in range(2000))], f"at most {MAX_SWEEP_LENGTHS}"),
        # One bound and one parser for every budget (explore.budget.budget_size): sweep's too, and a size whose
        # bytes pass float's range is no size (it was int(inf): an OverflowError).
        (["sweep", "--budget", "2000000GiB"], "above any machine's memory"),
        (["simulate", "--budget", "9" * 300 + "GiB"], "is not a memory size"),
    ],
)
def test_a_bound_is_one_message_and_exit_2(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and err.count("\n") == 0 and "Traceback" not in err, err


def _config_folder(tmp_path, change: str | dict):
    config, _, _ = ckptlab.model.catalog.load_config("tiny-llama")
    config.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    if isinstance(change, dict):
        path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    else:
        path.write_text(path.read_text().rstrip().rstrip("}") + change + "}")
    return tmp_path


@pytest.mark.parametrize(
    ("change", "key", "words"),
    [
        ({"torch_dtype": "os.system"}, "folder.bad_dtype", "\"torch_dtype\" field is 'os.system'"),
        ({"dtype": ["bfloat16"]}, "folder.bad_dtype", "\"dtype\" field is ['bfloat16']"),
        (', "rope_theta": NaN', "folder.non_finite", "NaN"),
        (', "rms_norm_eps": Infinity', "folder.non_finite", "Infinity"),
        (', "padding": "' + "x" * (5 * 2**20) + '"', "folder.config_too_large", "MiB"),
    ],
)
def test_a_config_json_with_what_no_config_holds_is_one_message(tmp_path, change, key, words, capsys):
    folder = _config_folder(tmp_path, change)
    with pytest.raises(CkptlabError) as raised:
        ckptlab.describe(str(folder))
    assert raised.value.key == key and words in str(raised.value) and "config.json" in str(raised.value)
    assert main(["simulate", "--model", str(folder)]) == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: ckptlab.measure("tiny-llama"), "ckptlab.measure() expects spec to be a RunSpec, not str"),
        (lambda: ckptlab.simulate({"model": "qwen3-8b"}), "ckptlab.simulate() expects spec to be a RunSpec, not dict"),
        (lambda: ckptlab.RunSpec(model=None).validate(), "RunSpec() expects model to be a str or PathLike"),
        (lambda: ckptlab.compare(1, 2), "ckptlab.compare() expects run to be a RunResult, not int"),
        (lambda: ckptlab.describe(42), "ckptlab.describe() expects name_or_dir to be a str or PathLike, not int"),
    ],
)
def test_public_functions_say_what_they_expected(call, words):
    with pytest.raises(SpecError) as raised:
        call()
    assert raised.value.key == "api.wrong_type" and str(raised.value).startswith(words)


def test_oversubscribe_lets_more_ranks_than_cores_through_the_check(monkeypatch):
    from ckptlab.cli import run as run_command

    run_command.check_room_for_ranks(64, "cpu", oversubscribe=True)  # no error
    with pytest.raises(SpecError, match="--oversubscribe"):
        run_command.check_room_for_ranks(64, "cpu", oversubscribe=False)


LONG_NAMES = ",".join(f"t{i}" for i in range(3500))[:20_000].rstrip(",")


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--attn-implementation", "x" * 5000],  # the lab's error: its option's value cut
        ["simulate", "--dtype", "z" * 5000],  # argparse's own message
        ["simulate", "--lora-targets", LONG_NAMES],  # a list of names: their repr, cut
    ],
)
def test_a_long_value_is_cut_in_its_one_line_message(argv, capsys):
    with pytest.raises(SystemExit) if argv[1] == "--dtype" else contextlib.nullcontext():
        assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and len(err) < 800 and "characters)" in err, err[:1000]


def test_a_long_link_value_is_cut_in_its_warning():
    from ckptlab.lab.query import gpus_from_query
    from ckptlab.show.i18n import say

    _, warnings = gpus_from_query("9" * 5000, (1, 8))
    assert [len(say(fact, "ja")) < 400 and "(5,000 文字)" in say(fact, "ja") for fact in warnings] == [True]
