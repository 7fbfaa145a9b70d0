"""What the Lab page shows in words and numbers, worked out here so the page only reads widgets and draws.

Every function takes plain values (a spec, a result, the page's translator ``tr``) and returns
text, a dict of widget values or ``st.metric`` keyword arguments; nothing here imports streamlit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import CkptlabError
from ..fact import Fact
from ..model import catalog
from ..model.catalog import ModelInfo
from ..model.selective import CHOICES as SELECTIVE_CHOICES
from ..model.selective import NONE, selective_key
from ..results import Comparison, MemoryResult, RunResult, memory_of, timing_of
from ..show.i18n import Translator
from ..show.labels import event_label, provenance_label, setting_label, training_label
from ..show.report import setting_name
from ..show.wording import app_message
from ..spec import RunSpec
from ..step.equivalence import GradientCheck
from ..step.preflight import resolve_device, resolve_dtype
from ..units import GIB, MIB, mib
from .query import LORA_RANK_DEFAULT
from .run import LabRun, Measured, check, cpu_estimate, phase_significant
from .server import ServerPolicy
from .stepboxes import step_fields, step_widget_values

LOCAL = "local directory"  # the model box's entry for a folder the instructor offers
SAME_MEMORY_BYTES = MIB / 20  # a memory delta below it reads "same as off"
PEAK_UNMOVED = 0.98  # peak ratio above it: what the forward freed did not lower the peak


def params_label(num_params: int) -> str:
    """A parameter count in the model boxes' words: ``1.5B`` or ``135M``."""
    return f"{num_params / 1e9:.1f}B" if num_params >= 1e9 else f"{num_params / 1e6:.0f}M"


def model_label(name: str, info: ModelInfo | None, tr: Translator) -> str:
    """A preset in the model box: its group (tiny or real), name, layers and size; the folder entry in words."""
    if name == LOCAL or info is None:
        return tr("lab.local_dir")
    group = tr("lab.group_tiny") if info.cpu_ok else tr("lab.group_real")
    return tr("lab.model_label", group=group, name=name, layers=info.num_layers, size=params_label(info.num_params))


def duration(seconds: float) -> str:
    """Seconds in whole seconds, minutes or hours, whichever reads best."""
    if seconds < 120:
        return f"{seconds:,.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:,.0f} min"
    return f"{seconds / 3600:,.0f} h"


def weights_and_gradients_bytes(num_params: int, dtype: str) -> int:
    """Parameters plus gradients in ``dtype`` ("auto" counts as float32, as on a CPU): a prediction, not a measurement."""
    return 2 * num_params * (2 if dtype in ("bfloat16", "float16") else 4)


def model_caption(info: ModelInfo, tr: Translator) -> str:
    """The sidebar's line under a preset: family, hidden size and, when the config says, its positions."""
    if info.max_positions:
        return tr(
            "lab.model_caption_positions",
            family=info.family,
            hidden=info.hidden_size,
            positions=f"{info.max_positions:,}",
        )
    return tr("lab.model_caption", family=info.family, hidden=info.hidden_size)


def folder_info(path: str, lang: str, tr: Translator) -> tuple[ModelInfo | None, str]:
    """A local folder described, or None and why not in the page's words (a folder that breaks transformers too)."""
    try:
        return catalog.describe(path), ""
    except CkptlabError as error:
        return None, app_message(error, lang)
    except Exception as error:  # a folder transformers chokes on must not take the page down
        return None, tr("lab.cannot_read", model=repr(path), error=f"{type(error).__name__}: {error}")


