"""The work of a simulated step's ops (ckptlab.step.opcount): the lab's formulas against hand counts, the bytes rule,
and a tiny model's step counted by hand (the fold's and the replay's counts are compared with simulating every layer
where their bytes are: tests/step/test_simulate.py, test_replay.py, test_fsdp.py, test_layer_kinds.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.utils.flop_counter import flop_registry

from ckptlab import RunSpec
from ckptlab.model.catalog import load_config
from ckptlab.results import Region
from ckptlab.step.opcount import LAB_FORMULAS, NotCombinable, WorkCounter, combine
from ckptlab.step.table import simulate_table
from ckptlab.step.work import OpCost

aten = torch.ops.aten


def _meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def _counted(func, args, out, phase: str = "forward") -> OpCost:
    """The one cost a fresh counter records for ``func`` (the op is not run: meta tensors stand for its shapes)."""
    counter = WorkCounter()
    counter.enter(Region("layer_forward", phase, 0, False, "", 0))
    counter.op(func, args, None, out)
    ((counted_phase, cost),) = counter.stretches[-1]
    assert counted_phase == phase
    return cost


@pytest.mark.parametrize(
    "a, b, out, hand",
    [
        ((10, 8), (3, 8, 6), (10, 6), 2 * 10 * 8 * 6),  # MoE's experts: tokens x k by groups x k x n
        ((3, 4, 8), (3, 8, 6), (3, 4, 6), 2 * 3 * 4 * 8 * 6),  # batched
        ((4, 12), (12, 6), (3, 4, 6), 2 * 4 * 12 * 6),  # the weights' gradient: k split into 3 groups
    ],
)
def test_grouped_mm_counts_two_m_k_n_summed_over_the_groups(a, b, out, hand):
    offs = torch.empty(3, dtype=torch.int32, device="meta")
    cost = _counted(aten._grouped_mm.default, (_meta(*a), _meta(*b), offs), _meta(*out))
    assert cost.flops == hand
    assert cost.bytes == 2 * (_numel(a) + _numel(b) + _numel(out)) + 3 * 4  # bf16 operands and output, int32 offsets
    assert cost.dtype == "bfloat16" and cost.op == "aten._grouped_mm.default"


def _numel(shape: tuple[int, ...]) -> int:
    return int(torch.Size(shape).numel())


def test_the_cpu_flash_attention_counts_as_the_cuda_flash_kernel_on_the_same_shapes():
    b, h, kv, s, d = 2, 8, 2, 16, 32  # grouped-query attention: 8 query heads over 2 key/value heads
    q, k, v = _meta(b, h, s, d), _meta(b, kv, s, d), _meta(b, kv, s, d)
    out, lse = _meta(b, h, s, d), _meta(b, h, s, dtype=torch.float32)
    forward = _counted(aten._scaled_dot_product_flash_attention_for_cpu.default, (q, k, v, 0.0, True), (out, lse))
    assert forward.flops == 2 * (2 * b * h * s * s * d)  # q @ k^T and the scores @ v, every query head
    cuda = flop_registry[aten._scaled_dot_product_flash_attention]
    assert forward.flops == cuda(q, k, v, out_val=(out, lse))
    grads = (_meta(b, h, s, d), _meta(b, kv, s, d), _meta(b, kv, s, d))
    backward = _counted(
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
        (out, q, k, v, out, lse, 0.0, True),
        grads,
        phase="backward",
    )
    assert backward.flops == 5 * (2 * b * h * s * s * d)  # the scores again, and four products for the gradients
    assert backward.flops == flop_registry[aten._scaled_dot_product_flash_attention_backward](
        out, q, k, v, out, lse, out_val=grads
    )


def test_a_4bit_matmul_counts_the_matmul_and_a_dequantization_one_multiply_a_weight():
    m, k, n = 32, 64, 48
    inputs, packed, absmax = _meta(m, k, dtype=torch.float32), _meta(k * n // 2, 1, dtype=torch.uint8), _meta(48)
    assert LAB_FORMULAS["bitsandbytes.gemm_4bit"](inputs, packed, out_val=_meta(m, n, dtype=torch.float32)) == (
        2 * m * k * n
    )
    weight = _meta(n, k, dtype=torch.float32)
    assert LAB_FORMULAS["bitsandbytes.dequantize_4bit"](packed, absmax, out_val=weight) == n * k


def test_bytes_are_distinct_tensors_read_and_written_a_broadcast_once_and_views_are_no_kernels():
    x, row = torch.empty(4, 8), torch.empty(8)
    # x + row broadcast: x and the row read (the row once, stride 0 along the rows), the sum written.
    cost = _counted(aten.add.Tensor, (x, row.expand(4, 8)), torch.empty(4, 8))
    assert cost.bytes == 4 * 8 * 4 + 8 * 4 + 4 * 8 * 4 and cost.flops == 0
    assert _counted(aten.mul.Tensor, (x, x), torch.empty(4, 8)).bytes == 2 * 4 * 8 * 4  # x read once
    assert _counted(aten.add_.Tensor, (x, x), x).bytes == 2 * 4 * 8 * 4  # in place: read, then written
    counter = WorkCounter()
    counter.op(aten.view.default, (x, [32]), None, x.view(32))
    counter.op(aten.empty.memory_format, ([4],), {}, torch.empty(4))
    assert counter.stretches == [{}]


def test_a_cost_that_grows_with_the_depth_combines_call_by_call_and_a_shrinking_count_is_refused():
    norm = "aten.linalg_vector_norm.default"
    per_param, stacked = OpCost(norm, "float32", 0, 100), lambda layers: OpCost(norm, "float32", 0, 8 * layers)
    three = {("optimizer", per_param): 3, ("optimizer", stacked(3)): 1}
    four = {("optimizer", per_param): 4, ("optimizer", stacked(4)): 1}
    grown = combine(lambda one, two: one + 3 * (two - one), three, four)  # three more layers
    assert grown == {("optimizer", per_param): 6, ("optimizer", stacked(6)): 1}
    with pytest.raises(NotCombinable):  # fewer calls at more layers, five layers on: no count
        combine(lambda one, two: one + 5 * (two - one), four, three)
    with pytest.raises(NotCombinable):  # a moving call of another count at each depth: no pairs
        combine(lambda one, two: one + 3 * (two - one), three, {**four, ("optimizer", stacked(4)): 2})


@pytest.mark.slow  # two simulated settings (the replay): the hand count of a real step's work
def test_a_tiny_models_step_counts_its_matmuls_by_hand_and_the_rerun_as_the_checkpointed_layers_forward():
    config, _, _ = load_config("tiny-llama")
    h, inter, vocab, layers = config.hidden_size, config.intermediate_size, config.vocab_size, config.num_hidden_layers
    heads, head_dim, tokens = config.num_attention_heads, h // config.num_attention_heads, 32
    base = RunSpec(model="tiny-llama", seq_len=tokens, batch_size=1)
    full, half = simulate_table([replace(base, every_n_layers=1, offload=True), replace(base, every_n_layers=2)])

    def flops(result, phase: str, ops: tuple[str, ...] = ("aten.mm.default",)) -> int:
        return sum(i.cost.flops * i.count for i in result.work.items if i.phase == phase and i.cost.op in ops)

    projections = 4 * h * h + 3 * h * inter  # q, k, v, o; gate, up, down (Llama's have no bias)
    attention = 2 * (2 * heads * tokens * tokens * head_dim)
    assert flops(full, "forward") == layers * 2 * tokens * projections
    assert flops(full, "forward", ("aten._scaled_dot_product_flash_attention_for_cpu.default",)) == layers * attention
    assert flops(full, "loss") == 2 * tokens * h * vocab  # the head, never rerun
    # torch's checkpoint stops the recompute once it has every tensor the backward saved: the down projection's
    # output is saved by nothing, so the rerun is each checkpointed layer's forward but that one matmul.
    down = 2 * tokens * inter * h
    assert flops(full, "rerun") == layers * (2 * tokens * projections - down)
    assert 2 * flops(half, "rerun") == flops(full, "rerun")  # every second layer checkpointed
    assert full.work.flops("backward") == half.work.flops("backward")  # the rerun is not the backward's
    # offload copies each checkpointed layer's input to the host and back.
    assert full.work.bytes("offload") == 2 * full.memory.offload_bytes == 2 * layers * tokens * h * 2
    assert half.work.kernels("offload") == 0
    summary = full.to_dict()["work"]
    assert summary["flops"]["rerun"] == flops(full, "rerun") + flops(
        full, "rerun", ("aten._scaled_dot_product_flash_attention_for_cpu.default",)
    )
    assert [row["layer"] for row in summary["by_layer"]] == [None, *range(layers)]
