"""The At-scale page, driven headless with AppTest: simulate, see the figures, change the GPU without simulating again, bad input."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from ckptlab.explore import scale
from tests.app.polling import rerun_until

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "pages" / "at_scale.py")
TIMEOUT = 60  # the first run describes every preset; AppTest's default 3 s is too short


def _texts(elements) -> str:
    return "\n".join(str(element.value) for element in elements)


def _page(**query: str) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


def _poll(at: AppTest, until) -> AppTest:
    """Rerun the page (as its fragment's timer would) until ``until(at)``, waiting on its job between reruns."""
    return rerun_until(at, until, "at_scale_job")


@pytest.fixture(scope="module")
def simulated():
    """The page after simulating tiny-llama at 128 tokens (6 settings), with a count of the simulations."""
    calls: list = []
    real = scale.TableSimulation.result
    # The shared bounded store is the process's (lab.store.SIMULATIONS: the lesson's ideas fill it too): empty here, so
    # the count below is this table's own simulations, whichever test module ran before in this process.
    from ckptlab.lab.store import SIMULATIONS

    SIMULATIONS.clear()

    def counting(table, spec, **kwargs):
        calls.append(spec)
        return real(table, spec, **kwargs)

    scale.TableSimulation.result = counting  # type: ignore[method-assign]
    # The device total stubbed as the tensors' peak: each fitting row's order would be simulated again (52 s here
    # where the page alone takes 7); the table's device totals are tests/explore/test_device.py's.
    real_device = scale.on_gpu
    scale.on_gpu = lambda gpu=None: lambda result, budget: result  # type: ignore[assignment]
    # The count is of calls in this process: the page's jobs run here (CKPTLAB_WORKERS=thread). The same jobs
    # in worker processes are tests/lab/test_jobs_in_workers.py's.
    workers = os.environ.get("CKPTLAB_WORKERS")
    os.environ["CKPTLAB_WORKERS"] = "thread"
    try:
        at = _page(model="tiny-llama", seq="128", gpu="H100 80 GB")
        assert not at.exception, _texts(at.exception)
        assert not at.get("plotly_chart") and "Simulate" in _texts(at.info)  # nothing heavy before the button
        assert not calls
        at.button(key="at_scale_run").click().run()
        _poll(at, lambda at: "at_scale_table" in at.session_state)
        yield at, calls
    finally:
        scale.TableSimulation.result = real  # type: ignore[method-assign]
        scale.on_gpu = real_device  # type: ignore[assignment]
        if workers is None:
            os.environ.pop("CKPTLAB_WORKERS", None)
        else:
            os.environ["CKPTLAB_WORKERS"] = workers


def test_the_page_is_in_the_app_navigation():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run()
    at.switch_page("pages/at_scale.py").run()
    assert not at.exception, _texts(at.exception)
    assert at.title[0].value == "At scale, simulated"


def test_a_real_shape_by_default_and_which_settings_will_be_simulated():
    at = _page()
    assert not at.exception, _texts(at.exception)
    assert at.selectbox(key="at_scale_model").value == "qwen3-8b" and at.number_input(key="at_scale_seq").value == 8192
    assert not at.toggle(key="at_scale_tiny").value
    assert "tiny-llama" not in at.selectbox(key="at_scale_model").options[0]
    assert "11 simulations" in _texts(at.markdown)  # off, 9 distinct n of 36, offload at n=1
    at.radio(key="at_scale_every").set_value("all").run()
    assert "38 simulations" in _texts(at.markdown)  # off, 36 values of n, offload at n=1


def test_simulate_shows_the_figures_labelled_simulated(simulated):
    at, calls = simulated
    assert not at.exception and not at.error, _texts(at.error)
    table = at.session_state["at_scale_table"]
    assert [setting.key for setting in table.settings] == ["off", "n=1", "n=1+offload", "n=2", "n=3", "n=6"]
    assert len(calls) == 6
    assert len(at.get("plotly_chart")) == 4  # peak, memory against predicted time, resident, diagram
    assert "Memory against time" in [header.value for header in at.subheader]
    columns = list(at.dataframe[-1].value.columns)  # the table: time beside memory
    assert "step, ms: predicted (roofline, H100 80 GB)" in columns and "× off's step" in columns
    assert "Checkpointing off" in _texts(at.success)  # a tiny model fits an H100 without checkpointing
    assert "simulated" in _texts(at.caption)
    assert at.selectbox(key="at_scale_show").value == "off"  # the verdict's setting is drawn
    assert at.get("arrow_data_frame") or at.dataframe


def test_changing_the_gpu_redraws_without_simulating_again(simulated):
    at, calls = simulated
    before, table = len(calls), at.session_state["at_scale_table"]
    job = at.session_state["at_scale_job"]
    at.selectbox(key="at_scale_gpu").set_value("L4 24 GB").run()
    assert not at.exception, _texts(at.exception)
    assert "L4 24 GB" in _texts(at.success) and len(at.get("plotly_chart")) == 4
    assert "predicted (roofline, L4 24 GB)" in _texts(at.success)  # the verdict's step time on the new GPU
    # A budget below every peak (tiny-llama needs about 53 MiB): the page says nothing fits, and by how much.
    at.selectbox(key="at_scale_gpu").set_value("custom").run()
    at.number_input(key="at_scale_budget_gib").set_value(0.01).run()
    assert not at.exception, _texts(at.exception)
    assert "Nothing simulated fits 0.01 GiB" in _texts(at.error)
    assert at.query_params["gpu"] == "0.01GiB"
    assert "predicted on an H100 80 GB's speed" in _texts(at.caption)  # a budget in GiB names no GPU
    # Another setting to draw: still only drawing.
    at.selectbox(key="at_scale_show").set_value("n=2").run()
    assert not at.exception and len(at.get("plotly_chart")) == 4
    assert at.session_state["at_scale_table"] is table and at.session_state["at_scale_job"] is job
    assert len(calls) == before


def test_a_sequence_beyond_the_positions_is_an_error_not_a_crash():
    at = _page(model="tiny-llama", seq="4096")  # tiny-llama has 2048 positions
    assert not at.exception, _texts(at.exception)
    assert "2048" in _texts(at.error)
    assert at.button(key="at_scale_run").disabled
    at.number_input(key="at_scale_seq").set_value(1024).run()
    assert not at.error and not at.button(key="at_scale_run").disabled


def test_a_bad_link_falls_back_with_warnings():
    at = _page(model="tiny-qwen3", seq="999999", gpu="no-such-card")
    assert not at.exception, _texts(at.exception)
    warnings = _texts(at.warning)
    assert "seq" in warnings and "no-such-card" in warnings
    assert at.selectbox(key="at_scale_gpu").value == "H100 80 GB"
    assert at.toggle(key="at_scale_tiny").value  # a tiny preset in the link shows the tiny presets


def test_a_link_opens_with_its_selective_policies_and_warns_of_an_unknown_one():
    at = _page(model="tiny-qwen3", seq="128", selective="matmuls,bogus")
    assert not at.exception, _texts(at.exception)
    assert at.multiselect(key="at_scale_selective").value == ["matmuls"]
    assert "bogus" in _texts(at.warning)


def test_stop_keeps_the_settings_simulated(monkeypatch):
    monkeypatch.setattr(scale, "on_gpu", lambda gpu=None: lambda result, budget: result)  # Stop, not the device total
    at = _page(model="tiny-qwen3", seq="128")  # not the fixture's model: nothing is in the shared cache yet
    at.radio(key="at_scale_every").set_value("all").run()  # 10 settings: Stop lands well before the last
    at.button(key="at_scale_run").click().run()
    _poll(at, lambda at: at.session_state["at_scale_job"].state().results or "at_scale_table" in at.session_state)
    at.button(key="at_scale_stop").click().run()
    _poll(at, lambda at: "at_scale_table" in at.session_state)
    assert not at.exception, _texts(at.exception)
    table = at.session_state["at_scale_table"]
    assert table.cancelled and 1 <= len(table.results) < 10
    assert "Stopped" in _texts(at.warning)
    assert (
        len(at.get("plotly_chart")) == 4
    )  # the peak, memory against time, resident, diagram  # what was simulated is drawn


def test_a_link_to_a_folder_the_server_does_not_offer_opens_the_default(tmp_path, monkeypatch):
    from tests.model.test_folders import config_folder

    monkeypatch.delenv("CKPTLAB_MODELS_ROOT", raising=False)
    at = _page(model="/etc")
    assert not at.exception
    assert (
        at.selectbox(key="at_scale_model").value == "qwen3-8b"
        and "local" not in at.selectbox(key="at_scale_model").options
    )
    assert "Local model folders are off on this server" in _texts(at.warning)
    config_folder(tmp_path / "mine")
    monkeypatch.setenv("CKPTLAB_MODELS_ROOT", str(tmp_path))
    at = _page(model=str(tmp_path / "mine"))
    assert not at.exception and at.selectbox(key="at_scale_local_dir").value == "mine"


def test_a_link_opens_with_its_attention():
    """The step box's keys in the page's link are their declarations' (ckptlab.spec_fields): attn= among them."""
    at = _page(model="tiny-qwen3", seq="128", attn="eager")
    assert not at.exception, _texts(at.exception)
    assert at.selectbox(key="at_scale_attention").value == "eager"


def test_longest_sequence_searches_off_and_n1_in_the_background_and_draws_its_table(monkeypatch):
    """The search stubbed (ckptlab.explore.longest.longest_seq answers at once): the button starts a job, the page
    draws its verdict, its provenance and one row per setting, and a new GPU only says the answer is for another."""
    from ckptlab.explore import longest
    from ckptlab.spec import Setting

    mib = 2**20
    searched: list = []

    def canned(spec, budget_bytes, *, simulate=None, gpu=None):
        searched.append(spec)
        key = Setting.of(spec).key
        if key == "off":
            return longest.LongestSeq(key, 1234, 90 * mib, 1235, 91 * mib, budget_bytes, 7, 2048)
        return longest.LongestSeq(key, 2048, 60 * mib, None, None, budget_bytes, 6, 2048)

    monkeypatch.setattr(longest, "longest_seq", canned)
    monkeypatch.setenv("CKPTLAB_WORKERS", "thread")  # the job on this process's thread, where the stub is
    at = _page(model="tiny-llama", seq="64", gpu="L4 24 GB")
    assert not at.exception, _texts(at.exception)
    assert "Longest sequence" in [button.label for button in at.button]
    at.button(key="at_scale_longest_run").click().run()
    _poll(at, lambda at: "at_scale_longest" in at.session_state)
    assert not at.exception and not at.error, _texts(at.error)

    found = at.session_state["at_scale_longest"]
    assert [setting.key for setting in found.settings] == ["off", "n=1", "n=1+offload"]  # of off, n=1 ... n=6
    assert [spec.every_n_layers for spec in searched] == [None, 1, 1] and {spec.seq_len for spec in searched} == {64}
    assert "**2,048 tokens**, with **n=1**" in _texts(at.success) and "the model's limit" in _texts(at.success)
    assert "simulated (fake tensors) · tiny-llama · batch 1 · 1 GPU · 3 settings searched" in _texts(at.caption)
    table = at.dataframe[0].value
    assert list(table["setting"]) == ["off", "n=1", "n=1+offload"]
    assert list(table["longest seq_len that fits"]) == ["1,234", "2,048", "2,048"]
    assert table["shortest that does not fit"][0] == "1,235"
    assert table["shortest that does not fit"][1] == "none: the model's limit (2,048) fits"
    assert "Set the model and shape" not in _texts(at.info)  # an answer is drawn: no "press Simulate"

    job = at.session_state["at_scale_job"]
    at.selectbox(key="at_scale_gpu").set_value("H100 80 GB").run()
    assert not at.exception, _texts(at.exception)
    assert "press **Longest sequence** again" in _texts(at.info) and at.session_state["at_scale_job"] is job
