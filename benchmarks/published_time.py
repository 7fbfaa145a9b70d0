"""Published step-time factors of activation checkpointing beside the roofline's predictions (issue 59).

    python benchmarks/published_time.py [--only korthikanti,torchtune,torchtitan,h200,transformers]

Each row is simulated (fake tensors, the lab's counted work: ``RunResult.work``) with the setup its source states,
and timed on the source's GPU by ``ckptlab.explore.roofline`` with the constants as they are in roofline.py: no
constant is fitted here (the one fitted figure is the H200 run's off forward, ``benchmarks/fit_roofline.py``).
It prints, per row, the published factor (a checkpointed step over the step without), the predicted one and their
difference (target: within 0.08), and where a source publishes an absolute time or throughput, that figure beside
the prediction (target: within 25%). docs/published-tables.md holds the table and, where a row is off, why.

Sources (all public):

- Korthikanti et al. 2022 (arXiv 2205.05198), Table 4: one layer of their 22B GPT (h 6144, 64 heads, s 2048,
  micro-batch 4: Table 3) on A100s with tensor parallel 8; forward 7.7 ms, backward 11.9 ms, full recompute's
  backward 19.5 ms (the layer x1.39). The lab runs ONE layer with the per-GPU shapes of tensor parallel 8: 8 of the
  64 heads (head dim 96) and an eighth of the MLP; a Llama layer (three MLP matmuls) with an intermediate of 2048
  has the FLOPs of GPT's two matmuls of 6144 x 3072. Tensor parallel's all-reduces are not simulated.
- torchtune README, "Optimization flags": Llama 3.2 3B, batch 2 x 4096 packed, bf16, A100, AdamW: "+ Activation
  Checkpointing" 7,210 tokens/s after 9,174 (x1.27, with torch.compile and chunked cross-entropy on); "+ Packed
  Dataset" (eager, no AC) 7,075 tokens/s: the absolute figure.
- torchtitan docs/performance.md as issue 59 quotes it: Llama 3 8B, FSDP2 over 8 H100, full AC 10-11% fewer
  tokens/s (x1.11-1.12); local batch 1 x 8192 here (torchtitan's Llama 3 8B training default).
- this project's H200 run (docs/gpu-results.md, section 3): qwen3-0.6b, 4096 tokens, bf16, forward and backward
  only: every_n_layers 2 x1.24, 4 x1.11, 1 x2.10 (wide spread: 190-221 ms; x1.67 in the first run).
- transformers docs, gradient checkpointing: "about 20% slower", no model named; the lab's headline case here
  (qwen3-8b, 8192 tokens, bf16, AdamW, one H100: issue 59's `simulate` example), every layer checkpointed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from published_tables import _folder, llama_3_2_3b
from transformers import LlamaConfig

from ckptlab import RunSpec, simulate
from ckptlab.explore.gpus import GPU_SPECS
from ckptlab.explore.roofline import (
    GPU_EFFICIENCY,
    TimePrediction,
    item_seconds,
    predict_time,
    result_tokens,
    step_work,
)
from ckptlab.step.work import StepWork

WITHIN_FACTOR = 0.08  # a published factor reproduced within +-0.08
WITHIN_ABSOLUTE = 0.25  # a published time or throughput within 25%
FORWARD_BACKWARD = ("forward", "loss", "backward", "rerun")  # a step timed without its optimizer


@dataclass(frozen=True)
class Step:
    """One simulated setting's counted work and its prediction on the row's GPU."""

    work: StepWork
    prediction: TimePrediction

    def seconds(self, phases: tuple[str, ...] | None = None, layer: int | str | None = "all") -> float:
        """The predicted seconds of ``phases`` (all: None) of ``layer`` ("all": the whole step)."""
        gpu = GPU_SPECS[self.prediction.device]
        return sum(
            item_seconds(item, gpu, efficiency=GPU_EFFICIENCY, f32="float32")
            for item in self.work.items
            if (phases is None or item.phase in phases) and (layer == "all" or item.layer == layer)
        )


def step(spec: RunSpec, gpu: str) -> Step:
    """``spec`` simulated and its work timed on ``gpu`` (float32 matmuls as torch's default: no TF32)."""
    result = simulate(spec)
    work = step_work(result)
    if work is None:
        raise SystemExit("The simulated result carries no counted work (RunResult.work): nothing to predict.")
    prediction = predict_time(
        work, GPU_SPECS[gpu], tokens=result_tokens(result), world_size=spec.world_size, f32="float32"
    )
    return Step(work, prediction)


@dataclass(frozen=True)
class Row:
    """A published factor, the lab's, and an absolute figure where the source gives one."""

    source: str
    setup: str
    published: float  # the checkpointed step over the plain one
    predicted: float
    absolute: str = ""  # "published X, predicted Y (error)" where the source gives a time or throughput
    absolute_error: float | None = None

    @property
    def error(self) -> float:
        return self.predicted - self.published

    @property
    def within(self) -> bool:
        return abs(self.error) <= WITHIN_FACTOR


def korthikanti() -> list[Row]:
    """Korthikanti et al. 2022, Table 4: one 22B layer, per-GPU shapes of tensor parallel 8, A100."""
    layer = LlamaConfig(
        hidden_size=6144,
        num_attention_heads=8,  # 64 heads / 8 GPUs
        num_key_value_heads=8,
        head_dim=96,  # 6144 / 64
        intermediate_size=2048,  # three Llama matmuls of 6144 x 2048 = GPT's two of 6144 x (4 x 6144 / 8)
        num_hidden_layers=1,
        vocab_size=1024,  # the head is outside the layer and not in the layer's time
        max_position_embeddings=2048,
        architectures=["LlamaForCausalLM"],
    )
    spec = RunSpec(
        model=_folder(layer, "korthikanti-22b-tp8-layer"),
        seq_len=2048,
        batch_size=4,
        dtype="bfloat16",
        optimizer="none",
        every_n_layers=None,  # RunSpec's default checkpoints every layer
    )
    off, full = step(spec, "A100 80 GB"), step(replace(spec, every_n_layers=1), "A100 80 GB")
    forward, backward = off.seconds(("forward",), 0), off.seconds(("backward",), 0)
    published_ms = 7.7 + 11.9
    predicted_ms = (forward + backward) * 1e3
    return [
        Row(
            "Korthikanti et al. 2022, Table 4 (A100)",
            "one 22B layer, per-GPU shapes of TP 8 (8 heads of 96, MLP / 8), s 2048, micro-batch 4, bf16; full recompute",
            (7.7 + 19.5) / published_ms,
            full.seconds(FORWARD_BACKWARD, 0) / off.seconds(FORWARD_BACKWARD, 0),
            f"layer forward {forward * 1e3:.1f} ms (published 7.7), backward {backward * 1e3:.1f} (11.9); "
            f"forward + backward {predicted_ms:.1f} ms against {published_ms:.1f}",
            predicted_ms / published_ms - 1,
        )
    ]


def torchtune() -> list[Row]:
    """torchtune README, Optimization flags: Llama 3.2 3B, 2 x 4096, bf16, AdamW, A100."""
    spec = RunSpec(
        model=_folder(llama_3_2_3b(), "llama-3.2-3b"),
        seq_len=4096,
        batch_size=2,
        dtype="bfloat16",
        optimizer="adamw_torch",
        max_grad_norm=0.0,
        every_n_layers=None,
    )
    off, full = step(spec, "A100 80 GB"), step(replace(spec, every_n_layers=1), "A100 80 GB")
    tokens_s = off.prediction.tokens_per_s
    return [
        Row(
            "torchtune README, Optimization flags (A100)",
            "Llama 3.2 3B, 2 x 4096 packed, bf16, AdamW; every layer checkpointed",
            9174 / 7210,
            full.prediction.seconds / off.prediction.seconds,
            f"no AC, eager ('+ Packed Dataset'): {tokens_s:,.0f} tokens/s predicted against 7,075",
            tokens_s / 7075 - 1,
        )
    ]


def torchtitan() -> list[Row]:
    """torchtitan docs/performance.md (as issue 59 quotes it): Llama 3 8B, FSDP2 over 8 H100, full AC."""
    spec = RunSpec(
        model="llama-3.1-8b",
        seq_len=8192,
        batch_size=1,
        dtype="float32",
        mixed_precision="bf16",  # FSDP2's MixedPrecisionPolicy(bf16, float32), torchtitan's default
        world_size=8,
        fsdp=True,
        optimizer="adamw_torch",
        max_grad_norm=1.0,
        every_n_layers=None,
    )
    off, full = step(spec, "H100 80 GB"), step(replace(spec, every_n_layers=1), "H100 80 GB")
    return [
        Row(
            "torchtitan docs/performance.md (H100), as issue 59 quotes it",
            "Llama 3 8B, FSDP2 over 8 GPUs, local batch 1 x 8192, bf16 compute; full AC (rank 0)",
            1.115,
            full.prediction.seconds / off.prediction.seconds,
            f"rank 0: {off.prediction.tokens_per_s:,.0f} tokens/s off, exposed collectives "
            f"{off.prediction.by_phase['collective'] * 1e3:.1f} ms of {off.prediction.seconds * 1e3:.0f} ms",
        )
    ]


def h200() -> list[Row]:
    """This project's H200 run, section 3: qwen3-0.6b, 4096 tokens, bf16, forward and backward only."""
    spec = RunSpec(model="qwen3-0.6b", seq_len=4096, dtype="bfloat16", optimizer="none", every_n_layers=None)
    off = step(spec, "H200 141 GB")
    rows = []
    for n, published in ((2, 1.24), (4, 1.11), (1, 2.10)):
        setting = step(replace(spec, every_n_layers=n), "H200 141 GB")
        absolute, absolute_error = "", None
        if n == 2:
            off_ms = off.seconds(FORWARD_BACKWARD) * 1e3
            absolute, absolute_error = f"off {off_ms:.1f} ms predicted against 102.4", off_ms / 102.4 - 1
        rows.append(
            Row(
                "this project, docs/gpu-results.md section 3 (H200)",
                f"qwen3-0.6b, 4096 tokens, bf16, forward and backward; every_n_layers={n}"
                + (" (wide spread: 190-221 ms, x1.67 in run 1)" if n == 1 else ""),
                published,
                setting.seconds(FORWARD_BACKWARD) / off.seconds(FORWARD_BACKWARD),
                absolute,
                absolute_error,
            )
        )
    return rows


def transformers_docs() -> list[Row]:
    """transformers docs: gradient checkpointing makes training "about 20% slower"; qwen3-8b at 8k on one H100."""
    spec = RunSpec(model="qwen3-8b", seq_len=8192, dtype="bfloat16", optimizer="adamw_torch", every_n_layers=None)
    off, full = step(spec, "H100 80 GB"), step(replace(spec, every_n_layers=1), "H100 80 GB")
    return [
        Row(
            "transformers docs, gradient checkpointing",
            "'about 20% slower' (no model named); lab: qwen3-8b, 8192 tokens, bf16, AdamW, one H100, every layer",
            1.20,
            full.prediction.seconds / off.prediction.seconds,
            f"off {off.prediction.seconds * 1e3:.0f} ms, {off.prediction.tokens_per_s:,.0f} tokens/s, "
            f"MFU {off.prediction.mfu:.0%}",
        )
    ]


ROWS: dict[str, Callable[[], list[Row]]] = {
    "korthikanti": korthikanti,
    "torchtune": torchtune,
    "torchtitan": torchtitan,
    "h200": h200,
    "transformers": transformers_docs,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(ROWS), help="comma-separated: " + ",".join(ROWS))
    args = parser.parse_args()
    print("| source | setup | published | predicted | error | within 0.08 | absolute (published, predicted) |")
    print("|---|---|---|---|---|---|---|")
    for name in args.only.split(","):
        start = time.perf_counter()
        for row in ROWS[name]():
            absolute = row.absolute
            if row.absolute_error is not None:
                verdict = "within" if abs(row.absolute_error) <= WITHIN_ABSOLUTE else "outside"
                absolute += f" ({row.absolute_error:+.1%}, {verdict} 25%)"
            print(
                f"| {row.source} | {row.setup} | x{row.published:.2f} | x{row.predicted:.2f} | {row.error:+.2f} | "
                f"{'yes' if row.within else 'no'} | {absolute} |",
                flush=True,
            )
        print(f"<!-- {name}: {time.perf_counter() - start:.0f} s -->", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
