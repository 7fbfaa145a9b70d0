"""The core's messages in the words of where they are read: the command line's flags, or the app's widgets.

Core messages (``SpecError`` and friends) name a spec's fields the Python way
(``every_n_layers=0``, ``lora_rank``) and the command line's flags where there is no field
(``--model``). At the edge, :func:`for_cli` turns fields into flags (``--every-n-layers 0``,
"turn checkpointing off" into ``--no-checkpointing``) and :func:`for_app` turns flags into the
names of the widgets a page shows. A small mapping, nothing decided on it.
"""

from __future__ import annotations

import re

from ..fact import Fact
from ..results import RunResult
from ..spec import Setting
from .i18n import error_text, say, t

# RunSpec field -> the command line's flag (cli/args.py).
CLI_FLAGS = {
    "every_n_layers": "--every-n-layers",
    "seq_len": "--seq-len",
    "batch_size": "--batch-size",
    "repeats": "--repeats",
    "warmup": "--warmup",
    "dtype": "--dtype",
    "device": "--device",
    "optimizer": "--optimizer",
    "lora_rank": "--lora-rank",
    "lora_targets": "--lora-targets",
    "world_size": "--world-size",
}
CLI_PHRASES = {
    "offload=True": "--offload",
    "fsdp=True": "--fsdp",
    "turn checkpointing off instead": "use --no-checkpointing instead",
    "with checkpointing off": "with --no-checkpointing",
    "drop offload": "drop --offload",
}
# The command line's flag -> the locale key of the widget that sets the same thing in the app.
APP_WIDGETS = {"--model": "common.model", "--no-checkpointing": "lab.checkpointing"}

# Fields whose names are also plain words ("device", "optimizer") are flags only as ``name=value``.
_ALSO_WORDS = ("repeats", "warmup", "dtype", "device", "optimizer")
_FIELD = re.compile(
    r"\b(?:(" + "|".join(CLI_FLAGS) + r")=(\S+?)|(" + "|".join(n for n in CLI_FLAGS if n not in _ALSO_WORDS) + r"))"
    r"(?=[\s,.:;)]|$)"
)


def for_cli(message: str) -> str:
    """``"every_n_layers=0 is not valid"`` -> ``"--every-n-layers 0 is not valid"``; flags stay flags."""
    for phrase, flag in CLI_PHRASES.items():
        message = message.replace(phrase, flag)
    return _FIELD.sub(
        lambda m: f"{CLI_FLAGS[m.group(1)]} {m.group(2)}" if m.group(1) else CLI_FLAGS[m.group(3)], message
    )


def for_app(message: str, lang: str = "en") -> str:
    """``"point --model at a folder"`` -> ``"point "Model" at a folder"``: the widget's name in ``lang``."""
    for flag, key in APP_WIDGETS.items():
        message = re.sub(re.escape(flag) + r"\b", f"“{t(key, lang)}”", message)
    return message


def app_message(error: Exception, lang: str = "en") -> str:
    """A core error as a page shows it: translated where it has a key (:func:`error_text`), in the widgets' names."""
    return for_app(error_text(error, lang), lang)


def run_message(result: RunResult, lang: str = "en") -> str:
    """Why a run has no figures, as a page shows it: a "does not fit" worded from the result's fields in ``lang``
    (never from the sentence the core wrote for the command line, ``RunResult.message``)."""
    if result.status != "does_not_fit":
        return result.message
    spec = result.spec
    params = {
        "model": result.model.name,
        "seq_len": spec.seq_len,
        "batch": spec.batch_size,
        "setting": Setting.of(spec).key,
        "device": result.device,
    }
    return say(Fact("run.does_not_fit", params), lang)
