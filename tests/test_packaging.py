"""ckptlab installs: the wheel holds every module, the texts (package data), the ``ckptlab`` command
and the dependencies, and requirements.txt asks for what pyproject.toml declares."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = {"torch", "transformers", "peft", "accelerate", "streamlit", "plotly", "pandas", "bitsandbytes"}
TEST_EXTRA = {"pytest", "pytest-xdist", "playwright", "nbclient", "nbformat", "ipykernel"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement.strip(), maxsplit=1)[0].lower()


def _setuptools_builds_wheels() -> str:
    """Why a wheel cannot be built offline here ("" when it can): setuptools >= 70.1 builds wheels by itself."""
    try:
        version = metadata.version("setuptools")
    except metadata.PackageNotFoundError:
        return "setuptools is not installed in this environment (pip install setuptools)"
    major, minor = (int(part) for part in re.findall(r"\d+", version)[:2])
    if (major, minor) < (70, 1):
        return f"setuptools {version} needs the separate 'wheel' package; setuptools >= 70.1 builds wheels itself"
    return ""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """ckptlab's wheel, built offline from a copy of what the build reads (the tree is left as it was)."""
    reason = _setuptools_builds_wheels()
    if reason:
        pytest.skip(reason)
    source = tmp_path_factory.mktemp("source")
    shutil.copy(ROOT / "pyproject.toml", source)
    shutil.copy(ROOT / "README.md", source)
    shutil.copytree(ROOT / "ckptlab", source / "ckptlab", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("dist")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    done = subprocess.run([*command, "-w", str(out), str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = out.glob("ckptlab-*.whl")
    with zipfile.ZipFile(built) as archive:
        yield archive


def test_the_wheel_holds_every_module_and_the_texts(wheel: zipfile.ZipFile):
    names = set(wheel.namelist())
    modules = {path.relative_to(ROOT).as_posix() for path in (ROOT / "ckptlab").rglob("*.py")}
    assert modules <= names, sorted(modules - names)
    locales = {path.relative_to(ROOT).as_posix() for path in (ROOT / "ckptlab" / "locales").glob("*.json")}
    assert locales == {"ckptlab/locales/en.json", "ckptlab/locales/ja.json", "ckptlab/locales/pt-BR.json"}
    assert locales <= names, sorted(locales - names)
    assert "ckptlab/model/preset_facts.json" in names  # what ``ckptlab models`` prints
    assert not any(name.startswith(("tests/", "pages/", "benchmarks/")) for name in names)


def test_the_wheel_puts_a_ckptlab_command_on_the_path(wheel: zipfile.ZipFile):
    (entry_points,) = [name for name in wheel.namelist() if name.endswith(".dist-info/entry_points.txt")]
    text = wheel.read(entry_points).decode()
    assert "[console_scripts]" in text
    assert re.search(r"^ckptlab = ckptlab\.cli:main$", text, re.MULTILINE), text


def test_the_wheel_declares_the_dependencies_and_the_test_extra(wheel: zipfile.ZipFile):
    (meta,) = [name for name in wheel.namelist() if name.endswith(".dist-info/METADATA")]
    lines = wheel.read(meta).decode().splitlines()
    requires = [line.removeprefix("Requires-Dist: ") for line in lines if line.startswith("Requires-Dist: ")]
    runtime = {_name(line) for line in requires if "extra ==" not in line}
    extra = {_name(line) for line in requires if 'extra == "test"' in line}
    assert runtime >= RUNTIME, runtime
    assert extra >= TEST_EXTRA, extra


def test_requirements_txt_asks_for_what_pyproject_declares():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    lines = (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()
    wanted = {_name(line) for line in lines if line.strip() and not line.startswith("#")}
    declared = {_name(r) for r in project["dependencies"]}
    declared |= {_name(r) for r in project["optional-dependencies"]["test"]}
    assert wanted == declared
    assert {_name(r) for r in project["dependencies"]} == RUNTIME
