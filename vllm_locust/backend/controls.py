"""Actions a person takes on the server during a run, from the web UI's "vLLM server" tab."""

from __future__ import annotations

import urllib.error
import urllib.request

from ..core.hosts import normalize_host

TIMEOUT_S = 10.0
NOT_ALLOWED = ("the server does not serve POST /reset_prefix_cache: vLLM serves it only when started with "
               "VLLM_SERVER_DEV_MODE=1")


def reset_prefix_cache(host: str, api_key: str = "") -> tuple[bool, str]:
    """``POST {host}/reset_prefix_cache`` (vLLM's route); ``(done, what happened in one line)``."""
    if not host:
        return False, "no --host: nothing to reset"
    url = normalize_host(host) + "/reset_prefix_cache"  # vLLM's route is at the root, not under /v1
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=b"", headers=headers, method="POST"),
                                    timeout=TIMEOUT_S) as response:
            return True, f"prefix cache reset ({response.status})"
    except urllib.error.HTTPError as err:
        if err.code in (404, 405):
            return False, NOT_ALLOWED
        return False, f"{url}: HTTP {err.code} {err.reason}"
    except (urllib.error.URLError, OSError) as err:
        return False, f"cannot reach {url}: {getattr(err, 'reason', err)}"
