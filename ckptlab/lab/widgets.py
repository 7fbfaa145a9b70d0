"""One codec between a spec and a page's widgets, and the page's link, from the fields' declarations.

A page says which declared fields it shows (:class:`PageWidgets`); each field's widget is read and written by its
declaration (``ckptlab.spec_fields.Widget``: its name after the page's prefix, its kind, its limits), and the
fields drawn by a shared box (``step_boxes``: Trainer's side of the step and the attention) are on every page that
draws it, so a field declared with that box reaches the pages by itself. The widgets that stand for more than one
field, or for a field with other values, are coded here once:

- the model box: ``<prefix>_model`` (a preset, or the folder and Hub entries, ``modelbox.LOCAL``/``HUB``),
  ``<prefix>_local_dir`` and ``<prefix>_hub_name``;
- checkpointing: the toggle ``<prefix>_ckpt`` (off: every_n_layers None), ``<prefix>_n``, ``<prefix>_offload``
  and the named selective policy ``<prefix>_selective`` (op names from Python and the command line only), which
  mean something only with the toggle on;
- LoRA: the toggle ``<prefix>_lora``, ``<prefix>_lora_rank`` (peft's default rank while off), the targets and the
  model they were chosen for (``<prefix>_targets_for``; None: all, once the model is read) and QLoRA's 4-bit base
  (``<prefix>_qlora``), which mean something only with the toggle on.

The link a page writes is :func:`ckptlab.lab.query.spec_to_query` of the fields it shows (:meth:`PageWidgets.query`);
a page adds only its own keys (the At-scale page's ``gpu=``, ``gpus=``). Nothing here imports streamlit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import spec_fields
from ..model.quantize import QLORA
from ..spec import RunSpec
from ..spec_fields import SpecField
from .modelbox import HUB, LOCAL
from .query import LORA_RANK_DEFAULT, spec_to_query

_DEFAULTS = RunSpec()

STEP_BOXES = "step_boxes"  # the shared box of Trainer's step (pages/_common.step_boxes); on every page here
# The fields each special group stands for (read and written by its own rule below, never by a field's plain one).
MODEL_BOX = ("model",)
CHECKPOINTING = ("every_n_layers", "offload", "selective")
LORA = ("lora_rank", "lora_targets", "quantization")


def widget_key(prefix: str, field: SpecField) -> str:
    """The session-state key of ``field``'s widget on a page: ``<prefix>_<widget name>`` (``lab_seq``)."""
    assert field.widget is not None, field.name
    return f"{prefix}_{field.widget.name}"


def to_widget(field: SpecField, value: Any, offered: tuple[object, ...] | None = None, default: Any = None) -> Any:
    """A field's value as its widget holds it.

    A number box cannot hold the field's ``never`` (max_grad_norm's inf, never clip), so it shows its top, which
    :func:`from_widget` reads back as ``never``. A select box of ``offered`` choices shows a value it does not offer
    as ``default`` (the page's).
    """
    if field.never is not None and value == field.never:
        return field.offered
    if offered is not None and value not in offered:
        return default
    return value


def from_widget(field: SpecField, value: Any) -> Any:
    """A widget's value as its field's: a number box's as the type of the field's default (a whole number or not), its
    top as the field's ``never`` where it has one (spec_fields.SpecField.never)."""
    if field.widget is not None and field.widget.kind == "number":
        if field.never is not None and value == field.offered:
            return field.never
        return type(getattr(_DEFAULTS, field.name))(value)
    return value


def drawn_by_step_boxes() -> tuple[SpecField, ...]:
    """The fields whose widgets the step box draws, read from the declarations when asked (a field declared with
    ``drawn_by="step_boxes"`` is on every page that draws the box)."""
    return spec_fields.drawn_by(STEP_BOXES)


