"""The app in a real browser: the three people's paths at projector size (1280x720), a participant, an instructor
with the room, an engineer, and what only a browser shows (a link to a page as a new server's first request, every
page in Japanese, Play's fragment timer, Cancel of a run in flight; the participant's cookie rides along the
participant's and the instructor's journeys).

One `streamlit run app.py` for the module, Debian's Chromium through playwright: a server's start and its first pages
cost seconds of both cores, so every browser test shares this one (issue 42), and its measured runs are shared by
the journeys, so the second language reuses the first's. At every step of a
journey the page must show no exception and every figure's words must fit: plotly draws a title in one SVG
``<text>`` and lets the SVG clip it, so each text's box is compared with its figure's, and no two of a figure's
words may overlap (:func:`check_page`). The machine's load is no part of a journey: the server starts with the
timing verdict stubbed busy (``journey_site/sitecustomize.py``), so the timing exercise's answer is always the
one for a busy machine. The last step's screenshots land in artifacts/ for a person to look at.

On the code before issue 43 the engineer's journey failed at "lab run with LoRA and accumulation" (run: the
diagram's and the memory figure's titles cut by the figure's edge). Not run there, by what the code did: the
participant's stops at *Next* after an answer (``ValueError: '1. ★ …' is not in list``, reproduced by AppTest in
tests/app/test_exercise_picker.py) and at the timed exercise (no "not measurable here, now"); the instructor's at
"the room's box is the only answer box" (the page's own copy of the exercise was drawn under it).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from ckptlab.show import i18n
from tests.app.test_app import PAGES
from tests.app.wire import CHROMIUM, CHROMIUM_ARGS, HANG_MS, ROOT, serve

playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
expect = playwright_api.expect
pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
]

SECRET = "heron at noon"
VIEWPORT = {"width": 1280, "height": 720}  # a projector
SITE = Path(__file__).resolve().parent / "journey_site"  # the busy stub, loaded by the server's interpreter
LANGS = ["en", "pt-BR"]
ARTIFACTS = ROOT / "artifacts"

# Every word plotly drew in the page's figures: its box in page pixels, its figure's box and what kind it is.
# Hover labels and empty texts are left out; a rotated text's box is its rotated extent (getBoundingClientRect).
FIGURE_WORDS_JS = """
() => [...document.querySelectorAll('.stPlotlyChart')].map((chart, index) => {
  const svg = chart.querySelector('svg.main-svg');
  if (!svg) return null;
  const frame = svg.getBoundingClientRect();
  const words = [...chart.querySelectorAll('svg text')]
    .filter(text => !text.closest('.hoverlayer') && text.textContent.trim()
                    && getComputedStyle(text).visibility !== 'hidden' && getComputedStyle(text).display !== 'none'
                    && Number(getComputedStyle(text).opacity || 1) > 0)
    .map(text => {
      const box = text.getBoundingClientRect();
      const kind = text.closest('.xtick,.ytick,.x2tick,.y2tick') ? 'tick'
        : text.closest('.legend') ? 'legend'
        : text.classList.contains('gtitle') ? 'title'
        : text.closest('.annotation') ? 'annotation'
        : text.closest('.g-xtitle,.g-ytitle,.g-x2title,.g-y2title') ? 'axis title'
        : 'trace text';
      // A bar's own words: the box of the bar they belong to (a bar trace's point holds its path and its text).
      const point = text.closest('.point');
      const path = point && point.querySelector('path');
      const bar = path ? path.getBoundingClientRect() : null;
      const tick = text.closest('.xtick,.ytick,.x2tick,.y2tick');
      return {text: text.textContent, kind, axis: tick ? tick.getAttribute('class') : null, left: box.left, right: box.right, top: box.top, bottom: box.bottom,
              width: box.width, height: box.height,
              bar: bar && bar.width > 0 ? {left: bar.left, right: bar.right, top: bar.top, bottom: bar.bottom} : null};
    })
    .filter(word => word.width > 0 && word.height > 0);
  // Plotly's toolbar (the modebar), over the figure's top right: shown on hover, so nothing may sit under it.
  const modebar = chart.querySelector('.modebar');
  const bar = modebar ? modebar.getBoundingClientRect() : null;
  const toolbar = bar && bar.width > 0 ? {left: bar.left, right: bar.right, top: bar.top, bottom: bar.bottom} : null;
  return {index, left: frame.left, right: frame.right, top: frame.top, bottom: frame.bottom, words, toolbar};
}).filter(Boolean)
"""
SLACK_PX = 1.0  # sub-pixel rounding of the boxes
LEAST_WORD_PX = 10  # a word's box at the smallest font that reads on a projector (plotly shrinks bar words to fit)


def _overlap(one: dict, other: dict) -> bool:
    overlap_x = min(one["right"], other["right"]) - max(one["left"], other["left"])
    overlap_y = min(one["bottom"], other["bottom"]) - max(one["top"], other["top"])
    return overlap_x > SLACK_PX and overlap_y > SLACK_PX


def _inside_its_bar(word: dict) -> bool:
    """Whether a bar's word is written inside the bar (its middle in the bar's box), not over or beside it."""
    bar = word.get("bar")
    if not bar:
        return False
    middle_x, middle_y = (word["left"] + word["right"]) / 2, (word["top"] + word["bottom"]) / 2
    return bar["left"] <= middle_x <= bar["right"] and bar["top"] <= middle_y <= bar["bottom"]


def figure_problems(figures: list[dict]) -> list[str]:
    """Words cut by their figure's edge, too small to read, wider than the bar they are written in (its neighbours
    cover the rest: "erun"), under plotly's toolbar, or overlapping another word of the same figure (tick labels
    of one axis included: one kept horizontal runs into its neighbour; two axes' first ticks may meet at the corner)."""
    problems = []
    for figure in figures:
        words = figure["words"]
        for word in words:
            outside_x = word["left"] < figure["left"] - SLACK_PX or word["right"] > figure["right"] + SLACK_PX
            if outside_x or word["top"] < figure["top"] - SLACK_PX or word["bottom"] > figure["bottom"] + SLACK_PX:
                problems.append(f"figure {figure['index']}: {word['kind']} {word['text']!r} is cut by the edge")
            if word["height"] < LEAST_WORD_PX:
                problems.append(
                    f"figure {figure['index']}: {word['kind']} {word['text']!r} is {word['height']:.0f} px tall"
                )
            bar = word.get("bar")
            if _inside_its_bar(word) and (
                word["left"] < bar["left"] - SLACK_PX or word["right"] > bar["right"] + SLACK_PX
            ):
                problems.append(f"figure {figure['index']}: {word['text']!r} is wider than its bar")
            if figure.get("toolbar") and word["kind"] == "annotation" and _overlap(word, figure["toolbar"]):
                problems.append(f"figure {figure['index']}: {word['kind']} {word['text']!r} is under the toolbar")
        for i, one in enumerate(words):
            for other in words[i + 1 :]:
                if one["kind"] == other["kind"] == "tick" and one["axis"] != other["axis"]:
                    continue
                if _overlap(one, other):
                    problems.append(
                        f"figure {figure['index']}: {one['kind']} {one['text']!r} overlaps {other['kind']} {other['text']!r}"
                    )
    return problems


