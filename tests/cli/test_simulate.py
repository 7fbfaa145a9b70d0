"""python -m ckptlab simulate: the report, the GPU verdict, JSON, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import ckptlab.step.simulate as simulate_module
from ckptlab.cli import main
from ckptlab.spec import Setting
from tests.cli.test_simulate_time import hand_work

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them


def test_simulate_prints_a_labelled_report_and_a_verdict(capsys, monkeypatch):
    # A verdict on the device total imports nothing of recommend (issue 61: 0.07 s of CPU in every --gpu process).
    monkeypatch.delitem(sys.modules, "ckptlab.explore.recommend", raising=False)
    assert main(["simulate", "--model", "qwen3-8b", "--seq-len", "4096", "--gpu", "L4"]) == 0
    assert "ckptlab.explore.recommend" not in sys.modules
    out = capsys.readouterr().out
    assert "simulated (fake tensors)" in out and "Time: not simulated" in out
    assert "Backward:  output <- [L36]" in out
    assert "does not fit in L4 24 GB" in out and "short by" in out
    assert "nvidia-smi will show about" in out and "CUDA context (estimated)" in out


@pytest.mark.parametrize("own_process", [True, False])
def test_only_the_commands_own_process_freezes_what_the_core_loaded(own_process, monkeypatch, capsys):
    """``python -m ckptlab`` freezes its imports out of each step's collection (``freeze_what_is_loaded``); a
    caller's ``main([...])`` (this test process) keeps its collector as it was."""
    frozen = []
    monkeypatch.setattr("ckptlab.cli.args.freeze_what_is_loaded", lambda: frozen.append(True))
    quick = ["simulate", "--model", "tiny-llama", "--seq-len", "64", "--json"]
    assert main(quick, own_process=own_process) == 0
    assert frozen == ([True] if own_process else [])
    assert main([*quick, "--seq-len", "0"], own_process=own_process) == 2  # bad input: nothing loaded, nothing frozen
    assert frozen == ([True] if own_process else [])


def _table_text(out: str) -> str:
    rows = json.loads(out)["rows"]
    for row in rows:
        del row["provenance"]["created_at"]
    return json.dumps(rows)  # dumps keeps each dict's order: the text a user would diff


def test_the_tables_json_is_the_same_text_whatever_the_hash_seed(capsys):
    """Breakdowns derived by the fold and the table keep their keys' order: a set's order followed the salted string
    hashes, so two runs of the same table printed their JSON keys in different orders. The two runs: this process's
    (its own hash seed) and one command whose seed is set apart from it (a seed is fixed when a process starts)."""
    table = ["simulate", "--model", "tiny-qwen3", "--seq-len", "64", "--every-n-layers", "all", "--json"]
    other_seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    done = subprocess.run(
        [sys.executable, "-m", "ckptlab", *table],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": other_seed},
    )
    assert main(table) == 0
    assert _table_text(done.stdout) == _table_text(capsys.readouterr().out)


