"""``simulate --gpu``'s words for a predicted step time and each setting's factor over off (issue 59), from
hand-built counted work; the command's own run with work injected into its results is in test_simulate.py, among
the module's other simulations."""

from __future__ import annotations

from ckptlab.cli.simulate import time_report, time_table_report
from ckptlab.explore.gpus import GPU_SPECS
from ckptlab.explore.roofline import over_off, predict_time
from ckptlab.spec import Setting
from ckptlab.step.work import OpCost, StepWork, WorkItem

ADD = OpCost("aten.add.Tensor", "bfloat16", flops=0, bytes=3 * 2**27)  # memory-bound: a known time each


def hand_work(setting: Setting, layers: int) -> StepWork:
    """Each layer's forward once and backward twice as long; a checkpointed layer's forward again as its rerun."""
    items = [
        WorkItem(phase, i, ADD, count) for i in range(layers) for phase, count in (("forward", 1), ("backward", 2))
    ]
    n = setting.every_n_layers
    items += [WorkItem("rerun", i, ADD, 1) for i in range(layers) if n is not None and i % n == 0]
    return StepWork(tuple(items))


def test_the_table_says_each_settings_time_and_its_factor_over_off():
    h100 = GPU_SPECS["H100 80 GB"]
    rows = over_off(
        [(s, predict_time(hand_work(s, 4), h100, tokens=64, f32="float32")) for s in (Setting(None), Setting(1))]
    )
    rows.append(over_off([(Setting(2), None)])[0])
    text = time_table_report(rows)
    assert "predicted (roofline, H100 80 GB)" in text
    assert [line.split()[-1] for line in text.splitlines()[2:]] == ["x1.00", "x1.33", "-"]  # (1 + 2 + 1) / 3
    assert "MFU" in time_report(rows[1]) and "x1.33" in time_report(rows[1])
    assert (
        time_report(rows[2])
        == time_table_report(rows[2:])
        == ("Predicted time: none: this simulation carries no count of its operations (FLOPs and bytes) to time.")
    )