# Every chart on the page drawn by plotly (its SVG holds words): FIGURE_WORDS_JS leaves a chart not yet drawn out.
CHARTS_DRAWN_JS = (
    "() => [...document.querySelectorAll('.stPlotlyChart')].every(c => c.querySelector('svg.main-svg text'))"
)


def settled_figures(page) -> list[dict]:
    """The figures' words once every chart is drawn and two reads 100 ms apart agree: boxes read while plotly lays
    a figure out again are not the ones drawn. Both are conditions the page is polled for, within HANG_MS as every
    other wait here, not a fixed time."""
    page.wait_for_function(CHARTS_DRAWN_JS, timeout=HANG_MS)
    page.evaluate("() => { window.ckptlabWords = null; }")
    settled = page.wait_for_function(
        f"""() => {{
          const now = JSON.stringify(({FIGURE_WORDS_JS.strip()})());
          const same = window.ckptlabWords === now;
          window.ckptlabWords = now;
          return same && now;
        }}""",
        polling=100,
        timeout=HANG_MS,
    )
    return json.loads(settled.json_value())


# What st.metric cuts: a metric's value or label wider than its column ends in "…" (a box of it that hides its
# overflow is narrower than its text).
METRICS_CUT_JS = """
() => [...document.querySelectorAll('[data-testid=stMetricValue], [data-testid=stMetricLabel]')].map(part => {
  const cut = [part, ...part.querySelectorAll('*')].some(box => box.scrollWidth > box.clientWidth + 1
    && getComputedStyle(box).overflowX !== 'visible');
  return cut ? `metric ${part.dataset.testid === 'stMetricValue' ? 'value' : 'label'} `
               + `${JSON.stringify(part.innerText)} is cut` : null;
}).filter(Boolean)
"""
# A table wider than the page scrolls sideways: its scroller wider than what shows. Checked on the Lab's tables (issue
# 58); At scale's table of every setting is wider still (1,074 px more at 1280x720), not fixed yet.
TABLES_CUT_JS = """
() => [...document.querySelectorAll('[data-testid=stDataFrame] .dvn-scroller')].map(scroller =>
  scroller.scrollWidth > scroller.clientWidth + 1
    ? `table is ${scroller.scrollWidth - scroller.clientWidth} px wider than the page shows` : null
).filter(Boolean)
"""


