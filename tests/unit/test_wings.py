"""The import rules between the wings, read from the source with ``ast`` (CONTRIBUTING.md says why).

Every import counts: absolute and relative, at module level or inside a function. A rule names the
first-party modules a wing may reach and which third-party packages it may (or may never) import;
the standard library is always allowed. The checker is tested on a synthetic tree too, so a rule
that could never fail would show.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = ("vllm_locust", "analysis", "launch", "benchmarks", "tests", "locustfile")
NEVER_IN_ANALYSIS = ("locust", "gevent", "openai", "httpx", "httpx2")


@dataclass(frozen=True)
class Rule:
    """What the modules under ``folder`` may import. ``internal``: first-party module prefixes.
    ``only_third_party``: the only third-party packages allowed (``None``: any but ``never``)."""

    folder: str
    internal: tuple[str, ...]
    only_third_party: tuple[str, ...] | None = None
    never: tuple[str, ...] = ()


RULES = (
    Rule("vllm_locust/core", ("vllm_locust.core",), only_third_party=("orjson",)),
    Rule("vllm_locust/backend", ("vllm_locust.core", "vllm_locust.backend"), never=("locust", "gevent")),
    Rule("vllm_locust/plugin", ("vllm_locust",)),
    Rule("vllm_locust/mock", ("vllm_locust.core", "vllm_locust.mock"), only_third_party=()),
    Rule("analysis", ("vllm_locust.core", "analysis"), never=NEVER_IN_ANALYSIS),
    # the sweep scrapes /metrics and samples the GPUs of the host it runs on, as the plugin's scraper child does
    Rule("launch", ("vllm_locust.core", "vllm_locust.backend.scraper", "vllm_locust.backend.gputelemetry", "launch",
                    "analysis"),
         never=("locust", "gevent")),
)


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(root: Path, dotted: str) -> bool:
    base = root.joinpath(*dotted.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def imports_of(root: Path, path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) for every import in the file, relative ones resolved against its package."""
    tree = ast.parse(path.read_text(), str(path))
    name = module_name(root, path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                # ``from pkg import submodule`` reaches the submodule; ``from mod import name`` the module.
                sub = f"{module}.{alias.name}"
                found.append((node.lineno, sub if is_module(root, sub) else module))
    return found


def _under(target: str, prefixes) -> bool:
    return any(target == p or target.startswith(p + ".") for p in prefixes)


def violations(root: Path, rules=RULES) -> list[str]:
    """One line per import that breaks its wing's rule: ``file:line: imports X (why)``."""
    out = []
    for rule in rules:
        for path in sorted((root / rule.folder).rglob("*.py")):
            for line, target in imports_of(root, path):
                top = target.split(".")[0]
                where = f"{path.relative_to(root)}:{line}: imports {target}"
                if top in FIRST_PARTY:
                    if not _under(target, rule.internal):
                        out.append(f"{where} ({rule.folder} may import only {', '.join(rule.internal)})")
                elif top in sys.stdlib_module_names or top == "__future__":
                    continue
                elif top in rule.never:
                    out.append(f"{where} ({rule.folder} never imports {top})")
                elif rule.only_third_party is not None and top not in rule.only_third_party:
                    allowed = ", ".join(rule.only_third_party) or "no third-party package"
                    out.append(f"{where} ({rule.folder} may import the standard library and {allowed})")
    return out


def test_every_wing_keeps_its_import_rules():
    broken = violations(ROOT)
    assert not broken, "imports that cross a wing's boundary:\n" + "\n".join(broken)


def test_every_python_folder_has_a_rule():
    """A new wing gets a rule: a sub-package of vllm_locust without one would go unchecked."""
    wings = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "vllm_locust").glob("*/__init__.py")}
    assert wings <= {r.folder for r in RULES}, f"wings without an import rule: {sorted(wings - {r.folder for r in RULES})}"


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


