"""`import ckptlab`, `--help`, `models` and the errors that need no model answer without importing torch or
transformers; the package's names still resolve to their homes."""

from __future__ import annotations

import ast
import importlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import ckptlab

ROOT = Path(__file__).resolve().parents[1]

# Runs the CLI in a fresh interpreter and reports, after it answered, whether torch or transformers got imported.
PROBE = """
import json, sys
from ckptlab.cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as exit:
    status = exit.code
print(json.dumps({"status": status, "heavy": sorted({"torch", "transformers"} & set(sys.modules))}), file=sys.stderr)
"""


def _probe(*argv: str) -> tuple[int, list[str], str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    *said, last = done.stderr.strip().splitlines()
    report = json.loads(last)
    return report["status"], report["heavy"], "\n".join(said) + done.stdout


@pytest.mark.parametrize(
    ("argv", "status", "words"),
    [
        (["--help"], 0, "simulate"),
        (["run", "--help"], 0, "--every-n-layers"),
        (["models"], 0, "tiny-llama"),
        (["models", "--json"], 0, '"num_params"'),
        (["run", "--seq-len", "0"], 2, "--seq-len 0"),
        (["run", "--dtype", "float64"], 2, "float64"),
        (["run", "--model", "tiny-lama"], 2, "neither a preset nor an existing directory"),
        # Written as a path: looked for on this machine only, never asked of the Hub (ckptlab.model.hub).
        (["run", "--model", "./no/such-model"], 2, "neither a preset nor an existing directory"),
        (["simulate", "--every-n-layers", "0"], 2, "--every-n-layers 0"),
        (["simulate", "--budget-gib", "-1"], 2, "--budget-gib -1"),
        (["simulate", "--every-n-layers", "al"], 2, "not a whole number nor 'all'"),
        (["simulate", "--every-n-layers", "all", "--seq-len", "0"], 2, "--seq-len 0"),
        (["sweep", "--seq-len", "x"], 2, "'x' is not a whole number"),
        (["run", "--selective", "keep-all"], 2, "keep-all"),
        (["run", "--quantization-config", "./no/such.json", "--lora-rank", "8"], 2, "cannot be read (no such file)"),
        # A preset's limits are stored (ckptlab/model/preset_facts.json): past its positions is refused before torch.
        (["simulate", "--model", "qwen3-8b", "--seq-len", "10000000"], 2, "(40960 positions)"),
        (["run", "--model", "qwen3-8b", "--seq-len", "40961"], 2, "(40960 positions)"),
    ],
)
def test_the_cli_answers_before_torch_loads(argv, status, words):
    got_status, heavy, output = _probe(*argv)
    assert got_status == status, output
    assert words in output
    assert heavy == [], f"{argv} imported {heavy} before answering"


def test_import_ckptlab_loads_neither_torch_nor_transformers():
    code = "import sys, ckptlab; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_every_public_name_resolves_to_its_home():
    for name in ckptlab.__all__:
        home = importlib.import_module(ckptlab._HOMES[name], "ckptlab")
        assert getattr(ckptlab, name) is getattr(home, name)
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = ckptlab.no_such_name  # type: ignore[attr-defined]


def test_the_type_checkers_imports_are_the_lazy_names():
    """The TYPE_CHECKING block of ckptlab/__init__.py imports exactly the names _HOMES loads, from the same homes."""
    tree = ast.parse((ROOT / "ckptlab" / "__init__.py").read_text(encoding="utf-8"))
    (block,) = [node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"]
    imported = {
        alias.name: "." * node.level + (node.module or "")
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert imported == ckptlab._HOMES


def test_bitsandbytes_hub_kernel_notice_is_dropped_and_its_other_messages_pass(caplog):
    """`import ckptlab` quiets the one notice every process printed on an AVX512-BF16 CPU (ckptlab/__init__.py)."""
    bitsandbytes_cpu = logging.getLogger("bitsandbytes.backends.cpu.ops")
    with caplog.at_level(logging.WARNING, logger=bitsandbytes_cpu.name):
        bitsandbytes_cpu.warning("Failed to load CPU gemm_4bit_forward from kernels-community: %s.", "untrusted")
        bitsandbytes_cpu.warning("another notice")
    assert [record.getMessage() for record in caplog.records] == ["another notice"]


def test_transformers_models_table_from_the_first_scan_is_transformers_own():
    """The table ``import_transformers_models`` gives ``transformers.models`` without a second scan of its folders
    (issue 61: 0.33 s of CPU a process) is the one transformers' own scan of ``models/__init__.py`` builds."""
    import transformers
    from transformers.utils import import_utils

    from ckptlab.model.libraries import MODELS_PREFIX, models_table

    models = Path(transformers.__file__).parent / MODELS_PREFIX
    first = import_utils.define_import_structure(models, prefix=MODELS_PREFIX)  # cached by `import transformers`
    own = import_utils.define_import_structure.__wrapped__(str(models / "__init__.py"))  # the scan it replaces
    assert "qwen3.modeling_qwen3" in own[frozenset({"torch"})]
    assert models_table(first) == own


# Two simulations in one interpreter, a preset's and a QLoRA one's, then a peft model handed to transformers' Trainer
# helpers (imported by the first run without peft: ckptlab.model.libraries). Reports what each run had imported.
RUNS = """
import json, sys
from ckptlab.cli import main

def simulate(*extra):
    try:
        status = main(["simulate", "--model", "tiny-llama", "--seq-len", "32", *extra])
    except SystemExit as exit:
        status = exit.code
    return status, sorted({"peft", "bitsandbytes"} & set(sys.modules))

TRAINER_MODULES = ("transformers.trainer", "transformers.training_args", "transformers.trainer_utils")
no_optimizer = simulate("--optimizer", "none"), sorted(set(TRAINER_MODULES) & set(sys.modules))
# transformers reads each folder under models/ once per scan of it (one cache miss a folder): a second scan of the
# whole tree misses once more for each (its cache holds 128 folders of 566).
import os, transformers
from transformers.utils.import_utils import create_import_structure_from_path
folders = sum(entry.is_dir() for entry in os.scandir(os.path.dirname(transformers.models.__file__)))
scans = create_import_structure_from_path.cache_info().misses / folders
plain = simulate()
qlora = simulate("--lora-rank", "8", "--quantization-config", sys.argv[1])
import peft, torch, transformers.trainer_utils
adapted = peft.get_peft_model(torch.nn.Sequential(torch.nn.Linear(4, 4)), peft.LoraConfig(target_modules=["0"]))
unwrapped = transformers.trainer_utils.unwrap_peft_model(adapted) is adapted.get_base_model()
report = {"no_optimizer": no_optimizer, "plain": plain, "qlora": qlora, "unwrapped": unwrapped, "scans": scans}
print(json.dumps(report), file=sys.stderr)
"""


@contextmanager
def _silent_hub() -> Iterator[tuple[str, list[socket.socket], threading.Event]]:
    """A server that accepts every connection and never answers (issue 62, item 7): its URL, what it accepted, and
    an event set at the first connection."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    asked = threading.Event()

    def accept() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:  # the server was closed
                return
            accepted.append(connection)
            asked.set()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}", accepted, asked
    finally:
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        for connection in accepted:
            connection.close()


@pytest.mark.slow
def test_a_run_asks_a_silent_hub_nothing_and_imports_peft_only_to_adapt(tmp_path):
    """A preset's run without an optimizer imports none of Trainer's modules and reads transformers' model folders
    once (issue 61); a preset's run imports neither
    peft nor bitsandbytes (Trainer's modules pulled both in, and bitsandbytes' Hub kernel lookup hung every run on a
    silent ``HF_ENDPOINT``); a QLoRA run imports them and sends the Hub nothing,
    ``HF_TOKEN`` included (issue 56, class 12); transformers still knows a peft model imported afterwards."""
    config = tmp_path / "qlora.json"
    config.write_text('{"load_in_4bit": true, "bnb_4bit_quant_type": "nf4"}', encoding="utf-8")
    with _silent_hub() as (url, accepted, asked):
        # Offline settings off: they would hide the lookup this test is about.
        env = {key: value for key, value in os.environ.items() if key not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
        env.update(HF_ENDPOINT=url, HF_TOKEN="hf_server_account_token")
        process = subprocess.Popen(
            [sys.executable, "-c", RUNS, str(config)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        # Whichever comes first: the runs end, or one asks the silent server (where it would wait forever).
        threading.Thread(target=lambda: (process.wait(), asked.set()), daemon=True).start()
        asked.wait(timeout=600)
        connections = len(accepted)
        if process.poll() is None:
            process.kill()
        _, err = process.communicate()
    assert connections == 0, "a run connected to HF_ENDPOINT"
    said = err.decode().strip().splitlines()
    assert process.returncode == 0, "\n".join(said[-20:])
    report = json.loads(said[-1])
    # Trainer's modules only where the recipe needs their mapping (an optimizer's class: step/training.py).
    assert report["no_optimizer"] == [[0, []], []]
    assert report["plain"] == [0, []]
    assert report["qlora"] == [0, ["bitsandbytes", "peft"]]
    assert report["unwrapped"]
    # transformers' model folders read once, at `import transformers` (ckptlab.model.libraries), not twice.
    assert 1 <= report["scans"] < 1.5
