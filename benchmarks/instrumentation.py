"""The cost of the lab's own instrumentation, as ratios measured side by side in one run.

Alternates, round after round on the same model and inputs, a bare training step with
the same step under each kind of instrumentation the lab uses, and prints the median
step time of each over the bare median:

- the probe of the timed steps (forward hooks on layers and their children: counts, reruns);
  the lab's timing figures carry this, so it should stay under 1.05;
- the probe of the memory step (plus saved-tensor hooks and peak location);
- MemTracker, which the memory step runs under on the CPU and which is why that step is
  not timed.

    python benchmarks/instrumentation.py [--model tiny-llama] [--seq-len 512] [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ckptlab import RunSpec, load_model  # noqa: E402
from ckptlab.measure import random_batch, _step  # noqa: E402
from ckptlab.meters import TrackerMeter  # noqa: E402
from ckptlab.probe import LayerProbe  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--every-n-layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()

    spec = RunSpec(model=args.model, seq_len=args.seq_len, every_n_layers=args.every_n_layers, device="cpu")
    model, info = load_model(spec)
    model.train()
    model.activation_checkpointing_enable(every_n_layers=spec.every_n_layers)
    batch = random_batch(model, spec, torch.device("cpu"))

    timed_probe = LayerProbe(model, track_saved=False)
    memory_probe = LayerProbe(model, on_region=lambda region: None, track_saved=True)

    def bare() -> None:
        _step(model, batch, None)

    def with_timed_probe() -> None:
        with timed_probe.attached():
            _step(model, batch, timed_probe)

    def with_memory_probe() -> None:
        with memory_probe.attached():
            _step(model, batch, memory_probe)

    def with_memtracker() -> None:
        with TrackerMeter(model, torch.device("cpu")).watching():
            _step(model, batch, None)

    variants = {
        "bare step": bare,
        "timed-step probe": with_timed_probe,
        "memory-step probe": with_memory_probe,
        "MemTracker": with_memtracker,
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(2):  # warm-up
        for run in variants.values():
            run()
    for _ in range(args.rounds):
        for name, run in variants.items():  # interleaved, so drift on a shared machine hits all alike
            start = time.perf_counter()
            run()
            samples[name].append(time.perf_counter() - start)

    bare_median = statistics.median(samples["bare step"])
    print(f"{info.name}, seq_len {spec.seq_len}, every_n_layers={spec.every_n_layers}, "
          f"{args.rounds} interleaved rounds, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'variant':<20}{'median ms':>10}{'ratio':>8}")
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"{name:<20}{median * 1000:>10.1f}{median / bare_median:>8.3f}")
    ratio = statistics.median(samples["timed-step probe"]) / bare_median
    print(f"\ntimed-step probe over bare: {ratio:.3f} (target < 1.05): {'OK' if ratio < 1.05 else 'OVER'}")


if __name__ == "__main__":
    main()
