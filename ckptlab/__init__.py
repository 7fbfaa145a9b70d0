"""ckptlab: activation checkpointing in Hugging Face transformers, measured.

>>> import ckptlab
>>> result = ckptlab.measure(ckptlab.RunSpec(model="tiny-llama", seq_len=512, every_n_layers=2))
>>> print(ckptlab.result_diagram(result))
>>> result.memory.after_forward_bytes, result.timing.step_s
"""

from .errors import CkptlabError, DoesNotFitError, ModelLoadError, SpecError, UnsupportedModelError
from .explore.predict import Prediction, predict
from .explore.recommend import Recommendation, recommend
from .explore.sweep import SweepResult, SweepRow, SweepSpec, sweep
from .integrations.trainer import CheckpointingCallback, CheckpointingReport
from .model.catalog import DEFAULT_PRESET, ModelInfo, Preset, build_model, describe, list_presets
from .model.plan import checkpointable_layers, describe_plan, observed_roles, planned_roles
from .results import Comparison, LayerResult, MemoryResult, Provenance, RunResult, TimingResult, compare
from .show.report import diagram, result_diagram, run_report
from .spec import RunSpec
from .step.measure import measure
from .step.preflight import load_model
from .step.simulate import simulate

__all__ = [
    "DEFAULT_PRESET",
    "CheckpointingCallback",
    "CheckpointingReport",
    "CkptlabError",
    "Comparison",
    "DoesNotFitError",
    "LayerResult",
    "MemoryResult",
    "ModelInfo",
    "ModelLoadError",
    "Prediction",
    "Preset",
    "Provenance",
    "Recommendation",
    "RunResult",
    "RunSpec",
    "SpecError",
    "SweepResult",
    "SweepRow",
    "SweepSpec",
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
    "predict",
    "recommend",
    "result_diagram",
    "run_report",
    "simulate",
    "sweep",
]