def problem_with(
    spec: RunSpec, info: ModelInfo | None, policy: ServerPolicy, lang: str, tr: Translator
) -> tuple[str, bool]:
    """Why ``spec`` cannot run here ("" when it can), and whether it would run on the CPU.

    The spec's own checks, then the server's limits for that model and device; a failure of the
    checks themselves is a message too. LoRA without a target is refused.
    """
    problem = ""
    try:
        check(spec)
        on_cpu = resolve_device(spec.device).type == "cpu"
        policy.check(spec, info, on_cpu)  # type: ignore[arg-type]  # check() raised already when info is None
    except CkptlabError as error:
        problem, on_cpu = app_message(error, lang), True
    except Exception as error:  # not bad input but a failure: still a message, not a dead page
        problem, on_cpu = tr("lab.cannot_check", error=f"{type(error).__name__}: {error}"), True
    if spec.lora_rank is not None and spec.lora_targets == ():
        problem = problem or tr("training.lora_targets_needed")
    return problem, on_cpu


def cpu_warning(spec: RunSpec, info: ModelInfo, tr: Translator) -> str:
    """A model meant for a GPU, run on the CPU: the predicted step and Run times and its weights and gradients."""
    step_s, run_s = cpu_estimate(spec, info)
    gib = f"{weights_and_gradients_bytes(info.num_params, spec.dtype) / GIB:,.1f}"
    return tr("lab.meant_for_gpu", model=info.name, step=duration(step_s), run=duration(run_s), gib=gib)


def head_line(spec: RunSpec, lang: str, tr: Translator) -> str:
    """The line beside Run: model, shape, dtype, device, setting and what is trained."""
    setting = setting_label(spec.every_n_layers, spec.offload, lang)
    # 'auto' says what it resolves to here (the run goes to this machine's device), so the line never reads
    # "auto · auto": each value has its name in the template.
    device, dtype = spec.device, spec.dtype
    if spec.device == "auto":
        device = f"auto ({resolve_device('auto').type})"
    if spec.dtype == "auto":
        resolved = resolve_dtype("auto", resolve_device(spec.device), spec.mixed_precision)
        dtype = f"auto ({str(resolved).removeprefix('torch.')})"
    line = tr(
        "lab.head",
        model=spec.model,
        seq=f"{spec.seq_len:,}",
        batch=spec.batch_size,
        dtype=dtype,
        device=device,
        setting=setting,
    )
    return line + f" · {training_label(spec, lang)}"


def clock(measured: Measured) -> str:
    """When a run was measured, in the local time of the server (``HH:MM``)."""
    return measured.measured_at.astimezone().strftime("%H:%M")


def widget_values(spec: RunSpec, folder: str) -> dict[str, Any]:
    """The Lab page's widget values (session-state keys) for ``spec``.

    Args:
        spec: the settings to show.
        folder: the offered folder's name when ``spec.model`` is a local folder, "" for a preset.
    """
    return {
        "lab_model": LOCAL if folder else spec.model,
        "lab_local_dir": folder,
        "lab_seq": spec.seq_len,
        "lab_batch": spec.batch_size,
        "lab_dtype": spec.dtype,
        "lab_device": spec.device,
        "lab_ckpt": spec.every_n_layers is not None,
        "lab_n": spec.every_n_layers or 1,
        "lab_offload": spec.offload,
        "lab_repeats": spec.repeats,
        "lab_warmup": spec.warmup,
        "lab_optimizer": spec.optimizer,
        "lab_lora": spec.lora_rank is not None,
        "lab_lora_rank": spec.lora_rank or LORA_RANK_DEFAULT,
        "lab_lora_targets": list(spec.lora_targets or ()),
        "lab_targets_for": None if spec.lora_targets is None else spec.model,  # None: all, once the model is read
        **step_widget_values("lab", spec),
        # The box offers the named policies; op names come from Python only.
        "lab_selective": spec.selective if spec.selective in SELECTIVE_CHOICES else NONE,
    }


