"""Steering a running test: what a person (or a schedule) may change, and the schedule file.

A change (``Change``) sets any of: the open-loop request rate and burstiness, the persona weights
(the open-loop arrival mix), each persona's think time, the cap on requests in flight, the user
count. ``parse_change`` reads one from JSON or TOML values and refuses a bad value in one line;
``Settings`` is what is in force after each change. A run keeps its changes and writes them as a
schedule (``schedule_toml``); ``read_schedule`` reads that file, or one written by hand, for
``--schedule FILE`` to replay headless::

    # vllm-locust schedule: replay with --schedule FILE
    run_time_s = 120.0      # a replay without -t ends then
    warmup_s = 5.0          # each change's warm-up (an entry's own warmup_s wins)

    [[at]]                  # the first entry, at t = 0: what the run starts with
    t = 0.0
    rate = 4.0

    [[at]]                  # every other entry: a change, a step of its own
    t = 30.0
    rate = 8.0
    burstiness = 0.5
    max_in_flight = 16

    [at.weights]
    chat = 1
    agent = 3

Stdlib only (``tomllib`` reads, the writer is here).
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields, replace

CHANGE_KEYS = ("rate", "burstiness", "weights", "think_time", "max_in_flight", "users", "spawn_rate")
MAX_USERS = 100_000
MAX_RATE = 1_000_000.0
MAX_THINK_S = 86_400.0
MAX_CHANGES = 1_000  # a schedule's entries (and a run's changes kept)


@dataclass(frozen=True)
class Change:
    """What one steering action sets; None: left as it is. ``think_time`` and ``weights`` by
    persona name (``""`` in ``think_time``: every user, with or without personas);
    ``max_in_flight`` 0 lifts the cap."""

    rate: float | None = None
    burstiness: float | None = None
    weights: dict | None = None
    think_time: dict | None = None
    max_in_flight: int | None = None
    users: int | None = None
    spawn_rate: float | None = None

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def label(self) -> str:
        """One line for a marker: ``rate 8/s, weights chat:1 agent:3``."""
        parts = []
        for key, value in self.as_dict().items():
            if isinstance(value, dict):
                value = " ".join(f"{k or 'all'}:{v:g}" for k, v in value.items())
            elif isinstance(value, float):
                value = f"{value:g}"
            parts.append(f"{key.replace('_', ' ')} {value}{'/s' if key == 'rate' else ''}")
        return ", ".join(parts) or "no change"


@dataclass(frozen=True)
class Settings:
    """The steerable settings in force (None: as the run was started)."""

    rate: float | None = None
    burstiness: float | None = None
    weights: dict = field(default_factory=dict)
    think_time: dict = field(default_factory=dict)
    max_in_flight: int = 0
    users: int | None = None

    def then(self, change: Change) -> "Settings":
        """These settings after ``change``."""
        out = self
        for key in ("rate", "burstiness", "users"):
            if getattr(change, key) is not None:
                out = replace(out, **{key: getattr(change, key)})
        if change.max_in_flight is not None:
            out = replace(out, max_in_flight=change.max_in_flight)
        if change.weights is not None:
            out = replace(out, weights={**out.weights, **change.weights})
        if change.think_time is not None:
            think = dict(change.think_time) if "" in change.think_time else {**out.think_time, **change.think_time}
            out = replace(out, think_time=think)
        return out

    def as_dict(self) -> dict:
        return {"rate": self.rate, "burstiness": self.burstiness, "weights": dict(self.weights),
                "think_time": dict(self.think_time), "max_in_flight": self.max_in_flight, "users": self.users}

    @classmethod
    def from_dict(cls, data: dict | None) -> "Settings":
        data = data or {}
        return cls(rate=data.get("rate"), burstiness=data.get("burstiness"), weights=dict(data.get("weights") or {}),
                   think_time=dict(data.get("think_time") or {}), max_in_flight=int(data.get("max_in_flight") or 0),
                   users=data.get("users"))


def _number(key: str, raw, low: float, high: float, integer: bool = False, low_open: bool = False) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise ValueError(f"{key} {raw!r}: expected a number")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{key} {raw!r}: expected a number") from None
    if not math.isfinite(value) or value < low or (low_open and value <= low) or value > high:
        bound = f"more than {low:g}" if low_open else f"at least {low:g}"
        raise ValueError(f"{key} {raw!r}: expected a number {bound} and at most {high:g}")
    if integer:
        if value != int(value):
            raise ValueError(f"{key} {raw!r}: expected a whole number")
        return int(value)
    return value


def _by_persona(key: str, raw, personas: list[str], check, allow_all: bool) -> dict:
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{key}: expected a table of persona = value, e.g. {{\"chat\": 3}}")
    out = {}
    for name, value in raw.items():
        name = str(name)
        if name == "" and allow_all:
            out[name] = check(f"{key} (all)", value)
            continue
        if name not in personas:
            known = ", ".join(personas) if personas else "none: the run has no --personas"
            raise ValueError(f"{key}: unknown persona {name!r} (personas: {known})")
        out[name] = check(f"{key}.{name}", value)
    return out


def parse_change(data, personas: list[str]) -> Change:
    """A ``Change`` from a JSON object or a TOML table; a ValueError of one line for anything else
    (an unknown key, a value out of range, a persona the run does not have)."""
    if not isinstance(data, dict):
        raise ValueError("a change is an object such as {\"rate\": 8}")
    unknown = sorted(set(data) - set(CHANGE_KEYS))
    if unknown:
        raise ValueError(f"unknown setting {unknown[0]!r} (settings: {', '.join(CHANGE_KEYS)})")
    values: dict = {}
    if data.get("rate") is not None:
        values["rate"] = _number("rate", data["rate"], 0.0, MAX_RATE, low_open=True)
    if data.get("burstiness") is not None:
        values["burstiness"] = _number("burstiness", data["burstiness"], 0.0, 1000.0, low_open=True)
    if data.get("max_in_flight") is not None:
        values["max_in_flight"] = _number("max_in_flight", data["max_in_flight"], 0, MAX_USERS, integer=True)
    if data.get("users") is not None:
        values["users"] = _number("users", data["users"], 0, MAX_USERS, integer=True)
    if data.get("spawn_rate") is not None:
        values["spawn_rate"] = _number("spawn_rate", data["spawn_rate"], 0.0, MAX_USERS, low_open=True)
    if data.get("weights") is not None:
        weights = _by_persona("weights", data["weights"], personas,
                              lambda k, v: _number(k, v, 0.0, 1e6), allow_all=False)
        values["weights"] = weights
    if data.get("think_time") is not None:
        raw = data["think_time"]
        if not isinstance(raw, dict):
            raw = {"": raw}
        values["think_time"] = _by_persona("think_time", raw, personas,
                                           lambda k, v: _number(k, v, 0.0, MAX_THINK_S), allow_all=True)
    if not values:
        raise ValueError(f"nothing to change: give at least one of {', '.join(CHANGE_KEYS)}")
    return Change(**values)


def check_weights(weights: dict, personas: list[str]) -> str | None:
    """None when some persona keeps a positive weight (``weights`` over the run's ``personas``)."""
    if personas and not any(weights.get(name, 1.0) > 0 for name in personas):
        return "weights: at least one persona needs a positive weight"
    return None


@dataclass(frozen=True)
class ScheduleEntry:
    t_s: float  # seconds after the run's start (its clock: after the workload was built)
    change: Change
    warmup_s: float | None = None  # this change's own warm-up (None: the schedule's, else --steer-warmup)


@dataclass(frozen=True)
class Schedule:
    entries: tuple[ScheduleEntry, ...]
    run_time_s: float | None = None  # the run's length (a replay without -t stops then)
    warmup_s: float | None = None  # the warm-up after each change the run was steered with


def read_schedule(text: str, personas: list[str], source: str = "--schedule") -> Schedule:
    """A schedule from TOML text; a ValueError naming the file's entry for anything wrong."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{source}: not TOML: {err}") from None
    unknown = sorted(set(data) - {"at", "run_time_s", "warmup_s"})
    if unknown:
        raise ValueError(f"{source}: unknown key {unknown[0]!r} (keys: at, run_time_s, warmup_s)")
    at = data.get("at")
    if not isinstance(at, list) or not at:
        raise ValueError(f"{source}: no [[at]] entries")
    if len(at) > MAX_CHANGES:
        raise ValueError(f"{source}: {len(at)} entries, at most {MAX_CHANGES}")
    entries = []
    for i, table in enumerate(at, 1):
        if not isinstance(table, dict) or "t" not in table:
            raise ValueError(f"{source}: [[at]] {i}: needs t, the seconds after the run's start")
        try:
            t_s = _number("t", table["t"], 0.0, 1e7)
            warmup = None if table.get("warmup_s") is None else float(_number("warmup_s", table["warmup_s"], 0.0, 1e5))
            change = parse_change({k: v for k, v in table.items() if k not in ("t", "warmup_s")}, personas)
        except ValueError as err:
            raise ValueError(f"{source}: [[at]] {i}: {err}") from None
        entries.append(ScheduleEntry(float(t_s), change, warmup))
    if any(b.t_s < a.t_s for a, b in zip(entries, entries[1:])):
        raise ValueError(f"{source}: [[at]] entries must come in order of t")
    extra = {}
    for key in ("run_time_s", "warmup_s"):
        if data.get(key) is not None:
            try:
                extra[key] = float(_number(key, data[key], 0.0, 1e7))
            except ValueError as err:
                raise ValueError(f"{source}: {err}") from None
    return Schedule(tuple(entries), **extra)


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(round(value, 6))
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _toml_key(key: str) -> str:
    return key if key and all(c.isalnum() or c in "-_" for c in key) else _toml_value(key)


def schedule_toml(schedule: Schedule, comment: str = "") -> str:
    """The schedule as TOML that ``read_schedule`` reads back to the same entries."""
    lines = ["# vllm-locust schedule: replay with --schedule FILE" + (f" ({comment})" if comment else "")]
    for key in ("run_time_s", "warmup_s"):
        if getattr(schedule, key) is not None:
            lines.append(f"{key} = {_toml_value(float(getattr(schedule, key)))}")
    for entry in schedule.entries:
        lines += ["", "[[at]]", f"t = {_toml_value(float(entry.t_s))}"]
        if entry.warmup_s is not None:
            lines.append(f"warmup_s = {_toml_value(float(entry.warmup_s))}")
        tables = []
        for key, value in entry.change.as_dict().items():
            if isinstance(value, dict):
                tables.append((key, value))
            else:
                lines.append(f"{key} = {_toml_value(value)}")
        for key, value in tables:
            lines += ["", f"[at.{key}]"] + [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()]
    return "\n".join(lines) + "\n"
