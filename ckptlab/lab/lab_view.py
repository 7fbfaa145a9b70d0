"""What the Lab page shows in words and numbers, worked out here so the page only reads widgets and draws.

Every function takes plain values (a spec, a result, the page's language ``lang``) and returns
text, a dict of widget values or ``st.metric`` keyword arguments; nothing here imports streamlit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import CkptlabError, Option
from ..fact import Fact
from ..model import catalog
from ..model.catalog import ModelInfo
from ..model.selective import CHOICES as SELECTIVE_CHOICES
from ..model.selective import NONE, selective_key
from ..results import Comparison, MemoryResult, RunResult, memory_of, timing_of
from ..show import i18n
from ..show.i18n import number, t
from ..show.labels import event_label, provenance_label, run_label, setting_label, short_setting_label, training_label
from ..show.report import setting_name
from ..show.wording import app_message, app_words
from ..spec import RunSpec
from ..spec_fields import FIELD, FIELDS
from ..step.equivalence import GradientCheck
from ..step.preflight import check_spec, resolve_device, resolve_dtype
from ..step.training import cpu_autocast_warning
from ..units import GIB, MIB, mib
from . import forged, workers
from .modelbox import HUB, LOCAL, duration
from .run import LabRun, Measured, PoolSource, phase_significant, run_estimate, step_prediction
from .server import ServerPolicy
from .widgets import PageWidgets, widget_key

# The Lab page's widgets as spec fields (the one codec, ckptlab.lab.widgets): the fields it holds as they are
# (lab_<widget name>), the model box, checkpointing (with the selective policy) and LoRA; the step box's besides.
PAGE = PageWidgets(
    "lab",
    ("seq_len", "batch_size", "dtype", "device", "repeats", "warmup", "optimizer"),
    model_box=True,
    checkpointing=True,
    lora=True,
)
SAME_MEMORY_BYTES = MIB / 20  # a memory delta below it reads "same as off"
PEAK_UNMOVED = 0.98  # peak ratio above it: what the forward freed did not lower the peak


def weights_and_gradients_bytes(num_params: int, dtype: str) -> int:
    """Parameters plus gradients in ``dtype`` ("auto" counts as float32, as on a CPU): a prediction, not a measurement."""
    return 2 * num_params * (2 if dtype in ("bfloat16", "float16") else 4)


def unknown_targets_warning(unknown: Sequence[str], model: str, choices: Sequence[str], lang: str) -> str:
    """The warning for LoRA targets a link asked for that ``model`` does not have: the link's names (and the model
    it named) shown as text, never Markdown a browser follows (a ``![p](http://...)`` image it would fetch)."""
    return t(
        "training.lora_targets_unknown",
        lang,
        unknown=i18n.Literal(", ".join(unknown)),
        model=i18n.Literal(model),
        choices=", ".join(choices),
    )


def folder_info(path: str, lang: str, policy: ServerPolicy | None = None) -> tuple[ModelInfo | None, str]:
    """A local folder or Hub name described, or None and why not in the page's words (a folder that breaks
    transformers too).

    With a server's ``policy`` whose jobs run in worker processes, the description (a model built on the meta
    device) runs in the describing worker (``workers.describe_workers``) under the policy's memory cap and run
    limit, never on the page's own thread: a config that makes the build heavy ends that worker, not the server.
    """
    try:
        if policy is not None and policy.workers:
            info = workers.describe_workers().run(
                "ckptlab.lab.workerjobs:describe_model",
                path,
                limit_s=policy.run_limit_s,
                memory_cap_bytes=policy.memory_cap_bytes,
            )
            return info, ""
        return catalog.describe(path), ""
    except CkptlabError as error:
        return None, app_message(error, lang)
    except Exception as error:  # a folder transformers chokes on must not take the page down
        return None, t("lab.cannot_read", lang, model=repr(path), error=f"{type(error).__name__}: {error}")


def problem_with(
    spec: RunSpec, info: ModelInfo | None, policy: ServerPolicy, lang: str, workers: PoolSource | None = None
) -> tuple[str, bool]:
    """Why ``spec`` cannot run here ("" when it can), and whether it would run on the CPU.

    The spec's own checks, then the server's limits for that model and device (its tokens, its Run's time); a
    failure of the
    checks themselves is a message too. LoRA without a target is refused.
    """
    problem = ""
    try:
        on_cpu = check_spec(spec, info).device.type == "cpu"  # the page's description: none built here again
        policy.check(spec, info)  # type: ignore[arg-type]  # check() raised already when info is None
        # A Run the run limit would stop part way: refused, with the line to run instead (its estimate's
        # simulations in ``workers()``, the server's simulation pool, where they are not kept yet).
        policy.check_run_time(spec, workers=workers)
    except CkptlabError as error:
        problem, on_cpu = app_message(error, lang), True
    except Exception as error:  # not bad input but a failure: still a message, not a dead page
        problem, on_cpu = t("lab.cannot_check", lang, error=f"{type(error).__name__}: {error}"), True
    if spec.lora_rank is not None and spec.lora_targets == ():
        problem = problem or t("training.lora_targets_needed", lang)
    return problem, on_cpu


def cpu_warning(spec: RunSpec, info: ModelInfo, lang: str, workers: PoolSource | None = None) -> str:
    """A model meant for a GPU, run on the CPU: the predicted step and Run times (the roofline's, this CPU) and its
    weights and gradients."""
    step = step_prediction(spec, workers=workers)
    step_s = None if step is None else step.seconds
    run_s = run_estimate(spec, workers=workers)
    gib = number(weights_and_gradients_bytes(info.num_params, spec.dtype) / GIB, ",.1f", lang)
    unknown = t("wait.unknown", lang)
    return t(
        "lab.meant_for_gpu",
        lang,
        model=info.name,
        step=unknown if step_s is None else duration(step_s, lang),
        run=unknown if run_s is None else duration(run_s, lang),
        gib=gib,
    )


def autocast_warning(spec: RunSpec, on_cpu: bool, lang: str) -> str:
    """The command line's warning before a run under mixed precision on the CPU (``step.training.cpu_autocast_warning``,
    the one fact), in the page's words; "" where it does not apply (``on_cpu``: :func:`problem_with`'s)."""
    warning = cpu_autocast_warning(spec, "cpu" if on_cpu else "cuda")
    return "" if warning is None else i18n.say(warning, lang)


def head_line(spec: RunSpec, lang: str) -> str:
    """The line beside Run: model, shape, dtype, device, setting and what is trained, then every other setting that
    differs from the defaults (:func:`changed_settings`)."""
    setting = setting_label(spec.every_n_layers, spec.offload, lang)
    # 'auto' says what it resolves to here (the run goes to this machine's device), so the line never reads
    # "auto · auto": each value has its name in the template.
    device, dtype = spec.device, spec.dtype
    if spec.device == "auto":
        device = f"auto ({resolve_device('auto').type})"
    if spec.dtype == "auto":
        resolved = resolve_dtype("auto", resolve_device(spec.device), spec.mixed_precision)
        dtype = f"auto ({str(resolved).removeprefix('torch.')})"
    line = t(
        "lab.head",
        lang,
        model=spec.model,
        seq=number(spec.seq_len, ",", lang),
        batch=spec.batch_size,
        dtype=dtype,
        device=device,
        setting=setting,
    )
    # The line is Markdown: a value a link typed (LoRA's targets) is shown as text.
    changed = [i18n.markdown_literal(word) for word in changed_settings(spec, lang)]
    return " · ".join([line, training_label(spec, lang), *changed])


# The RunSpec fields the head line says in its own words (lab.head and training_label): every other field that
# differs from RunSpec's default is named after them (changed_settings).
HEAD_FIELDS = frozenset(
    (
        "model",
        "seq_len",
        "batch_size",
        "dtype",
        "device",
        "every_n_layers",
        "offload",
        "optimizer",
        "lora_rank",
        "quantization",
    )
)


def changed_settings(spec: RunSpec, lang: str) -> list[str]:
    """Each field of ``spec`` that differs from ``RunSpec``'s default and the head line does not say already, in the
    order of ``spec_fields.FIELDS`` and named as an error names it (its widget's label and value, ``app_words``): a
    field added to the spec appears here by itself. A selective policy is said by its name (its ops when a tuple)."""
    defaults = RunSpec()
    words = []
    for field in FIELDS:
        value = getattr(spec, field.name)
        if field.name in HEAD_FIELDS or value == getattr(defaults, field.name):
            continue
        if field.name == "selective":
            value = selective_key(value)
        words.append(app_words(Option(field.name, value), lang))
    return words


def clock(measured: Measured) -> str:
    """When a run was measured, in the local time of the server (``HH:MM``)."""
    return measured.measured_at.astimezone().strftime("%H:%M")


def widget_values(spec: RunSpec, folder: str, hub_name: str = "") -> dict[str, Any]:
    """The Lab page's widget values (session-state keys) for ``spec`` (:data:`PAGE`, the one codec).

    Args:
        spec: the settings to show.
        folder: the offered folder's name when ``spec.model`` is a local folder, "" for a preset.
        hub_name: ``spec.model`` when it is a Hub repository the server may fetch, else "".
    """
    return PAGE.values(spec, folder, hub_name)


# Every widget of the Lab page (and its session state's targets_for), from the one mapping of a spec to them.
WIDGETS = tuple(widget_values(RunSpec(model="tiny-llama"), ""))


def widget_checks(presets: Sequence[str]) -> dict[str, forged.Check]:
    """What each of the Lab page's widgets could send (:mod:`ckptlab.lab.forged`): a preset or the folder and Hub
    entries, the fields' numbers and choices as declared, toggles, the targets' names, the named policies."""
    fields = [*PAGE.plain(), FIELD["lora_rank"]]
    return {
        "lab_model": forged.one_of([*presets, LOCAL, HUB]),
        "lab_local_dir": forged.text,
        "lab_hub_name": forged.text,
        **{widget_key("lab", field): forged.field_check(field.name) for field in fields},
        **{f"lab_{name}": forged.flag for name in ("ckpt", "offload", "lora", "qlora", "check_grads")},
        "lab_n": forged.field_check("every_n_layers"),
        "lab_lora_targets": forged.names,
        "lab_selective": forged.one_of(SELECTIVE_CHOICES),
    }


def spec_from_widgets(values: Mapping[str, Any], model: str, lora_targets: tuple[str, ...] | None) -> RunSpec:
    """The :class:`RunSpec` the Lab page's widgets say (every_n_layers and offload only with checkpointing on)."""
    return RunSpec(model=model, **PAGE.fields(values, lora_targets))


def status_label(lab: LabRun, lang: str) -> str:
    """The run's status line once done: reused from the cache at a time, or measured in so many seconds."""
    if lab.run.reused and (lab.reference is None or lab.reference.reused):
        return t("lab.reused_label", lang, clock=clock(lab.run))
    waited = t("lab.waited", lang, seconds=number(lab.wait_s, ".1f", lang)) if lab.wait_s >= 0.5 else ""
    return t("lab.measured_in", lang, seconds=number(lab.elapsed_s, ".1f", lang), waited=waited)


def gradients_message(
    outcome: GradientCheck | None, problem: str, lang: str
) -> tuple[Literal["success", "warning", "error"], str]:
    """The gradient check in words and how loud (``st.success``, ``st.warning`` or ``st.error``)."""
    if outcome is None:
        return "warning", t("lab.grads_failed", lang, error=problem)
    if outcome.equal:
        return "success", t("lab.grads_equal", lang, count=outcome.gradients_compared, dropout=outcome.dropout)
    return "error", t(
        "lab.grads_differ",
        lang,
        diff=f"{outcome.max_abs_difference:.3g}",
        loss=t("lab.grads_loss_same" if outcome.loss_equal else "lab.grads_loss_differs", lang),
        count=outcome.gradients_compared,
    )


def memory_delta(value: int, reference: int | None, lang: str) -> dict[str, Any]:
    """``st.metric`` delta arguments for a memory figure against checkpointing off (none without a reference)."""
    if reference is None:
        return {}
    diff = value - reference
    if abs(diff) < SAME_MEMORY_BYTES:
        return {"delta": t("lab.same_as_off", lang), "delta_color": "off", "delta_arrow": "off"}
    return {"delta": t("lab.mib_vs_off", lang, diff=number(diff / MIB, "+,.1f", lang)), "delta_color": "inverse"}


def time_delta(value: float, reference: float | None, significant: bool | None, lang: str) -> dict[str, Any]:
    """``st.metric`` delta arguments for a time against checkpointing off: grey when too few steps or noise."""
    if reference is None:
        return {}
    diff = f"{number((value - reference) * 1000, '+,.0f', lang)} ms"
    if significant:
        return {"delta": t("lab.vs_off", lang, diff=diff), "delta_color": "inverse"}
    key = "lab.too_few_steps" if significant is None else "lab.noise"
    return {"delta": t(key, lang, diff=diff), "delta_color": "off", "delta_arrow": "off"}


def time_sentence(comparison: Comparison, min_samples: int, lang: str) -> str:
    """The step time's change against checkpointing off, said as measurable, noise or too few steps to tell."""
    change = f"{number((comparison.step_ratio - 1) * 100, '+.0f', lang)}%"
    if comparison.step_significant is None:
        return t("lab.time_too_few", lang, change=change, min=min_samples)
    if comparison.step_significant:
        return t("lab.time_significant", lang, change=change)
    return t("lab.time_noise", lang, change=change)


def freed_sentence(memory: MemoryResult, base: MemoryResult, comparison: Comparison, lang: str) -> str:
    """ "" unless the forward freed memory that did not lower the peak; then how much, in words."""
    freed = base.after_forward_bytes - memory.after_forward_bytes
    if freed > 0 and comparison.peak_ratio > PEAK_UNMOVED:
        return t("lab.freed_not_peak", lang, mib=mib(freed, lang))
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
    value: str  # a number, e.g. "12.5" or "340"; its unit is in the label
    delta: dict[str, Any]  # st.metric's delta arguments (:func:`memory_delta`, :func:`time_delta`); {} for none
    help: str


def reference_run(lab: LabRun) -> RunResult | None:
    """The run with checkpointing off to compare against: None when it did not run or is the run itself."""
    reference = lab.reference.result if lab.reference and lab.reference.result.status == "ok" else None
    return None if reference is lab.result else reference  # checkpointing off: nothing to compare


def metrics(lab: LabRun, lang: str) -> list[Metric]:
    """The run's figures, in the page's order (two columns, left then right): peak, resident, forward,
    backward, baseline, step; memory and times with deltas against checkpointing off where it ran."""
    memory, timing = memory_of(lab.result), timing_of(lab.result)
    base = reference_run(lab)

    def mem(field: str) -> dict[str, Any]:
        return memory_delta(getattr(memory, field), getattr(memory_of(base), field) if base else None, lang)

    def phase(name: str) -> dict[str, Any]:
        if base is None:
            return {}
        value, reference = getattr(timing, f"{name}_s"), getattr(timing_of(base), f"{name}_s")
        return time_delta(value, reference, phase_significant(lab.result, base, name), lang)

    def ms(seconds: float) -> str:
        return number(seconds * 1000, ",.0f", lang)

    def named(key: str, unit: str) -> str:
        # The unit in the label, not the value: st.metric cuts a value wider than its column ("2,193.3 …" in a
        # 152 px column at 1280x720), and a label wraps.
        return t("lab.metric_unit", lang, metric=t(key, lang), unit=unit)

    return [
        Metric(named("lab.metric_peak", "MiB"), mib(memory.peak_bytes, lang), mem("peak_bytes"), t("lab.metric_peak_help", lang)),
        Metric(named("lab.metric_resident", "MiB"), mib(memory.after_forward_bytes, lang), mem("after_forward_bytes"),
               t("lab.metric_resident_help", lang)),
        Metric(named("lab.metric_forward", "ms"), ms(timing.forward_s), phase("forward"), t("lab.metric_forward_help", lang)),
        Metric(named("lab.metric_backward", "ms"), ms(timing.backward_s), phase("backward"), t("lab.metric_backward_help", lang)),
        Metric(named("lab.metric_baseline", "MiB"), mib(memory.baseline_bytes, lang), {}, t("lab.metric_baseline_help", lang)),
        Metric(named("lab.metric_step", "ms"), ms(timing.step_s), phase("step"), t("lab.metric_step_help", lang)),
    ]  # fmt: skip


def peak_line(memory: MemoryResult, lang: str) -> str:
    """Where the step reached its peak, in the page's words ("?" when the probe did not say)."""
    where = event_label(memory.peak_where, lang) if memory.peak_where.kind else "?"
    return t("lab.peak_reached", lang, where=where)


def medians_caption(result: RunResult, lang: str) -> str:
    """Under the figures: where they come from, and how many timed steps the medians are of."""
    return t(
        "lab.medians",
        lang,
        provenance=provenance_label(result.provenance, lang),
        steps=len(timing_of(result).step_samples),
        warmup=result.spec.warmup,
    )


def settings_changed(result: RunResult, lang: str) -> str:
    """The line over a result whose settings are no longer the widgets': which run it is."""
    return t(
        "lab.settings_changed",
        lang,
        model=result.model.name,
        seq=number(result.spec.seq_len, ",", lang),
        batch=result.spec.batch_size,
        setting=run_label(result, lang),
    )


def offload_box(spec: RunSpec, result: RunResult, lang: str) -> tuple[Literal["info", "success"], str] | None:
    """What offload did, when the widgets or the run ask for it: moved (``st.success``), or not applied
    here and what it would move on a GPU (``st.info``); None when there is nothing to say."""
    if not (spec.offload or result.spec.offload):
        return None
    memory = memory_of(result)
    if result.spec.offload and not memory.offload_applied:
        layers = sum(layer.planned == "CP" for layer in result.layers)
        return "info", t(
            "lab.offload_not_applied", lang, device=result.device, mib=mib(memory.offload_bytes, lang), layers=layers
        )
    if memory.offload_applied:
        return "success", t("lab.offload_moved", lang, mib=mib(memory.offload_bytes, lang))
    return None


OFFLOAD_BOX_SAYS = ("note.offload_on_cpu", "note.offload_would_move")  # the notes :func:`offload_box` words


def notes_to_show(result: RunResult) -> list[Fact]:
    """The run's notes but those :func:`offload_box` says already (decided on the facts' keys)."""
    return [note for note in result.notes if note.key not in OFFLOAD_BOX_SAYS]


# -- selective checkpointing: what the policy kept, beside plain checkpointing and off ---------------------------


def policy_label(policy: str, lang: str) -> str:
    """A named policy in the page's words (the selective box's entries); op names as they are."""
    return t(f"selective.policy_{policy}", lang) if policy in SELECTIVE_CHOICES else policy


def kept_bytes(result: RunResult) -> int:
    """Bytes the run's selective policy kept, over its CP layers (observed in the memory step; 0 without one)."""
    return sum(layer.kept_bytes for layer in result.layers if layer.enabled == "CP")


def kept_line(result: RunResult, lang: str) -> str:
    """What the policy kept in the CP layers and what their rerun did, observed; "" without a policy."""
    if result.spec.selective == NONE or not result.layers:
        return ""
    cp = [layer for layer in result.layers if layer.enabled == "CP"]
    reused = sum(sum(layer.reused_ops.values()) for layer in cp)
    rerun = sum(sum(layer.rerun_ops.values()) for layer in cp)
    return t(
        "selective.kept_line",
        lang,
        policy=selective_key(result.spec.selective),
        bytes=number(kept_bytes(result), ",", lang),
        mib=number(kept_bytes(result) / MIB, ",.2f", lang),
        layers=len(cp),
        reused=number(reused, ",", lang),
        rerun=number(rerun, ",", lang),
    )


def selective_rows(lab: LabRun, lang: str) -> list[dict[str, Any]]:
    """The run beside plain checkpointing of the same setting and checkpointing off: memory, kept bytes, time.

    Empty without a policy or when a row is missing; each row's numbers are that run's, measured.
    """
    if lab.plain is None or lab.result.spec.selective == NONE:
        return []
    base = reference_run(lab)
    # Short names (the settings' own, the policy's name): with its description and every_n_layers spelled out the
    # table ran 125 px past the page's right edge at 1280x720 (issue 58); the section's line above says the policy.
    runs = [
        (t("setting.short_off", lang), base),
        (t("selective.row_full", lang, setting=short_setting_label(lab.result.spec.every_n_layers, lang)),
         lab.plain.result),
        (t("selective.row_policy", lang, policy=selective_key(lab.result.spec.selective)), lab.result),
    ]  # fmt: skip
    rows = []
    for name, run in runs:
        if run is None or run.status != "ok":
            continue
        memory, timing = memory_of(run), timing_of(run)
        rows.append(
            {
                t("selective.col_setting", lang): name,
                t("selective.col_kept", lang): kept_bytes(run),
                t("selective.col_resident", lang): round(memory.after_forward_bytes / MIB, 2),
                t("selective.col_peak", lang): round(memory.peak_bytes / MIB, 2),
                t("selective.col_step", lang): round(timing.step_s * 1000, 1),
                t("selective.col_reruns", lang): sum(layer.recompute_calls for layer in run.layers),
            }
        )
    return rows
