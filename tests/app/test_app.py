"""The lab page, driven headless with Streamlit's AppTest.

Runs share the process-wide result cache, so each distinct setting is measured once in
the whole suite; settings that no other test needs are kept to a minimum.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from ckptlab.lab.modelbox import LOCAL
from ckptlab.show import i18n

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

APP = str(Path(__file__).resolve().parents[2] / "app.py")
FAST = {"seq": "128", "repeats": "1", "warmup": "1"}
TIMEOUT = 120  # a real measured step plus its baseline; AppTest's default 3 s is far too short


def _app(**query: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({**FAST, **query})
    return at.run()


def _texts(elements) -> str:
    return "\n".join(str(element.value) for element in elements)


def _assert_alive(at: AppTest) -> None:
    assert not at.exception, _texts(at.exception)


def test_default_path_run_shows_the_diagram_and_the_measurements():
    at = _app()
    _assert_alive(at)
    assert len(at.get("plotly_chart")) == 1  # the planned pattern, before anything ran
    assert not at.metric
    assert "activation_checkpointing_enable(every_n_layers=1, offload=False)" in _texts(at.code)

    at.button(key="lab_run").click().run()
    _assert_alive(at)
    assert not at.error, _texts(at.error)
    assert len(at.get("plotly_chart")) == 3  # the observed diagram, where the memory goes, the comparison chart
    metrics = {metric.label: metric for metric in at.metric}
    # each value alone, its unit in the label (a value with its unit was cut in its column at 1280x720)
    assert {
        "Peak memory (MiB)",
        "Resident (MiB)",
        "Baseline (MiB)",
        "Forward (ms)",
        "Backward (ms)",
        "Step (ms)",
    } <= set(metrics)
    assert metrics["Resident (MiB)"].delta.endswith("MiB vs off")
    markdown = _texts(at.markdown)
    assert "Peak reached in:" in markdown
    assert "Time:" in markdown  # one repeat: says it cannot tell an effect from noise
    assert "measured on the CPU" in _texts(at.caption)
    assert {button.label for button in at.get("download_button")} == {"Result as JSON", "Result as CSV"}
    assert at.status[0].label.startswith(("Measured in", "Reused from a run at"))

    # The same settings again: reused, and the page says from when.
    at.button(key="lab_run").click().run()
    _assert_alive(at)
    assert at.status[0].label.startswith("Reused from a run at")
    assert "reused from a run at" in _texts(at.caption)


def test_changing_the_model_changes_the_every_n_layers_range():
    at = _app()
    assert at.slider(key="lab_n").max == 6
    at.selectbox(key="lab_model").set_value("qwen3-8b").run()
    _assert_alive(at)
    assert at.slider(key="lab_n").max == 36
    at.slider(key="lab_n").set_value(30).run()
    at.selectbox(key="lab_model").set_value("tiny-bert").run()
    _assert_alive(at)
    slider = at.slider(key="lab_n")
    assert (slider.max, slider.value) == (4, 4)
    assert "lowered to 4" in _texts(at.warning)
    assert at.query_params["n"] == "4" and at.query_params["model"] == "tiny-bert"


def test_a_real_shape_model_on_the_cpu_warns_before_run():
    at = _app(model="qwen3-0.6b")
    _assert_alive(at)
    warning = _texts(at.warning)
    assert "meant for a GPU" in warning and "a step takes about" in warning
    assert not at.button(key="lab_run").disabled  # a warning, not a ban


def test_offload_on_the_cpu_explains_itself():
    at = _app(offload="1")
    _assert_alive(at)
    assert "offload does not apply on the CPU" in _texts(at.info)
    at.button(key="lab_run").click().run()
    _assert_alive(at)
    assert not at.error, _texts(at.error)
    info = _texts(at.info)
    assert "offload did not apply here" in info and "MiB" in info
    assert "offload does not apply on the CPU" not in info  # said once, with the number, not twice
    assert "offload=True" in _texts(at.code)


def test_bad_query_values_fall_back_with_a_warning():
    at = _app(seq="lots", device="tpu", n="-2", dtype="int3", offload="perhaps")
    _assert_alive(at)
    assert len(at.warning) == 5
    assert at.number_input(key="lab_seq").value == 512
    assert at.selectbox(key="lab_device").value == "auto"
    assert at.query_params["seq"] == "512"  # the URL now holds what is shown


def test_query_parameters_restore_the_settings():
    at = _app(model="tiny-qwen3", seq="256", batch="2", dtype="float32", n="3", repeats="2", warmup="0")
    _assert_alive(at)
    assert not at.warning
    assert at.selectbox(key="lab_model").value == "tiny-qwen3"
    assert at.number_input(key="lab_seq").value == 256
    assert at.number_input(key="lab_batch").value == 2
    assert at.selectbox(key="lab_dtype").value == "float32"
    assert at.slider(key="lab_n").value == 3
    assert at.toggle(key="lab_ckpt").value is True
    assert at.number_input(key="lab_repeats").value == 2
    assert "every_n_layers=3" in _texts(at.code)
    at.toggle(key="lab_ckpt").set_value(False).run()
    assert at.query_params["n"] == "off"
    assert "activation_checkpointing_disable()" in _texts(at.code)


def test_a_sequence_longer_than_the_model_allows_is_explained():
    at = _app(model="tiny-gpt2", seq="4096")
    _assert_alive(at)
    assert "longer than tiny-gpt2 accepts (1024 positions)" in _texts(at.error)
    assert at.button(key="lab_run").disabled


def test_local_folders_are_off_unless_the_instructor_sets_a_root(monkeypatch):
    monkeypatch.delenv("CKPTLAB_MODELS_ROOT", raising=False)
    at = _app(model="/etc")
    _assert_alive(at)
    assert LOCAL not in at.selectbox(key="lab_model").options
    assert at.selectbox(key="lab_model").value == "tiny-llama"  # the link falls back to the default model
    assert "Local model folders are off on this server" in _texts(at.warning)
    assert not at.error and len(at.get("plotly_chart")) == 1


def test_a_folder_outside_the_models_root_is_not_opened(tmp_path, monkeypatch):
    from tests.model.test_folders import config_folder

    config_folder(tmp_path / "models" / "mine")
    outside = config_folder(tmp_path / "elsewhere")
    monkeypatch.setenv("CKPTLAB_MODELS_ROOT", str(tmp_path / "models"))
    for link in (str(outside), str(tmp_path / "models" / ".." / "elsewhere")):
        at = _app(model=link)
        _assert_alive(at)
        assert at.selectbox(key="lab_model").value == "tiny-llama"
        assert "outside the models folder this server offers" in _texts(at.warning)
    # The folder inside the root is offered by name, and runs.
    at = _app(model=str(tmp_path / "models" / "mine"))
    assert at.selectbox(key="lab_model").value == LOCAL
    assert at.selectbox(key="lab_local_dir").options == ["mine"]
    assert not at.error and not at.warning


def test_a_directory_without_config_is_not_offered(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("CKPTLAB_MODELS_ROOT", str(tmp_path))
    at = _app(model=str(tmp_path / "empty"))
    _assert_alive(at)
    assert LOCAL not in at.selectbox(key="lab_model").options  # no model folder under the root
    assert "is not one this server offers" in _texts(at.warning)


def test_a_run_larger_than_the_server_allows_is_refused_in_the_apps_language(monkeypatch):
    monkeypatch.setenv("CKPTLAB_MAX_TOKENS", "tiny-llama=100")
    at = _app(seq="128")
    _assert_alive(at)
    assert "128 tokens x batch 1 = 128 tokens is more than this server allows for tiny-llama (100)" in _texts(at.error)
    assert at.button(key="lab_run").disabled
    at = _app(seq="128", lang="pt-BR")
    assert "mais do que este servidor permite para tiny-llama (100)" in _texts(at.error)


def test_a_run_past_the_servers_time_limit_is_stopped_and_said(monkeypatch):
    from ckptlab.lab.server import ServerPolicy

    monkeypatch.setenv("CKPTLAB_RUN_LIMIT_S", "0.001")
    monkeypatch.setenv("CKPTLAB_MAX_TOKENS", "*=4096")  # else the predicted token limit of 1 ms refuses it first
    # A Run the estimate let through (the refusal before the start is tests/lab/test_server.py's): the limit stops it.
    monkeypatch.setattr(ServerPolicy, "check_run_time", lambda *args, **kwargs: None)
    at = _app(seq="144", lang="ja")  # a setting no other test measures: it must run, not be reused
    at.button(key="lab_run").click().run()
    _assert_alive(at)
    assert "上限 0.001 秒に達したため" in _texts(at.error)
    monkeypatch.setenv("CKPTLAB_RUN_LIMIT_S", "600")  # the next run of the session is whole
    at.button(key="lab_run").click().run()
    _assert_alive(at)
    assert not at.error and at.metric


def test_an_eight_billion_model_on_the_cpu_says_it_does_not_fit(monkeypatch):
    preflight = sys.modules["ckptlab.step.preflight"]
    monkeypatch.setattr(preflight, "available_host_bytes", lambda: 8 * 2**30)  # any machine's RAM
    monkeypatch.setenv("CKPTLAB_MAX_TOKENS", "*=1000000")  # past the server's limit to the machine's
    monkeypatch.setenv("CKPTLAB_RUN_LIMIT_S", "1e12")  # and past its run limit (its Run's estimate is hours)
    at = _app(model="qwen3-8b", device="cpu")
    at.button(key="lab_run").click().run()
    _assert_alive(at)
    assert "does not fit on this CPU" in _texts(at.error)
    assert at.status[0].label == "Could not run"
    # The session keeps working, and the error stays with the settings that caused it.
    at.selectbox(key="lab_model").set_value("tiny-llama").run()
    _assert_alive(at)
    assert not at.error


def test_an_unexpected_failure_is_a_short_message_not_a_dead_page(monkeypatch):
    import ckptlab.lab.run

    def broken(*args, **kwargs):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(ckptlab.lab.run, "run_queued", broken)
    at = _app()
    at.button(key="lab_run").click().run()
    _assert_alive(at)
    assert "failed unexpectedly" in _texts(at.error)
    assert "RuntimeError: simulated bug" in _texts(at.code)


# Every page of app.py's navigation and the heading it draws first (its own words, from the locale files).
PAGES = {
    "pages/lab.py": ("header", "lab.title"),
    "pages/tradeoffs.py": ("title", "tradeoffs.title"),
    "pages/at_scale.py": ("title", "at_scale.title"),
    "pages/lesson.py": ("title", "lesson.page_title"),
    "pages/timeline.py": ("title", "timeline.page_title"),
    "pages/exercises.py": ("title", "exercises.page_title"),
    "pages/instructor.py": ("title", "classroom.page_title"),
}


def test_the_page_list_is_the_apps_navigation():
    listed = set(re.findall(r"st\.Page\(\s*\"(pages/[a-z_]+\.py)\"", Path(APP).read_text(encoding="utf-8")))
    assert listed == set(PAGES)


@pytest.mark.parametrize("page", list(PAGES))
def test_every_page_opens_without_an_exception(page):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.switch_page(page).run()
    _assert_alive(at)
    kind, key = PAGES[page]
    # The page drew past its first lines: its heading, in its own words (a page that raised would have none).
    assert any(element.value == i18n.t(key, "en") for element in at.get(kind)), [e.value for e in at.get(kind)]


def test_a_session_waits_its_turn_while_another_run_holds_the_device():
    import threading

    from ckptlab.lab.runqueue import DEVICE_QUEUE

    holding, release = threading.Event(), threading.Event()

    def other_session() -> None:
        with DEVICE_QUEUE.turn(label="another session"):
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=other_session)
    holder.start()
    holding.wait(10)

    def release_once_the_page_waits() -> None:
        # On the queue's own state, not on a timer: a loaded machine may take seconds to reach Run.
        while DEVICE_QUEUE.busy() != (True, 1):
            release.wait(0.05)
        release.wait(0.6)  # the page says "waited" from half a second on: held at least that long
        release.set()

    threading.Thread(target=release_once_the_page_waits, daemon=True).start()
    at = _app(seq="136", n="4")  # a setting no other test measures: it must queue, not be reused
    at.button(key="lab_run").click().run()
    holder.join(10)
    _assert_alive(at)
    label = at.status[0].label
    assert label.startswith("Measured in") and "waited" in label and "for the device" in label


def test_a_folder_transformers_cannot_read_is_a_message(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPTLAB_MODELS_ROOT", str(tmp_path))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    at = _app(model=str(tmp_path / "broken"))
    _assert_alive(at)
    assert "could not be read as JSON" in _texts(at.error)


@pytest.mark.parametrize("which", ["run", "reference"])
def test_a_step_that_ran_out_of_memory_is_explained(monkeypatch, which):
    """measure returns status "does_not_fit" on OOM; fake that outcome around a real result."""
    from dataclasses import replace

    import ckptlab
    import ckptlab.lab.run as labrun

    spec = ckptlab.RunSpec(model="tiny-llama", seq_len=128, repeats=1, warmup=1, every_n_layers=1)
    real = labrun.run_queued(spec)  # shared cache: measured once for the suite
    from ckptlab.fact import Fact

    where = Fact("memory.cuda_total", {"total": 80 * 2**30, "name": "a GPU"})  # bytes: the template says GiB
    params = {"model": "tiny-llama", "seq_len": 128, "batch": 1, "offload": "", "where": where}
    reason = Fact("run.does_not_fit", {**params, "setting": Fact("run.setting_every_n", {"n": 1})})
    failed = lambda result: replace(result, status="does_not_fit", layers=[], memory=None, timing=None, reason=reason)  # noqa: E731
    if which == "run":
        fake = replace(real, run=replace(real.run, result=failed(real.result)), reference=None, comparison=None)
    else:
        fake = replace(real, reference=replace(real.reference, result=failed(real.reference.result)), comparison=None)
    monkeypatch.setattr(labrun, "run_queued", lambda *args, **kwargs: fake)

    at = _app(n="1")
    at.button(key="lab_run").click().run()
    _assert_alive(at)
    if which == "run":
        # The result's reason, worded in the page's language (show.wording.run_message): the CLI's sentence.
        assert (
            "Does not fit: tiny-llama at seq_len=128, batch_size=1, every_n_layers=1 ran out of the 80.0 GiB"
            in _texts(at.error)
        )
        assert len(at.get("plotly_chart")) == 1  # the planned pattern, titled as not fitting
    else:
        assert "Without checkpointing it does not fit" in _texts(at.warning)
        assert len(at.get("plotly_chart")) == 3  # the diagram, the run's memory alone (no reference), the comparison


def test_a_folder_with_a_bad_size_is_a_message_before_run(tmp_path, monkeypatch):
    from tests.model.test_folders import config_folder

    monkeypatch.setenv("CKPTLAB_MODELS_ROOT", str(tmp_path))
    at = _app(model=str(config_folder(tmp_path / "heads", num_attention_heads=0)))
    _assert_alive(at)
    assert "num_attention_heads=0" in _texts(at.error) and "config.json" in _texts(at.error)


def test_a_folder_too_large_for_the_machine_is_a_message_after_run(tmp_path, monkeypatch):
    from tests.model.test_folders import config_folder

    monkeypatch.setenv("CKPTLAB_MODELS_ROOT", str(tmp_path))
    monkeypatch.setenv("CKPTLAB_MAX_TOKENS", "*=1000000")  # past the server's limit to the machine's
    monkeypatch.setenv("CKPTLAB_RUN_LIMIT_S", "1e12")  # and past its run limit (its Run's estimate is hours)
    at = _app(model=str(config_folder(tmp_path / "huge", vocab_size=10**10)), device="cpu")
    _assert_alive(at)
    at.button(key="lab_run").click().run()
    _assert_alive(at)
    assert "does not fit on this CPU" in _texts(at.error) and "Nothing was built" in _texts(at.error)
    assert at.status[0].label == "Could not run"
