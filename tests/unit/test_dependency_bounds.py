"""``pyproject.toml`` bounds what ``pip install .`` may bring: every package whose internals the suite
touches is held to the minor release ``requirements.txt`` pins (``~=``), and every dependency has an
exact pin there. Seen: only Locust was bounded, so a newer openai or httpx2 brought whatever its
internals had become."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from tests.unit.test_wings import FIRST_PARTY, NOT_YET_COMPAT, _private

ROOT = Path(__file__).resolve().parents[2]
# The packages reached privately, each in its *_compat.py module: by import (found below) and by
# attribute (gevent's sockets, Locust's objects, httpx2's headers), which no static check can
# attribute to a package. The openai SDK is not among them since the StreamClient seam.
TOUCHED_INTERNALLY = {"locust", "gevent", "geventhttpclient", "httpx2"}


def dependencies() -> dict[str, str]:
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {re.split(r"[~=<>!]", d, maxsplit=1)[0].strip(): d for d in listed}


def pins() -> dict[str, str]:
    found = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            found[name.strip()] = version.strip()
    return found


def privately_imported() -> set[str]:
    """Top-level packages whose private modules or names some module of the suite imports."""
    found = set()
    for path in (ROOT / "vllm_locust").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                top = node.module.split(".")[0]
                if top not in FIRST_PARTY and (any(_private(p) for p in node.module.split("."))
                                               or any(_private(a.name) for a in node.names)):
                    found.add(top)
    return found


def test_every_package_imported_privately_is_in_the_touched_list():
    assert privately_imported() <= TOUCHED_INTERNALLY, privately_imported() - TOUCHED_INTERNALLY
    assert not NOT_YET_COMPAT, "no module outside a *_compat.py one reaches another package's private names"


def test_every_package_touched_internally_is_held_to_its_verified_minor_release():
    deps, pinned = dependencies(), pins()
    for name in sorted(TOUCHED_INTERNALLY):
        spec = deps.get(name, "")
        assert spec.startswith(f"{name}~="), f"{name}: {spec or 'not a dependency'} (want {name}~=<pin>)"
        bound = spec.split("~=")[1]
        assert bound.count(".") == 2, f"{spec}: three parts, so ~= holds the minor release"
        version = [int(part) for part in pinned[name].split(".")[:3]]
        floor = [int(part) for part in bound.split(".")]
        assert version[:2] == floor[:2] and version >= floor, \
            f"{spec} does not hold requirements.txt's {name}=={pinned[name]}"


def test_every_dependency_has_an_exact_pin():
    pinned = pins()
    assert set(dependencies()) <= set(pinned), set(dependencies()) - set(pinned)
