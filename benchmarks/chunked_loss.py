"""transformers' loss beside a chunked one (cut-cross-entropy), measured on the CPU: the peak resident memory of a step.

    MALLOC_MMAP_THRESHOLD_=65536 python benchmarks/chunked_loss.py [--vocab 131072] [--tokens 256]

Needs ``pip install cut-cross-entropy`` (it imports triton; its ``torch_compile`` implementation, the
one used here, runs on the CPU). The lab's CPU meter (MemTracker, a dispatch mode) cannot follow
it: ``torch.compile(fullgraph=True)`` finds no frame to compile under a dispatch mode. So each
loss is measured in a process of its own by the kernel's high-water mark of resident memory
(``VmHWM``, reset through ``/proc/self/clear_refs`` after a warm-up step that compiles), with
glibc told to map every allocation above 64 KiB on its own (``MALLOC_MMAP_THRESHOLD_``) so that
freed tensors leave the resident set at once. Measured on the CPU, float32, random weights.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _hwm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def one(loss_name: str, vocab: int, tokens: int) -> dict:
    """One step's peak above the resident memory before it, in this process."""
    import torch

    sys.path.insert(0, str(ROOT))
    from ckptlab.model.catalog import instantiate, load_config

    config, _, task = load_config("tiny-llama")
    config.vocab_size = vocab
    torch.manual_seed(0)
    model = instantiate(config, task, torch.float32)
    model.train()
    ids = torch.randint(vocab, (1, tokens))

    def step() -> float:
        if loss_name == "transformers":
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss  # ForCausalLMLoss: float32 logits
        else:
            from cut_cross_entropy import linear_cross_entropy

            hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state  # (batch, seq, hidden)
            loss = linear_cross_entropy(hidden, model.lm_head.weight, ids, shift=1, impl="torch_compile")
        loss.backward()
        model.zero_grad(set_to_none=False)  # gradients stay allocated: both steps start from the same memory
        return loss.item()

    step()  # compiles (cut-cross-entropy) and allocates the gradients
    before = _rss_bytes()
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark starts again from the current RSS
    value = step()
    return {"loss": loss_name, "value": value, "peak_above_bytes": _hwm_bytes() - before}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=131072)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--one", choices=("transformers", "cut-cross-entropy"))
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.vocab, args.tokens)))
        return
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": os.environ.get("MALLOC_MMAP_THRESHOLD_", "65536")}
    logits = args.tokens * args.vocab * 4
    print(
        f"tiny-llama, vocab {args.vocab:,}, {args.tokens} tokens, float32; one float32 logits: {logits / 2**20:.0f} MiB"
    )
    for name in ("transformers", "cut-cross-entropy"):
        command = [sys.executable, __file__, "--one", name, "--vocab", str(args.vocab), "--tokens", str(args.tokens)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        peak = row["peak_above_bytes"]
        print(
            f"{name:<18} loss {row['value']:.4f}  peak above the step's start {peak / 2**20:8.1f} MiB (measured, CPU)"
        )


if __name__ == "__main__":
    main()
