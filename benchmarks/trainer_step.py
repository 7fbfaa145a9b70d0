"""The lab's step against a real ``transformers.Trainer`` step, side by side in one run: peaks and their ratio.

For each recipe (TrainingArguments fields), a real ``Trainer.train()`` runs three steps on the CPU under
torch's own ``MemTracker`` (entered at ``on_step_begin``, module stats reset at ``on_substep_end`` for
gradient accumulation, read at ``on_step_end``: DESIGN.md's recipe, independent of the lab's meters), and
``ckptlab.measure`` runs ``RunSpec.from_training_args`` of the same fields. The lab's peak over the last
Trainer step (the steady state: the optimizer's state exists) is printed with the ratio; the goal is within 3%.

The default model is the one the Trainer-recipe issue measured: a llama with hidden 384, 6 layers and a
32,000-token vocabulary (35M parameters, random weights), 256 tokens.

    python benchmarks/trainer_step.py [--seq-len 256] [--model DIR_OR_PRESET]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.distributed._tools.mem_tracker import MemTracker
from transformers import LlamaConfig, Trainer, TrainerCallback, TrainingArguments

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ckptlab import RunSpec, build_model, measure
from ckptlab.units import MIB

GOAL = 0.03  # the lab's peak within 3% of the Trainer step's
RECIPES: dict[str, dict[str, Any]] = {
    "Trainer's defaults, batch 1, every_n_layers=2": {
        "per_device_train_batch_size": 1,
        "activation_checkpointing": True,
        "activation_checkpointing_kwargs": {"every_n_layers": 2},
    },
    "Trainer's defaults (batch 8), every_n_layers=2": {
        "activation_checkpointing": True,
        "activation_checkpointing_kwargs": {"every_n_layers": 2},
    },
    "adamw_torch, accumulation 2, full checkpointing": {
        "optim": "adamw_torch",
        "gradient_accumulation_steps": 2,
        "per_device_train_batch_size": 1,
        "activation_checkpointing": True,
    },
    "bf16 autocast, max_grad_norm 0.5, full checkpointing": {
        "bf16": True,
        "max_grad_norm": 0.5,
        "per_device_train_batch_size": 1,
        "activation_checkpointing": True,
    },
}


class TrackedSteps(TrainerCallback):
    """torch's MemTracker around each Trainer step; ``peaks`` holds each step's peak (bytes)."""

    def __init__(self) -> None:
        self.peaks: list[int] = []
        self._tracker: MemTracker | None = None

    def on_step_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self._tracker = MemTracker()
        self._tracker.track_external(model, optimizer)
        self._tracker.__enter__()

    def on_substep_end(self, args, state, control, **kwargs):
        # Gradient accumulation runs the model again within the step: MemTracker needs its module stats cleared.
        if self._tracker is not None:
            self._tracker.reset_mod_stats()

    def on_step_end(self, args, state, control, **kwargs):
        if self._tracker is None:
            return
        self._tracker.__exit__(None, None, None)
        self.peaks.append(self._tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])
        self._tracker = None


def trainer_peaks(model_name: str, fields: dict[str, Any], seq_len: int, folder: str, steps: int = 3) -> list[int]:
    """The MemTracker peak of each of ``steps`` real Trainer steps (CPU) for ``fields`` on ``model_name``."""
    model, _ = build_model(model_name)
    args = TrainingArguments(
        output_dir=folder,
        max_steps=steps,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        **fields,
    )
    rows = args.per_device_train_batch_size * args.gradient_accumulation_steps * steps
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(model.config.vocab_size, (rows, seq_len), generator=generator)
    tracked = TrackedSteps()
    Trainer(
        model=model, args=args, train_dataset=[{"input_ids": ids, "labels": ids} for ids in tokens], callbacks=[tracked]
    ).train()
    return tracked.peaks


def issue_model(folder: Path) -> str:
    """The Trainer-recipe issue's llama (hidden 384, 6 layers, vocab 32,000) as a folder with its config.json."""
    config = LlamaConfig(
        hidden_size=384,
        intermediate_size=1024,
        num_hidden_layers=6,
        num_attention_heads=6,
        num_key_value_heads=6,
        vocab_size=32000,
        max_position_embeddings=2048,
    )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config.to_dict()))
    return str(folder)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a preset or a folder (default: the issue's 35M llama)")
    parser.add_argument("--seq-len", type=int, default=256)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model or issue_model(Path(scratch) / "llama-h384")
        print(
            f"model {args.model or 'llama h384 x 6 layers, vocab 32000'} · seq {args.seq_len} · CPU · torch {torch.__version__}"
        )
        print(f"{'recipe':<54} {'Trainer MiB':>12} {'lab MiB':>9} {'lab/Trainer':>12}")
        worst = 0.0
        for name, fields in RECIPES.items():
            peaks = trainer_peaks(model, fields, args.seq_len, scratch)
            lab = measure(RunSpec.from_training_args(fields, model=model, seq_len=args.seq_len, repeats=1, warmup=1))
            ratio = lab.memory.peak_bytes / peaks[-1]
            worst = max(worst, abs(ratio - 1))
            print(f"{name:<54} {peaks[-1] / MIB:>12.1f} {lab.memory.peak_bytes / MIB:>9.1f} {ratio:>12.4f}")
    verdict = "within" if worst <= GOAL else "OUTSIDE"
    print(f"largest gap {worst:.2%}: {verdict} the {GOAL:.0%} goal")
    return 0 if worst <= GOAL else 1


if __name__ == "__main__":
    raise SystemExit(main())