def check_page(page, step: str, *, tables: bool = False) -> None:
    """No exception on the page, every figure's words inside it and apart, no metric cut, and with ``tables`` no
    table wider than the page."""
    problems = figure_problems(settled_figures(page)) + page.evaluate(METRICS_CUT_JS)
    problems += page.evaluate(TABLES_CUT_JS) if tables else []
    exceptions = page.locator("[data-testid='stException'], .stException")
    assert not exceptions.count(), f"{step}: {exceptions.first.inner_text()}"
    assert not problems, f"{step}: " + "; ".join(problems)


# Every button of the page's segmented controls (the lesson's part picker): its label, its box, whether what the
# browser draws at its centre is the button itself (not Next, not a neighbour), and whether its text is cut short.
PICKER_JS = """
() => [...document.querySelectorAll("[data-testid='stButtonGroup']")].flatMap(group => {
  const frame = group.getBoundingClientRect();
  return [...group.querySelectorAll('button')].map(button => {
    const box = button.getBoundingClientRect();
    button.scrollIntoView({block: 'nearest'});
    const seen = button.getBoundingClientRect();
    const hit = document.elementFromPoint(seen.left + seen.width / 2, seen.top + seen.height / 2);
    const label = button.querySelector('p') || button;
    return {text: button.innerText.trim(), inside: box.left >= frame.left - 1 && box.right <= frame.right + 1
              && box.right <= window.innerWidth, covered: !(hit && button.contains(hit)),
            cut: label.scrollWidth > label.clientWidth + 1};
  });
})
"""


def picker_problems(page, lang: str) -> list[str]:
    """The lesson's part picker: each of its parts' labels shown whole, inside the page, under nothing."""
    from ckptlab.lab.learn import LESSON_PARTS

    last = f"{len(LESSON_PARTS)}. {words(f'lesson.{LESSON_PARTS[-1].name}.tab', lang)}"
    page.locator("[data-testid='stButtonGroup'] button").filter(has_text=last).first.wait_for(timeout=HANG_MS)
    buttons = {button["text"]: button for button in page.evaluate(PICKER_JS)}
    problems = []
    for number, part in enumerate(LESSON_PARTS, start=1):
        label = f"{number}. {words(f'lesson.{part.name}.tab', lang)}"
        button = buttons.get(label)
        if button is None:
            problems.append(f"{label!r} is not shown")
        elif not button["inside"] or button["covered"] or button["cut"]:
            problems.append(f"{label!r} is cut or covered: {button}")
    return problems


LESSON_FIGURES = {
    "attention": "breakdown.title_after_forward",
    "shrink": "breakdown.title",
    "qlora": "sharding_fig.title",
}


def walk_lesson_parts(page, lang: str) -> None:
    """Open the lesson's parts of :data:`LESSON_FIGURES` by the picker's buttons, wait for each one's own figure (by its
    title: a simulated part draws none while it simulates), check its figures' words (titles, ticks, axis titles,
    legends: inside their figure and apart), and take a picture of the figure in artifacts/."""
    for name, title in LESSON_FIGURES.items():
        button = page.locator("[data-testid='stButtonGroup'] button")
        button.filter(has_text=words(f"lesson.{name}.tab", lang)).first.click()
        page.get_by_text(words(f"lesson.{name}.title", lang)).first.wait_for(timeout=HANG_MS)
        figure_title(page, title, lang).wait_for(timeout=HANG_MS)
        check_page(page, f"lesson part {name} ({lang})")
        scrolled_to(page.locator(".stPlotlyChart").first)
        shoot(page, f"lesson-{name}-{lang}")


def words(key: str, lang: str, **values: object) -> str:
    return i18n.t(key, lang, **values)


def figure_title(page, key: str, lang: str):
    """The figure title worded by ``key``, found by its fixed words (its placeholders left out): a wrapped title's
    lines (SVG tspans) run together without the space at the break."""
    fixed = max(words(key, lang, setting="\0", seen="\0").split("\0"), key=len).strip(" :()")
    pattern = re.compile(r"\s*".join(map(re.escape, fixed.split())))
    return page.locator("svg text.gtitle").filter(has_text=pattern).first