@dataclass(frozen=True)
class PageWidgets:
    """One page's widgets as spec fields: its prefix, the declared fields it shows as they are, and which special
    groups it has (the model box, checkpointing, LoRA). The step box's fields are on every page.

    ``offered``: the choices the page's select box offers for a field where fewer than declared (the At-scale
    page's dtypes); a value outside them shows as ``default``'s (the page's first settings).
    """

    prefix: str
    shown: tuple[str, ...]
    model_box: bool = False
    checkpointing: bool = False
    lora: bool = False
    offered: Mapping[str, tuple[object, ...]] | None = None
    default: RunSpec = _DEFAULTS

    def key(self, name: str) -> str:
        """The session-state key of a widget by its name after the prefix (``ckpt`` -> ``lab_ckpt``)."""
        return f"{self.prefix}_{name}"

    def plain(self) -> tuple[SpecField, ...]:
        """The fields held by their widget as they are: the page's own, then the step box's."""
        return (*(spec_fields.FIELD[name] for name in self.shown), *drawn_by_step_boxes())

    def _offered(self, field: SpecField) -> tuple[object, ...] | None:
        if self.offered is not None and field.name in self.offered:
            return self.offered[field.name]
        if field.widget is not None and field.widget.kind == "select" and field.choices:
            return field.choices  # the declared choices (this machine's fewer ones are the box's business)
        return None

    def values(self, spec: RunSpec, folder: str = "", hub_name: str = "") -> dict[str, Any]:
        """The page's widget values (session-state keys) for ``spec``.

        Args:
            spec: the settings to show.
            folder: the offered folder's name when ``spec.model`` is a local folder, "" for a preset (the model box).
            hub_name: ``spec.model`` when it is a Hub repository the server may fetch, else "" (the model box).
        """
        out: dict[str, Any] = {}
        if self.model_box:
            out[self.key("model")] = LOCAL if folder else HUB if hub_name else spec.model
            out[self.key("local_dir")] = folder
            out[self.key("hub_name")] = hub_name
        step = drawn_by_step_boxes()
        for field in self.plain():
            if field not in step:
                out[widget_key(self.prefix, field)] = self._to_widget(field, spec)
        if self.checkpointing:
            out[self.key("ckpt")] = spec.every_n_layers is not None
            out[self.key("n")] = spec.every_n_layers or 1
            out[self.key("offload")] = spec.offload
        if self.lora:
            out[self.key("lora")] = spec.lora_rank is not None
            out[self.key("lora_rank")] = spec.lora_rank or LORA_RANK_DEFAULT
            out[self.key("lora_targets")] = list(spec.lora_targets or ())
            out[self.key("qlora")] = spec.quantization is not None
            # None: all of the model's projections, once the model is read (lab.targets.settle)
            out[self.key("targets_for")] = None if spec.lora_targets is None else spec.model
        for field in step:
            out[widget_key(self.prefix, field)] = self._to_widget(field, spec)
        if self.checkpointing:  # the box offers the named policies; op names come from Python only
            out[widget_key(self.prefix, spec_fields.FIELD["selective"])] = self._to_widget(
                spec_fields.FIELD["selective"], spec
            )
        return out

    def _to_widget(self, field: SpecField, spec: RunSpec) -> Any:
        default = getattr(self.default, field.name)
        return to_widget(field, getattr(spec, field.name), self._offered(field), default)

    def fields(
        self, values: Mapping[str, Any], lora_targets: tuple[str, ...] | None = None, *, lora_offered: bool = True
    ) -> dict[str, Any]:
        """The ``RunSpec`` fields the page's widgets say (the model aside where the page has the model box: the page
        resolves its entry).

        The step box's fields take their defaults where the box is not drawn; checkpointing's fields mean something
        only with its toggle on, LoRA's with its toggle on and ``lora_offered`` (the model has projections to adapt);
        ``lora_targets``: the targets the page settled (``lab.targets.spec_targets``).
        """
        step = drawn_by_step_boxes()
        out: dict[str, Any] = {}
        for field in self.plain():
            key = widget_key(self.prefix, field)
            if field in step and key not in values:
                out[field.name] = getattr(_DEFAULTS, field.name)
            else:
                out[field.name] = from_widget(field, values[key])
        if self.checkpointing:
            on = values[self.key("ckpt")]
            out["every_n_layers"] = int(values[self.key("n")]) if on else None
            out["offload"] = bool(values[self.key("offload")]) and on
            out["selective"] = values.get(widget_key(self.prefix, spec_fields.FIELD["selective"]), _DEFAULTS.selective)
            if not on:
                out["selective"] = _DEFAULTS.selective
        if self.lora:
            on = bool(values[self.key("lora")]) and lora_offered
            out["lora_rank"] = int(values[self.key("lora_rank")]) if on else None
            out["lora_targets"] = lora_targets if on else None  # targets without adapters mean nothing
            out["quantization"] = QLORA if on and values.get(self.key("qlora")) else None  # a 4-bit base under LoRA
        return out

    def spec_fields(self) -> tuple[str, ...]:
        """The RunSpec fields the page's widgets set, in the declarations' order."""
        names = {field.name for field in self.plain()}
        names |= set(MODEL_BOX) if self.model_box else set()
        names |= set(CHECKPOINTING) if self.checkpointing else set()
        names |= set(LORA) if self.lora else set()
        return tuple(field.name for field in spec_fields.FIELDS if field.name in names)

    def link_keys(self) -> tuple[str, ...]:
        """The link's keys of the fields the page shows (the keys it reads from a link and writes)."""
        return tuple(
            spec_fields.FIELD[name].link.key  # type: ignore[union-attr]
            for name in self.spec_fields()
            if spec_fields.FIELD[name].link is not None
        )

    def query(self, spec: RunSpec) -> dict[str, str]:
        """The link's keys for ``spec``'s fields that the page shows, written by the one writer
        (:func:`ckptlab.lab.query.spec_to_query`)."""
        return spec_to_query(spec, self.spec_fields())