def spec_from_widgets(values: Mapping[str, Any], model: str, lora_targets: tuple[str, ...] | None) -> RunSpec:
    """The :class:`RunSpec` the Lab page's widgets say (every_n_layers and offload only with checkpointing on)."""
    checkpointing = values["lab_ckpt"]
    return RunSpec(
        model=model,
        seq_len=int(values["lab_seq"]),
        batch_size=int(values["lab_batch"]),
        dtype=values["lab_dtype"],
        device=values["lab_device"],
        every_n_layers=int(values["lab_n"]) if checkpointing else None,
        offload=bool(values["lab_offload"]) and checkpointing,
        repeats=int(values["lab_repeats"]),
        warmup=int(values["lab_warmup"]),
        optimizer=values["lab_optimizer"],
        lora_rank=int(values["lab_lora_rank"]) if values["lab_lora"] else None,
        lora_targets=lora_targets,
        **step_fields("lab", values),
        selective=values.get("lab_selective", NONE) if checkpointing else NONE,
    )


def status_label(lab: LabRun, tr: Translator) -> str:
    """The run's status line once done: reused from the cache at a time, or measured in so many seconds."""
    if lab.run.reused and (lab.reference is None or lab.reference.reused):
        return tr("lab.reused_label", clock=clock(lab.run))
    waited = tr("lab.waited", seconds=f"{lab.wait_s:.1f}") if lab.wait_s >= 0.5 else ""
    return tr("lab.measured_in", seconds=f"{lab.elapsed_s:.1f}", waited=waited)


def gradients_message(
    outcome: GradientCheck | None, problem: str, tr: Translator
) -> tuple[Literal["success", "warning", "error"], str]:
    """The gradient check in words and how loud (``st.success``, ``st.warning`` or ``st.error``)."""
    if outcome is None:
        return "warning", tr("lab.grads_failed", error=problem)
    if outcome.equal:
        return "success", tr("lab.grads_equal", count=outcome.gradients_compared, dropout=outcome.dropout)
    return "error", tr(
        "lab.grads_differ",
        diff=f"{outcome.max_abs_difference:.3g}",
        loss=tr("lab.grads_loss_same" if outcome.loss_equal else "lab.grads_loss_differs"),
        count=outcome.gradients_compared,
    )


def memory_delta(value: int, reference: int | None, tr: Translator) -> dict[str, Any]:
    """``st.metric`` delta arguments for a memory figure against checkpointing off (none without a reference)."""
    if reference is None:
        return {}
    diff = value - reference
    if abs(diff) < SAME_MEMORY_BYTES:
        return {"delta": tr("lab.same_as_off"), "delta_color": "off", "delta_arrow": "off"}
    return {"delta": tr("lab.mib_vs_off", diff=f"{diff / MIB:+,.1f}"), "delta_color": "inverse"}


def time_delta(value: float, reference: float | None, significant: bool | None, tr: Translator) -> dict[str, Any]:
    """``st.metric`` delta arguments for a time against checkpointing off: grey when too few steps or noise."""
    if reference is None:
        return {}
    diff = f"{(value - reference) * 1000:+,.0f} ms"
    if significant is None:
        return {"delta": tr("lab.too_few_steps", diff=diff), "delta_color": "off", "delta_arrow": "off"}
    if not significant:
        return {"delta": tr("lab.noise", diff=diff), "delta_color": "off", "delta_arrow": "off"}
    return {"delta": tr("lab.vs_off", diff=diff), "delta_color": "inverse"}


def time_sentence(comparison: Comparison, min_samples: int, tr: Translator) -> str:
    """The step time's change against checkpointing off, said as measurable, noise or too few steps to tell."""
    change = f"{(comparison.step_ratio - 1) * 100:+.0f}%"
    if comparison.step_significant is None:
        return tr("lab.time_too_few", change=change, min=min_samples)
    if comparison.step_significant:
        return tr("lab.time_significant", change=change)
    return tr("lab.time_noise", change=change)


def freed_sentence(memory: MemoryResult, base: MemoryResult, comparison: Comparison, tr: Translator) -> str:
    """ "" unless the forward freed memory that did not lower the peak; then how much, in words."""
    freed = base.after_forward_bytes - memory.after_forward_bytes
    if freed > 0 and comparison.peak_ratio > PEAK_UNMOVED:
        return tr("lab.freed_not_peak", mib=mib(freed))
    return ""


