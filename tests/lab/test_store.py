"""The one bounded store of results (lab.store): bounded in entries and in bytes, least recently used out first."""

from ckptlab.lab.store import ResultStore


def test_the_store_keeps_within_its_entries_and_its_bytes_least_recently_used_out_first():
    store: ResultStore[str, str] = ResultStore(len, max_entries=3, max_bytes=10)
    for key in "abc":
        store.put(key, key * 3)  # 3 bytes each: 9 in all
    assert store["a"] == "aaa"  # read: now the most recently used
    store.put("d", "ddd")  # a 4th entry: the least recently used ("b") goes
    assert list(store) == ["c", "a", "d"] and store.bytes == 9
    store.put("e", "eeeeee")  # 6 more bytes: over 10, so "c" and "a" go
    assert list(store) == ["d", "e"] and store.bytes == 9
    store.put("f", "f" * 11)  # larger than the whole store: not kept, nothing else dropped
    assert "f" not in store and list(store) == ["d", "e"]
    store.put("d", "d")  # a key put again is replaced, its bytes recounted
    assert store.bytes == 7 and store.get("d") == "d"