def test_simulate_json_carries_the_fit(capsys):
    assert main(["simulate", "--model", "tiny-llama", "--seq-len", "256", "--budget-gib", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["provenance"]["kind"] == "simulated" and data["timing"] is None
    assert data["fit"]["fits"] is True and data["fit"]["margin_bytes"] > 0


def test_budget_is_one_name_in_sweep_and_simulate_and_budget_gib_stays_its_alias(capsys):
    """``--budget`` takes a size as sweep's does; the older ``--budget-gib X`` is the same as ``--budget XGiB``."""
    fits = {}
    for flags in (["--budget", "1GiB"], ["--budget-gib", "1"], ["--budget", str(2**30)]):
        assert main(["simulate", "--model", "tiny-llama", "--seq-len", "256", *flags, "--json"]) == 0
        fits[flags[1]] = json.loads(capsys.readouterr().out)["fit"]
    assert {fit["budget_bytes"] for fit in fits.values()} == {2**30}
    assert len({fit["margin_bytes"] for fit in fits.values()}) == 1
    assert fits["1GiB"]["budget_label"] == "a budget of 1GiB"


@pytest.mark.parametrize(
    "args, words",
    [
        (["--gpu", "TPU"], "is not in the list"),
        (["--gpu", "A100"], "matches A100 40 GB, A100 80 GB: say which"),
        (["--budget-gib", "0"], "--budget-gib 0"),
        (["--budget", "lots"], "--budget 'lots' is not a memory size"),
        (["--every-n-layers", "0"], "--every-n-layers 0"),  # the CLI names its flags (show/wording.cli_message)
        (["--seq-len", "99999"], "--seq-len 99999"),
    ],
)
def test_bad_input_exits_2_with_a_message(args, words, capsys):
    assert main(["simulate", "--seq-len", "64", *args]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def _bytes_of(fit: dict) -> dict:
    """A fit's JSON without its words and without how its allocation order was had (``trace_how``)."""
    return {
        key: _bytes_of(value) if isinstance(value, dict) else value
        for key, value in fit.items()
        if key not in ("sentence", "trace_how")
    }


def test_every_n_layers_all_prints_one_row_a_setting_as_each_single_simulation(capsys):
    """``--every-n-layers all``: off and n=1..4 of tiny-bert, one result each, the single command's JSON (the table is
    the same code on any model: the fewest layers, the fewest simulations)."""
    from ckptlab.model.catalog import load_config  # torch and transformers: only the test that simulates pays

    layers = load_config("tiny-bert")[0].num_hidden_layers
    quick = ["simulate", "--model", "tiny-bert", "--seq-len", "32", "--dtype", "float32"]
    assert main([*quick, "--every-n-layers", "all", "--offload", "--budget", "1GiB", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(row["spec"]["every_n_layers"], row["spec"]["offload"]) for row in rows] == [(None, False)] + [
        (n, True) for n in range(1, layers + 1)
    ]
    assert main([*quick, "--every-n-layers", "3", "--offload", "--budget", "1GiB", "--json"]) == 0
    single = json.loads(capsys.readouterr().out)
    # a row replays expandable segments beside torch's defaults as a single simulation does: the same typed beside,
    # every byte the same; only how the order was had differs (the row's composed from the table's stretches, the
    # single one's recorded over its whole step), in the trace's name and the sentence's last clause
    assert rows[3].keys() == single.keys() and _bytes_of(rows[3]["fit"]) == _bytes_of(single["fit"])
    assert rows[3]["device_total"]["trace_how"] == "stretches_replayed" != single["device_total"]["trace_how"]
    assert rows[3]["fit"]["beside"]["alloc_conf"] == "expandable_segments:True"
    assert rows[3]["memory"]["peak_bytes"] == single["memory"]["peak_bytes"]
    assert rows[3]["memory"]["timeline"] == single["memory"]["timeline"]

    assert main([*quick, "--every-n-layers", "all", "--gpu", "L4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:3] == ["setting", "CP", "layers"] and "fits" in lines[1]
    assert [line.split()[:2] for line in lines[2 : 3 + layers]] == [["off", "0"], ["n=1", "4"], ["n=2", "2"]] + [
        [f"n={n}", str(-(-layers // n))] for n in range(3, layers + 1)
    ]
    assert all(" yes " in line for line in lines[2 : 3 + layers]) and lines[3 + layers].startswith(
        "fits: what nvidia-smi will show"
    )
    # --gpu's time: a row a setting from the work each simulation counted, its factor over off last
    timed = lines[lines.index(next(line for line in lines if line.startswith("Predicted step time on L4"))) + 1 :]
    assert [line.split()[0] for line in timed if line.strip()][-layers - 1 :] == ["off"] + [
        f"n={n}" for n in range(1, layers + 1)
    ]
    assert timed[-1].split()[-1].startswith("x")


def test_simulate_gpu_prints_the_time_from_a_results_counted_work(monkeypatch, capsys):
    """A lone checkpointed setting that carries work has off simulated beside it, for its factor; JSON and text."""
    real = simulate_module.simulate

    def with_work(spec, **kwargs):
        result = real(spec, **kwargs)
        # RunResult.work comes with the counting (issue 59's first item); until then it is set on the result here
        object.__setattr__(result, "work", hand_work(Setting.of(spec), result.model.num_layers))
        return result

    monkeypatch.setattr(simulate_module, "simulate", with_work)
    quick = ["simulate", "--model", "tiny-llama", "--seq-len", "64", "--every-n-layers", "2", "--gpu", "H100"]
    assert main([*quick, "--json"]) == 0
    timed = json.loads(capsys.readouterr().out)["predicted_time"]
    assert timed["setting"] == "n=2" and timed["factor_over_off"] == pytest.approx(21 / 18)  # 3 of 6 layers rerun
    assert timed["predicted"]["provenance"]["kind"] == "predicted-roofline"
