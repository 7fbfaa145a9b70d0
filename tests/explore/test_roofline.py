"""The roofline: a step's predicted time from hand-built counted work, each rule checked by hand on H100's figures."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ckptlab.errors import SpecError
from ckptlab.explore.gpus import GPU_SPECS
from ckptlab.explore.roofline import (
    CPU_DISPATCH_S,
    E_COMPUTE,
    E_GPU_LINK,
    E_HOST_LINK,
    E_MEMORY,
    LAUNCH_S,
    PYTHON_OP_S,
    SettingTime,
    TimePrediction,
    cpu_speed,
    item_seconds,
    measured_efficiency,
    op_seconds,
    over_off,
    predict_time,
    step_work,
)
from ckptlab.show.labels import provenance_label
from ckptlab.spec import Setting
from ckptlab.step.work import OpCost, StepWork, WorkItem

H100 = GPU_SPECS["H100 80 GB"]  # dense bf16 989.4 TFLOP/s, tf32 494.7, fp32 66.9; HBM 3.35 TB/s; PCIe 5 64 GB/s
N = 4096
MATMUL = OpCost("aten.mm.default", "bfloat16", flops=2 * N**3, bytes=3 * N * N * 2)  # 137 GFLOP over 96 MiB
ADD = OpCost("aten.add.Tensor", "bfloat16", flops=0, bytes=3 * 2**27)  # three 128 MiB tensors: read two, write one


def work(*items: tuple[str, int | None, OpCost, int]) -> StepWork:
    return StepWork(tuple(WorkItem(phase, layer, cost, count) for phase, layer, cost, count in items))


def predict(*items: tuple[str, int | None, OpCost, int], world_size: int = 1) -> TimePrediction:
    return predict_time(work(*items), H100, tokens=N, world_size=world_size, f32="float32")


def test_a_matmul_is_bound_by_the_tensor_cores_of_its_dtype():
    assert op_seconds(MATMUL, H100) == pytest.approx(2 * N**3 / (989.4e12 * E_COMPUTE))
    # float32 on the CUDA cores unless torch is told TF32 (precision "high"), then TF32's tensor-core peak
    f32 = dataclasses.replace(MATMUL, dtype="float32", bytes=MATMUL.bytes * 2)
    assert op_seconds(f32, H100, f32="float32") == pytest.approx(2 * N**3 / (66.9e12 * E_COMPUTE))
    assert op_seconds(f32, H100, f32="tf32") == pytest.approx(2 * N**3 / (494.7e12 * E_COMPUTE))


def test_an_elementwise_op_is_bound_by_memory_bandwidth():
    assert op_seconds(ADD, H100) == pytest.approx(3 * 2**27 / (3.35e12 * E_MEMORY))


def test_a_tiny_kernel_costs_one_launch():
    tiny = OpCost("aten.mul.Tensor", "bfloat16", flops=0, bytes=1024)
    assert op_seconds(tiny, H100) == LAUNCH_S
    assert item_seconds(WorkItem("backward", 0, tiny, 1000), H100) == pytest.approx(1000 * LAUNCH_S)
    # a view or a metadata query launches no kernel (the fake step asks prim.device about thrice per real op)
    for free in ("aten.view.default", "aten.t.default", "prim.device.default"):
        assert op_seconds(dataclasses.replace(tiny, op=free), H100) == 0.0


def test_ops_the_models_python_issues_have_the_higher_floor():
    """The forward's, the loss's and the rerun's ops are issued by the model's Python (PYTHON_OP_S, from the H200
    run's off forward); the backward's and the optimizer's by C++ (LAUNCH_S); a long op is above both floors."""
    tiny = OpCost("aten.mul.Tensor", "bfloat16", flops=0, bytes=1024)
    assert PYTHON_OP_S > LAUNCH_S
    for phase in ("forward", "loss", "rerun"):
        assert item_seconds(WorkItem(phase, 0, tiny, 10), H100) == pytest.approx(10 * PYTHON_OP_S)
    for phase in ("backward", "optimizer"):
        assert item_seconds(WorkItem(phase, 0, tiny, 10), H100) == pytest.approx(10 * LAUNCH_S)
    assert item_seconds(WorkItem("rerun", 0, ADD, 1), H100) == pytest.approx(op_seconds(ADD, H100))
    # a small layer's rerun costs its Python floor, above its GPU time: n=1's factor of tiny ops
    step = predict(("forward", 0, tiny, 4), ("backward", 0, tiny, 8), ("rerun", 0, tiny, 4))
    assert step.seconds == pytest.approx(8 * PYTHON_OP_S + 8 * LAUNCH_S)


def test_offload_bytes_cross_the_host_link_and_add_to_the_step():
    gib = 2**30
    copy = OpCost("aten._to_copy.default", "bfloat16", flops=0, bytes=2 * gib)  # read on the GPU, written on the host
    over_link = gib / (64e9 * E_HOST_LINK)
    plain = predict(("forward", 0, ADD, 1))
    offloaded = predict(("forward", 0, ADD, 1), ("offload", 0, copy, 2))  # out in the forward, back in the backward
    assert offloaded.by_phase["offload"] == pytest.approx(2 * over_link)
    assert offloaded.seconds == pytest.approx(plain.seconds + 2 * over_link)  # on the compute stream: no overlap
    with pytest.raises(SpecError) as refused:  # a CPU record has no host link: said, not a crash
        predict_time(
            work(("offload", 0, copy, 1)),
            cpu_speed(_Cpu(), "this CPU"),
            tokens=N,
            efficiency=measured_efficiency(_Cpu()),
        )
    assert refused.value.key == "roofline.no_link"


def test_fsdp2_collectives_overlap_their_layers_compute():
    """A layer costs the larger of its compute and its collectives (FSDP2 prefetches), not their sum."""
    compute = op_seconds(MATMUL, H100)
    # world 8: an all-gather's bytes are the whole it writes (the record's rule: the unsharded buffer); a ring moves 7/8
    whole = int(compute * 450e9 * E_GPU_LINK * 8 / 7) // 8 * 8  # an all-gather as long as the matmul, about
    for scale in (0.5, 3):
        gather = OpCost("_c10d_functional.all_gather_into_tensor.default", "bfloat16", 0, int(whole * scale))
        step = predict(("forward", 0, MATMUL, 1), ("collective", 0, gather, 1), world_size=8)
        collective = gather.bytes * 7 / 8 / (450e9 * E_GPU_LINK)
        assert step.seconds == pytest.approx(max(compute, collective))
        assert step.by_phase["collective"] == pytest.approx(max(0.0, collective - compute))  # only what shows
        assert step.by_layer == (pytest.approx(max(compute, collective)),)


def test_a_ring_all_reduce_sends_twice_what_an_all_gather_sends():
    """The record's bytes are a collective's unsharded buffer; a ring all-reduce (a reduce-scatter, then an
    all-gather) sends 2(w-1)/w of it per rank. Hand count: one s x b x h bf16 activation of Korthikanti's 22B layer
    (2048 x 4 x 6144 x 2 = 100,663,296 B) across 8 A100s: 176,160,768 B over NVLink 3's 300 GB/s at E_GPU_LINK."""
    a100 = GPU_SPECS["A100 80 GB"]
    activation = 2048 * 4 * 6144 * 2
    reduce = OpCost("_c10d_functional.all_reduce.default", "bfloat16", 0, activation)
    gather = dataclasses.replace(reduce, op="_c10d_functional.all_gather_into_tensor.default")
    seconds = item_seconds(WorkItem("collective", 0, reduce, 1), a100, world_size=8)
    assert seconds == pytest.approx(176_160_768 / (300e9 * E_GPU_LINK))  # 0.734 ms
    assert item_seconds(WorkItem("collective", 0, gather, 1), a100, world_size=8) == pytest.approx(seconds / 2)


def test_the_factor_over_off_and_the_reruns_share():
    """n=1 reruns every layer's forward in the backward: (forward + backward + forward) over (forward + backward)."""
    forward, backward = (
        (("forward", layer, ADD, 2) for layer in (0, 1)),
        (("backward", layer, ADD, 4) for layer in (0, 1)),
    )
    off_items = [*forward, *backward]
    off = predict(*off_items)
    n1 = predict(*off_items, ("rerun", 0, ADD, 2), ("rerun", 1, ADD, 2))
    rows = over_off([(Setting(None), off), (Setting(1), n1), (Setting(2), None)])
    assert [row.factor_over_off for row in rows] == [1.0, pytest.approx((2 + 4 + 2) / (2 + 4)), None]
    assert n1.rerun_share == pytest.approx(2 / 8)
    assert over_off([(Setting(1), n1)])[0].factor_over_off is None  # no off to divide by


def test_mfu_counts_the_model_flops_without_the_rerun():
    """PaLM's MFU: a step of compute-bound matmuls runs at E_COMPUTE of the peak; its rerun is hardware work, not
    model work, so MFU halves where the rerun doubles the time and HFU stays."""
    plain = predict(("forward", 0, MATMUL, 1))
    assert plain.mfu == pytest.approx(E_COMPUTE)
    assert plain.tokens_per_s == pytest.approx(N / op_seconds(MATMUL, H100))
    rerun = predict(("forward", 0, MATMUL, 1), ("rerun", 0, MATMUL, 1))
    assert rerun.model_flops == 2 * N**3 and rerun.hardware_flops == 4 * N**3
    assert (rerun.mfu, rerun.hfu) == (pytest.approx(E_COMPUTE / 2), pytest.approx(E_COMPUTE))


def test_a_prediction_says_it_is_predicted_by_the_roofline_on_its_device():
    prediction = predict(("forward", 0, ADD, 1))
    assert provenance_label(prediction.provenance) == "predicted (roofline, H100 80 GB)"
    assert prediction.provenance.label == "predicted (roofline, H100 80 GB)"
    assert "H100 80 GB" in provenance_label(prediction.provenance, "ja")
    data = json.loads(json.dumps(SettingTime(Setting(None), prediction, 1.0).to_dict()))
    assert data["predicted"]["seconds"] == prediction.seconds and data["factor_over_off"] == 1.0


@dataclasses.dataclass
class _Cpu:
    """A measured CPU record as explore/machine.py keeps it (its speed fields only)."""

    matmul_flops: dict[str, float] = dataclasses.field(default_factory=lambda: {"float32": 100e9, "bfloat16": 50e9})
    memory_bandwidth: float | None = 20e9
    host_op_s: dict[str, float] = dataclasses.field(
        default_factory=lambda: {"forward": 15e-6, "backward": 7e-6, "rerun": 45e-6}
    )


def test_the_cpus_measured_speed_plugs_into_the_same_predictor():
    cpu = cpu_speed(_Cpu(), "this CPU")
    f32 = dataclasses.replace(MATMUL, dtype="float32")
    # measured figures need no efficiency; a CPU has no TF32, so float32 stays float32 whatever torch is told; and a
    # CPU runs the host's part of an op and its arithmetic in turn: the measured host time adds, by phase (a rerun op
    # pays the checkpoint's hooks too)
    matmul_s = 2 * N**3 / 100e9
    ops = work(("forward", 0, f32, 1), ("backward", 0, f32, 2), ("rerun", 0, f32, 1), ("loss", None, ADD, 1))
    step = predict_time(ops, cpu, tokens=N, efficiency=measured_efficiency(_Cpu()), f32="tf32")
    add_s = ADD.bytes / 20e9
    assert step.seconds == pytest.approx(matmul_s + 15e-6 + 2 * (matmul_s + 7e-6) + matmul_s + 45e-6 + add_s + 15e-6)
    # a record from before the host times were measured: PyTorch's dispatch, 5 us an op, still added
    older = measured_efficiency(_Cpu(host_op_s={}))
    assert older.launch_s == older.python_op_s == older.rerun_op_s == CPU_DISPATCH_S and older.host_adds
    with pytest.raises(SpecError):
        cpu_speed(_Cpu(memory_bandwidth=None), "this CPU")


def test_a_result_without_counted_work_has_no_prediction():
    class Measured:  # a measured result, or a simulation from before the counting: no ``work``
        pass

    assert step_work(Measured()) is None  # type: ignore[arg-type]


def test_the_reruns_anatomy_against_the_textbooks_one_extra_forward():
    """The lesson's figures, by hand: the rerun repeats the layers' forward but not the head and the loss (so it is
    less than a forward), its attention share is the attention kernel's time over the rerun's, and a kernel shorter
    than a launch counts as launch-bound."""
    from ckptlab.explore.roofline import TEXTBOOK_FACTOR, host_floor, rerun_anatomy

    attention = OpCost("aten._scaled_dot_product_flash_attention_for_cpu.default", "bfloat16", 4 * N**3, 4 * N * N * 2)
    tiny = OpCost("aten.mul.Tensor", "bfloat16", flops=0, bytes=64)
    layer = [("forward", 0, MATMUL, 2), ("forward", 0, attention, 1), ("forward", 0, tiny, 3)]
    head = [("forward", None, MATMUL, 1), ("loss", None, ADD, 1)]
    backward = [("backward", 0, MATMUL, 4), ("backward", 0, attention, 2)]
    rerun = [("rerun", 0, cost, count) for _, _, cost, count in layer]
    anatomy = rerun_anatomy(work(*layer, *head, *backward), work(*layer, *head, *backward, *rerun), H100, tokens=N)
    mm, att, add = op_seconds(MATMUL, H100), op_seconds(attention, H100), op_seconds(ADD, H100)
    floor = host_floor("forward")  # a tiny op the model's Python issues costs its host floor, not its kernel
    forward = 2 * mm + att + 3 * floor + mm + add
    assert anatomy.forward_s == pytest.approx(forward)
    assert anatomy.head_share == pytest.approx((mm + add) / forward)
    assert anatomy.rerun_of_forward == pytest.approx((2 * mm + att + 3 * floor) / forward)
    assert anatomy.rerun_of_forward < 1
    assert anatomy.attention_share == pytest.approx(att / (2 * mm + att + 3 * floor))
    assert anatomy.launch_share == pytest.approx(3 * floor / anatomy.off.seconds)
    off = forward + 4 * mm + 2 * att
    assert anatomy.factor == pytest.approx((off + 2 * mm + att + 3 * floor) / off)
    assert anatomy.factor < TEXTBOOK_FACTOR  # the head and the loss are not rerun
