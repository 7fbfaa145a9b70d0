"""What the At-scale page shows in words and tables, worked out here so the page only draws.

Every function takes the page's language (its words are ``at_scale.*`` through ``i18n.t``) and returns text,
rows or a :class:`Verdict`; nothing here imports streamlit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from importlib import metadata
from typing import Any, Literal

from ..errors import CkptlabError
from ..explore.budget import BUDGET_BOX_GIB, GPUS, fit, fits, gpu_name
from ..explore.gpu_search import GpuSearch, SearchCode
from ..explore.gpus import GPU_SPECS, GpuSpec
from ..explore.longest import LongestSeq, LongestTable
from ..explore.roofline import SettingTime, TimePrediction, predict_time, setting_times
from ..explore.scale import (
    SIMULATION_DTYPES,
    EveryN,
    ScaleRequest,
    ScaleTable,
    Setting,
    every_n_choices,
    fastest_that_fits,
    scale_settings,
    table_times,
)
from ..fact import Fact
from ..model.catalog import ModelInfo
from ..model.selective import CHOICES as SELECTIVE_CHOICES
from ..model.selective import NONE
from ..results import RunResult, memory_of
from ..results.allocations import DeviceTotal
from ..show import i18n
from ..show.figures.breakdown import part_bytes
from ..show.labels import event_label, provenance_label
from ..show.wording import app_message
from ..spec import RunSpec
from ..units import GIB, size_in_bytes
from .modelbox import duration
from .widgets import PageWidgets

CATEGORY_COLUMNS = ("parameter", "gradient", "optimizer_state", "activation", "temp")  # per GPU at the peak
CUSTOM = "custom"  # the GPU box's entry for a budget in GiB
DEFAULT = RunSpec(model="qwen3-8b", seq_len=8192, batch_size=1, dtype="bfloat16")
DEFAULT_GPU = "H100 80 GB"
DEFAULT_BUDGET_GIB = 40.0  # the custom budget's first value
# A custom budget is bytes and names no GPU, so no speed: its predicted times are on this GPU's, and the page says so
# (``time_gpu_caption``). The default GPU: the card the page opens on, the one most people decide for.
TIME_GPU_FOR_CUSTOM = DEFAULT_GPU
TABLE_ROW_PX = 36  # st.dataframe's row height: the table is as tall as its rows and header
TABLE_MAX_PX = 720  # taller than this, the table scrolls inside
PLAN_KEYS_SHOWN = 14  # more settings than this: the plan line names the first four and the last two


@dataclass(frozen=True)
class Verdict:
    """A sentence for the page, how to show it, and the result it is about."""

    kind: Literal["success", "error", "info"]  # st.success, st.error or st.info
    text: str
    result: RunResult | None  # the setting to draw (the one that fits, or the closest)


def gpu_from_link(text: str) -> tuple[str, float, list[Fact]] | None:
    """A link's ``gpu=``: a GPU of the list (its name, the default custom budget) or a budget (``CUSTOM``): a size as
    ``units.size_in_bytes`` reads it, a bare number in GiB (the box's unit), clamped to the box's bounds
    (``explore.budget.BUDGET_BOX_GIB``, the clamp said as a fact); None when it is neither (NaN and infinity
    included: no budget)."""
    try:
        return gpu_name(text), DEFAULT_BUDGET_GIB, []  # a GPU of the list only: "24GiB" is the custom budget below
    except CkptlabError:
        pass
    size = size_in_bytes(text, "gib")
    if size is None or not math.isfinite(size):
        return None
    gib = size / GIB
    low, high = BUDGET_BOX_GIB
    used = min(max(gib, low), high)
    clamped = [Fact("link.clamped", {"key": "gpu", "value": text, "used": used, "unit": "GiB"})] if used != gib else []
    return CUSTOM, used, clamped


# The named selective policies the page simulates beside plain checkpointing (its multiselect's options).
OFFERED_POLICIES = tuple(policy for policy in SELECTIVE_CHOICES if policy != NONE)


def policies_from_link(text: str) -> tuple[list[str], list[str]]:
    """A link's ``selective=`` (``attention,matmuls``): the named policies the page offers, in their order, and
    the names it does not know (the page warns of those and leaves them out)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    chosen = [policy for policy in OFFERED_POLICIES if policy in names]
    return chosen, [name for name in names if name not in OFFERED_POLICIES]


# The page's widgets as spec fields (the one codec, ckptlab.lab.widgets): the shape, the optimizer, the model box and
# LoRA, the step box's besides; the dtypes it simulates (SIMULATION_DTYPES: "auto" is bf16, as on a GPU). Its own:
# the tiny presets' toggle, which settings to simulate (every, offload, selective), the GPU, its budget and count.
PAGE = PageWidgets(
    "at_scale",
    ("seq_len", "batch_size", "dtype", "optimizer", "alloc_conf"),
    model_box=True,
    lora=True,
    offered={"dtype": SIMULATION_DTYPES},
    default=DEFAULT,
)


def widget_values(spec: RunSpec, folder: str, tiny: bool, hub_name: str = "") -> dict[str, Any]:
    """The model and shape boxes for ``spec`` (session-state keys); the GPU boxes at their defaults.

    Args:
        spec: the link's settings (its sequence already within the page's ``spec_fields.SEQ_MAX``).
        folder: the offered folder's name when ``spec.model`` is a local folder, "" for a preset.
        tiny: whether the preset is a CPU-sized one (the tiny presets are shown then).
        hub_name: ``spec.model`` when it is a Hub repository the server may fetch, else "".
    """
    return {
        **PAGE.values(spec, folder, hub_name),
        "at_scale_tiny": not folder and not hub_name and tiny,
        "at_scale_every": "distinct",
        "at_scale_offload": "n=1",
        "at_scale_selective": [],  # selective policies simulated beside plain checkpointing (none: plain alone)
        "at_scale_gpu": DEFAULT_GPU,
        "at_scale_budget_gib": DEFAULT_BUDGET_GIB,
    }


# Every widget of the page: the model and shape boxes' (one mapping of a spec to them) and the GPU count's.
WIDGETS = (*widget_values(DEFAULT, "", tiny=False), "at_scale_gpus")
# The keys of a link the page reads into its boxes (gpu=, gpus= and selective= are its own, read apart).
LINK_KEYS = PAGE.link_keys()


def query(values: Mapping[str, Any], model: str, targets: tuple[str, ...] | None) -> dict[str, str]:
    """The page's keys in the URL, from its widget values: a link that opens the same shape on the same GPU (the
    fields' keys by the one writer, then the page's own: the GPU or budget, the GPUs, the policies simulated)."""
    custom = values["at_scale_gpu"] == CUSTOM
    return {
        **PAGE.query(RunSpec(model=model, **PAGE.fields(values, targets))),
        "gpu": f"{values['at_scale_budget_gib']:g}GiB" if custom else values["at_scale_gpu"],
        "gpus": str(values["at_scale_gpus"]),
        **({"selective": ",".join(values["at_scale_selective"])} if values.get("at_scale_selective") else {}),
    }


def request_from_widgets(
    values: Mapping[str, Any], model: str, num_layers: int, lora_targets: tuple[str, ...] | None
) -> ScaleRequest:
    """The :class:`ScaleRequest` the page's widgets say: the shape, the settings to simulate, training, GPUs."""
    return ScaleRequest(
        model=model,
        **PAGE.fields(values, lora_targets),  # a 4-bit base under LoRA: one GPU only (spec.fsdp_with_quantization)
        settings=tuple(
            scale_settings(
                num_layers,
                values["at_scale_every"],
                values["at_scale_offload"],
                # One GPU only: the lab cannot simulate a policy under FSDP2 with an optimizer step
                # (ckptlab.step.selective.check_simulated_selective); the page trains with one.
                policies=tuple(values.get("at_scale_selective", ())) if int(values["at_scale_gpus"]) == 1 else (),
            )
        ),
        world_size=int(values["at_scale_gpus"]),
    )


def request_problem(request: ScaleRequest, info: ModelInfo, lang: str) -> str:
    """Why ``request`` cannot be simulated, in the page's language; "" when it can."""
    try:
        request.check(info)
    except CkptlabError as error:
        return app_message(error, lang)
    return ""


def budget(gpu: str, budget_gib: float, lang: str = i18n.DEFAULT) -> tuple[int, str]:
    """The budget in bytes and its label: a GPU of the list, or a custom number of GiB in ``lang``'s form."""
    if gpu == CUSTOM:
        return int(budget_gib * GIB), gib_label(budget_gib, lang)
    return GPUS[gpu], gpu


def gib_label(gib: float, lang: str) -> str:
    """A custom budget as people read it in ``lang`` ("12.5 GiB", "12,5 GiB")."""
    return f"{i18n.number(gib, 'g', lang)} GiB"


def plan_line(request: ScaleRequest, every: EveryN, num_layers: int, known: int, lang: str) -> str:
    """What Simulate will run: how many settings, which (a long list shortened), and how many are known already."""
    if every == "all":
        which = i18n.t("at_scale.plan_all", lang, layers=num_layers)
    else:
        which = i18n.t(
            "at_scale.plan_distinct", lang, chosen=len(every_n_choices(num_layers, every)), layers=num_layers
        )
    keys = [setting.key for setting in request.settings]
    shown = ", ".join(keys if len(keys) <= PLAN_KEYS_SHOWN else [*keys[:4], "…", *keys[-2:]])
    line = i18n.t("at_scale.plan", lang, count=len(request.settings), keys=shown, which=which)
    return line + (i18n.t("at_scale.plan_known", lang, known=known) if known else "")


def progress_words(done: int, total: int | None, message: Fact, stop_requested: bool, lang: str = i18n.DEFAULT) -> str:
    """The progress bar's text: stopping, searching (``total`` None) or so many of so many simulated,
    with the job's progress ``message`` said in ``lang``, the page's."""
    if stop_requested:
        return i18n.t("at_scale.stopping", lang)
    if total is None:
        return i18n.t("at_scale.searching", lang, done=done, message=i18n.say(message, lang))
    return i18n.t("at_scale.progress", lang, done=done, total=total, message=i18n.say(message, lang))


def changed_line(shown: ScaleRequest, lang: str) -> str:
    """The table drawn is for other settings than the boxes say: which."""
    return i18n.t(
        "at_scale.changed",
        lang,
        model=shown.model,
        seq=shown.seq_len,
        batch=shown.batch_size,
        dtype=shown.dtype,
        gpus=gpus_label(shown.world_size, lang),
    )


def gpus_label(gpus: int, lang: str) -> str:
    return i18n.t("at_scale.gpus_one", lang) if gpus == 1 else i18n.t("at_scale.gpus_many", lang, gpus=gpus)


def summary(table: ScaleTable, lang: str) -> str:
    """One line: provenance, model, GPUs, how many settings and how long they took."""
    seconds = list(table.seconds.values())
    each = i18n.t("at_scale.each", lang, low=min(seconds), high=max(seconds)) if seconds else ""
    reused = len(table.results) - len(seconds)
    line = i18n.t(
        "at_scale.summary",
        lang,
        provenance=provenance_label(table.results[0].provenance, lang)
        if table.results
        else i18n.t("at_scale.simulated", lang),
        model=table.request.model,
        layers=table.num_layers,
        count=len(table.results),
        elapsed=duration(table.elapsed_s, lang),
        each=each,
        reused=i18n.t("at_scale.reused", lang, count=reused) if reused else "",
    ).replace(" ()", "")
    return line + " · " + gpus_label(table.request.world_size, lang)


def time_gpu(gpu: str) -> GpuSpec:
    """The GPU whose speed the page's predicted times are on: the one chosen, or :data:`TIME_GPU_FOR_CUSTOM` for a
    custom budget (a number of bytes has no speed)."""
    return GPU_SPECS[TIME_GPU_FOR_CUSTOM if gpu == CUSTOM else gpu]


def time_gpu_caption(gpu: str, lang: str) -> str:
    """Under a custom budget, which GPU's speed the times are predicted on; "" for a GPU of the list."""
    return i18n.t("at_scale.time_custom", lang, gpu=TIME_GPU_FOR_CUSTOM) if gpu == CUSTOM else ""


def predicted_step(time: SettingTime | None, lang: str) -> str:
    """One sentence: the setting's predicted step time and its factor over off, labelled with the roofline's
    provenance ("predicted (roofline, H100 80 GB)"); "" where the result carries no counted work."""
    if time is None or time.prediction is None:
        return ""
    prediction = time.prediction
    words = {"ms": i18n.number(prediction.seconds * 1000, ",.1f", lang), "provenance": _time_label(prediction, lang)}
    if time.factor_over_off is None:
        return i18n.t("at_scale.predicted_step_alone", lang, **words)
    return i18n.t("at_scale.predicted_step", lang, factor=time.factor_over_off, **words)


def _time_label(prediction: TimePrediction, lang: str) -> str:
    return provenance_label(prediction.provenance, lang)


def verdict(table: ScaleTable, budget: int, budget_label: str, lang: str, speed: GpuSpec | None = None) -> Verdict:
    """Which setting fits with the shortest predicted step on ``speed`` (the least recompute where no time is
    known: no speed, or results without counted work) on each GPU of the table, or by how much nothing does."""
    choice = fastest_that_fits(table, budget, speed)
    gpus = gpus_label(table.request.world_size, lang)
    if choice is not None:
        best = choice.result
        setting = Setting.of(best.spec)
        answer = fit(memory_of(best).peak_bytes, budget, best.device_total)  # the device total, where it has one
        peak, margin = answer.peak_bytes / GIB, answer.margin_bytes / GIB
        cp = setting.cp_layers(table.num_layers)
        if setting.every_n_layers is None:
            key = "at_scale.fits_off"
        elif choice.ranked_by == "time":  # time decided: not the fewest reruns, the shortest predicted step
            key = "at_scale.fits_fastest"
        elif cp == table.num_layers:  # every layer reruns: "the fewest layers (36 of 36)" would say nothing
            key = "at_scale.fits_all"
        else:
            key = "at_scale.fits"
        text = i18n.t(
            key,
            lang,
            setting=setting.key,
            budget=budget_label,
            peak=peak,
            margin=margin,
            cp=cp,
            layers=table.num_layers,
        )
        text += predicted_step(choice.time, lang)
        thin = i18n.t("at_scale.thin", lang) if answer.thin else ""
        fitting = [Setting.of(result.spec).key for result in table.results if fits(result, budget)]
        also = i18n.t("at_scale.all_that_fit", lang, settings=", ".join(fitting)) if len(fitting) > 1 else ""
        return Verdict("success", f"{gpus}: {text}{thin}{also}{precision(table.results[0].spec, lang)}", best)
    lowest = min(table.results, key=lambda result: memory_of(result).peak_bytes)
    lowest_peak = memory_of(lowest).peak_bytes
    text = i18n.t(
        "at_scale.no_fit",
        lang,
        budget=budget_label,
        peak=lowest_peak / GIB,
        setting=Setting.of(lowest.spec).key,
        short=fit(lowest_peak, budget).short_bytes / GIB,
    )
    return Verdict("error", f"{gpus}: {text}{precision(table.results[0].spec, lang)}", lowest)


def precision(spec: RunSpec, lang: str) -> str:
    """The precision the verdict on ``spec``'s table assumed, said after it: the weights' dtype, and Trainer's mixed
    precision if any.

    Half-precision weights hold half-precision gradients and optimizer state; Trainer's usual ``bf16=True`` keeps
    float32 weights (and their state) and needs far more: a verdict that does not say which it is misleads. With LoRA
    only the adapters train, and peft keeps them (so their gradients and AdamW's state) in float32 whatever the base's
    dtype (``predict_training.ADAPTER``); a 4-bit or 8-bit base also has its other weights (embeddings, norms, the
    head) cast to float32 by ``prepare_model_for_kbit_training`` (``model.quantize.prepare``).
    """
    mixed = i18n.t("at_scale.assumed_mixed_compute", lang, mp=spec.mixed_precision)
    mixed = mixed if spec.mixed_precision != "none" else ""
    if spec.lora_rank is not None and spec.quantization is not None:
        quantization = spec.quantization
        compute = quantization.bnb_4bit_compute_dtype if quantization.bits == 4 else ""
        computing = i18n.t("at_scale.assumed_computing", lang, dtype=compute) if compute else ""
        return (
            i18n.t("at_scale.assumed_qlora", lang, bits=quantization.bits, base=quantization.label, computing=computing)
            + mixed
        )
    if spec.lora_rank is not None:
        return i18n.t("at_scale.assumed_lora", lang, dtype=spec.dtype) + mixed
    if spec.mixed_precision != "none":
        return i18n.t("at_scale.assumed_mixed", lang, dtype=spec.dtype, mp=spec.mixed_precision)
    return i18n.t("at_scale.assumed_dtype", lang, dtype=spec.dtype)


def float32_under_mixed(values: Mapping[str, Any]) -> bool:
    """Whether the page's widgets ask for half-precision weights (bfloat16 or float16) without mixed precision:
    then the page offers Trainer's usual ``bf16=True`` on float32 weights, one click away."""
    return values.get("at_scale_dtype") in ("bfloat16", "float16") and values.get("at_scale_mixed_precision") == "none"


def rows(table: ScaleTable, budget: int, budget_label: str, lang: str, speed: GpuSpec | None = None) -> list[dict]:
    """The table under the figures: one row per setting, per GPU, GiB; with ``speed``, each setting's predicted step
    time on it (ms) and its factor over checkpointing off, the header saying "predicted (roofline, GPU)"; the
    seconds column only when something ran."""
    category_words = {part: i18n.t(f"at_scale.col_{part}", lang) for part in CATEGORY_COLUMNS}
    times = table_times(table, speed) if speed is not None else [None] * len(table.results)
    labelled = next((time.prediction for time in times if time is not None and time.prediction is not None), None)
    out = []
    for result, time in zip(table.results, times):
        setting = Setting.of(result.spec)
        memory = memory_of(result)
        timed: dict[str, float | None] = {}
        if labelled is not None and time is not None:  # a GPU's speed and counted work: the time beside the memory
            prediction, factor = time.prediction, time.factor_over_off
            timed = {
                i18n.t("at_scale.col_time", lang, provenance=_time_label(labelled, lang)): None
                if prediction is None
                else round(prediction.seconds * 1000, 1),
                i18n.t("at_scale.col_factor", lang): None if factor is None else round(factor, 2),
            }
        row = {
            i18n.t("at_scale.col_setting", lang): setting.key,
            i18n.t("at_scale.col_cp", lang): setting.cp_layers(table.num_layers),
            i18n.t("at_scale.col_peak", lang): round(memory.peak_bytes / GIB, 2),
            i18n.t("at_scale.col_fits", lang, budget=budget_label): i18n.t("at_scale.yes", lang)
            if fits(result, budget)
            else i18n.t("at_scale.no", lang),
            i18n.t("at_scale.col_margin", lang): round(
                fit(memory.peak_bytes, budget, result.device_total).margin_bytes / GIB, 2
            ),
            **timed,  # beside the peak and the margin: memory and time, the two sides of the trade
            **device_columns(result, table.beside.get(setting.key), lang),
            **{
                label: round(part_bytes(memory.breakdown_at_peak, part) / GIB, 2)
                for part, label in category_words.items()
            },
            i18n.t("at_scale.col_resident", lang): round(memory.after_forward_bytes / GIB, 3),
            i18n.t("at_scale.col_host", lang): round(memory.host_offload_bytes / GIB, 3),
            i18n.t("at_scale.col_where", lang): event_label(memory.peak_where, lang) if memory.peak_where.kind else "",
        }
        if table.seconds:  # none when every result was reused: no column of times then
            seconds = table.seconds.get(setting.key)
            row[i18n.t("at_scale.col_seconds", lang)] = None if seconds is None else round(seconds, 1)
        out.append(row)
    return out


def device_columns(result: RunResult, beside: DeviceTotal | None, lang: str) -> dict[str, float | None]:
    """A row's reserved bytes and what nvidia-smi will show (GiB), under the request's allocator setting and, beside
    them, with expandable segments; None where the row has no device total (its tensors' peak alone is over the
    budget, or the table was simulated without one)."""
    total = result.device_total

    def gib(size: int | None) -> float | None:
        return None if size is None else round(size / GIB, 2)

    return {
        i18n.t("at_scale.col_reserved", lang): gib(None if total is None else total.reserved_bytes),
        i18n.t("at_scale.col_device", lang): gib(None if total is None else total.total_bytes),
        i18n.t("at_scale.col_reserved_expandable", lang): gib(None if beside is None else beside.reserved_bytes),
        i18n.t("at_scale.col_device_expandable", lang): gib(None if beside is None else beside.total_bytes),
    }


def search_time(search: GpuSearch, speed: GpuSpec) -> SettingTime | None:
    """The search's answer's predicted step on ``speed`` per GPU, and its factor over checkpointing off where the
    search simulated off on as many GPUs; None when nothing fits."""
    if search.result is None:
        return None
    same = [result for result in search.tried if result.spec.world_size == search.result.spec.world_size]
    times = setting_times([result for result in same if result is not search.result] + [search.result], speed)
    return times[-1]


def search_verdict(search: GpuSearch, budget_label: str, lang: str, speed: GpuSpec | None = None) -> Verdict:
    """The GPU search's answer in words: how many GPUs and which setting, or what comes closest; with ``speed``,
    the answer's predicted step time on it."""
    counted = i18n.t(
        "at_scale.search_counted",
        lang,
        tried=len(search.tried),
        simulated=search.simulated,
        elapsed=duration(search.elapsed_s, lang),
    )
    verdict = _search_verdict(search, budget_label, counted, lang)
    if speed is not None and search.result is not None:
        verdict = replace(verdict, text=verdict.text + predicted_step(search_time(search, speed), lang))
    if search.quantized_one_gpu:  # a 4-bit base: one GPU searched, and why
        return replace(verdict, text=i18n.t("at_scale.search_qlora_one_gpu", lang) + " " + verdict.text)
    return verdict


def _search_verdict(search: GpuSearch, budget_label: str, counted: str, lang: str) -> Verdict:
    if search.cancelled and not search.fits:
        return Verdict("info", i18n.t("at_scale.search_stopped", lang) + " " + counted, None)
    if search.result is None:
        lowest = search.lowest()
        if lowest is None:
            return Verdict(
                "error", i18n.t("at_scale.search_none", lang, budget=budget_label, gpus=search.counts[-1]), None
            )
        text = i18n.t(
            "at_scale.search_no_fit",
            lang,
            budget=budget_label,
            gpus=search.counts[-1],
            peak=memory_of(lowest).peak_bytes / GIB,
            setting=Setting.of(lowest.spec).key,
        )
        return Verdict("error", text + " " + counted, lowest)
    # search.setting and search.gpus, read from the result itself: it is there.
    setting, peak = Setting.of(search.result.spec), memory_of(search.result).peak_bytes
    text = i18n.t(
        "at_scale.search_fits",
        lang,
        gpus=gpus_label(search.result.spec.world_size, lang),
        setting=setting.key,
        budget=budget_label,
        peak=peak / GIB,
        margin=fit(peak, search.budget_bytes).margin_bytes / GIB,
        cp=setting.cp_layers(search.num_layers),
        layers=search.num_layers,
    )
    stopped = " " + i18n.t("at_scale.search_stopped_early", lang) if search.cancelled else ""
    return Verdict("success", text + stopped + " " + counted, search.result)


def search_is_for(search: GpuSearch, request: ScaleRequest, budget: int) -> bool:
    """True when ``search`` answered this shape, these settings and this budget (the GPUs chosen aside)."""
    return search.budget_bytes == budget and replace(search.request, world_size=1) == replace(request, world_size=1)


def longest_settings(request: ScaleRequest) -> tuple[Setting, ...]:
    """The settings the longest-sequence search runs: those of the page's at n=1 and checkpointing off.

    Off and n=1 are the ends: every layer checkpointed keeps the fewest activations, none the most, so the
    longest sequence of any other n lies between theirs. The offload twin and the selective policies the page
    simulates sit at n=1, beside it. A search costs six to ten simulations: the page's eleven settings of an 8B
    model would be a hundred, where these are two to four.
    """
    return tuple(setting for setting in request.settings if setting.every_n_layers in (None, 1))


def longest_is_for(found: LongestTable, request: ScaleRequest, budget: int) -> bool:
    """True when ``found`` answered this model, recipe, GPUs and budget and these settings; the page's sequence
    length aside, which is only the search's first guess."""
    same = replace(found.request, seq_len=0, settings=()) == replace(request, seq_len=0, settings=())
    return same and found.budget_bytes == budget and found.settings == longest_settings(request)


def longest_time(found: LongestTable, row: LongestSeq, speed: GpuSpec) -> SettingTime | None:
    """The predicted step on ``speed`` of ``row``'s setting at its longest sequence (one rank's tokens under FSDP2);
    None where its simulation carried no counted work. No factor over off: off's longest sequence is another."""
    if row.work is None:
        return None
    request = found.request
    tokens = row.seq_len * request.batch_size * request.gradient_accumulation_steps
    prediction = predict_time(row.work, speed, tokens=tokens, world_size=request.world_size)
    setting = next(setting for setting in found.settings if setting.key == row.setting)
    return SettingTime(setting, prediction, None)


def longest_verdict(
    found: LongestTable, budget: int, budget_label: str, lang: str, speed: GpuSpec | None = None
) -> Verdict:
    """The longest sequence of all the settings searched and which setting reaches it, or that nothing fits; with
    ``speed``, that setting's predicted step time on it at that length.

    ``budget``, ``budget_label``: the page's; the search's own budget in GiB where it was for another.
    """
    label = budget_label if found.budget_bytes == budget else gib_label(found.budget_bytes / GIB, lang)
    best = max(found.rows, key=lambda row: row.seq_len)  # the first of equals: the least recompute
    if best.seq_len == 0 or best.peak_bytes is None:
        lowest = min(found.rows, key=lambda row: row.over_peak_bytes or 0)
        text = i18n.t(
            "at_scale.longest_none",
            lang,
            seq=lowest.over_seq_len or 0,
            budget=label,
            peak=(lowest.over_peak_bytes or 0) / GIB,
            setting=lowest.setting,
        )
        return Verdict("error", text, None)
    text = i18n.t(
        "at_scale.longest_best", lang, budget=label, seq=best.seq_len, setting=best.setting, peak=best.peak_bytes / GIB
    )
    if speed is not None:
        text += predicted_step(longest_time(found, best, speed), lang)
    if best.over_seq_len is None:
        text += i18n.t("at_scale.longest_at_limit", lang, limit=best.limit)
    return Verdict("success", text, None)


def longest_summary(found: LongestTable, lang: str) -> str:
    """One line: where the figures come from (simulated), the model, batch and GPUs, what was searched and how long."""
    return i18n.t(
        "at_scale.longest_summary",
        lang,
        provenance=provenance_label("simulated", lang),
        model=found.request.model,
        batch=found.request.batch_size,
        gpus=gpus_label(found.request.world_size, lang),
        count=len(found.rows),
        elapsed=duration(found.elapsed_s, lang),
        simulated=found.simulated,
    )


def longest_rows(found: LongestTable, lang: str) -> list[dict]:
    """The search's table: per setting, the longest ``seq_len`` that fits, its simulated peak (GiB per GPU) and the
    bytes it leaves to spare, then the shortest length that does not fit, its peak and the bytes it is over by (or
    that the model's limit fits). Two peaks a token apart round to the same GiB: the bytes show why one fits and the
    next does not. Every number is text in the page's form (its separators), so the table reads one way."""
    out = []
    for row in found.rows:
        if row.over_seq_len is None:
            after = i18n.t("at_scale.longest_limit_fits", lang, limit=row.limit)
        else:
            after = i18n.number(row.over_seq_len, ",", lang)
        out.append(
            {
                i18n.t("at_scale.col_setting", lang): row.setting,
                i18n.t("at_scale.col_longest", lang): i18n.number(row.seq_len, ",", lang),
                i18n.t("at_scale.col_longest_peak", lang): _shown(row.peak_bytes, GIB, ",.2f", lang),
                i18n.t("at_scale.col_spare", lang): _shown(row.spare_bytes, 1, ",", lang),
                i18n.t("at_scale.col_next", lang): after,
                i18n.t("at_scale.col_next_peak", lang): _shown(row.over_peak_bytes, GIB, ",.2f", lang),
                i18n.t("at_scale.col_over", lang): _shown(row.over_bytes, 1, ",", lang),
                i18n.t("at_scale.col_simulations", lang): i18n.number(row.simulations, ",", lang),
            }
        )
    return out


def _shown(size: int | None, unit: int, spec: str, lang: str) -> str | None:
    """``size`` in ``unit`` as the page writes a number (None stays an empty cell)."""
    return None if size is None else i18n.number(size / unit if unit > 1 else size, spec, lang)


def peak_header(gpus: int, lang: str) -> str:
    """The peak figure's header: per GPU past one."""
    return i18n.t("at_scale.peak_header", lang) if gpus == 1 else i18n.t("at_scale.peak_header_gpus", lang, gpus=gpus)


def table_height(rows: int) -> int:
    """Pixels for a table of ``rows`` rows and its header to show without an inner scroll (up to ``TABLE_MAX_PX``)."""
    return min(TABLE_ROW_PX * (rows + 1) + 4, TABLE_MAX_PX)


def trainer_versions() -> dict[str, str]:
    """The transformers and accelerate the Trainer code was written for: the ones installed here, never a version
    written into a sentence that an upgrade makes wrong."""
    found = {}
    for name in ("transformers", "accelerate"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "-"
    return found


def timed_code(code: str, time: SettingTime | None, lang: str) -> str:
    """The code box with its predicted step time as a first comment line (labelled predicted, never measured); the
    code alone where there is no prediction."""
    if time is None or time.prediction is None:
        return code
    prediction = time.prediction
    line = i18n.t(
        "at_scale.code_predicted",
        lang,
        ms=i18n.number(prediction.seconds * 1000, ",.1f", lang),
        provenance=_time_label(prediction, lang),
    )
    return f"# {line}\n{code}"


def launch_code(code: SearchCode, lang: str) -> str:
    """The launch lines of a search's answer: a user's training script, then the same step measured by ckptlab."""
    return f"{code.launch}\n\n# {i18n.t('at_scale.code_ckptlab', lang)}\n{code.ckptlab_launch}"
