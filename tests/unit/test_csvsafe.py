"""Text a spreadsheet would evaluate gets a leading ``'``; numbers and other text do not."""

from vllm_locust.core.csvsafe import inert, inert_row


def test_formula_text_is_made_inert_and_nothing_else_changes():
    for text in ("=1+1", "+1", "-cmd", "@SUM(A1)", "\tx", "\rx"):
        assert inert(text) == "'" + text
    for value in ("model", "", "1-2", -5, -5.5, None, b"=x"):
        assert inert(value) == value
    row = ("a", 1, -2.0)
    assert inert_row(row) is row
    assert inert_row(("a", "=b", -2)) == ("a", "'=b", -2)
