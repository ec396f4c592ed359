"""Issue 21, item 1, as it was found: with the key in the environment and the web UI on loopback,
a form POST from another site (``Origin: http://evil.example``; a browser sends it without a
preflight) to ``/swarm`` with ``host=`` the attacker's server made the suite send
``Authorization: Bearer <key>`` there. Real Locust, real web UI; the attacker's server records
every request it gets."""

from __future__ import annotations

import contextlib
import os

import requests as http

from tests.conftest import locust_web_ui, recording_server, start_fake_server, until

KEY = "sk-SECRET123-cross-site"


def test_a_cross_site_swarm_is_refused_and_the_key_stays_home(tmp_path):
    attacker = contextlib.ExitStack()
    evil_host, seen = attacker.enter_context(recording_server())
    server = start_fake_server()
    server.configure(ttft_ms=5, itl_ms=1, tokens=8, api_key=KEY)
    log = tmp_path / "locust.log"
    try:
        with locust_web_ui(server.url, log, "--samples-dir", str(tmp_path / "s"), "--max-tokens", "8",
                           "--prompt-tokens", "32", "--prompt-pool", "8", env={**os.environ, "OPENAI_API_KEY": KEY}) as (base, _ui):
            attack_and_own_run(server, evil_host, base)
    finally:
        attacker.close()
        server.stop()
    assert seen == [], f"the attacker's server was reached: {seen}"
    text = log.read_text()
    assert KEY not in text
    refusals = text.count("from 'http://evil.example' refused")
    assert refusals == 1, f"{refusals} refusals logged: once per origin\n" + text[-3000:]


def attack_and_own_run(server, evil_host: str, base: str) -> None:
    attack = {"user_count": "1", "spawn_rate": "1", "host": evil_host}
    refused = [http.post(base + "/swarm", data=attack, timeout=10, headers={"Origin": "http://evil.example"}),
               http.post(base + "/swarm", data=attack, timeout=10, headers={"Origin": "http://evil.example"}),
               http.post(base + "/vllm-server/reset-prefix-cache", data="x", timeout=10,
                         headers={"Origin": "http://evil.example", "Content-Type": "text/plain"})]
    assert [r.status_code for r in refused] == [403, 403, 403], [r.text for r in refused]
    read = http.get(base + "/server-metrics", headers={"Origin": "http://evil.example"}, timeout=10)
    assert "Access-Control-Allow-Origin" not in read.headers, "another site cannot read the figures"

    # The UI's own page (its Origin) still starts a run, against the host named on the command line.
    own = http.post(base + "/swarm", data={"user_count": "1", "spawn_rate": "1", "host": server.url},
                    headers={"Origin": base}, timeout=10)
    assert own.status_code == 200 and own.json()["success"], own.text
    until(server.log, "a streamed request at the real server (which answers only with the key)")
    http.post(base + "/stop", timeout=10)  # a script: no Origin, no Referer
    assert server.prefix_cache_resets() == 0, "the cross-site reset did not reach the server"
