"""The instructor's policy: which local folders participants may open, how large and how long a run may be."""

from __future__ import annotations

import os

import pytest
import torch

from ckptlab import RunSpec
from ckptlab.errors import SpecError
from ckptlab.lab.server import NotAllowedError, ServerPolicy, parse_max_tokens, policy_from_environment
from ckptlab.model.catalog import describe
from ckptlab.show import i18n


def _model_folder(path):
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


@pytest.fixture
def root(tmp_path):
    """A models root with two model folders, a folder that is no model, and a link leading out of the root."""
    models = tmp_path / "models"
    _model_folder(models / "llama-small")
    _model_folder(models / "group" / "qwen-small")
    (models / "notes").mkdir()
    outside = _model_folder(tmp_path / "secret-model")
    os.symlink(outside, models / "escape")
    return models


def test_local_folders_are_off_without_a_root():
    policy = policy_from_environment({})
    assert policy.models_root is None and policy.model_folders() == []
    with pytest.raises(NotAllowedError) as refused:
        policy.local_folder("/etc")
    assert refused.value.key == "server.folders_off" and "CKPTLAB_MODELS_ROOT" in str(refused.value)


def test_only_model_folders_inside_the_root_are_offered(root):
    policy = ServerPolicy(models_root=root.resolve())
    assert policy.model_folders() == ["group/qwen-small", "llama-small"]  # no "notes" (no config), no "escape"
    assert policy.local_folder("llama-small") == str(root.resolve() / "llama-small")
    assert policy.local_folder(str(root / "group" / "qwen-small")) == str(root.resolve() / "group" / "qwen-small")


def test_a_link_that_loops_back_into_the_root_lists_each_folder_once(root):
    os.symlink(".", root / "loop")
    os.symlink("llama-small", root / "again")
    assert ServerPolicy(models_root=root.resolve()).model_folders() == ["group/qwen-small", "llama-small"]


@pytest.mark.parametrize("name", ["..", "../secret-model", "escape", "/etc", "llama-small/../../secret-model"])
def test_no_path_leads_out_of_the_root(root, name):
    with pytest.raises(NotAllowedError) as refused:
        ServerPolicy(models_root=root.resolve()).local_folder(name)
    assert refused.value.key == "server.folder_outside" and repr(name) in str(refused.value)


def test_settings_come_from_the_environment_before_the_secrets(root, monkeypatch):
    monkeypatch.setenv("CKPTLAB_RUN_LIMIT_S", "60")
    policy = policy_from_environment({"CKPTLAB_RUN_LIMIT_S": "5", "CKPTLAB_MODELS_ROOT": str(root)})
    assert policy.run_limit_s == 60 and policy.models_root == root.resolve()


@pytest.mark.parametrize(
    "settings, named",
    [
        ({"CKPTLAB_MODELS_ROOT": "/no/such/folder"}, "CKPTLAB_MODELS_ROOT"),
        ({"CKPTLAB_RUN_LIMIT_S": "soon"}, "CKPTLAB_RUN_LIMIT_S"),
        ({"CKPTLAB_RUN_LIMIT_S": "0"}, "CKPTLAB_RUN_LIMIT_S"),
        ({"CKPTLAB_MAX_TOKENS": "tiny-llama:4096"}, "CKPTLAB_MAX_TOKENS"),
        ({"CKPTLAB_WARM_LEARN": "yes"}, "CKPTLAB_WARM_LEARN"),
        ({"CKPTLAB_WORKERS": "fork"}, "CKPTLAB_WORKERS"),
        ({"CKPTLAB_WORKER_MEMORY_GIB": "-1"}, "CKPTLAB_WORKER_MEMORY_GIB"),
    ],
)
def test_a_bad_setting_names_itself(settings, named):
    with pytest.raises(SpecError, match=named) as refused:
        ServerPolicy.from_settings(settings)
    # Every participant's page shows it (the Lab page's policy problem): keyed, so it reads in their language.
    assert refused.value.key is not None and refused.value.key.startswith("server.")
    assert named in i18n.error_text(refused.value, "ja") != str(refused.value)


def test_the_warm_up_is_the_instructors_choice():
    assert not ServerPolicy.from_settings({}).warm_learn
    assert ServerPolicy.from_settings({"CKPTLAB_WARM_LEARN": "1"}).warm_learn
    assert not ServerPolicy.from_settings({"CKPTLAB_WARM_LEARN": "0"}).warm_learn


