"""`import ckptlab`, `--help`, `models` and the errors that need no model answer without importing torch or
transformers; the package's names still resolve to their homes."""

from __future__ import annotations

import ast
import importlib
import json
import logging
import subprocess
import sys
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