def file_stem(result: RunResult) -> str:
    """The downloads' file name without extension: model, sequence length and setting, no spaces or slashes."""
    model = result.model.name.strip("/").replace("/", "_")
    setting = setting_name(result.spec.every_n_layers, result.spec.offload).replace(", ", "-").replace("=", "")
    policy = "" if result.spec.selective == NONE else "-" + selective_key(result.spec.selective)
    return f"ckptlab-{model}-seq{result.spec.seq_len}-{setting}{policy}".replace(" ", "-").replace(":", "_")


@dataclass(frozen=True)
class Metric:
    """One ``st.metric`` of the Lab page: what it measures, its value, its delta against checkpointing off, its help."""

    label: str
    value: str  # e.g. "12.5 MiB", "340 ms"
    delta: dict[str, Any]  # st.metric's delta arguments (:func:`memory_delta`, :func:`time_delta`); {} for none
    help: str


def reference_run(lab: LabRun) -> RunResult | None:
    """The run with checkpointing off to compare against: None when it did not run or is the run itself."""
    reference = lab.reference.result if lab.reference and lab.reference.result.status == "ok" else None
    return None if reference is lab.result else reference  # checkpointing off: nothing to compare


def metrics(lab: LabRun, tr: Translator) -> list[Metric]:
    """The run's figures, in the page's order (two columns, left then right): peak, resident, forward,
    backward, baseline, step; memory and times with deltas against checkpointing off where it ran."""
    memory, timing = memory_of(lab.result), timing_of(lab.result)
    base = reference_run(lab)

    def mem(field: str) -> dict[str, Any]:
        return memory_delta(getattr(memory, field), getattr(memory_of(base), field) if base else None, tr)

    def phase(name: str) -> dict[str, Any]:
        if base is None:
            return {}
        value, reference = getattr(timing, f"{name}_s"), getattr(timing_of(base), f"{name}_s")
        return time_delta(value, reference, phase_significant(lab.result, base, name), tr)

    def ms(seconds: float) -> str:
        return f"{seconds * 1000:,.0f} ms"

    return [
        Metric(tr("lab.metric_peak"), f"{mib(memory.peak_bytes)} MiB", mem("peak_bytes"), tr("lab.metric_peak_help")),
        Metric(tr("lab.metric_resident"), f"{mib(memory.after_forward_bytes)} MiB", mem("after_forward_bytes"),
               tr("lab.metric_resident_help")),
        Metric(tr("lab.metric_forward"), ms(timing.forward_s), phase("forward"), tr("lab.metric_forward_help")),
        Metric(tr("lab.metric_backward"), ms(timing.backward_s), phase("backward"), tr("lab.metric_backward_help")),
        Metric(tr("lab.metric_baseline"), f"{mib(memory.baseline_bytes)} MiB", {}, tr("lab.metric_baseline_help")),
        Metric(tr("lab.metric_step"), ms(timing.step_s), phase("step"), tr("lab.metric_step_help")),
    ]  # fmt: skip


def peak_line(memory: MemoryResult, lang: str, tr: Translator) -> str:
    """Where the step reached its peak, in the page's words ("?" when the probe did not say)."""
    where = event_label(memory.peak_where, lang) if memory.peak_where.kind else "?"
    return tr("lab.peak_reached", where=where)


def medians_caption(result: RunResult, lang: str, tr: Translator) -> str:
    """Under the figures: where they come from, and how many timed steps the medians are of."""
    return tr(
        "lab.medians",
        provenance=provenance_label(result.provenance, lang),
        steps=len(timing_of(result).step_samples),
        warmup=result.spec.warmup,
    )


def settings_changed(result: RunResult, lang: str, tr: Translator) -> str:
    """The line over a result whose settings are no longer the widgets': which run it is."""
    return tr(
        "lab.settings_changed",
        model=result.model.name,
        seq=f"{result.spec.seq_len:,}",
        batch=result.spec.batch_size,
        setting=setting_label(result.spec.every_n_layers, result.spec.offload, lang),
    )


