"""``python -m ckptlab``: list the models, run a measured step, sweep, simulate.

One module per command (``models``, ``run``, ``sweep``, ``simulate``); what they share
(the spec options, the exit codes, the progress line) is in :mod:`ckptlab.cli.args`.

Bad input exits with status 2 and one message naming the value and the fix, never a
traceback; so does a step that does not fit in memory.

The commands import the core (torch, transformers) inside their handlers, after the flags and the
spec passed every check that needs no model (``args.check_before_the_core``): ``--help``, ``models``
and a typo answer in a fifth of a second instead of the seconds those imports take
(benchmarks/cli_startup.py; tests/test_lazy_imports.py keeps it so).
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

from ..errors import CkptlabError
from ..show.i18n import t
from ..show.wording import cli_message
from .args import EXIT_BAD_INPUT, Parser, option_flags
from .models import add_models_command
from .run import add_run_command
from .simulate import add_simulate_command
from .sweep import add_sweep_command

# One entry per subcommand: a function that adds its parser to the subparsers and sets
# ``handler`` (a function of the parsed args returning the exit status). A new command
# lives in its own module and adds one line here.
COMMANDS = [add_models_command, add_run_command, add_sweep_command, add_simulate_command]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m ckptlab",
        description="Activation checkpointing in transformers, measured: run real steps and see what each layer keeps.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for add_command in COMMANDS:
        add_command(commands)
    return parser


def _values_that_look_like_flags(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--budget -1GiB`` as ``--budget=-1GiB``: argparse takes a value starting with "-" that is not a plain negative
    number for a flag and answers "expected one argument"; glued to its flag, the value reaches the lab's own check,
    which names it (``--max-grad-norm -inf``, ``--seq-len -5``)."""
    takes_value, flags = set(), set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                for option in command._actions:
                    flags.update(option.option_strings)
                    if option.nargs is None and option.option_strings:
                        takes_value.update(option.option_strings)
    glued, skip = [], False
    for index, token in enumerate(argv):
        if skip:
            skip = False
            continue
        following = argv[index + 1] if index + 1 < len(argv) else None
        if token in takes_value and following is not None and following.startswith("-") and following not in flags:
            glued.append(f"{token}={following}")
            skip = True
        else:
            glued.append(token)
    return glued


def main(argv: Sequence[str] | None = None, *, own_process: bool = False) -> int:
    """Run one command; ``own_process`` when this process is the command (``python -m ckptlab``), not a caller's."""
    parser = build_parser()
    args = parser.parse_args(_values_that_look_like_flags(parser, sys.argv[1:] if argv is None else list(argv)))
    args.own_process = own_process  # read by core_loaded
    try:
        return args.handler(args)
    except CkptlabError as error:
        # The error's options as this command's flags (world_size is run's --nproc-per-node, simulate's --world-size).
        print(t("cli.error", message=cli_message(error, option_flags(parser), args.command)), file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(t("cli.interrupted"), file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (``... --json | head``): nothing left to say, and no traceback.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - Python flushes stdout again at exit
        return 0


def end_process(status: int) -> NoReturn:
    """End ``python -m ckptlab``'s own process with ``status`` once its answer is out, without the interpreter's
    teardown of what the command loaded.

    Python's exit frees the process's objects one by one, modules and their dictionaries first: with torch and
    transformers loaded, 0.12-0.15 s of CPU after a ``simulate`` answered (issue 61), work whose result nothing
    reads. What an exit does that something outside could see is done first, in the order Python does it: the
    ``atexit`` handlers (logging's flush, ``weakref.finalize`` and tempfile's clean-ups, multiprocessing's), then
    stdout and stderr flushed; then ``os._exit``. Where Python would still wait (another thread that is not a daemon)
    or a stream cannot be flushed (a reader that went away), the ordinary exit runs instead. Only for a process that
    is the command (``__main__``): a caller's ``main([...])`` returns.
    """
    waiting = [
        thread for thread in threading.enumerate() if not thread.daemon and thread is not threading.main_thread()
    ]
    if not waiting:
        atexit._run_exitfuncs()  # CPython's own call at exit; the handlers are dropped once run
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):  # a closed pipe or stream: the ordinary exit says it as it always did
            sys.exit(status)
        os._exit(status)
    sys.exit(status)
