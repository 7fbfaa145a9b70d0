"""ckptlab: activation checkpointing in Hugging Face transformers, measured.

    >>> import ckptlab
    >>> result = ckptlab.measure(ckptlab.RunSpec(model="tiny-llama", seq_len=512, every_n_layers=2))
    >>> print(ckptlab.result_diagram(result))
    >>> result.memory.after_forward_bytes, result.timing.step_s
"""

from .catalog import DEFAULT_PRESET, ModelInfo, Preset, build_model, describe, list_presets
from .errors import CkptlabError, DoesNotFitError, ModelLoadError, SpecError, UnsupportedModelError
from .measure import load_model, measure
from .plan import checkpointable_layers, describe_plan, observed_roles, planned_roles
from .report import diagram, result_diagram, run_report
from .results import Comparison, LayerResult, MemoryResult, Provenance, RunResult, RunSpec, TimingResult, compare

__all__ = [
    "DEFAULT_PRESET",
    "CkptlabError",
    "Comparison",
    "DoesNotFitError",
    "LayerResult",
    "MemoryResult",
    "ModelInfo",
    "ModelLoadError",
    "Preset",
    "Provenance",
    "RunResult",
    "RunSpec",
    "SpecError",
    "TimingResult",
    "UnsupportedModelError",
    "build_model",
    "checkpointable_layers",
    "compare",
    "describe",
    "describe_plan",
    "diagram",
    "list_presets",
    "load_model",
    "measure",
    "observed_roles",
    "planned_roles",
    "result_diagram",
    "run_report",
]
