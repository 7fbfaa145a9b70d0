"""The longest sequence that fits: a search over simulated steps, ending on a length that fits next to one a token
longer that does not (the simulation stubbed with a known peak; the real one is ckptlab.simulate)."""

from __future__ import annotations

from types import SimpleNamespace

from ckptlab import RunSpec
from ckptlab.explore.longest import longest_seq


def _stub(bytes_per_token: int, fixed: int, asked: list[int]):
    def simulate(spec: RunSpec):
        asked.append(spec.seq_len)
        quadratic = spec.seq_len**2 // 64  # a little curvature, as attention's or the allocator's
        return SimpleNamespace(memory=SimpleNamespace(peak_bytes=fixed + bytes_per_token * spec.seq_len + quadratic))

    return simulate


def test_the_search_ends_one_token_apart_within_few_simulations():
    asked: list[int] = []
    spec = RunSpec(model="tiny-llama", seq_len=128)  # 2,048 positions
    budget = 10_000_000 + 1000 * 1234 + 1234**2 // 64
    found = longest_seq(spec, budget, simulate=_stub(1000, 10_000_000, asked))
    assert (found.seq_len, found.over_seq_len, found.setting) == (1234, 1235, "n=1")
    assert found.peak_bytes <= budget < found.over_peak_bytes and found.simulations == len(set(asked)) <= 12
    assert longest_seq(spec, 10**12, simulate=_stub(1000, 0, [])).seq_len == 2048  # the model's limit fits
    assert longest_seq(spec, 1000, simulate=_stub(1000, 10**6, [])).seq_len == 0  # nothing fits
