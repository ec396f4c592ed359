"""Personas (``--personas FILE``): weighted tenants of one run, each with its own options.

A persona file is TOML, a list of ``[[persona]]`` tables: a ``name`` (a Python identifier: it
becomes a Locust user class), a ``weight`` (a positive whole number: Locust's ``weight``), an
optional ``slo`` (the analysis's ``ttft:500,itl:50`` form, kept for the per-persona verdict) and
any of the suite's own options by their names with underscores, overriding the run's options for
that persona's users. Parsing is pure: the caller passes the options a persona may set (their
type and choices), so a bad file is refused with one line naming the persona and the key before
anything is sent.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from typing import Callable, Mapping

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SLO_METRICS = ("ttft", "itl", "tpot", "e2e")  # analysis/goodput.py's metrics (it parses the same form)
RESERVED = ("name", "weight", "slo")


@dataclass(frozen=True)
class OptionKind:
    """What a persona may write for one option: its ``type`` (int, float; None: text), its
    ``choices``, whether it is a flag (true/false)."""

    kind: Callable | None = None
    choices: tuple | None = None
    flag: bool = False
    nullable: bool = False  # no default: an empty value means "not given" (--max-tokens)


@dataclass(frozen=True)
class Persona:
    name: str
    weight: int
    overrides: Mapping[str, object] = field(default_factory=dict)  # option dest -> value
    slo: str = ""

    def as_dict(self) -> dict:
        """The load record's form: ``{name, weight, overrides, slo}``."""
        return {"name": self.name, "weight": self.weight, "overrides": dict(self.overrides), "slo": self.slo}


class PersonaError(ValueError):
    """One line: ``--personas FILE: persona "chat": unknown option "modle"``."""


def check_slo(text: str) -> str | None:
    """None when ``text`` is metric:ms pairs such as ``ttft:500,itl:50``, else what is wrong."""
    parts = [p for p in str(text).replace(" ", "").split(",") if p]
    if not parts:
        return "no thresholds"
    for part in parts:
        name, _, value = part.partition(":")
        try:
            ok = float(value) > 0
        except ValueError:
            ok = False
        if name.lower() not in SLO_METRICS or not ok:
            return f"expected metric:ms pairs such as ttft:500,itl:50 (metrics: {', '.join(SLO_METRICS)}; ms > 0)"
    return None


def _value(key: str, raw, spec: OptionKind):
    """The option's value from TOML's, or a ValueError saying what was expected."""
    if spec.flag:
        if not isinstance(raw, bool):
            raise ValueError(f"option {key} = {raw!r}: expected true or false")
        return raw
    if isinstance(raw, bool) or isinstance(raw, (dict, list)):
        raise ValueError(f"option {key} = {raw!r}: expected {_expected(spec)}")
    if spec.kind is int:
        if not isinstance(raw, int):
            raise ValueError(f"option {key} = {raw!r}: expected a whole number")
        value = raw
    elif spec.kind is float:
        if not isinstance(raw, (int, float)):
            raise ValueError(f"option {key} = {raw!r}: expected a number")
        value = float(raw)
    elif spec.kind is not None:
        try:
            value = spec.kind(raw)
        except (TypeError, ValueError):
            raise ValueError(f"option {key} = {raw!r}: expected {_expected(spec)}") from None
    else:
        if not isinstance(raw, str):
            raise ValueError(f"option {key} = {raw!r}: expected text")
        value = raw
    if spec.choices and value not in spec.choices:
        raise ValueError(f"option {key} = {raw!r}: choose one of {', '.join(map(str, spec.choices))}")
    return value


def _expected(spec: OptionKind) -> str:
    return {int: "a whole number", float: "a number"}.get(spec.kind, "text")


def parse_personas(text: str, source: str, options: Mapping[str, OptionKind],
                   refused: Mapping[str, str] | None = None) -> list[Persona]:
    """The personas of a TOML text. ``options``: what a persona may set (dest -> kind);
    ``refused``: keys that are options but not a persona's (dest -> why, e.g. a secret).
    Raises ``PersonaError`` with one line naming ``source``, the persona and the key."""
    refused = refused or {}
    head = f"--personas {source}"
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise PersonaError(f"{head}: not TOML ({err})") from None
    except RecursionError:  # seen (issue 39, L6): a value of 100,000 nested arrays
        raise PersonaError(f"{head}: not TOML this suite reads (nested too deeply)") from None
    extra = sorted(set(data) - {"persona"})
    if extra:
        raise PersonaError(f"{head}: unknown table or key {extra[0]!r} (a file of [[persona]] tables)")
    tables = data.get("persona")
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise PersonaError(f"{head}: no [[persona]] tables")
    personas: list[Persona] = []
    seen: set[str] = set()
    for number, table in enumerate(tables, 1):
        name = table.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            shown = f"persona {number}" if name is None else f"persona {number} ({name!r})"
            raise PersonaError(f"{head}: {shown}: name must be a Python identifier such as chat_short")
        where = f'{head}: persona "{name}"'
        if name in seen:
            raise PersonaError(f"{where}: duplicate name")
        seen.add(name)
        weight = table.get("weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
            raise PersonaError(f"{where}: weight {weight!r}: a positive whole number")
        slo = table.get("slo", "")
        if not isinstance(slo, str):
            raise PersonaError(f'{where}: slo {slo!r}: text such as "ttft:500,itl:50"')
        if slo:
            problem = check_slo(slo)
            if problem:
                raise PersonaError(f'{where}: slo "{slo}": {problem}')
        overrides: dict[str, object] = {}
        for key, raw in table.items():
            if key in RESERVED:
                continue
            if key in refused:
                raise PersonaError(f'{where}: option "{key}" {refused[key]}')
            spec = options.get(key)
            if spec is None:
                raise PersonaError(f'{where}: unknown option "{key}"')
            try:
                overrides[key] = _value(key, raw, spec)
            except ValueError as err:
                raise PersonaError(f"{where}: {err}") from None
        personas.append(Persona(name, weight, overrides, slo))
    return personas


def load_personas(path: str, options: Mapping[str, OptionKind],
                  refused: Mapping[str, str] | None = None) -> list[Persona]:
    """``parse_personas`` of the file at ``path``; a file that cannot be read is one line too."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except OSError as err:
        raise PersonaError(f"--personas {path}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise PersonaError(f"--personas {path}: not UTF-8 text") from None
    return parse_personas(text, path, options, refused)

