"""Two libraries the lab imports that reach further than a run asks: the one home of how the lab imports them.

**transformers' Trainer modules import peft.** ``transformers.trainer_utils`` (which ``TrainingArguments`` and
``Trainer`` import) runs ``from peft import PeftMixedModel, PeftModel`` whenever peft is installed, and peft
imports bitsandbytes, whose CPU backend asks the Hub for a kernel (below). Every run with an optimizer builds it
through ``Trainer.get_optimizer_cls_and_kwargs``, so every run paid about a second of imports and a request to
``HF_ENDPOINT``, and a Hub that accepted connections and never answered hung every run, presets included (issue 62,
item 7). :func:`trainer_modules_without_peft` imports those modules with a stand-in for the two names, which
answer ``isinstance`` as peft's classes do: nothing is an instance of a peft class before peft is imported, and
after, the stand-ins ask peft's own classes. A run that adapts imports peft before its optimizer (``model.lora``),
and then transformers gets peft itself.

**bitsandbytes asks the Hub on import.** On a CPU with AVX512-BF16, ``import bitsandbytes`` calls
``kernels.get_kernel("kernels-community/quantization-bitsandbytes")``, which asks ``HF_ENDPOINT`` for the
publisher's overview with the process's ``HF_TOKEN`` and no timeout, before it looks at any cache (issue 56, class
12: a worker sent the server account's token on every start). :func:`import_bitsandbytes` imports it with
huggingface_hub's offline switch on for the duration of the import: ``kernels`` reads that switch
(``constants.HF_HUB_OFFLINE``) when it is called, looks in the local cache only and sends nothing. The kernel is
optional: without it bitsandbytes runs its own CPU kernel, the one the lab's 4-bit runs measure.

**transformers scans its model folders twice.** ``import transformers`` builds its lazy table by reading every
file under ``transformers/models`` (``define_import_structure(Path(.../models), prefix="models")``), and the first
import of ``transformers.models`` (which every modeling module, the auto classes and ``transformers.modeling_utils``
import) reads them all again for its own table (``define_import_structure(".../models/__init__.py")``): the two
calls differ in their arguments, and the per-folder cache under them (``create_import_structure_from_path``, an
``lru_cache`` of 128 entries) is too small for the 566 model folders of 5.25, so nothing is reused. That second scan
is about 0.33 s of CPU in every process that builds a model (issue 61: a ``simulate`` process at 8k tokens is 1.5 s of
simulation beside 3.6 s of imports). :func:`import_transformers_models` imports ``transformers.models`` with its
table taken from the first scan's cached answer, the same entries without the ``models.`` prefix
(``tests/model/test_libraries.py`` checks it equals transformers' own scan).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import sys
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# The names transformers' Trainer modules import from peft at their top level (trainer_utils, trainer; 5.25).
PEFT_CLASS_NAMES = ("PeftModel", "PeftMixedModel")
# kernels' notice that offline mode skips its publisher check: the lab turned offline on, on purpose.
_KERNELS_HUB_LOGGER = "kernels._internals.hf_hub"
# The stand-in and the offline switch are process-wide while they are on: the lab's imports of peft and bitsandbytes
# take this lock, so another thread's run never meets the stand-in nor inherits the switch.
_LOCK = threading.RLock()


class _PeftClass(type):
    """The type of a stand-in for one of peft's model classes: ``isinstance`` asks peft's class once peft is imported.

    An object can only be an instance of a peft class after peft was imported, so before that the answer is False.
    """

    def __instancecheck__(cls, instance: Any) -> bool:
        real = _peft_class(cls.__name__)
        return real is not None and isinstance(instance, real)

    def __subclasscheck__(cls, subclass: type) -> bool:
        real = _peft_class(cls.__name__)
        return real is not None and issubclass(subclass, real)


def _peft_class(name: str) -> type | None:
    peft = sys.modules.get("peft")
    if peft is None or getattr(peft, "__ckptlab_stand_in__", False):
        return None
    return getattr(peft, name)


@contextmanager
def trainer_modules_without_peft() -> Iterator[None]:
    """Import transformers' ``Trainer``/``TrainingArguments`` inside this block without importing peft.

    Where peft is already imported, or the Trainer modules are, the block changes nothing.
    """
    with _LOCK:
        if "peft" in sys.modules or "transformers.trainer_utils" in sys.modules:
            yield
            return
        stand_in = types.ModuleType("peft")
        # transformers asks importlib.util.find_spec("peft"), which reads the module's spec once it is in sys.modules.
        stand_in.__spec__ = importlib.machinery.ModuleSpec("peft", None)
        stand_in.__ckptlab_stand_in__ = True  # type: ignore[attr-defined]
        for name in PEFT_CLASS_NAMES:
            setattr(stand_in, name, _PeftClass(name, (), {}))
        sys.modules["peft"] = stand_in
        try:
            yield
        finally:
            if sys.modules.get("peft") is stand_in:
                del sys.modules["peft"]  # a later `import peft` imports peft itself


def import_bitsandbytes() -> None:
    """``import bitsandbytes`` without its Hub kernel lookup sending anything (the module docstring); imported once.

    Call it before any import that may import bitsandbytes (``import bitsandbytes`` then finds it in ``sys.modules``).

    Raises:
        ImportError: bitsandbytes is not installed (as ``import bitsandbytes`` does).
    """
    if "bitsandbytes" in sys.modules:
        return
    from huggingface_hub import constants

    quiet = logging.getLogger(_KERNELS_HUB_LOGGER)
    with _LOCK:
        offline, level = constants.HF_HUB_OFFLINE, quiet.level
        constants.HF_HUB_OFFLINE = True
        quiet.setLevel(logging.ERROR)
        try:
            import bitsandbytes  # noqa: F401  # imported for the process: the lab's modules import it by name
        finally:
            constants.HF_HUB_OFFLINE = offline
            quiet.setLevel(level)


def import_peft() -> None:
    """``import peft`` as a run that adapts needs it: bitsandbytes first (peft imports it where it is installed)
    through :func:`import_bitsandbytes`, and never while the Trainer modules' stand-in is in place."""
    if "peft" in sys.modules and not getattr(sys.modules["peft"], "__ckptlab_stand_in__", False):
        return
    with _LOCK:
        if importlib.util.find_spec("bitsandbytes") is not None:
            import_bitsandbytes()
        import peft  # noqa: F401  # imported for the process: the lab's modules import from it by name


