"""Each persona's workload: built ahead by ``prepare`` (its own model, a LoRA adapter's included),
and one persona's build never stalls another persona's users (seen on the H200: an adapter's
prompts built mid-run held the one lock of the process for 17 s, and every other persona's users
of that worker waited)."""

from __future__ import annotations

from types import SimpleNamespace

import gevent
import gevent.event
import pytest

from vllm_locust.plugin import prepare
from vllm_locust.plugin import workload as plugin_workload
from vllm_locust.plugin.workload import Workload


def _ctx(key):
    return SimpleNamespace(key=key, spec=SimpleNamespace(name="fixed"), prompts=(), model=key,
                           workload=SimpleNamespace(atoms=(), note=""), continuous_usage=False)


def test_a_persona_whose_build_is_slow_does_not_stall_another_personas_users(monkeypatch):
    release_b = gevent.event.Event()
    built = []

    def build(environment, options=None):
        if options.model == "lora-b":
            release_b.wait()  # lora-b's prompts are still being built (its /tokenize calls)
        built.append(options.model)
        return _ctx(("key", options.model))

    monkeypatch.setattr(plugin_workload, "build_context", build)
    monkeypatch.setattr(plugin_workload, "context_key", lambda environment, options=None: ("key", options.model))
    workload = Workload(SimpleNamespace(parsed_options=None), failures=None)
    view_a, view_b = SimpleNamespace(model="lora-a"), SimpleNamespace(model="lora-b")
    assert workload.context(view_a, "tenant_a").model == ("key", "lora-a")

    building_b = gevent.spawn(workload.context, view_b, "tenant_b")
    gevent.sleep(0)  # tenant_b's first user is inside its build now
    assert built == ["lora-a"]
    try:
        # tenant_a's users go on while tenant_b builds (one lock for all waited here for ever)
        with gevent.Timeout(5, AssertionError("tenant_a's request waited for tenant_b's build")):
            assert workload.context(view_a, "tenant_a").model == ("key", "lora-a")
            # and a persona not built yet builds beside it
            assert workload.context(SimpleNamespace(model="base"), "tenant_c").model == ("key", "base")
    finally:
        release_b.set()
    assert building_b.get(timeout=5).model == ("key", "lora-b")
    assert built == ["lora-a", "base", "lora-b"]


def test_a_personas_own_users_wait_for_its_one_build(monkeypatch):
    calls = []
    release = gevent.event.Event()

    def build(environment, options=None):
        calls.append(options.model)
        release.wait()
        return _ctx(("key", options.model))

    monkeypatch.setattr(plugin_workload, "build_context", build)
    monkeypatch.setattr(plugin_workload, "context_key", lambda environment, options=None: ("key", options.model))
    workload = Workload(SimpleNamespace(parsed_options=None), failures=None)
    view = SimpleNamespace(model="lora-b")
    users = [gevent.spawn(workload.context, view, "tenant_b") for _ in range(5)]
    gevent.sleep(0)
    release.set()
    assert {u.get(timeout=5).model for u in users} == {("key", "lora-b")}
    assert calls == ["lora-b"], "five users of one persona built its workload once"


PERSONAS = """
[[persona]]
name = "tenant_a"
weight = 3
model = "lora-a"

[[persona]]
name = "tenant_b"
weight = 1
model = "lora-b"
prompt_tokens = 24
"""


def test_prepare_builds_and_caches_every_personas_workload(fake_server, tmp_path, capsys):
    fake_server.configure(adapters=["lora-a", "lora-b"])
    personas = tmp_path / "personas.toml"
    personas.write_text(PERSONAS)
    cache = tmp_path / "cache"
    code = prepare.main(["--host", fake_server.url, "--personas", str(personas), "--prompt-tokens", "30",
                         "--prompt-pool", "2", "--prompt-cache-dir", str(cache)])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0, out
    assert len(out) == 3, out
    assert "persona" not in out[0] and "for fake-model cached" in out[0]
    assert out[1].startswith("prepare: persona tenant_a: 2 fixed prompts of [30] tokens for lora-a cached"), out[1]
    assert out[2].startswith("prepare: persona tenant_b: 2 fixed prompts of [24] tokens for lora-b cached"), out[2]
    assert len([p for p in cache.rglob("*") if p.is_file()]) == 3, "one cached workload per model and length"


def test_prepare_names_the_persona_whose_model_the_server_does_not_serve(fake_server, tmp_path, capsys):
    fake_server.configure(adapters=["lora-a"])
    personas = tmp_path / "personas.toml"
    personas.write_text(PERSONAS)
    code = prepare.main(["--host", fake_server.url, "--personas", str(personas), "--prompt-tokens", "30",
                         "--prompt-pool", "2", "--prompt-cache-dir", ""])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert 'persona "tenant_b"' in err[0] and "'lora-b' is not served" in err[0], err[0]


@pytest.mark.parametrize("text", ['[[persona]]\nname = "x"\nweight = 0\n'])
def test_prepare_refuses_a_bad_personas_file_in_one_line(fake_server, tmp_path, capsys, text):
    personas = tmp_path / "personas.toml"
    personas.write_text(text)
    code = prepare.main(["--host", fake_server.url, "--personas", str(personas), "--prompt-cache-dir", ""])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and str(personas) in err[0], err
