"""``ckptlab.CheckpointingCallback``: proof, from a user's own ``Trainer``, that the checkpointing setting took effect.

Added to a ``transformers.Trainer``, the callback watches one training step (the first by
default) with the lab's own instruments (:class:`~ckptlab.step.observe.StepObserver`: the
layer probe, the memory meter), reports once what that step did (the CP / keep / rerun
diagram observed, whether it is what ``TrainingArguments(activation_checkpointing=...,
activation_checkpointing_kwargs=...)`` asked for, the memory resident after the forward and
the peak, and where the peak was), then removes every hook so the rest of training runs at
full speed. The observed step itself is slower (on the CPU the meter is torch's MemTracker,
which looks at every operator).

What Trainer does with the setting, and the warnings about it, is
``ckptlab.integrations.trainer_setting``: the callback says which checkpoint variant a run
ended up with, and warns where a setting does not do what it looks like it does.

The report goes to the ``ckptlab.trainer`` logger, into ``state.log_history`` (numbers only,
keys ``ckptlab/...``) and to ``<output_dir>/ckptlab_checkpointing.json``.

What the step did is the report's typed fields and its notes are facts (:class:`~ckptlab.fact.Fact`,
``CheckpointingReport.facts``); ``notes`` and the JSON's ``"notes"`` are their English, as they always were,
beside the typed ``"facts"``. The report's text is the edge: :meth:`CheckpointingReport.text_facts` says each
line as a fact from the typed fields, and :meth:`CheckpointingReport.text` words them with
:func:`ckptlab.show.i18n.say` (English for the logger, which has no reader's language), so every sentence lives
in ``ckptlab/locales/<lang>.json`` under ``said.trainer.*``. The callback never
stops training: when it cannot observe (a model it does not understand, a failure of its own),
it says so once and steps aside.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from ..errors import SpecError
from ..fact import Fact, worded
from ..model.plan import nested_in, observed_roles, planned_roles
from ..model.quantize import model_quantization
from ..results import METHOD_FACTS, LayerResult, MemoryResult
from ..show.i18n import say
from ..show.report import diagram
from ..spec import RunSpec
from ..step.measure import layer_results
from ..step.observe import StepObserver
from ..step.training import model_device
from ..training_args import read_training_args
from ..units import mib
from .trainer_setting import (
    RequestedSetting,
    checkpoint_call,
    model_checkpoint_kwargs,
    requested_setting,
    setting_warnings,
)

logger = logging.getLogger("ckptlab.trainer")

REPORT_FILE = "ckptlab_checkpointing.json"


@dataclass(frozen=True)
class CheckpointingReport:
    """What one observed Trainer step did, beside what TrainingArguments asked for."""

    step: int  # the Trainer's global step observed (1 = the first)
    model: str  # the model's class
    device: str
    requested: RequestedSetting
    model_checkpoint_kwargs: dict[str, Any] | None  # read back from the model's first checkpointed layer
    layers: list[LayerResult]
    memory: MemoryResult
    micro_batches: int  # forwards in the step (gradient accumulation runs several)
    training_args: dict[str, Any] = field(default_factory=dict)  # the step's TrainingArguments (RunSpec.trainer_fields)
    warning_facts: list[Fact] = field(default_factory=list)  # a setting that does not do what it looks like
    facts: list[Fact] = field(default_factory=list)  # what a reader must know: the optimizer's state made, ...

    @property
    def warnings(self) -> list[str]:
        """The warning facts in English, as the report's warnings always read (the Python API's and the JSON's)."""
        return [worded(fact) for fact in self.warning_facts]

    @property
    def notes(self) -> list[str]:
        """The facts in English, as the report's notes always read (the Python API's and the JSON's)."""
        return [worded(fact) for fact in self.facts]

    @property
    def observed(self) -> list[str]:
        return [layer.observed for layer in self.layers]

    @property
    def matches(self) -> bool:
        """Asked, flagged by transformers and observed agree for every layer."""
        return all(layer.as_planned for layer in self.layers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "model": self.model,
            "device": self.device,
            "requested": asdict(self.requested),
            "model_checkpoint_kwargs": self.model_checkpoint_kwargs,
            "observed": self.observed,
            "matches": self.matches,
            "layers": [asdict(layer) | {"observed": layer.observed} for layer in self.layers],
            "memory": asdict(self.memory) | {"peak_above_baseline_bytes": self.memory.peak_above_baseline_bytes},
            "micro_batches": self.micro_batches,
            "training_args": self.training_args,
            "warnings": self.warnings,  # English, as JSON always had them
            "warning_facts": [fact.to_dict() for fact in self.warning_facts],  # the same warnings, typed
            "notes": self.notes,  # English, as JSON always had them
            "facts": [fact.to_dict() for fact in self.facts],  # the same notes, typed
        }

    def log_values(self) -> dict[str, float]:
        """The report's numbers, for ``state.log_history`` and the Trainer's loggers."""
        return {
            "ckptlab/plan_matches": float(self.matches),
            "ckptlab/checkpointed_layers": float(sum(layer.enabled == "CP" for layer in self.layers)),
            "ckptlab/reran_layers": float(sum(layer.observed == "CP" for layer in self.layers)),
            "ckptlab/resident_after_forward_bytes": float(self.memory.after_forward_bytes),
            "ckptlab/peak_bytes": float(self.memory.peak_bytes),
            "ckptlab/peak_above_baseline_bytes": float(self.memory.peak_above_baseline_bytes),
            "ckptlab/selective_kept_bytes": float(self.kept_bytes),
        }

    @property
    def kept_bytes(self) -> int:
        """Bytes of op outputs a selective policy (the user's ``context_fn``, or the lab's) kept in the CP layers, observed."""
        return sum(layer.kept_bytes for layer in self.layers if layer.enabled == "CP")

    def selective_facts(self) -> list[Fact]:
        """Inside the CP layers, when a ``context_fn`` reached torch's checkpoint: what it kept and what the rerun did."""
        cp = [layer for layer in self.layers if layer.enabled == "CP"]
        given = "context_fn" in (self.model_checkpoint_kwargs or {}) or "context_fn" in self.requested.checkpoint_kwargs
        policies = sorted({layer.selective for layer in cp if layer.selective != "none"})
        if not policies:
            return [Fact("trainer.context_fn_kept_nothing")] if given and cp else []
        ops: dict[str, int] = {}
        for layer in cp:
            for name, count in layer.kept_ops.items():
                ops[name] = ops.get(name, 0) + count
        kept = {
            "policies": ", ".join(policies),
            "bytes": self.kept_bytes,
            "rerun": sum(sum(layer.rerun_ops.values()) for layer in cp),
            "reused": sum(sum(layer.reused_ops.values()) for layer in cp),
        }
        # The ops as torch names them, in every language; a policy that saved no op says so in words.
        listed = ", ".join(f"{name} x{count}" for name, count in sorted(ops.items()))
        facts = [
            Fact("trainer.selective_kept", kept | {"ops": listed}) if listed else Fact("trainer.selective_no_op", kept)
        ]
        empty = [layer.name for layer in cp if not layer.kept_ops]
        if empty:
            facts.append(Fact("trainer.context_fn_kept_nothing_in", {"layers": ", ".join(empty)}))
        return facts

    def selective_lines(self, lang: str = "en") -> list[str]:
        """:meth:`selective_facts` in ``lang``'s words."""
        return [say(fact, lang) for fact in self.selective_facts()]

    def text_facts(self) -> list[Fact | str]:
        """The report's text, line by line: each line a fact of the typed fields, the diagram and blank lines as
        they are (the diagram draws the layers; its words are the CLI's)."""
        memory, asked = self.memory, self.requested
        lines: list[Fact | str] = [
            Fact(
                "trainer.header",
                {"step": self.step, "model": self.model, "layers": len(self.layers), "device": self.device},
            ),
            Fact(
                "trainer.asked_on",
                {
                    "activation_checkpointing": asked.activation_checkpointing,
                    "every_n_layers": asked.every_n_layers,
                    "offload": asked.offload,
                    "use_reentrant": asked.use_reentrant,
                    "use_reentrant_from": asked.use_reentrant_from,
                },
            )
            if asked.activation_checkpointing
            else Fact("trainer.asked_off", {"activation_checkpointing": asked.activation_checkpointing}),
            "",
            diagram(
                [layer.enabled for layer in self.layers],
                ["rerun" if layer.recompute_calls else "keep" for layer in self.layers],
                asked.title + " (observed)",
            ),
            "",
        ]
        if self.matches:
            lines.append(Fact("trainer.matches"))
        else:
            rows = tuple(
                Fact(
                    "trainer.mismatch_row",
                    {
                        "layer": layer.name,
                        "planned": layer.planned,
                        "enabled": layer.enabled,
                        "observed": layer.observed,
                    },
                )
                for layer in self.layers
                if not layer.as_planned
            )
            lines.append(Fact("trainer.mismatch", {"rows": rows}))
        peak_where = memory.peak_where.description
        lines += [
            Fact("trainer.memory", {"method": METHOD_FACTS.get(memory.method, memory.method)}),
            Fact("trainer.memory_baseline", {"mib": mib(memory.baseline_bytes)}),
            Fact("trainer.memory_after_forward", {"mib": mib(memory.after_forward_bytes)}),
            Fact(
                "trainer.memory_peak",
                {
                    "mib": mib(memory.peak_bytes),
                    "above_mib": mib(memory.peak_above_baseline_bytes),
                    "where": peak_where,
                },
            ),
        ]
        lines += self.selective_facts()
        if self.training_args:
            fields = ", ".join(f"{name}={value!r}" for name, value in self.training_args.items())
            lines.append(Fact("trainer.training_args", {"fields": fields}))
        lines += [Fact("trainer.warning", {"warning": fact}) for fact in self.warning_facts]
        lines += [Fact("trainer.note", {"note": fact}) for fact in self.facts]
        return lines

    def text(self, lang: str = "en") -> str:
        """The report in ``lang``'s words (the logger's is English): :meth:`text_facts` worded by ``say``."""
        return "\n".join(line if isinstance(line, str) else say(line, lang) for line in self.text_facts())


