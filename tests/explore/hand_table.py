"""An At-scale table made by hand: settings with a peak and counted work each, no simulation (a unit test's input).

Each result stands for a 4-layer step on H100 figures: every layer's forward is two 384 MiB elementwise ops and its
backward four (memory-bound: 0.14 ms each on an H100), a checkpointed layer reruns its two forward ops, and offload
copies 1 GiB a checkpointed layer to the host and back over PCIe (about 21 ms each way at 80% of 64 GB/s): offload
costs far more time than rerunning, as on a real card once the inputs are large.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ckptlab.explore.scale import ScaleRequest, ScaleTable
from ckptlab.results import Provenance
from ckptlab.spec import RunSpec, Setting
from ckptlab.step.provenance import made_now
from ckptlab.step.work import OpCost, StepWork, WorkItem
from ckptlab.units import GIB

LAYERS = 4
ADD = OpCost("aten.add.Tensor", "bfloat16", flops=0, bytes=3 * 2**27)
COPY = OpCost("aten._to_copy.default", "bfloat16", flops=0, bytes=2 * GIB)  # read on one side, written on the other


@dataclass(frozen=True)
class Where:
    """Where the peak was: nowhere said (a hand-made result)."""

    kind: str = ""


@dataclass(frozen=True)
class Memory:
    """What ``fits``, the At-scale rows and the figures read of a result's memory."""

    peak_bytes: int
    host_offload_bytes: int = 0
    after_forward_bytes: int = 0
    breakdown_at_peak: dict[str, int] = field(default_factory=dict)
    peak_where: Where = Where()


@dataclass(frozen=True)
class HandResult:
    """A simulated result's fields the At-scale choice reads: its spec, its peak, its counted work."""

    spec: RunSpec
    memory: Memory
    work: StepWork | None
    device_total: None = None
    provenance: Provenance = field(default_factory=lambda: made_now("simulated", "fake tensors"))


def work(setting: Setting, layers: int = LAYERS) -> StepWork:
    """The step's counted work for ``setting`` (see the module's docstring)."""
    items = []
    for layer in range(layers):
        items += [WorkItem("forward", layer, ADD, 2), WorkItem("backward", layer, ADD, 4)]
        if setting.every_n_layers is not None and layer % setting.every_n_layers == 0:
            items.append(WorkItem("rerun", layer, ADD, 2))
            if setting.offload:
                items.append(WorkItem("offload", layer, COPY, 2))  # out in the forward, back in the backward
    return StepWork(tuple(items))


def table(peaks_gib: dict[Setting, float], counted: bool = True) -> ScaleTable:
    """A table of these settings and peaks (GiB), each with its counted work (or none: a simulation from before the
    counting)."""
    request = ScaleRequest("tiny-llama", 128, 1, "bfloat16", tuple(peaks_gib))
    results = [
        HandResult(
            RunSpec(model="tiny-llama", seq_len=128, batch_size=1, dtype="bfloat16", every_n_layers=setting.every_n_layers,
                    offload=setting.offload),
            Memory(int(peak * GIB)),
            work(setting) if counted else None,
        )
        for setting, peak in peaks_gib.items()
    ]  # fmt: skip
    return ScaleTable(request, LAYERS, results)  # type: ignore[arg-type]


# Off and n=2 are over a 75 GiB budget; n=2 with offload reruns the fewest layers of those that fit, n=1 with offload
# has the lowest peak, and n=1 (four reruns, no copies) is the fastest predicted.
PEAKS = {
    Setting(None): 100.0,
    Setting(2): 90.0,
    Setting(2, offload=True): 60.0,
    Setting(1): 70.0,
    Setting(1, offload=True): 50.0,
}
BUDGET = 75 * GIB
