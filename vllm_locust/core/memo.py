"""Small memos for values that repeat from request to request (a spec per option values, a csv text
per field values, a tag's fixed words): kept while they repeat, cleared whole past a size, so a hit
costs one dict lookup and no recency bookkeeping."""

from __future__ import annotations


class BoundedMemo(dict):
    """A dict that ``keep`` clears once it holds ``limit`` entries: values that change without end
    (a web-UI edit per second for hours) cannot grow it."""

    __slots__ = ("limit",)

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def keep(self, key, value):
        """``self[key] = value`` (after a clear when full); returns ``value``."""
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value


def typed_key(values: tuple) -> tuple:
    """``values`` with their types: ``1``, ``1.0`` and ``True`` are one dict key, but neither one option
    value nor one csv text."""
    return values, tuple(map(type, values))
