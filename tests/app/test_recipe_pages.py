"""Trainer's side of the step (accumulation, mixed precision, clipping, Trainer's optimizers) on the Lab,
Trade-offs and At-scale pages: from the link, into the run, back into the link, in every language."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import ckptlab
from ckptlab.explore.sweep import plan_sweep
from ckptlab.show import i18n
from tests.app.given_sweep import give_sweep

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

APP = str(Path(__file__).resolve().parents[2] / "app.py")
TIMEOUT = 300  # real measured steps on 2 shared cores; AppTest's default 3 s is far too short
LANGS = list(i18n.LANGUAGES)
RECIPE = {"opt": "adamw_torch", "accum": "2", "mp": "bf16", "clip": "0.5"}


@pytest.fixture(autouse=True)
def in_the_servers_threads(monkeypatch):
    """The pages' jobs in this process (CKPTLAB_WORKERS=thread): the At-scale simulations start no worker process (the
    tests wait on the job's thread, no page rerun beside it); the same jobs in worker processes are
    tests/lab/test_jobs_in_workers.py's."""
    monkeypatch.setenv("CKPTLAB_WORKERS", "thread")


def _texts(elements) -> str:
    return "\n".join(str(element.value) for element in elements)


def _open(page: str | None, lang: str, **query: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({"lang": lang, **query})
    at.run()
    if page is not None:
        at.switch_page(page).run()
    assert not at.exception, _texts(at.exception)
    return at


def _boxes(at: AppTest, prefix: str) -> tuple:
    return (
        at.selectbox(key=f"{prefix}_optimizer").value,
        at.number_input(key=f"{prefix}_accumulation").value,
        at.selectbox(key=f"{prefix}_mixed_precision").value,
        at.number_input(key=f"{prefix}_max_grad_norm").value,
    )


LAB_LINK = {"model": "tiny-llama", "seq": "64", "repeats": "1", "warmup": "0", "n": "1", **RECIPE}


# The languages differ in words only: each reads the link into its boxes and words the step's box; one language
# runs the pages for real (a run's figures and the link it writes back do not depend on the words).
@pytest.mark.parametrize("lang", LANGS)
def test_the_lab_page_reads_the_recipe_of_its_link_in_every_language(lang):
    at = _open(None, lang, **LAB_LINK)
    assert _boxes(at, "lab") == ("adamw_torch", 2, "bf16", 0.5)
    assert i18n.t("training.step", lang) in [expander.label for expander in at.expander]
    assert "gradient_accumulation_steps=2" in _texts(at.code) and "bf16=True" in _texts(at.code)


# A measured run the stubbed Run answers with: the setting tests/app/test_app.py measures too (the process-wide
# result cache measures it once). What is drawn from a real run is test_app's default run; that the page's
# figures are the core's for the spec it asked, test_lab_selective's.
DRAWN = ckptlab.RunSpec(model="tiny-llama", seq_len=128, repeats=1, warmup=1, every_n_layers=1)


def test_the_lab_page_runs_the_recipe_of_its_link_and_keeps_it_in_the_link(monkeypatch):
    import ckptlab.lab.run as labrun

    drawn = labrun.run_queued(DRAWN)
    asked = []

    def run_queued(spec, **kwargs):  # the page's one call on Run (pages/lab.py looks it up on each Run)
        asked.append(spec)
        return drawn

    monkeypatch.setattr(labrun, "run_queued", run_queued)
    at = _open(None, "en", **LAB_LINK)
    at.button(key="lab_run").click().run()
    assert not at.exception and not at.error, _texts(at.exception) + _texts(at.error)
    [spec] = asked
    assert (spec.optimizer, spec.gradient_accumulation_steps, spec.mixed_precision, spec.max_grad_norm) == (
        "adamw_torch",
        2,
        "bf16",
        0.5,
    )
    assert at.session_state["lab_last"] is drawn  # the page keeps and draws what its run answered
    assert {key: at.query_params[key] for key in RECIPE} == RECIPE


def test_the_trade_offs_sweep_runs_every_row_with_the_recipe(monkeypatch):
    # The sweep stubbed: what the page hands it is proven here; a real sweep from the page is test_tradeoffs_page's,
    # every row measured with SweepSpec.run_spec is tests/explore/test_sweep.py's, a measured step with each part of
    # the recipe tests/step/test_recipe.py's.
    given = give_sweep(monkeypatch)
    at = _open("pages/tradeoffs.py", "en")
    at.selectbox(key="tradeoffs_model").set_value("tiny-llama")
    at.multiselect(key="tradeoffs_seq").set_value([64])
    at.toggle(key="tradeoffs_choose_n").set_value(True).run()
    at.multiselect(key="tradeoffs_n").set_value([1])
    at.number_input(key="tradeoffs_repeats").set_value(1)
    at.number_input(key="tradeoffs_warmup").set_value(0)
    at.number_input(key="tradeoffs_accumulation").set_value(2)
    at.selectbox(key="tradeoffs_mixed_precision").set_value("bf16").run()
    at.button(key="tradeoffs_run").click().run()
    at.session_state["tradeoffs_job"].join()  # the sweep's thread: wait on it, not on a clock
    at.run()
    at.run()
    assert not at.exception and not at.error, _texts(at.exception) + _texts(at.error)
    [spec] = given.asked
    rows = [  # every row the sweep runs, as it runs it
        spec.run_spec(length, n, offload, selective=policy, attn_implementation=attention)
        for length, n, offload, policy, attention in plan_sweep(spec).rows
    ]
    assert [row.every_n_layers for row in rows] == [None, 1]
    assert {(row.gradient_accumulation_steps, row.mixed_precision) for row in rows} == {(2, "bf16")}


@pytest.mark.parametrize("lang", LANGS)
def test_the_at_scale_page_reads_the_recipe_of_its_link_in_every_language(lang):
    at = _open("pages/at_scale.py", lang, model="tiny-llama", seq="128", **RECIPE)
    assert _boxes(at, "at_scale") == ("adamw_torch", 2, "bf16", 0.5)


def test_the_at_scale_simulations_take_the_recipe_of_the_link():
    at = _open("pages/at_scale.py", "en", model="tiny-llama", seq="128", **RECIPE)
    at.button(key="at_scale_run").click().run()
    at.session_state["at_scale_job"].join()  # the simulations' thread: wait on it, not on a clock
    at.run()
    assert not at.exception and not at.error, _texts(at.exception) + _texts(at.error)
    table = at.session_state["at_scale_table"]
    assert {
        (r.spec.gradient_accumulation_steps, r.spec.mixed_precision, r.spec.max_grad_norm) for r in table.results
    } == {(2, "bf16", 0.5)}
    assert {key: at.query_params[key] for key in RECIPE} == RECIPE


@pytest.mark.parametrize("lang", LANGS)
def test_past_one_gpu_the_at_scale_page_says_mixed_precision_is_fsdp2s_policy(lang):
    words = i18n.t("fsdp.mixed_precision_policy", lang, gpus=2, dtype="bf16", param_dtype="bfloat16")
    at = _open("pages/at_scale.py", lang, model="tiny-llama", seq="128", mp="bf16")
    assert words not in _texts(at.sidebar.caption)  # one GPU: autocast, as the box's own help says
    at.selectbox(key="at_scale_gpus").set_value(2).run()
    assert words in _texts(at.sidebar.caption)


@pytest.mark.parametrize("lang", ["en", "ja"])
def test_the_at_scale_page_says_when_the_float32_logits_set_the_peak(lang):
    at = _open("pages/at_scale.py", lang, model="tiny-llama", seq="256", opt="none")
    at.button(key="at_scale_run").click().run()
    at.session_state["at_scale_job"].join()  # the simulations' thread: wait on it, not on a clock
    at.run()
    assert not at.exception and not at.error, _texts(at.exception) + _texts(at.error)
    table = at.session_state["at_scale_table"]
    shown = table.result_for(next(s for s in table.settings if s.key == at.session_state["at_scale_show"]))
    assert shown.memory.logits_set_the_peak  # without an optimizer the loss's backward is tiny-llama's peak
    opening = i18n.t("scale.logits_peak", lang).split("{")[0]
    assert any(str(caption.value).startswith(opening) for caption in at.caption), _texts(at.caption)