CLEAN = {
    "vllm_locust/__init__.py": "",
    "vllm_locust/core/__init__.py": "",
    "vllm_locust/core/schema.py": "import json\nfrom dataclasses import dataclass\n",
    "vllm_locust/core/sse.py": "from .schema import json\ntry:\n    import orjson\nexcept ImportError:\n    pass\n",
    "vllm_locust/backend/__init__.py": "",
    "vllm_locust/backend/scraper.py": "from ..core import schema\nimport select\nimport geventhttpclient\n",
    "vllm_locust/backend/client.py": "",
    "vllm_locust/plugin/__init__.py": "",
    "vllm_locust/plugin/user.py": "import gevent\nimport locust\nfrom ..backend import scraper\n",
    "vllm_locust/mock/__init__.py": "",
    "vllm_locust/mock/server.py": "from ..core.schema import dataclass\nfrom .metrics import x\n",
    "vllm_locust/mock/metrics.py": "x = 1\n",
    "analysis/__init__.py": "",
    "analysis/load.py": "import pandas\nfrom vllm_locust.core.schema import json\nfrom . import tidy\n",
    "analysis/tidy.py": "",
    "launch/__init__.py": "",
    "launch/sweep.py": "from vllm_locust.backend.scraper import x\nfrom vllm_locust.backend import scraper\nimport analysis.load\n",
}


def test_checker_passes_a_clean_tree(tmp_path):
    assert violations(_tree(tmp_path, CLEAN)) == []


@pytest.mark.parametrize("path, text, expect", [
    ("vllm_locust/core/sse.py", "import numpy\n", "imports numpy"),
    ("vllm_locust/core/sse.py", "from ..backend import scraper\n", "imports vllm_locust.backend.scraper"),
    ("vllm_locust/core/sse.py", "def f():\n    from ..plugin.user import x\n", "imports vllm_locust.plugin.user"),
    ("vllm_locust/backend/scraper.py", "from gevent import select\n", "never imports gevent"),
    ("vllm_locust/backend/scraper.py", "def f():\n    import locust.stats\n", "never imports locust"),
    ("vllm_locust/backend/scraper.py", "from ..plugin import user\n", "imports vllm_locust.plugin.user"),
    ("vllm_locust/mock/server.py", "from ..backend.scraper import x\n", "imports vllm_locust.backend.scraper"),
    ("vllm_locust/mock/server.py", "import requests\n", "imports requests"),
    ("analysis/load.py", "from vllm_locust.backend.client import failure_kind\n", "imports vllm_locust.backend.client"),
    ("analysis/load.py", "def f():\n    import openai\n", "never imports openai"),
    ("analysis/tidy.py", "import httpx\n", "never imports httpx"),
    ("launch/sweep.py", "from vllm_locust.backend import client\n", "imports vllm_locust.backend.client"),
    ("launch/sweep.py", "from vllm_locust.plugin.user import x\n", "imports vllm_locust.plugin.user"),
])
def test_checker_fails_a_broken_rule(tmp_path, path, text, expect):
    files = dict(CLEAN, **{path: text})
    broken = violations(_tree(tmp_path, files))
    assert len(broken) == 1 and expect in broken[0] and broken[0].startswith(path), \
        f"the checker missed (or misreported) {text.strip()!r} in {path}: {broken}"