class CheckpointingCallback(TrainerCallback):
    """A ``TrainerCallback`` that proves the checkpointing setting took effect, once, then steps aside.

    Usage::

        trainer = Trainer(model=model, args=TrainingArguments(..., activation_checkpointing=True,
                          activation_checkpointing_kwargs={"every_n_layers": 2}), train_dataset=data,
                          callbacks=[ckptlab.CheckpointingCallback()])
        trainer.train()   # logs the report at the first step; ckptlab_checkpointing.json in output_dir

    Args:
        observe_step: which optimizer step to observe (1 = the first). The first step also creates
            the optimizer's state (AdamW's moments), which the report says; later steps hold it from the start.
        report_file: file name of the JSON report inside ``args.output_dir`` (None: no file).
        log_level: level of the report on the ``ckptlab.trainer`` logger (warnings are logged as warnings).
    """

    def __init__(
        self, observe_step: int = 1, report_file: str | None = REPORT_FILE, log_level: int = logging.WARNING
    ) -> None:
        if isinstance(observe_step, bool) or not isinstance(observe_step, int) or observe_step < 1:
            raise SpecError(key="api.observe_step", value=observe_step)
        self.observe_step = observe_step
        self.report_file = report_file
        self.log_level = log_level
        self.report: CheckpointingReport | None = None  # set once the step is observed
        self.stepped_aside: Fact | None = None  # why the callback stepped aside, when it did
        self._observer: StepObserver | None = None
        self._done = False

    # -- Trainer events -----------------------------------------------------------------------

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._detach()  # an earlier train() that raised inside the observed step left one inert hook
        self._safely(self._warn_before_training, args)
        self._safely(self._check_model, model)

    def on_step_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if not self._done and self._observer is None and state.global_step + 1 == self.observe_step:
            self._safely(self._begin, model, optimizer)

    def on_substep_end(self, args, state, control, **kwargs):
        if self._observer is not None:  # gradient accumulation: the step's next micro-batch comes
            self._safely(self._observer.next_micro_batch)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self._observer is not None:
            self._safely(self._observer.optimizer_phase)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self._observer is not None:
            self._safely(self._end, self._observer, args, state, model)

    def on_train_end(self, args, state, control, **kwargs):
        self._detach()  # training stopped inside the observed step: leave nothing behind

    # -- the work -----------------------------------------------------------------------------

    def _warn_before_training(self, args: Any) -> None:
        requested = requested_setting(
            bool(getattr(args, "activation_checkpointing", False)),
            getattr(args, "activation_checkpointing_kwargs", None),
        )
        if requested.offload and torch.accelerator.current_accelerator() is None:
            logger.warning("ckptlab: %s", say(Fact("trainer.warn_offload_without_accelerator")))

    def _check_model(self, model: Any) -> None:
        if not isinstance(model, torch.nn.Module):
            self._step_aside(Fact("trainer.aside_not_a_module", {"type": type(model).__name__}))
            return
        observer = StepObserver(model)
        if not observer.layers:
            self._step_aside(Fact("trainer.aside_no_layers", {"type": type(model).__name__}))

    def _begin(self, model: Any, optimizer: Any) -> None:
        self._check_model(model)
        if self._done:
            return
        self._observer = StepObserver(model, optimizer, on_failure=self._forward_raised)
        self._observer.begin()

    def _end(self, observer: StepObserver, args: Any, state: Any, model: torch.nn.Module) -> None:
        try:
            counts, memory = observer.finish()
        finally:
            self._detach()
        self._done = True
        requested = requested_setting(
            bool(getattr(args, "activation_checkpointing", False)),
            getattr(args, "activation_checkpointing_kwargs", None),
        )
        self.report = build_report(model, observer, requested, counts, memory, state.global_step, step_fields(args))
        self._publish(self.report, args, state)

    def _forward_raised(self, error: BaseException) -> None:
        self._step_aside(
            Fact("trainer.aside_forward_raised", {"error_type": type(error).__name__, "error": str(error)})
        )

    def _publish(self, report: CheckpointingReport, args: Any, state: Any) -> None:
        level = self.log_level if report.matches and not report.warning_facts else logging.WARNING
        logger.log(level, "%s", report.text())  # the warnings are in it, one line each
        state.log_history.append({**report.log_values(), "step": state.global_step})
        if self.report_file and getattr(state, "is_world_process_zero", True) and getattr(args, "output_dir", None):
            path = Path(args.output_dir) / self.report_file
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(report.to_dict(), indent=2, default=str), encoding="utf-8")

    def _safely(self, action: Any, *args: Any) -> None:
        """Run ``action``; a failure of the lab's own becomes one message, never the end of someone's training."""
        if self._done:
            return
        try:
            action(*args)
        except Exception as error:  # the user's training matters more than the report
            self._detach()
            self._step_aside(Fact("trainer.aside_failed", {"error_type": type(error).__name__, "error": str(error)}))

    @property
    def message(self) -> str | None:
        """Why the callback stepped aside, in English (the logger's words), or None."""
        return None if self.stepped_aside is None else worded(Fact("trainer.aside", {"reason": self.stepped_aside}))

    def _step_aside(self, reason: Fact) -> None:
        if self._done:
            return
        self._done = True
        self.stepped_aside = reason
        logger.warning("%s", self.message)

    def _detach(self) -> None:
        observer, self._observer = self._observer, None
        if observer is not None:
            observer.detach()


