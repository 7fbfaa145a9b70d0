"""The Python API answers a wrong argument with the lab's own error, the bounds RunSpec's checks hold (one home)."""

from __future__ import annotations

import pytest

import ckptlab
from ckptlab import RunSpec
from ckptlab.cli import main
from ckptlab.errors import CkptlabError
from ckptlab.explore.budget import budget_bytes
from ckptlab.units import MIB


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: ckptlab.sweep("tiny-llama"), "ckptlab.sweep() expects spec to be a SweepSpec, not str"),
        (lambda: ckptlab.sweep(None), "not NoneType None"),
        (lambda: ckptlab.recommend("abc", "24GiB"), "ckptlab.recommend() expects rows to be a list or tuple"),
        (lambda: ckptlab.recommend([1, 2], "24GiB"), "each of rows to be a SweepRow"),
        (lambda: ckptlab.predict(None, seq_len=8), "ckptlab.predict() expects model"),
        (lambda: ckptlab.predict("tiny-llama", seq_len=8, num_layers=-1), "num_layers=-1 is not valid"),
        (lambda: ckptlab.predict("tiny-llama", seq_len=10**12), "at most 16,777,216"),
        (lambda: ckptlab.predict("tiny-llama", seq_len=2**20, batch_size=17), "at most 16,777,216"),
        (lambda: ckptlab.predict("tiny-llama", seq_len=8, device="tpu"), "device='tpu' is not one of"),
        (lambda: ckptlab.predict("tiny-llama", seq_len=8, dtype="float64"), "dtype='float64' is not one of"),
        (lambda: ckptlab.predict("tiny-llama", seq_len=8, every_n_layers=range(1, 10**7)), "at most 1,024"),
        (lambda: ckptlab.predict("tiny-llama", seq_len=8, offload=["yes"]), "each offload to be a bool"),
        (lambda: ckptlab.predict("tiny-llama", seq_len=8, lora_rank=10**6), "lora_rank=1000000 is more than"),
        (lambda: RunSpec(offload="yes").validate(), "RunSpec() expects offload to be a bool, not str"),
        (lambda: RunSpec(offload=None).validate(), "expects offload to be a bool, not NoneType"),
        (lambda: RunSpec(optim_args="lr=abc").validate(), "lr=abc is not a number"),
        (lambda: RunSpec(optim_args="momentum=nan").validate(), "is not a finite number"),
        (lambda: RunSpec(optim_args="=====;;;").validate(), "is not one key=value pair"),
        (lambda: budget_bytes("-1GiB"), "is not a memory size"),
    ],
)
def test_a_wrong_argument_raises_the_labs_error(call, words):
    with pytest.raises(CkptlabError, match=None) as caught:
        call()
    assert words in str(caught.value), str(caught.value)


def test_predict_takes_one_setting_as_a_bare_value_and_budgets_as_sizes():
    predictions = ckptlab.predict("tiny-llama", seq_len=8, every_n_layers=5, offload=True)
    assert [(p.every_n_layers, p.offload) for p in predictions] == [(None, False), (5, True)]
    assert budget_bytes("230MiB") == (230 * MIB, "230.0 MiB")
    assert budget_bytes("4090")[1] == "RTX 4090 24 GB"  # a bare number stays a GPU's name
    with pytest.raises(CkptlabError, match="recommend\\(\\) needs measured rows"):  # the size itself was accepted
        ckptlab.recommend([], "230MiB")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["sweep", "--model", "tiny-llama", "--budget", "-1GiB"], "--budget '-1GiB' is not a memory size"),
        (["simulate", "--model", "tiny-llama", "--seq-len", "-5"], "--seq-len -5 is not valid"),
        (["simulate", "--model", "tiny-llama", "--optim-args", "=====;;;"], "is not one key=value pair"),
        (["simulate", "--model", "tiny-llama", "--optimizer", "sgd", "--optim-args", "momentum=abc"], "not a number"),
    ],
)
def test_the_cli_answers_values_that_look_like_flags_with_the_labs_one_line(argv, words, capsys):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
