"""The core's errors in the words of where they are read: the command line's flags, or the app's widgets.

A core error names the settings it is about as typed references (``ckptlab.errors.Option``,
``Command``), never as a flag nor a widget (the core knows neither edge), and its ``str()`` is
the Python API's words. Here each edge words those references: :func:`cli_message` as flags
(``--every-n-layers 0``, ``--offload``, ``--no-checkpointing``) and command lines, :func:`app_message`
as the label of the widget that sets the option and the page that runs a command, in the page's
language. Nothing here reads or rewrites a sentence: only the references are worded.

The flags have one home, the CLI's own argparse parsers: this layer may not import ``cli/``
(show < cli), so the CLI hands its parsers' flags in (:data:`CliFlags`, read by
``ckptlab.cli.args.option_flags``); a flag renamed there is renamed in every message.
The app's widgets are named by the locale keys the pages label them with, declared with each field
(``ckptlab.spec_fields``, :data:`APP_WIDGETS`); a setting no page has a widget for is said in the Python API's words.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from typing import NamedTuple

from ..errors import UNSET, Command, Option, Reference
from ..results import RunResult
from ..spec_fields import FIELDS
from .i18n import error_text, say, t


class Flag(NamedTuple):
    """One of the command line's flags: its name and whether it takes no value (``--offload``, ``--fsdp``)."""

    name: str
    switch: bool = False


# Per command ("run", "simulate", ...): an option's key -> its flag. The key is the RunSpec field the flag sets
# (``"seq_len"``), or ``"field=value"`` for a switch that sets one value (``"every_n_layers=None"``:
# ``--no-checkpointing``); see ``ckptlab.cli.args.option_flags``.
CliFlags = Mapping[str, Mapping[str, Flag]]

# The command the CLI's own program is invoked as; a Command's action -> its subcommand.
PROGRAM = "python -m ckptlab"
CLI_COMMANDS = {"simulate": "simulate", "measure": "run"}

# RunSpec field -> the locale key of the label of the widget that sets it in the app (spec_fields.SpecField.label).
# A field without a widget is said in the Python API's words. every_n_layers is the checkpointing toggle only when off.
APP_WIDGETS = {field.name: field.label for field in FIELDS if field.label is not None}
# A Command's action -> the locale key of the page that does it.
APP_PAGES = {"simulate": "nav.at_scale_page", "measure": "nav.lab_page"}


def cli_flag(option: Option, flags: CliFlags, command: str, value: Callable[[object], str] = repr) -> str:
    """``Option("every_n_layers", 0)`` -> ``--every-n-layers 0``; the Python words where no flag sets it.

    ``command``'s own flags first (``world_size`` is ``--nproc-per-node`` in ``run``, ``--world-size`` in
    ``simulate``), then any command's. ``value`` says the value: Python's repr in a sentence (``--device
    'cuda'``, as the message has always read), the shell's word in a line to paste (:func:`cli_line`).
    """
    tables = [flags.get(command, {}), *flags.values()]
    for table in tables:
        flag = table.get(f"{option.field}={option.value!r}")  # a switch that sets this one value
        if flag is not None:
            return flag.name
    for table in tables:
        flag = table.get(option.field)
        if flag is None or (flag.switch and option.value is not UNSET and option.value is not True):
            continue
        if isinstance(option.value, bool) and not flag.switch:
            continue  # sweep's --offload takes a choice: offload=True is run's switch
        return flag.name if option.value is UNSET or flag.switch else f"{flag.name} {value(option.value)}"
    return str(Option(option.field, option.value))


def cli_line(command: Command, flags: CliFlags) -> str:
    """``Command("simulate", (Option("model", "x"),))`` -> ``python -m ckptlab simulate --model x``: a line to paste."""
    name = CLI_COMMANDS[command.action]
    options = [cli_flag(option, flags, name, lambda value: shlex.quote(str(value))) for option in command.options]
    return " ".join([PROGRAM, name, *options])


def cli_message(error: Exception, flags: CliFlags, command: str = "run") -> str:
    """A core error as the command line prints it: options as ``command``'s flags, commands as command lines."""

    def word(reference: Reference) -> str:
        return cli_line(reference, flags) if isinstance(reference, Command) else cli_flag(reference, flags, command)

    return error_text(error, "en", word)


def app_words(reference: Reference, lang: str = "en") -> str:
    """An option as the label of the widget that sets it (``“Model”``, ``“Activation checkpointing” off``),
    a command as the page that runs it; the Python API's words where the app has no widget or page for it."""
    if isinstance(reference, Command):
        if reference.ranks > 1:  # no page starts ranks: the function to launch under torchrun
            return str(reference)
        return t("wording.page", lang, page=t(APP_PAGES[reference.action], lang))
    if reference.field == "every_n_layers" and reference.value is None:
        return f"“{t('lab.checkpointing', lang)}” {t('setting.short_off', lang)}"
    key = APP_WIDGETS.get(reference.field)
    if key is None:
        return str(Option(reference.field, reference.value))
    label = f"“{t(key, lang)}”"
    return label if reference.value is UNSET or reference.value is True else f"{label} = {reference.value!r}"


def app_message(error: Exception, lang: str = "en") -> str:
    """A core error as a page shows it: translated where it has a key, its options as the page's widgets."""
    return error_text(error, lang, lambda reference: app_words(reference, lang))


def run_message(result: RunResult, lang: str = "en") -> str:
    """Why a run has no figures, as a page shows it: its reason (a fact) in ``lang``; "" when it has figures.
    The command line and the JSON say the same fact in English (``RunResult.message``)."""
    return "" if result.reason is None else say(result.reason, lang)