def test_importing_the_analysis_loads_no_load_generator_library():
    modules = sorted(p.stem for p in (ROOT / "analysis").glob("*.py") if p.stem != "__init__")
    code = ("import sys\n"
            + "".join(f"import analysis.{m}\n" for m in modules)
            + f"print(','.join(m for m in {NEVER_IN_ANALYSIS!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"importing the analysis failed: {done.stderr[-2000:]}"
    assert done.stdout.strip() == "", f"importing every analysis module loaded {done.stdout.strip()}"


def test_no_metric_name_is_retyped_outside_the_schema():
    """A metric is defined once (``core/schema.py``); a string literal ``"TTFT"`` elsewhere would be a
    second definition that a rename leaves behind."""
    from vllm_locust.core import schema

    names = {*schema.METRIC_NAMES, schema.TTFT_FROM_INTENDED, schema.E2E_FROM_INTENDED}
    retyped = []
    for folder in ("vllm_locust", "analysis", "launch", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "vllm_locust/core/schema.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and node.value in names:
                    retyped.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not retyped, "metric names typed outside the schema (import them from it):\n" + "\n".join(retyped)


def test_the_core_names_no_endpoint():
    """Endpoints are a registry in the backend: the core decides nothing by an endpoint's name (the
    prompt's form comes from the endpoint's ``prompt_form``)."""
    import ast

    from vllm_locust.backend.endpoints import names

    core = Path(__file__).resolve().parents[2] / "vllm_locust" / "core"
    found = []
    for path in core.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(isinstance(c, ast.Constant) and c.value in names()
                                                     for c in [node.left, *node.comparators]):
                found.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.Call) and any(isinstance(a, ast.Constant) and a.value in names() for a in node.args):
                found.append(f"{path.name}:{node.lineno}")
    assert not found, f"the core switches on endpoint names at {found}"


def loaded_by(module: str) -> set[str]:
    """The top-level load-generator packages importing ``module`` loads, in a fresh interpreter."""
    code = (f"import sys\nimport {module}\n"
            "print(','.join(m for m in ('locust', 'gevent', 'geventhttpclient', 'openai', 'httpx2', "
            "'vllm_locust.backend.llhttp_compat') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"import {module} failed: {done.stderr[-2000:]}"
    return set(filter(None, done.stdout.strip().split(",")))


def modules_under(folder: str) -> list[str]:
    return sorted(module_name(ROOT, p) for p in (ROOT / folder).rglob("*.py"))


def test_the_package_and_its_core_load_no_locust_and_no_gevent_at_run_time():
    """The rules above read imports' letter; this imports them. The package itself, every core
    module together, and the lazily exported ``ChatStreamUser`` only when it is asked for."""
    core = ",".join(modules_under("vllm_locust/core"))
    got = loaded_by(f"vllm_locust; import {core.replace(',', '; import ')}")
    assert not got & {"locust", "gevent", "geventhttpclient", "openai", "httpx2"}, got
    code = "import sys\nfrom vllm_locust import ChatStreamUser\nprint(ChatStreamUser.__module__, 'locust' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["vllm_locust.plugin.user", "True"], done.stderr[-2000:]


@pytest.mark.parametrize("module", modules_under("vllm_locust/backend"))
def test_a_backend_module_loads_no_locust_and_gevent_only_with_the_lean_clients_parser(module):
    """The lean client's parser (llhttp through geventhttpclient, ``llhttp_compat``) is the one
    backend module allowed to load gevent (the lean client's sockets are gevent's under Locust);
    no backend module loads Locust."""
    got = loaded_by(module)
    assert "locust" not in got, f"import {module} loaded Locust"
    assert "gevent" not in got or "vllm_locust.backend.llhttp_compat" in got, \
        f"import {module} loaded gevent without the lean client's parser: {sorted(got)}"


# -- other packages through their public API (issue 40) ------------------------------------------------
# Modules allowed to reach other packages' private names outside a ``*_compat.py`` module: none since
# the StreamClient seam. The list may only shrink: a listed module with nothing to report fails.
NOT_YET_COMPAT: tuple[str, ...] = ()
REFLECTION = ("getattr", "setattr", "hasattr", "delattr")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("_")  # dunders and enum's sunder names are public


def _defined_in(tree: ast.AST) -> set[str]:
    """Names this module defines itself: functions, classes, assignment targets (``self._x = ...``)
    and ``setattr(self, "_x", ...)``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Attribute):
                        names.add(sub.attr)
                    elif isinstance(sub, ast.Name):
                        names.add(sub.id)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
              and len(node.args) > 1 and isinstance(node.args[0], ast.Name) and node.args[0].id in ("self", "cls")
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            names.add(node.args[1].value)
    return names


def private_reaches(path: Path) -> list[str]:
    """``line: what`` for each private module or name of another package this file imports, and each
    private attribute it reads or writes (also through ``getattr``/``setattr``/``hasattr``) that the
    module does not define itself."""
    tree = ast.parse(path.read_text(), str(path))
    ours, out = _defined_in(tree), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module.split(".")[0] in FIRST_PARTY:
                continue
            if any(_private(part) for part in node.module.split(".")):
                out.append(f"{node.lineno}: imports {node.module}")
            out += [f"{node.lineno}: imports {node.module}.{a.name}" for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Import):
            out += [f"{node.lineno}: imports {a.name}" for a in node.names
                    if a.name.split(".")[0] not in FIRST_PARTY and any(_private(p) for p in a.name.split("."))]
        elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in ours:
            out.append(f"{node.lineno}: .{node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in REFLECTION
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _private(node.args[1].value) and node.args[1].value not in ours):
            out.append(f"{node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    return out


def private_report(root: Path, allowed=NOT_YET_COMPAT) -> list[str]:
    """What breaks the rule: a module outside ``*_compat.py`` (and ``allowed``) reaching another
    package's private names, and an ``allowed`` module that no longer does (take it off the list)."""
    broken = []
    for path in sorted((root / "vllm_locust").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if path.name.endswith("_compat.py"):
            continue
        found = private_reaches(path)
        if found and rel not in allowed:
            broken += [f"{rel}:{line}" for line in found]
        elif not found and rel in allowed:
            broken.append(f"{rel}: reaches nothing private any more: take it off NOT_YET_COMPAT")
    return broken


def test_no_module_outside_a_compat_module_reaches_another_packages_private_names():
    broken = private_report(ROOT)
    assert not broken, "private names of other packages (move them to a *_compat.py module):\n" + "\n".join(broken)


@pytest.mark.parametrize("text, expect", [
    ("from httpx2._client import x\n", "imports httpx2._client"),
    ("import locust\nhandlers = getattr(locust.events.request, '_handlers', None)\n", "getattr(..., '_handlers')"),
    ("def f(runner):\n    runner._send_stats()\n", "._send_stats"),
    ("import openai\nfrom openai import _models\n", "imports openai._models"),
])
def test_the_private_check_finds_each_kind_of_reach(tmp_path, text, expect):
    files = dict(CLEAN, **{"vllm_locust/plugin/user.py": text,
                           "vllm_locust/plugin/locust_compat.py": "def f(x):\n    return x._internal\n",
                           "vllm_locust/core/schema.py": "class A:\n    def __init__(self):\n        self._mine = 1\n"
                                                         "    def get(self):\n        return self._mine\n"})
    broken = private_report(_tree(tmp_path, files), allowed=())
    assert len(broken) == 1 and broken[0].startswith("vllm_locust/plugin/user.py") and expect in broken[0], broken
    listed = private_report(_tree(tmp_path, dict(files, **{"vllm_locust/plugin/user.py": ""})),
                            allowed=("vllm_locust/plugin/user.py",))
    assert listed == ["vllm_locust/plugin/user.py: reaches nothing private any more: take it off NOT_YET_COMPAT"]


def test_each_test_carries_its_folders_tier_marker():
    """``bash tests/run.sh --fast`` is ``-m unit``: a test outside the tier folders gets none."""
    from types import SimpleNamespace

    from tests.conftest import pytest_collection_modifyitems

    items = [SimpleNamespace(fspath=ROOT / "tests" / tier / "test_x.py", markers=[]) for tier in ("unit", "e2e", "integration")]
    items.append(SimpleNamespace(fspath=ROOT / "benchmarks" / "test_y.py", markers=[]))
    for item in items:
        item.add_marker = item.markers.append
    pytest_collection_modifyitems(items)
    assert [item.markers for item in items] == [["unit"], ["e2e"], ["integration"], []]
