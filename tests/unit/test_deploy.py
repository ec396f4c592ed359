"""The container image and the Kubernetes manifests (no cluster or Docker engine is reachable
here): rendered and checked for structure, and every Locust argument in them parsed by the
suite's own parser."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def manifests() -> dict[str, dict]:
    docs = [d for f in sorted((DEPLOY / "k8s").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


def expand(args: list[str], env: list[dict]) -> list[str]:
    """Kubernetes' $(VAR) expansion from the container's env values."""
    values = {e["name"]: e.get("value", "") for e in env}
    return [re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], a) for a in args]


def parse(args: list[str]):
    from locust.argument_parser import get_parser

    from vllm_locust.plugin.options import add_options

    from vllm_locust.plugin import locust_compat

    parser = get_parser()
    add_options(parser)
    try:
        return parser.parse_args(args)
    finally:
        locust_compat.uninstall()


def test_the_image_installs_the_pinned_requirements_and_copies_what_exists():
    lines = [line.strip() for line in (DEPLOY / "Dockerfile").read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert lines[0].startswith("FROM python:3.11")
    assert "RUN pip install --no-cache-dir -r requirements.txt" in lines
    for line in lines:
        if line.startswith("COPY"):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
    assert lines[-1] == 'ENTRYPOINT ["python", "-m", "locust", "-f", "locustfile.py"]'
    assert "ENV LOCUST_WEB_HOST=0.0.0.0" in lines, "in a pod the web UI must listen beyond loopback"


def test_master_workers_service_and_volume_fit_together():
    m = manifests()
    assert set(m) == {"Service/vllm-locust-master", "Job/vllm-locust-master", "Deployment/vllm-locust-worker",
                      "PersistentVolumeClaim/vllm-locust-runs"}
    service, job, workers = m["Service/vllm-locust-master"], m["Job/vllm-locust-master"], m["Deployment/vllm-locust-worker"]
    master_pod, worker_pod = job["spec"]["template"], workers["spec"]["template"]
    assert service["spec"]["selector"].items() <= master_pod["metadata"]["labels"].items()
    assert workers["spec"]["selector"]["matchLabels"].items() <= worker_pod["metadata"]["labels"].items()
    (master,), (worker,) = master_pod["spec"]["containers"], worker_pod["spec"]["containers"]
    assert master["image"] == worker["image"]
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    opts = parse(expand(master["args"], master["env"]))
    wopts = parse(worker["args"])
    assert opts.master and opts.headless and wopts.worker
    assert wopts.master_host == service["metadata"]["name"] and wopts.master_port == ports["workers"] == 5557
    assert opts.expect_workers == workers["spec"]["replicas"], "the master waits for as many workers as are deployed"
    mounts = {v["name"]: v["mountPath"] for v in master["volumeMounts"]}
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in master_pod["spec"]["volumes"]}
    assert claims == {"runs": "vllm-locust-runs"} and opts.samples_dir.startswith(mounts["runs"] + "/")
    assert "volumeMounts" not in worker, "workers send their rows to the master: no volume"
    assert opts.steps and opts.step_duration > 0 and opts.host.startswith("http://")
    key = [e for e in master["env"] if e["name"] == "OPENAI_API_KEY"][0]
    assert "secretKeyRef" in key["valueFrom"], "the key comes from a Secret, never a manifest"
    assert opts.master_bind_host == "0.0.0.0", "the master listens on 127.0.0.1 unless told: the Service must reach it"
    tokens = [[e for e in c.get("env", []) if e["name"] == "LOCUST_WORKER_TOKEN"] for c in (master, worker)]
    assert all(len(t) == 1 and "secretKeyRef" in t[0]["valueFrom"] for t in tokens), "the channel's token, from a Secret"
    assert tokens[0][0]["valueFrom"] == tokens[1][0]["valueFrom"], "master and workers share one token"