@pytest.fixture(scope="module")
def server():
    env = {
        "CKPTLAB_INSTRUCTOR_SECRET": SECRET,
        # The cancel journey starts a Run of minutes on purpose (to stop it): a server refuses a Run its limit would
        # stop (issue 58's honest waits), so this one's limit is an hour; no other journey reaches it.
        "CKPTLAB_RUN_LIMIT_S": "3600",
        "PYTHONPATH": os.pathsep.join([str(SITE), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    with serve("streamlit-journeys.log", env) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def new_page(browser):
    """Opens a tab of its own (a person of its own) at projector size; a loaded server may take long to answer.

    Every tab a journey opened is closed when it ends: a tab left open keeps its session alive on the server, and
    the room's pages rerun a fragment every few seconds, so the tabs of earlier journeys would load the server
    under the later ones (on CI the engineer's At-scale simulation waited 300 s behind them and failed)."""
    contexts = []

    def open_tab():
        context = browser.new_context(viewport=VIEWPORT, accept_downloads=True)
        contexts.append(context)
        page = context.new_page()
        page.set_default_navigation_timeout(HANG_MS)
        return page

    yield open_tab
    for context in contexts:
        context.close()


def lab_run(page, url: str, lang: str, query: str) -> None:
    """The Lab page at ``query``, Run pressed, and its result drawn (the metrics, which only a result has)."""
    page.goto(f"{url}/?lang={lang}&{query}")
    run = page.get_by_role("button", name=words("lab.run", lang), exact=True)
    run.wait_for(timeout=HANG_MS)
    figure_title(page, "fig.plan_title", lang).wait_for(timeout=HANG_MS)  # the page's first run has ended
    run.click()
    page.locator("[data-testid='stMetric']").first.wait_for(timeout=HANG_MS)
    figure_title(page, "fig.what_step_did", lang).wait_for(timeout=HANG_MS)


def open_page(new_page, url: str, lang: str, address: str):
    """A new tab on the page at ``address`` (its file's name under st.navigation), as a link shared in a room opens
    it: the Lab page's run is no part of a participant's way in."""
    page = new_page()
    page.goto(f"{url}/{address}?lang={lang}")
    return page


def participant_key(page) -> str:
    """The participant key a small script keeps in a cookie, once the Exercises page has drawn (the script sits after
    the room's part of the page)."""
    page.wait_for_function("document.cookie.includes('ckptlab_participant=')", timeout=HANG_MS)
    return next(c["value"] for c in page.context.cookies() if c["name"] == "ckptlab_participant")


# The scripts in the page that write the key: a session that found no key of this browser adds one; they stay in the
# page once run.
KEY_WRITERS_JS = (
    "() => [...document.querySelectorAll('script')].filter(s => s.textContent.includes('ckptlab_participant=')).length"
)


def shoot(page, name: str) -> None:
    """The page once its run has ended (not faded mid-rerun), in artifacts/."""
    page.locator("[data-testid='stStatusWidget']").wait_for(state="hidden", timeout=HANG_MS)
    page.wait_for_timeout(500)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"journey-{name}.png"))


def test_a_link_to_a_page_as_the_new_servers_first_request_gets_the_app_around_it(server, new_page):
    """Before app.py has ever run, Streamlit serves a pages/ folder in its older mode and runs the page alone (no
    navigation, no language selector); each page leaves that mode and reruns. First in this module: the server's first
    request."""
    page = new_page()
    page.goto(f"{server}/at_scale?lang=ja", timeout=HANG_MS)
    sidebar = page.locator("section[data-testid='stSidebar']")
    expect(sidebar.get_by_text("Language · Idioma · 言語")).to_be_visible(timeout=HANG_MS)
    expect(sidebar.get_by_text("at scale", exact=True)).to_have_count(0)  # no pages/ file-name entries


@pytest.mark.parametrize("lang", LANGS)
def test_a_participant_walks_the_lesson_then_the_exercises(server, new_page, lang):
    page = open_page(new_page, server, lang, "lesson")
    page.get_by_text(words("lesson.activation.title", lang)).first.wait_for(timeout=HANG_MS)
    page.locator(".stPlotlyChart").first.wait_for(timeout=HANG_MS)
    check_page(page, "lesson part 1")
    page.locator("[data-testid='stButtonGroup'] button").filter(
        has_text=words("lesson.every_n.tab", lang)
    ).first.click()
    page.get_by_text(words("lesson.every_n.title", lang)).first.wait_for(timeout=HANG_MS)
    page.locator(".stPlotlyChart").first.wait_for(timeout=HANG_MS)
    check_page(page, "lesson part 3")
    assert not picker_problems(page, lang), picker_problems(page, lang)
    # The parts whose rotated labels were cut at 1280x720 (issue 58), and the attention part's figure after the forward
    walk_lesson_parts(page, lang)

    page.get_by_role("link", name=words("nav.exercises_page", lang)).first.click()
    page.get_by_text(words("exercises.score_title", lang)).wait_for(timeout=HANG_MS)
    walked = ["resident_all", "resident_half", "step_time"]  # the warm-up, its half, and a timed one (stubbed busy)
    for done, exercise_id in enumerate(walked, start=1):
        page.get_by_role("button", name=words("exercises.submit", lang)).click()
        page.get_by_text(words("exercises.result_title", lang)).first.wait_for(
            timeout=HANG_MS
        )  # a stale copy may linger
        page.get_by_text(words("exercises.answered", lang, done=done, total=7)).wait_for(timeout=HANG_MS)
        check_page(page, f"exercise {exercise_id} answered")
        if done < len(walked):
            page.get_by_role("button", name=words("exercises.next", lang)).click()
            name = words(f"exercise.{walked[done]}.name", lang)
            page.get_by_role("heading", name=name, exact=True).first.wait_for(
                timeout=HANG_MS
            )  # a stale copy may linger
            check_page(page, f"exercise {walked[done]} picked by Next")
    # The timed exercise on a machine the lab judges too busy: no points and none possible (it says so), and the page
    # says why: the two other answers count, of 3 points each.
    page.get_by_text(words("verdict.busy", lang)).first.wait_for(timeout=HANG_MS)
    score = page.locator("[data-testid='stSidebar'] [data-testid='stMetricValue']").first.inner_text()
    assert re.fullmatch(r"\d+ / 6", score.strip()), score
    shoot(page, f"participant-{lang}")
    # A new tab of the same browser is the same participant: its session reads the cookie back and keeps the key.
    key = participant_key(page)
    second = page.context.new_page()
    second.goto(f"{server}/exercises?lang={lang}")
    second.get_by_text(words("exercises.score_title", lang)).first.wait_for(timeout=HANG_MS)
    second.locator("[data-testid='stStatusWidget']").wait_for(state="hidden", timeout=HANG_MS)  # its run has ended
    assert second.evaluate(KEY_WRITERS_JS) == 0  # it wrote no key of its own over the browser's
    assert len(key) == 32 and participant_key(second) == key
    second.close()

    # Exercise 6, the budget (issue 58): five settings in two panels across the page, their names ("desligado",
    # "n=1") apart and the step times over the bars at a size that reads.
    for exercise_id in ("peak_short", "keep_attention", "budget"):
        page.get_by_role("button", name=words("exercises.next", lang)).click()
        name = words(f"exercise.{exercise_id}.name", lang)
        page.get_by_role("heading", name=name, exact=True).first.wait_for(timeout=HANG_MS)
    page.get_by_role("button", name=words("exercises.submit", lang)).click()
    page.get_by_text(words("exercises.answered", lang, done=len(walked) + 1, total=7)).wait_for(timeout=HANG_MS)
    check_page(page, "exercise budget answered")
    scrolled_to(page.locator(".stPlotlyChart").last)
    shoot(page, f"participant-budget-{lang}")


@pytest.mark.parametrize("lang", LANGS)
def test_an_instructor_runs_a_round_with_two_participants(server, new_page, lang):
    """The participants' pages follow the round by their fragment's timer alone (no reload); in the second language
    the instructor's page is in English: one room, each person in their own language."""
    participants = [open_page(new_page, server, lang, "exercises") for _ in range(2)]
    for participant in participants:
        participant.get_by_text(words("exercises.score_title", lang)).wait_for(timeout=HANG_MS)
    keys = [participant_key(participant) for participant in participants]
    assert keys[0] != keys[1]  # two browsers: two participants, each with a key of its own
    teacher_lang = LANGS[0]
    teacher = open_page(new_page, server, teacher_lang, "instructor")
    phrase = teacher.get_by_label(words("classroom.secret", teacher_lang))
    phrase.fill(SECRET)
    phrase.press("Enter")
    teacher.get_by_role("button", name=words("classroom.open", teacher_lang)).click(timeout=HANG_MS)
    close = teacher.get_by_role("button", name=words("classroom.close", teacher_lang))
    close.wait_for(timeout=HANG_MS)
    number = int(re.search(r"\d+", teacher.get_by_text(re.compile(r"\d")).first.inner_text() or "1").group())
    check_page(teacher, "round open")

    for guess, participant in zip((60, 80), participants):
        title = participant.get_by_role(
            "heading", name=re.compile(re.escape(words("classroom.room_title", lang, number=99)).replace("99", r"\d+"))
        )
        # no reload: the page's fragment asks the room (while its rerun ends, a stale copy of the heading may linger)
        title.first.wait_for(timeout=HANG_MS)
        # During the round the room's box is the only answer box on the page (the page's own copy goes once the
        # rerun the room asked for has ended: until then its elements linger, stale).
        own = participant.get_by_role("button", name=words("exercises.submit", lang))
        playwright_api.expect(own).to_have_count(0, timeout=HANG_MS)
        box = participant.locator("[data-testid='stNumberInput'] input").first
        box.fill(str(guess))
        box.press("Enter")
        participant.get_by_role("button", name=words("classroom.submit", lang)).click()
        participant.get_by_text(words("classroom.your_answer", lang, value=guess)).wait_for(timeout=HANG_MS)
        # Sent: the button says so and is off (it looked live after sending, issue 58).
        expect(participant.get_by_role("button", name=words("classroom.sent", lang))).to_be_disabled(timeout=HANG_MS)
        check_page(participant, "answered in the room")
    teacher.locator("[data-testid='stMetricValue']").get_by_text("2", exact=True).wait_for(timeout=HANG_MS)

    close.click()
    people = (
        ("instructor", teacher, teacher_lang),
        *((f"participant {i}", p, lang) for i, p in enumerate(participants, 1)),
    )
    for who, page, page_lang in people:
        page.get_by_text(
            re.compile(re.escape(words("classroom.result_title", page_lang, number=99)).replace("99", r"\d+"))
        ).first.wait_for(timeout=HANG_MS)
        page.get_by_text(words("classroom.measured", page_lang)).first.wait_for(timeout=HANG_MS)
        page.locator(".stPlotlyChart").first.wait_for(timeout=HANG_MS)
        check_page(page, f"round closed, {who}")
    del number
    shoot(teacher, f"instructor-{lang}")
    shoot(participants[0], f"room-participant-{lang}")


@pytest.mark.parametrize("lang", LANGS)
def test_an_engineer_measures_a_recipe_then_sizes_it_at_scale(server, new_page, lang):
    page = new_page()
    page.goto(f"{server}/?lang={lang}&seq=64&repeats=1&warmup=0&n=2&lora=8&accum=2")
    run = page.get_by_role("button", name=words("lab.run", lang), exact=True)
    run.wait_for(timeout=HANG_MS)
    figure_title(page, "fig.plan_title", lang).wait_for(timeout=HANG_MS)  # the plan, before a run
    run.click()
    download = page.get_by_role("button", name=words("lab.download_json", lang))
    download.wait_for(timeout=HANG_MS)
    figure_title(page, "fig.what_step_did", lang).wait_for(timeout=HANG_MS)
    # The planned chart of the previous script run lingers (stale) until this run finishes.
    expect(page.locator(".stPlotlyChart")).to_have_count(
        3, timeout=HANG_MS
    )  # diagram, where the memory goes, comparison
    expect(page.locator("svg text").filter(has_text=re.compile(r"^L3")).first).to_be_visible()  # a layer's box
    check_page(page, "lab run with LoRA and accumulation")
    with page.expect_download() as saving:
        download.click()
    result = json.loads(Path(saving.value.path()).read_text())
    assert result["spec"]["lora_rank"] == 8 and result["spec"]["gradient_accumulation_steps"] == 2

    page.get_by_role("link", name=words("nav.at_scale_page", lang)).first.click()
    page.get_by_role("button", name=words("at_scale.simulate", lang), exact=True).click(timeout=HANG_MS)
    verdict = page.locator("[data-testid='stAlert']").filter(has_text="GiB").first
    verdict.wait_for(timeout=HANG_MS)
    page.locator(".stPlotlyChart").first.wait_for(timeout=HANG_MS)
    check_page(page, "at scale: qwen3-8b at 8,192 tokens on an H100 80 GB")
    fitting = [row for row in page.locator("[data-testid='stAlert']").first.inner_text().splitlines() if row.strip()]
    assert "bfloat16" in " ".join(fitting)  # the verdict says the precision it assumed
    assert page.get_by_role("button", name=words("at_scale.try_float32_mixed", lang).replace("`", "")).count() == 1
    # Issue 59: time beside memory. The verdict says the chosen setting's predicted step and the memory-against-time
    # chart is drawn (check_page above read its words at 1280x720). The table's time columns are not checked here:
    # st.dataframe draws on a canvas, and its accessible grid was not in the page (the AppTest of the page reads them).
    time_title = words("scale_figures.time_title", lang, model="\0", seq_len=0).split("\0")[0].strip(" :")
    chart = page.locator("svg text.gtitle").filter(has_text=re.compile(r"\s*".join(map(re.escape, time_title.split()))))
    expect(chart.first).to_be_visible(timeout=HANG_MS)
    step = words("at_scale.predicted_step_alone", lang, ms="\0", provenance="\0").split("\0")[0].strip()
    assert step in " ".join(fitting), fitting  # "Step time: 1,234.5 ms, x1.05 ..., predicted (roofline, H100 80 GB)."
    scrolled_to(chart.first)
    shoot(page, f"at-scale-time-{lang}")
    scrolled_to(page.locator("[data-testid='stDataFrame']").last)
    shoot(page, f"at-scale-table-{lang}")  # the time columns, for a person to look at
    scrolled_to(page.locator("[data-testid='stAlert']").first)
    shoot(page, f"at-scale-{lang}")

    # The fewest GPUs, on a small preset so the search stays cheap: its answer and the code to launch it.
    page.goto(f"{server}/at_scale?lang={lang}&model=tiny-llama&seq=64&gpu=H100%2080%20GB")
    page.get_by_role("button", name=words("at_scale.search", lang), exact=True).click(timeout=HANG_MS)
    # The answer's code box, which only the search draws. Not its header: on two runs of this module of 2026-12-04
    # the verdict and the code were drawn and the header above them was not, after the other journeys had loaded the
    # server (the job's end is drawn by a rerun its progress fragment asks for; not reproduced alone in 22 tries).
    code = page.locator("[data-testid='stCode']").first
    code.wait_for(timeout=HANG_MS)
    assert "from_pretrained" in code.inner_text() or "torchrun" in code.inner_text() or code.inner_text().strip()
    check_page(page, "fewest GPUs and the code")
    scrolled_to(code)
    shoot(page, f"engineer-code-{lang}")

    # The longest sequence per setting on the same page: tiny-llama's 2,048 positions fit an H100, so the answer is
    # the model's limit. From 1,024 tokens, two simulations a setting (from 64 it took six, 20 s more of the run).
    page.goto(f"{server}/at_scale?lang={lang}&model=tiny-llama&seq=1024&gpu=H100%2080%20GB")
    page.get_by_role("button", name=words("at_scale.longest", lang), exact=True).click(timeout=HANG_MS)
    longest = page.locator("[data-testid='stDataFrame']").first  # the table only this search draws (not its header,
    # which went missing once as the search's did above, in the second language, where every result was cached)
    longest.wait_for(timeout=HANG_MS)
    check_page(page, "the longest sequence that fits")
    at_limit = words("at_scale.longest_at_limit", lang, limit=2048).strip()  # every setting reaches it: off first
    page.locator("[data-testid='stAlert']").filter(has_text=at_limit).first.wait_for(timeout=HANG_MS)

    # gpt2-small's 12 layers with a selective policy (issue 58): the diagram in its 3/5 column (wrapped so each box
    # holds "rerun", its two-line subtitle given room), the breakdown's three bars (off, plain, the policy) labelled
    # horizontally, the metrics' numbers whole, the per-layer table inside the page. Eight tokens and no optimizer
    # keep its three runs short; the second language (and Japanese, after the first) reuses them.
    for shown_lang in (lang, "ja") if lang == LANGS[0] else (lang,):
        lab_run(page, server, shown_lang, "model=gpt2-small&seq=8&repeats=1&warmup=0&n=2&selective=matmuls&opt=none")
        page.get_by_text(words("lab.per_layer", shown_lang)).first.click()  # the table, folded away until asked
        # The selective table and the per-layer one, drawn once the expander opens.
        expect(page.locator("[data-testid='stDataFrame']")).to_have_count(2, timeout=HANG_MS)
        check_page(page, f"lab run of gpt2-small with a selective policy, {shown_lang}", tables=True)
        for element, where in (("diagram", ".stPlotlyChart"), ("metrics", "[data-testid='stMetric']")):
            scrolled_to(page.locator(where).first)
            shoot(page, f"lab-gpt2-selective-{shown_lang}-{element}")
        scrolled_to(page.locator("[data-testid='stDataFrame']").last)
        shoot(page, f"lab-gpt2-selective-{shown_lang}-table")


def scrolled_to(element, tries: int = 5) -> None:
    """Scroll ``element`` into view for a screenshot. The page's fragments redraw while it settles (a run's countdown),
    and an element found a moment ago may be replaced as Playwright reaches it ("not attached to the DOM"): look it up
    again (its locator does), a few times, then say so."""
    for attempt in range(tries):
        try:
            element.scroll_into_view_if_needed()
            return
        except playwright_api.Error:
            if attempt == tries - 1:
                raise


# -- what only a browser shows, on the same server --------------------------------------------------------------


def test_every_page_draws_in_japanese_without_an_exception(server, new_page):
    """Each page opened with ``?lang=ja`` shows its own heading in Japanese (from ja.json, the one the AppTest of the
    page checks in English) and runs its script to the end without an exception. The pictures land in
    ``$CKPTLAB_SCREENSHOTS`` when it is set, else in artifacts/screenshots-ja/; without a CJK font the Japanese shows
    as boxes: the pictures still tell whether a page drew."""
    folder = Path(os.environ.get("CKPTLAB_SCREENSHOTS") or ARTIFACTS / "screenshots-ja")
    folder.mkdir(parents=True, exist_ok=True)
    for page_file, (_, key) in PAGES.items():
        name = Path(page_file).stem
        address = "" if name == "lab" else name  # under st.navigation a page's address is its file's name
        page = new_page()
        page.goto(f"{server}/{address}?lang=ja", timeout=HANG_MS)
        heading = words(key, "ja")
        assert heading != words(key, "en")  # the page's own words in Japanese, not English
        page.get_by_role("heading", name=heading).first.wait_for(timeout=HANG_MS)
        # The script ran to its end: Streamlit's running indicator gone, no widget left a placeholder.
        expect(page.get_by_test_id("stStatusWidget")).to_be_hidden(timeout=HANG_MS)
        expect(page.get_by_test_id("stSkeleton")).to_have_count(0, timeout=HANG_MS)
        expect(page.locator(".stException")).to_have_count(0)
        shown = urlsplit(page.url)  # still this page, still in Japanese
        assert shown.path.strip("/") == address and parse_qs(shown.query)["lang"] == ["ja"]
        path = folder / f"{name}-ja.png"
        page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 10_000  # a picture, not an empty frame
        page.close()


def test_play_steps_through_the_training_step_in_japanese(server, new_page):
    """AppTest does not run a fragment's timer: Play moving the step-through on by itself is seen here."""
    page = new_page()
    page.goto(f"{server}/?lang=ja")  # the entry point first: st.navigation takes over the URLs
    page.get_by_role("link", name=words("nav.lesson_page", "ja")).first.click()
    page.get_by_text(words("lesson.activation.title", "ja")).first.wait_for(timeout=HANG_MS)
    # The picker and the lesson's figures in Japanese too (issue 58: the y title was cut, "ピーク時のメモリ (MiB")
    assert not picker_problems(page, "ja"), picker_problems(page, "ja")
    walk_lesson_parts(page, "ja")
    page.locator("[data-testid='stButtonGroup'] button").filter(has_text="ステップ実行").click()
    page.get_by_text("1回の学習ステップをイベントごとに").wait_for(timeout=HANG_MS)
    slider = page.locator("[data-testid='stSliderThumbValue']").first
    slider.get_by_text(re.compile(r"^1/\d+ · ")).wait_for(timeout=HANG_MS)
    page.get_by_role("button", name=re.compile("再生")).click()
    # The fragment's timer moves one event every PLAY_SECONDS: after a few seconds the slider is further on.
    slider.get_by_text(re.compile(r"^([4-9]|\d\d)/\d+ · ")).wait_for(timeout=HANG_MS)
    assert page.get_by_role("button", name=re.compile("一時停止")).count() == 1
    assert "lang=ja" in page.url
    assert not page.locator(".stException").count()
    page.screenshot(path=str(ARTIFACTS / "browser-lesson-play-ja.png"))


def test_cancel_stops_a_run_in_flight(server, new_page):
    """A long run (tiny-llama, 2048 tokens x 4, 20 timed steps: minutes on 2 cores), cancelled from the page. Last in
    this module: a cancelled run's worker ends its step before it stops."""
    page = new_page()
    page.goto(f"{server}/?seq=2048&batch=4&repeats=20&warmup=0&n=1")
    run = page.get_by_role("button", name="Run", exact=True)
    run.wait_for(timeout=HANG_MS)
    figure_title(page, "fig.plan_title", "en").wait_for(timeout=HANG_MS)
    run.click()
    page.get_by_text("timed step 1 of 20").first.wait_for(timeout=HANG_MS)  # the run is in flight
    page.get_by_role("button", name="Cancel", exact=True).click()
    page.get_by_text("Run cancelled").wait_for(timeout=HANG_MS)
    assert not page.get_by_text("Peak reached in:").count()  # nothing was measured
    assert not page.locator(".stException").count()
