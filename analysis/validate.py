"""Check a run's files as they are read, against the schema's row and record types, so that a
damaged file (a 0-byte CSV, text in a numeric column, a JSON field of the wrong type) stops the
analysis with one line naming the file and the field, instead of a traceback far downstream.

The expected types come from the schema's dataclasses (their annotations, e.g. ``float | None``),
so a column or field added there is checked here without a second list.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from pathlib import Path

import numpy as np
import pandas as pd

from vllm_locust.core.schema import RecordError, from_dict


class AnalysisError(Exception):
    """A problem with the input, in one line."""


class BadRunFile(AnalysisError):
    """One file of a run that is not what the suite writes: which file, which field, why."""

    def __init__(self, path: str | Path, field: str, why: str):
        self.path, self.field, self.why = Path(path), field, why
        super().__init__(f"{path}: {field}: {why}")


def annotations(row_type) -> dict[str, str]:
    """Field name -> its annotation as text (``"float | None"``): the schema's modules use
    postponed annotations, so these are strings already."""
    return {f.name: f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            for f in fields(row_type)}


def numeric_columns(row_type) -> tuple[str, ...]:
    return tuple(name for name, ann in annotations(row_type).items()
                 if {p.strip() for p in ann.split("|")} & {"int", "float"})


def check_csv(frame: pd.DataFrame, path: Path, required: tuple[str, ...], numeric: tuple[str, ...],
              measured: tuple[str, ...] = ()) -> pd.DataFrame:
    """The frame with its numeric columns as numbers; ``BadRunFile`` for a missing column, a cell
    that is text where a number belongs, an infinite one, or an empty (or ``nan``) one among
    ``measured`` (a sample's value); elsewhere an empty cell is a missing value, not an error."""
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise BadRunFile(path, missing[0], f"missing column(s) {', '.join(missing)}: not a file this suite wrote")
    for column in numeric:
        if column not in frame or pd.api.types.is_numeric_dtype(frame[column]):
            continue
        values = frame[column]
        numbers = pd.to_numeric(values, errors="coerce")
        bad = numbers.isna() & values.notna() & (values.astype(str).str.strip() != "")
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0])
            raise BadRunFile(path, column, f"row {row + 1} (line {row + 2}): {str(values.iloc[row])[:40]!r} is not a number")
        frame[column] = numbers
    for column in numeric:  # inf and nan read as numbers; no measurement is either (numpy failed on them)
        if column not in frame:
            continue
        values = frame[column].astype(float)
        bad = (values.notna() & ~np.isfinite(values)) | (values.isna() if column in measured else False)
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0])
            raise BadRunFile(path, column, f"row {row + 1} (line {row + 2}): {str(frame[column].iloc[row])[:40]!r} is "
                                           "not a finite number")
    return frame


def check_whole(frame: pd.DataFrame, path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """``BadRunFile`` for a cell of ``columns`` (numbers already: ``check_csv``) that is not a whole
    number (a turn of 1.5), so that reading them as integers cannot fail far downstream."""
    for column in columns:
        if column not in frame:
            continue
        values = frame[column]
        bad = values.notna() & (values % 1 != 0)
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0])
            raise BadRunFile(path, column, f"row {row + 1} (line {row + 2}): {float(values.iloc[row]):g} is not a whole number")
    return frame


def empty_csv(path: Path) -> BadRunFile:
    return BadRunFile(path, "header", "empty file (0 bytes), not even the header row (a run killed before its first "
                                      "write, or a full disk?): move it away or delete it")


def _parts(annotation: str) -> list[str]:
    """``"list[float | None] | None"`` -> ``["list[float | None]", "None"]``: ``|`` outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(annotation):
        depth += (ch == "[") - (ch == "]")
        if ch == "|" and depth == 0:
            parts.append(annotation[start:i].strip())
            start = i + 1
    return parts + [annotation[start:].strip()]


def _matches(value, annotation: str) -> bool:
    for part in _parts(annotation):
        if part == "None" and value is None:
            return True
        if part == "str" and isinstance(value, str):
            return True
        if part == "bool" and isinstance(value, bool):
            return True
        if part in ("int", "float") and isinstance(value, (int, float)) and not isinstance(value, bool):
            if part == "float" or float(value).is_integer():
                return True
        if part == "dict" and isinstance(value, dict):
            return True
        if part.startswith("list") and isinstance(value, list):
            inner = part[5:-1] if part.startswith("list[") else ""
            if not inner or all(_matches(v, inner) for v in value):
                return True
    return False


def _describe(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


def check_fields(data: dict, types: dict[str, str], path: Path, where: str = "", required: tuple[str, ...] = ()) -> None:
    """Each present field of ``data`` that ``types`` names has that type; ``required`` ones are present.
    Unknown fields pass (a newer suite may add some); ``where`` prefixes the field's name."""
    for name in required:
        if name not in data:
            raise BadRunFile(path, f"{where}{name}", "missing")
    for name, annotation in types.items():
        if name in data and not _matches(data[name], annotation):
            raise BadRunFile(path, f"{where}{name}", f"expected {annotation}, found {_describe(data[name])}")


def check_items(data: dict, key: str, types: dict[str, str], path: Path, required: tuple[str, ...] = ()) -> None:
    """``data[key]``, when present and not null, is a list of objects whose fields have ``types``."""
    items = data.get(key)
    if items is None:
        return
    if not isinstance(items, list):
        raise BadRunFile(path, key, f"expected a list, found {_describe(items)}")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadRunFile(path, f"{key}[{i}]", f"expected an object, found {_describe(item)}")
        check_fields(item, types, path, f"{key}[{i}].", required)


def required_fields(row_type) -> tuple[str, ...]:
    """The fields of a schema type without a default: a record without one is not the suite's."""
    return tuple(f.name for f in fields(row_type) if f.default is MISSING and f.default_factory is MISSING)


def check_record(row_type, data: dict, path: Path, required: tuple[str, ...] | None = None) -> dict:
    """``data`` checked against the schema's ``row_type``: a field it does not have (a misspelling),
    a ``required`` one missing (default: every field without a default) or one of the wrong type is
    a ``BadRunFile`` naming it, never a silent default."""
    types = annotations(row_type)
    unknown = sorted(set(data) - set(types))
    if unknown:
        raise BadRunFile(path, unknown[0], f"not a field of {row_type.__name__} (misspelled?); "
                                           "it has: " + ", ".join(types))
    check_fields(data, types, path, required=required_fields(row_type) if required is None else required)
    return data


def typed(row_type, data: dict, path: Path):
    """``data`` as an instance of the schema's ``row_type``, checked first (``check_record``)."""
    check_record(row_type, data, path)
    try:
        return from_dict(row_type, data, str(path))
    except RecordError as err:  # pragma: no cover - check_record finds what from_dict would
        raise AnalysisError(str(err)) from None
