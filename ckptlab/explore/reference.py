"""Published figures, and the lab's reproduction of them by simulation.

transformers PR #48444 measured, on one H100, the memory resident after the forward of a
Qwen3 model with every layer checkpointed, with and without offload (docs/published-tables.md, "The published offload table, reproduced"). The
harness those numbers fit, worked out from the figures themselves:

- the base ``Qwen3Model`` (no LM head, no loss), bf16, batch 1, 16 attention heads
  (head_dim = hidden / 16) and 8 key/value heads;
- "resident" is the memory allocated after the forward minus before it, with the output
  still held: the final RMSNorm's float32 input, its bf16 output and the model output
  (8 bytes per hidden element), the rotary cos/sin tables the checkpoints keep, and the
  checkpointed layer inputs, ``layers x seq x hidden x 2`` bytes, which offload frees.

The fit is in the numbers: 66.1 MiB at 8192 x 1024 = 64 MiB (8 bytes x 8M elements) +
2 MiB (cos and sin, 8192 x 64 x 2 bytes each) + 0.1 MiB of position ids and norm
statistics; and it scales to the other two rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from transformers import AutoModel, Qwen3Config

from ..step.memory_meters import TrackerMeter
from ..step.simulate import HostLedger, simulating
from ..units import MIB


@dataclass(frozen=True)
class OffloadRow:
    """One row of the published table, with the lab's simulation of it."""

    layers: int
    hidden: int
    seq_len: int
    published_plain_mib: float  # resident after the forward, MiB, as published
    published_offload_mib: float
    simulated_plain_bytes: int = 0  # the same, simulated
    simulated_offload_bytes: int = 0

    @property
    def formula_freed_bytes(self) -> int:
        """layers x seq x hidden x 2 bytes (bf16): the checkpointed layer inputs."""
        return self.layers * self.seq_len * self.hidden * 2

    @property
    def simulated_freed_bytes(self) -> int:
        return self.simulated_plain_bytes - self.simulated_offload_bytes


PR_48444_ROWS = (
    OffloadRow(8, 1024, 8192, 194.1, 66.1),
    OffloadRow(16, 1024, 16384, 644.2, 132.2),
    OffloadRow(28, 2048, 32768, 4112.4, 528.4),
)


def pr48444_config(layers: int, hidden: int) -> Qwen3Config:
    """The Qwen3 config of a row of the table (see the module docstring for how it was worked out)."""
    return Qwen3Config(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=hidden // 16,
        intermediate_size=3 * hidden,
        vocab_size=151936,
        max_position_embeddings=40960,
    )


def simulate_resident_after_forward(config: Qwen3Config, seq_len: int, offload: bool) -> int:
    """Bytes resident after the forward of the base model, every layer checkpointed, on fake tensors.

    The same machinery as :func:`ckptlab.simulate`: fake tensors, transformers' own
    ``activation_checkpointing_enable``, the simulated ``save_on_cpu`` and MemTracker.
    """
    device = torch.device("cpu")
    with FakeTensorMode(), simulating(HostLedger()):
        model = AutoModel.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
        model.train()
        model.activation_checkpointing_enable(every_n_layers=1, offload=offload)
        input_ids = torch.randint(config.vocab_size, (1, seq_len))
        meter = TrackerMeter(model, device)
        with meter.watching():
            before = meter.current()
            output = model(input_ids=input_ids, use_cache=False)
            resident = meter.current() - before
        del output
    return resident


def measure_resident_after_forward_cuda(config: Qwen3Config, seq_len: int, offload: bool) -> int:
    """The same harness on a real CUDA device: the allocator's bytes after the forward minus before.

    Raises:
        RuntimeError: without a CUDA device.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("measure_resident_after_forward_cuda needs a CUDA device")
    device = torch.device("cuda:0")
    with torch.device(device):
        model = AutoModel.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.train()
    model.activation_checkpointing_enable(every_n_layers=1, offload=offload)
    input_ids = torch.randint(config.vocab_size, (1, seq_len), device=device)
    # The first matmul of a thread makes cuBLAS allocate its workspace (32 MiB on Hopper) through
    # the caching allocator, where it stays: measured cold, the first row of the table read 32 MiB
    # high on an H200 (docs/gpu-results.md). One untimed forward first, as any real run has had.
    model(input_ids=input_ids, use_cache=False)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    output = model(input_ids=input_ids, use_cache=False)
    torch.cuda.synchronize(device)
    resident = torch.cuda.memory_allocated(device) - before
    del output, model, input_ids
    torch.cuda.empty_cache()
    return resident


def reproduce_pr48444() -> list[OffloadRow]:
    """Simulate every row of the published table."""
    rows = []
    for row in PR_48444_ROWS:
        config = pr48444_config(row.layers, row.hidden)
        rows.append(
            OffloadRow(
                row.layers,
                row.hidden,
                row.seq_len,
                row.published_plain_mib,
                row.published_offload_mib,
                simulated_plain_bytes=simulate_resident_after_forward(config, row.seq_len, offload=False),
                simulated_offload_bytes=simulate_resident_after_forward(config, row.seq_len, offload=True),
            )
        )
    return rows


def offload_table_markdown(rows: list[OffloadRow]) -> str:
    """The reproduction beside the published figures, as a Markdown table (MiB)."""
    lines = [
        "| layers x hidden x seq | published plain | simulated plain | published offload | simulated offload "
        "| simulated freed | layers x seq x hidden x 2 |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.layers} x {row.hidden} x {row.seq_len} | {row.published_plain_mib:.1f} | "
            f"{row.simulated_plain_bytes / MIB:.1f} | {row.published_offload_mib:.1f} | "
            f"{row.simulated_offload_bytes / MIB:.1f} | {row.simulated_freed_bytes / MIB:.1f} | "
            f"{row.formula_freed_bytes / MIB:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(offload_table_markdown(reproduce_pr48444()))