def test_the_token_limit_per_model_is_the_instructors_and_time_is_the_run_limits_alone():
    """Issue 57: no limit in tokens predicted from time beside the Run's time check (a second rule, and a
    simulation per length tried): a model the instructor names nothing for has no token limit."""
    assert parse_max_tokens("tiny-llama=65536, *=8192") == {"tiny-llama": 65536, "*": 8192}
    tiny, real = describe("tiny-llama"), describe("qwen3-8b")
    named = ServerPolicy(max_tokens={"tiny-llama": 512, "*": 64})
    assert named.max_tokens_for(tiny) == 512 and named.max_tokens_for(real) == 64
    assert ServerPolicy(run_limit_s=300).max_tokens_for(real) is None
    ServerPolicy(run_limit_s=300).check(RunSpec(model="qwen3-8b", seq_len=32768), real)


def test_a_run_over_the_limit_is_refused_naming_both_numbers():
    policy = ServerPolicy(max_tokens={"*": 1000})
    policy.check(RunSpec(seq_len=500, batch_size=2), describe("tiny-llama"))  # exactly the limit
    with pytest.raises(NotAllowedError) as refused:
        policy.check(RunSpec(seq_len=501, batch_size=2), describe("tiny-llama"))
    assert refused.value.key == "server.too_many_tokens"
    assert "1,002 tokens" in str(refused.value) and "(1,000)" in str(refused.value)


def test_a_run_the_limit_would_stop_is_refused_before_it_starts_with_the_line_to_run_instead():
    """Issue 58: qwen3-0.6b, 256 tokens, n=4, offload, under the 300 s limit, was predicted at 27 min, started, and
    was killed at 39%. Its whole Run (warm-up, repeats, memory step, the off reference) is estimated before it
    starts, at the speed tests/conftest.py hands in (no benchmark, no run), and refused with the command line."""
    from ckptlab.lab import lab_view
    from ckptlab.lab.run import Pace, ResultCache, run_estimate

    policy, cache = ServerPolicy(run_limit_s=300), ResultCache()
    issue = RunSpec(model="qwen3-0.6b", seq_len=256, every_n_layers=4, offload=True)
    with pytest.raises(NotAllowedError) as refused:
        policy.check_run_time(issue, Pace(), cache)
    line = "python -m ckptlab run --model qwen3-0.6b --seq-len 256 --every-n-layers 4 --offload"
    seconds = refused.value.params["seconds"]
    assert refused.value.key == "server.run_too_long" and refused.value.params["command"] == line
    assert seconds == round(run_estimate(issue)) > 300 and refused.value.params["limit"] == 300
    # The Lab page says it before Run is pressed (a problem disables its button), in every language.
    for lang in i18n.LANGUAGES:
        problem, _ = lab_view.problem_with(issue, describe("qwen3-0.6b"), policy, lang)
        assert line in problem and i18n.number(seconds, ",", lang) in problem
    # A smaller Run starts, even where tiny Runs (mostly fixed costs) took twenty times their prediction: only Runs
    # of a like size scale an estimate.
    small = RunSpec(model="gpt2-small", seq_len=256, every_n_layers=4)
    tiny, slow_tiny = RunSpec(model="tiny-llama", seq_len=128), Pace()
    slow_tiny.record(tiny, 20 * run_estimate(tiny))
    assert slow_tiny.estimate(small) == (run_estimate(small), False) and slow_tiny.estimate(tiny)[1]
    policy.check_run_time(small, slow_tiny, cache)
    quick = Pace()
    quick.record(issue, run_estimate(issue) / 4)  # this server's Runs took a quarter of the prediction
    policy.check_run_time(issue, quick, cache)


def test_a_server_without_a_memory_setting_caps_each_worker_at_half_the_machine():
    # Issue 56: with no CKPTLAB_WORKER_MEMORY_GIB, one participant's job could take all of the server's memory.
    from ckptlab.lab.server import DEFAULT_WORKER_MEMORY_SHARE
    from ckptlab.model.folder_checks import memory_limit

    machine = memory_limit(torch.device("cpu"))
    assert machine is not None
    assert ServerPolicy.from_settings({}).memory_cap_bytes == int(machine[0] * DEFAULT_WORKER_MEMORY_SHARE)
    assert ServerPolicy.from_settings({"CKPTLAB_WORKER_MEMORY_GIB": "2"}).memory_cap_bytes == 2 * 2**30