# The lab builds a TrainingArguments of its own only to ask Trainer for an optimizer's class (step/training.py). Under
# a simulated FSDP2 step the fake process group of step/fake_pg is up at that moment, and TrainingArguments warns that
# "torch.distributed process group is initialized, but parallel_mode != ParallelMode.DISTRIBUTED": about the lab's
# own stand-in, not the user's launch, and it filled 28 of 35 lines of a workshop server's log (issue 58). The filter
# drops that one warning, and only while this thread builds the lab's arguments; a user's own TrainingArguments, in
# any thread, still warns.
_TRAINING_ARGS_LOGGER = "transformers.training_args"
_OWN_ARGUMENTS = threading.local()


class _OwnArgumentsFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(_OWN_ARGUMENTS, "building", False):
            return True
        return "parallel_mode != ParallelMode.DISTRIBUTED" not in record.getMessage()


_OWN_ARGUMENTS_FILTER = _OwnArgumentsFilter()


@contextmanager
def lab_own_training_arguments() -> Iterator[None]:
    """While this thread builds the lab's own ``TrainingArguments``, drop its warning about the lab's process group."""
    logger = logging.getLogger(_TRAINING_ARGS_LOGGER)
    with _LOCK:
        if _OWN_ARGUMENTS_FILTER not in logger.filters:
            logger.addFilter(_OWN_ARGUMENTS_FILTER)
    _OWN_ARGUMENTS.building = True
    try:
        yield
    finally:
        _OWN_ARGUMENTS.building = False


# The prefix transformers' own import gives the model folders' entries in its table (transformers/__init__.py, 5.25).
MODELS_PREFIX = "models"


def models_table(scanned: dict[frozenset[str], dict[str, set[str]]]) -> dict[frozenset[str], dict[str, set[str]]]:
    """``transformers.models``' lazy table from the one ``import transformers`` built: its model folders' entries,
    named inside ``transformers.models`` (``models.qwen3.modeling_qwen3`` as ``qwen3.modeling_qwen3``).

    transformers/__init__.py added its own top-level modules to that table in place: only the models' entries count.
    """
    dotted = f"{MODELS_PREFIX}."
    return {
        backends: {name.removeprefix(dotted): set(names) for name, names in modules.items() if name.startswith(dotted)}
        for backends, modules in scanned.items()
    }


def import_transformers_models() -> None:
    """Import ``transformers.models`` without scanning its folders a second time (the module docstring); once.

    Call it before the first import of a modeling module, ``transformers.modeling_utils`` or the auto classes (each
    imports ``transformers.models``); afterwards it changes nothing. ``transformers.models`` gets :func:`models_table`
    of the table ``import transformers`` built and cached: the scan of the same folder, read once.
    """
    if "transformers.models" in sys.modules:
        return
    import transformers
    from transformers.utils import import_utils

    define = import_utils.define_import_structure
    models = Path(transformers.__file__).parent / MODELS_PREFIX

    # transformers' signature: its callers may name `prefix`.
    def define_once(module_path: str | Path, prefix: str | None = None) -> Any:
        if prefix is not None or Path(module_path) != models / "__init__.py":
            return define(module_path, prefix)  # another package's table: transformers' own call
        # The cached answer to transformers/__init__.py's own call (a scan only if it did not make that call).
        return models_table(define(models, prefix=MODELS_PREFIX))

    with _LOCK:
        # transformers/models/__init__.py imports define_import_structure by name when it runs: only this import sees
        # the stand-in, and any other package's table still comes from transformers' own function.
        import_utils.define_import_structure = define_once  # type: ignore[assignment]  # for this import only
        try:
            import transformers.models  # imported for the process, its table read from the first scan
        finally:
            import_utils.define_import_structure = define