def offload_box(spec: RunSpec, result: RunResult, tr: Translator) -> tuple[Literal["info", "success"], str] | None:
    """What offload did, when the widgets or the run ask for it: moved (``st.success``), or not applied
    here and what it would move on a GPU (``st.info``); None when there is nothing to say."""
    if not (spec.offload or result.spec.offload):
        return None
    memory = memory_of(result)
    if result.spec.offload and not memory.offload_applied:
        layers = sum(layer.planned == "CP" for layer in result.layers)
        return "info", tr("lab.offload_not_applied", device=result.device, mib=mib(memory.offload_bytes), layers=layers)
    if memory.offload_applied:
        return "success", tr("lab.offload_moved", mib=mib(memory.offload_bytes))
    return None


OFFLOAD_BOX_SAYS = ("note.offload_on_cpu", "note.offload_would_move")  # the notes :func:`offload_box` words


def notes_to_show(result: RunResult) -> list[Fact]:
    """The run's notes but those :func:`offload_box` says already (decided on the facts' keys)."""
    return [note for note in result.notes if note.key not in OFFLOAD_BOX_SAYS]


# -- selective checkpointing: what the policy kept, beside plain checkpointing and off ---------------------------


def policy_label(policy: str, tr: Translator) -> str:
    """A named policy in the page's words (the selective box's entries); op names as they are."""
    return tr(f"selective.policy_{policy}") if policy in SELECTIVE_CHOICES else policy


def kept_bytes(result: RunResult) -> int:
    """Bytes the run's selective policy kept, over its CP layers (observed in the memory step; 0 without one)."""
    return sum(layer.kept_bytes for layer in result.layers if layer.enabled == "CP")


def kept_line(result: RunResult, tr: Translator) -> str:
    """What the policy kept in the CP layers and what their rerun did, observed; "" without a policy."""
    if result.spec.selective == NONE or not result.layers:
        return ""
    cp = [layer for layer in result.layers if layer.enabled == "CP"]
    reused = sum(sum(layer.reused_ops.values()) for layer in cp)
    rerun = sum(sum(layer.rerun_ops.values()) for layer in cp)
    return tr(
        "selective.kept_line",
        policy=selective_key(result.spec.selective),
        bytes=f"{kept_bytes(result):,}",
        mib=f"{kept_bytes(result) / MIB:,.2f}",
        layers=len(cp),
        reused=f"{reused:,}",
        rerun=f"{rerun:,}",
    )


def selective_rows(lab: LabRun, lang: str, tr: Translator) -> list[dict[str, Any]]:
    """The run beside plain checkpointing of the same setting and checkpointing off: memory, kept bytes, time.

    Empty without a policy or when a row is missing; each row's numbers are that run's, measured.
    """
    if lab.plain is None or lab.result.spec.selective == NONE:
        return []
    base = reference_run(lab)
    runs = [
        (tr("setting.off"), base),
        (tr("selective.row_full", setting=setting_label(lab.result.spec.every_n_layers, lab.result.spec.offload, lang)),
         lab.plain.result),
        (tr("selective.row_policy", policy=policy_label(str(lab.result.spec.selective), tr)), lab.result),
    ]  # fmt: skip
    rows = []
    for name, run in runs:
        if run is None or run.status != "ok":
            continue
        memory, timing = memory_of(run), timing_of(run)
        rows.append(
            {
                tr("selective.col_setting"): name,
                tr("selective.col_kept"): kept_bytes(run),
                tr("selective.col_resident"): round(memory.after_forward_bytes / MIB, 2),
                tr("selective.col_peak"): round(memory.peak_bytes / MIB, 2),
                tr("selective.col_step"): round(timing.step_s * 1000, 1),
                tr("selective.col_reruns"): sum(layer.recompute_calls for layer in run.layers),
            }
        )
    return rows