def step_fields(args: Any) -> dict[str, Any]:
    """The TrainingArguments fields of the step (batch, accumulation, optim, clipping, mixed precision), as the lab
    reads them; empty for arguments it cannot read (a Trainer subclass's own args, say)."""
    try:
        # Read, not RunSpec.from_training_args: the step observed here runs whatever checkpointing kwargs it was
        # given (use_reentrant=True among them, which the report warns about); the lab's own run refuses those.
        return RunSpec(**read_training_args(args).changes).trainer_fields()
    except (SpecError, TypeError, ValueError):
        return {}


def build_report(
    model: torch.nn.Module,
    observer: StepObserver,
    requested: RequestedSetting,
    counts: list,
    memory: MemoryResult,
    step: int,
    training_args: dict[str, Any] | None = None,
) -> CheckpointingReport:
    """The report of an observed step: asked, flagged and observed per layer, memory, warnings and notes."""
    num_layers = len(observer.layers)
    planned = planned_roles(num_layers, requested.every_n_layers)
    # A layer nested in a checkpointed one (Zamba2) reruns with it: as planned, not a mismatch.
    layers = layer_results(observer.layers, planned, observed_roles(model), counts, nested_in(model))
    on_model = model_checkpoint_kwargs(model)
    if on_model is not None and requested.activation_checkpointing:
        # The model's own binding is the truth (checkpointing may have been enabled outside the Trainer).
        passed, reentrant, source = (
            (on_model, bool(on_model["use_reentrant"]), requested.use_reentrant_from)
            if "use_reentrant" in on_model
            else checkpoint_call(on_model)
        )
        requested = RequestedSetting(True, requested.every_n_layers, requested.offload, passed, reentrant, source)
    warnings = setting_warnings(requested, num_layers, model_device(model))
    if not requested.activation_checkpointing and any(layer.enabled == "CP" for layer in layers):
        warnings.append(Fact("trainer.warn_enabled_outside"))
    facts = []
    if observer.optimizer_state_created:
        facts.append(Fact("trainer.optimizer_state_created", {"mib": mib(memory.optimizer_state_bytes)}))
    if observer.micro_batches > 1:
        facts.append(Fact("trainer.micro_batches", {"micro_batches": observer.micro_batches}))
    quantization = model_quantization(model)
    if quantization is not None:  # the lab's twin of this step needs the quantized base too
        fields = ", ".join(f"{name}={value!r}" for name, value in quantization.to_dict().items() if value is not None)
        eight = quantization.bits == 8
        facts.append(Fact("trainer.quantized_base_8bit" if eight else "trainer.quantized_base", {"fields": fields}))
    return CheckpointingReport(
        step=step,
        model=type(model).__name__,
        device=str(model_device(model)),
        requested=requested,
        model_checkpoint_kwargs=on_model,
        layers=layers,
        memory=memory,
        micro_batches=observer.micro_batches,
        training_args=training_args or {},
        warning_facts=warnings,
        facts=facts,
    )
