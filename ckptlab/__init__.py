"""ckptlab: activation checkpointing in Hugging Face transformers, measured.

>>> import ckptlab
>>> result = ckptlab.measure(ckptlab.RunSpec(model="tiny-llama", seq_len=512, every_n_layers=2))
>>> print(ckptlab.result_diagram(result))
>>> result.memory.after_forward_bytes, result.timing.step_s

The names below load their module when first used (PEP 562): ``import ckptlab`` and the CLI's
``--help``, ``models`` and argument errors answer before torch and transformers load.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any


class _NoHubKernelNotice(logging.Filter):
    """Drops bitsandbytes' notice that the Hub's optional CPU 4-bit kernel did not load.

    On a CPU with AVX512-BF16, importing bitsandbytes asks the ``kernels`` package for
    kernels-community's 4-bit GEMM; the lab imports it with the Hub offline (``ckptlab.model.libraries``),
    where kernels finds it in no cache, so every run that adapts or quantizes (peft imports bitsandbytes)
    printed "Failed to load CPU gemm_4bit_forward from kernels-community" first. Nothing is missing:
    bitsandbytes falls back to its own CPU kernel, the one the lab's 4-bit runs measure. Its other
    messages pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "from kernels-community" not in record.getMessage()


# On the logger before bitsandbytes makes it: its module takes the same logger by name when imported.
logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_NoHubKernelNotice())

# A message's unit specs ("{needed:gib}") are the units module's to register (ckptlab.fact.UNIT_SPECS): importing
# any part of the package runs this file first, so no message is worded before they are there.
from . import units as _units  # noqa: E402

# Each public name and the module that defines it; ``__getattr__`` imports that module on first use.
_HOMES = {
    "CkptlabError": ".errors",
    "DoesNotFitError": ".errors",
    "ModelLoadError": ".errors",
    "SpecError": ".errors",
    "UnsupportedModelError": ".errors",
    "LongestSeq": ".explore.longest",
    "longest_seq": ".explore.longest",
    "Prediction": ".explore.predict",
    "predict": ".explore.predict",
    "Recommendation": ".explore.recommend",
    "recommend": ".explore.recommend",
    "SweepResult": ".explore.sweep",
    "SweepRow": ".explore.sweep",
    "SweepSpec": ".explore.sweep",
    "sweep": ".explore.sweep",
    "CheckpointingCallback": ".integrations.trainer",
    "CheckpointingReport": ".integrations.trainer",
    "DEFAULT_PRESET": ".model.catalog",
    "ModelInfo": ".model.catalog",
    "Preset": ".model.catalog",
    "build_model": ".model.catalog",
    "describe": ".model.catalog",
    "list_presets": ".model.catalog",
    "checkpointable_layers": ".model.plan",
    "describe_plan": ".model.plan",
    "observed_roles": ".model.plan",
    "planned_roles": ".model.plan",
    "QLORA": ".model.quantize",
    "Quantization": ".model.quantize",
    "Comparison": ".results",
    "LayerResult": ".results",
    "MemoryResult": ".results",
    "Provenance": ".results",
    "RunResult": ".results",
    "TimingResult": ".results",
    "compare": ".results",
    "diagram": ".show.report",
    "result_diagram": ".show.report",
    "run_report": ".show.report",
    "RunSpec": ".spec",
    "measure": ".step.measure",
    "load_model": ".step.preflight",
    "simulate": ".step.simulate",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'ckptlab' has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


# The same names, eagerly, for type checkers and editors (tests/test_packaging.py checks they are _HOMES).
if TYPE_CHECKING:
    from .errors import CkptlabError, DoesNotFitError, ModelLoadError, SpecError, UnsupportedModelError
    from .explore.longest import LongestSeq, longest_seq
    from .explore.predict import Prediction, predict
    from .explore.recommend import Recommendation, recommend
    from .explore.sweep import SweepResult, SweepRow, SweepSpec, sweep
    from .integrations.trainer import CheckpointingCallback, CheckpointingReport
    from .model.catalog import DEFAULT_PRESET, ModelInfo, Preset, build_model, describe, list_presets
    from .model.plan import checkpointable_layers, describe_plan, observed_roles, planned_roles
    from .model.quantize import QLORA, Quantization
    from .results import Comparison, LayerResult, MemoryResult, Provenance, RunResult, TimingResult, compare
    from .show.report import diagram, result_diagram, run_report
    from .spec import RunSpec
    from .step.measure import measure
    from .step.preflight import load_model
    from .step.simulate import simulate
