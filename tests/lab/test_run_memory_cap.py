"""A job killed for memory tells its participant so, with the cap, in their language: not "cancelled"."""

from __future__ import annotations

import pytest

from ckptlab import RunSpec
from ckptlab.errors import RunStoppedError
from ckptlab.lab import run as labrun
from ckptlab.lab import workers
from ckptlab.lab.run import ResultCache
from ckptlab.lab.runqueue import DeviceQueue
from ckptlab.show.wording import app_message


def test_a_job_killed_for_memory_is_reported_as_the_memory_cap(monkeypatch):
    def killed(*args, **kwargs):
        raise workers._memory_cap(int(1.3 * 2**30), int(1.2 * 2**30))

    monkeypatch.setattr(labrun, "_measured", killed)
    monkeypatch.setattr(labrun, "_cached", lambda cache, spec: None)
    with pytest.raises(RunStoppedError) as caught:
        labrun.run_queued(RunSpec(model="tiny-llama"), queue=DeviceQueue(), cache=ResultCache())
    assert caught.value.key == "job.memory_cap" and caught.value.params["cap"] == int(1.2 * 2**30)  # bytes, a number
    # the template formats it in the reader's language
    assert "1.2 GiB" in app_message(caught.value, "ja") and "1,2 GiB" in app_message(caught.value, "pt-BR")
    assert "cancelled" not in str(caught.value)
