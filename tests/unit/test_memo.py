"""The memos the request path keeps (``core.memo``): bounded, and typed where equal values differ."""

from vllm_locust.core.memo import BoundedMemo, typed_key
from vllm_locust.plugin.records.recorder import _KEPT_FIELDS


def test_bounded_memo_clears_whole_when_full_and_keeps_the_new_entry():
    memo = BoundedMemo(3)
    for n in range(3):
        assert memo.keep(n, str(n)) == str(n)
    assert dict(memo) == {0: "0", 1: "1", 2: "2"}
    assert memo.keep(3, "3") == "3"
    assert dict(memo) == {3: "3"}


def test_typed_key_keeps_equal_values_of_other_types_apart():
    keys = {typed_key((1,)), typed_key((1.0,)), typed_key((True,)), typed_key((1,))}
    assert len(keys) == 3
    assert typed_key(("a", 2)) == (("a", 2), (str, int))


def test_kept_csv_fields_differ_for_equal_values_of_other_types():
    _KEPT_FIELDS.clear()
    assert _KEPT_FIELDS.text((2, "x")) != _KEPT_FIELDS.text((2.0, "x"))
    assert _KEPT_FIELDS.text((True,)) != _KEPT_FIELDS.text((1,))
    assert len(_KEPT_FIELDS) == 4
    _KEPT_FIELDS.clear()
