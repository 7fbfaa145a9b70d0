"""The Trade-offs sidebar says which every_n_layers a sweep runs: no disabled chips "1 2 4" beside a sweep of every
value (cheap: the page is opened, nothing is swept)."""

from __future__ import annotations

from ckptlab.show import i18n
from tests.app.sessions import open_page


def test_the_sidebar_names_every_value_until_a_person_chooses_some():
    at = open_page("pages/tradeoffs.py", "en", timeout=60)
    assert not [box for box in at.multiselect if box.key == "tradeoffs_n"]
    assert i18n.t("tradeoffs.every_n_all", "en", layers=6) in [caption.value for caption in at.sidebar.caption]
    at.toggle(key="tradeoffs_choose_n").set_value(True).run()
    assert at.multiselect(key="tradeoffs_n").value == [1, 2, 4]
    at.multiselect(key="tradeoffs_n").set_value([3]).run()
    at.toggle(key="tradeoffs_choose_n").set_value(False).run()
    at.toggle(key="tradeoffs_choose_n").set_value(True).run()
    assert at.multiselect(key="tradeoffs_n").value == [3]  # the choice is kept while the box is hidden
