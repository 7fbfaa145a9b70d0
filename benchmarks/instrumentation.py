"""The cost of the lab's own instrumentation, as ratios measured side by side in one run.

Alternates, round after round on the same model and inputs, a bare training step with
the same step under each kind of instrumentation the lab uses, and prints the median
step time of each over the bare median:

- the probe of the timed steps (forward hooks on layers and their children: counts, reruns);
  the lab's timing figures carry this, so it should stay under 1.05;
- the probe of the memory step (plus saved-tensor hooks and peak location);
- MemTracker, which the memory step runs under on the CPU and which is why that step is
  not timed.

Then the memory step itself (meter + probe), with the StepRecorder that records the
step's timeline attached and without it, side by side: the time ratio and the peak ratio.
Recording the timeline must not change the measured peak or time by more than a few percent.

    python benchmarks/instrumentation.py [--model tiny-llama] [--seq-len 512] [--rounds 15] [--recorder-rounds 9]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ckptlab import RunSpec, load_model
from ckptlab.step.memory_meters import TrackerMeter, meter_for
from ckptlab.step.probe import LayerProbe, StepRecorder
from ckptlab.step.trainstep import random_batch, train_step

RECORDER_LIMIT = 1.05  # "a few percent": the timeline may cost at most this ratio in time or peak


def recorder_ratio(model: torch.nn.Module, batch: dict, device: torch.device, rounds: int = 9) -> dict[str, float]:
    """The memory step with the timeline's StepRecorder attached over the same step without it.

    Both run under the device's meter with the memory probe (saved-tensor hooks); only the
    recorder (and the region events it listens to) differs. Interleaved rounds, medians.

    Args:
        model: a model in train mode, checkpointing already set.
        batch: its inputs (``measure.random_batch``).
        device: where it runs (selects the meter: MemTracker on the CPU, the allocator on CUDA).
        rounds: timed rounds of each variant, after one warm-up round.

    Returns:
        ``time_ratio`` and ``peak_ratio`` (with over without), the medians in seconds and the peaks in bytes.
    """

    def without() -> int:
        meter = meter_for(model, device)
        probe = LayerProbe(model, on_region=None, track_saved=True)
        with meter.watching(), probe.attached():
            train_step(model, batch, probe)
            return meter.take_peak()

    def with_recorder() -> int:
        meter = meter_for(model, device)
        recorder = StepRecorder(meter)
        probe = LayerProbe(model, on_region=recorder, track_saved=True)
        with meter.watching(), probe.attached():
            train_step(model, batch, probe)
            return recorder.finish().region_peak_bytes

    samples: dict[str, list[float]] = {"without": [], "with": []}
    peaks: dict[str, list[int]] = {"without": [], "with": []}
    without(), with_recorder()  # warm-up
    for _ in range(rounds):
        for name, run in (("without", without), ("with", with_recorder)):
            start = time.perf_counter()
            peaks[name].append(run())
            samples[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    peak = {name: max(values) for name, values in peaks.items()}
    return {
        "time_ratio": medians["with"] / medians["without"],
        "peak_ratio": peak["with"] / peak["without"],
        "with_s": medians["with"],
        "without_s": medians["without"],
        "with_peak_bytes": peak["with"],
        "without_peak_bytes": peak["without"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--every-n-layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--recorder-rounds", type=int, default=9)
    args = parser.parse_args()

    spec = RunSpec(model=args.model, seq_len=args.seq_len, every_n_layers=args.every_n_layers, device="cpu")
    model, info = load_model(spec)
    model.train()
    model.activation_checkpointing_enable(every_n_layers=spec.every_n_layers)
    batch = random_batch(model, spec, torch.device("cpu"))

    timed_probe = LayerProbe(model, track_saved=False)
    memory_probe = LayerProbe(model, on_region=lambda region: None, track_saved=True)

    def bare() -> None:
        train_step(model, batch, None)

    def with_timed_probe() -> None:
        with timed_probe.attached():
            train_step(model, batch, timed_probe)

    def with_memory_probe() -> None:
        with memory_probe.attached():
            train_step(model, batch, memory_probe)

    def with_memtracker() -> None:
        with TrackerMeter(model, torch.device("cpu")).watching():
            train_step(model, batch, None)

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
    print(
        f"{info.name}, seq_len {spec.seq_len}, every_n_layers={spec.every_n_layers}, "
        f"{args.rounds} interleaved rounds, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(f"{'variant':<20}{'median ms':>10}{'ratio':>8}")
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"{name:<20}{median * 1000:>10.1f}{median / bare_median:>8.3f}")
    ratio = statistics.median(samples["timed-step probe"]) / bare_median
    print(f"\ntimed-step probe over bare: {ratio:.3f} (target < 1.05): {'OK' if ratio < 1.05 else 'OVER'}")

    recorded = recorder_ratio(model, batch, torch.device("cpu"), rounds=args.recorder_rounds)
    print(f"\nmemory step with the timeline's StepRecorder over without it, {args.recorder_rounds} interleaved rounds:")
    print(
        f"  time  {recorded['with_s'] * 1000:,.1f} ms over {recorded['without_s'] * 1000:,.1f} ms = {recorded['time_ratio']:.3f}"
    )
    print(
        f"  peak  {recorded['with_peak_bytes']:,} over {recorded['without_peak_bytes']:,} bytes = {recorded['peak_ratio']:.4f}"
    )
    worst = max(recorded["time_ratio"], recorded["peak_ratio"])
    print(f"  (target < {RECORDER_LIMIT}): {'OK' if worst < RECORDER_LIMIT else 'OVER'}")


if __name__ == "__main__":
    main()
