"""serve.sh --dry-run on every profile, and the profile parser's refusals (no vLLM needed)."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROFILES = sorted(p.stem for p in (ROOT / "profiles").glob("*.conf"))
SEED_OPTIMIZED = ("--gpu-memory-utilization 0.92 --max-num-seqs 128 --max-num-batched-tokens 4096 "
                  "--max-model-len 8192 --enable-chunked-prefill --enable-prefix-caching")


def serve(*args, env=None):
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("MODEL", "PORT", "TP", "HOST", "SERVED_MODEL_NAME", "SPANS_ENDPOINT")}
    full_env.update(env or {})
    return subprocess.run(["bash", str(ROOT / "launch" / "serve.sh"), *args], capture_output=True, text=True,
                          env=full_env, timeout=30)


@pytest.mark.parametrize("profile", PROFILES)
def test_dry_run_prints_a_valid_looking_command(profile):
    proc = serve(profile, "--dry-run", env={"MODEL": "/models/m"})
    assert proc.returncode == 0, proc.stderr
    cmd = proc.stdout
    assert "vllm.entrypoints.openai.api_server --model /models/m" in cmd
    assert "--host 127.0.0.1 --port 8000" in cmd, "loopback unless told otherwise"
    assert "--disable-log-requests" not in cmd and "--enable-metrics" not in cmd, "flags vLLM 0.26+ refuses"
    assert "VLLM_SERVER_DEV_MODE=1" in cmd, "needed for /reset_prefix_cache between runs"


def test_optimized_is_the_seed_config_and_knob_profiles_change_one_thing():
    base = serve("baseline", "--dry-run", env={"MODEL": "/m"}).stdout.split()
    assert SEED_OPTIMIZED in serve("optimized", "--dry-run", env={"MODEL": "/m"}).stdout
    for knob in ("max-num-seqs", "max-num-batched-tokens", "max-model-len", "gpu-memory-utilization",
                 "chunked-prefill-off", "prefix-caching-on", "enforce-eager", "quantization-fp8"):
        extra = [t for t in serve(knob, "--dry-run", env={"MODEL": "/m"}).stdout.split() if t not in base]
        assert 1 <= len(extra) <= 2, f"{knob} adds one flag (and its value) to baseline: {extra}"
    assert "--no-enable-chunked-prefill" in serve("chunked-prefill-off", "--dry-run", env={"MODEL": "/m"}).stdout


def test_environment_overrides_model_port_and_tp():
    out = serve("tensor-parallel-2", "--dry-run", env={"MODEL": "/x", "PORT": "9001", "TP": "4"}).stdout
    assert "--model /x" in out and "--port 9001" in out and "--tensor-parallel-size 4" in out
    cpu = serve("optimized-cpu", "--dry-run").stdout
    assert "models/tiny" in cpu and "VLLM_CPU_KVCACHE_SPACE=2" in cpu and "--dtype float32" in cpu


def test_unknown_profile_lists_the_profiles():
    proc = serve("fastest", "--dry-run")
    assert proc.returncode != 0
    assert "unknown profile 'fastest'" in proc.stderr and "baseline" in proc.stderr and "optimized-cpu" in proc.stderr


def test_profile_values_are_parsed_never_evaluated(tmp_path):
    marker = tmp_path / "pwned"
    (tmp_path / "evil.conf").write_text(f"max-model-len=$(touch {marker})\n")
    proc = serve("evil", "--dry-run", env={"MODEL": "/m", "PROFILES_DIR": str(tmp_path)})
    assert proc.returncode == 0 and not marker.exists(), "a value is text, not a command"
    assert "touch" in proc.stdout, "printed as given, quoted"
    (tmp_path / "bad.conf").write_text("Max Seqs=4\n")
    proc = serve("bad", "--dry-run", env={"MODEL": "/m", "PROFILES_DIR": str(tmp_path)})
    assert proc.returncode != 0 and "not a vLLM flag name" in proc.stderr


def test_gpu_profile_without_model_says_what_to_set():
    """The README's `launch/serve.sh optimized --dry-run` runs as written: without MODEL the dry
    run shows where the model goes; a real start (or --check) still needs it."""
    dry = serve("optimized", "--dry-run")
    assert dry.returncode == 0 and "--model \\<MODEL\\>" in dry.stdout and "no MODEL set" in dry.stderr
    proc = serve("optimized", "--check")
    assert proc.returncode == 2
    assert "set MODEL=" in proc.stderr


def test_a_port_another_server_listens_on_is_refused_before_anything_starts(tmp_path):
    """Seen: serve.sh on a busy port reported "healthy after 0.0s" for the other server, wrote a
    manifest with vLLM's versions and exited 0 while its own vLLM died with EADDRINUSE."""
    from tests.conftest import start_fake_server

    other = start_fake_server()
    try:
        proc = serve("baseline-cpu", "--run-dir", str(tmp_path / "run"),
                     env={"PORT": str(other.port), "VLLM_PYTHON": "/nonexistent/python"})
    finally:
        other.stop()
    assert proc.returncode != 0
    assert f"port {other.port} on 127.0.0.1 is in use by another process" in proc.stderr, proc.stderr
    assert "healthy" not in proc.stdout + proc.stderr and not (tmp_path / "run" / "manifest.json").exists()


def test_listening_beyond_loopback_is_said_out_loud():
    local = serve("baseline-cpu", "--dry-run")
    assert local.returncode == 0 and "--host 127.0.0.1" in local.stdout and "warning" not in local.stderr
    wide = serve("baseline-cpu", "--dry-run", env={"HOST": "0.0.0.0"})
    assert wide.returncode == 0 and "warning: vLLM will listen on 0.0.0.0" in wide.stderr


def test_help_is_a_clean_usage_that_lists_the_profiles():
    """Seen: ``serve.sh --help`` printed the script's header down to ``set -euo pipefail`` and
    listed the profiles only on an error."""
    proc = serve("--help")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert text.startswith("Usage: "), text
    assert "set -euo" not in text and "#" not in text and "source " not in text, text
    for profile in PROFILES:
        assert profile in text, f"{profile} not listed"
    for flag in ("--dry-run", "--check", "--sweep-settings", "--run-dir", "MODEL", "PORT", "SERVER_CPUS"):
        assert flag in text, flag


def test_spans_go_to_the_suites_receiver_by_profile_or_by_spans_endpoint():
    """``otlp-traces-endpoint=suite`` (tracing-cpu, tracing) or ``SPANS_ENDPOINT`` on any profile: vLLM
    exports its request spans over OTLP/HTTP protobuf, in batches every 500 ms; without either, none."""
    traced = serve("tracing-cpu", "--dry-run").stdout
    assert "--otlp-traces-endpoint http://127.0.0.1:4318/v1/traces" in traced and "suite" not in traced.split()
    assert "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf" in traced and "OTEL_BSP_SCHEDULE_DELAY=500" in traced
    elsewhere = serve("tracing", "--dry-run", env={"MODEL": "/m", "SPANS_ENDPOINT": "http://127.0.0.1:9999/v1/traces"})
    assert elsewhere.stdout.count("--otlp-traces-endpoint") == 1 and "127.0.0.1:9999/v1/traces" in elsewhere.stdout
    any_profile = serve("optimized-cpu", "--dry-run", env={"SPANS_ENDPOINT": "http://127.0.0.1:9999/v1/traces"}).stdout
    assert "--otlp-traces-endpoint http://127.0.0.1:9999/v1/traces" in any_profile
    plain = serve("baseline-cpu", "--dry-run").stdout
    assert "otlp" not in plain and "OTEL_" not in plain


def test_a_vllm_without_opentelemetry_starts_without_spans_and_says_so_once(tmp_path):
    """vLLM refuses to start with --otlp-traces-endpoint when its Python lacks OpenTelemetry: serve.sh
    says so in one line and drops the flag (the run's rows then stay unjoined, and the run says that)."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nexit 1\n")  # a Python whose imports all fail
    python.chmod(0o755)
    proc = subprocess.run(["bash", "-c", f"source {ROOT}/launch/lib.sh; build_command tracing-cpu; check_tracing; "
                                         "print_command"], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "VLLM_PYTHON": str(python), "PROFILES_DIR": str(ROOT / "profiles")})
    assert proc.returncode == 0, proc.stderr
    assert "--otlp-traces-endpoint" not in proc.stdout and "--max-model-len 4096" in proc.stdout
    assert proc.stderr.count("spans are off") == 1 and "OpenTelemetry" in proc.stderr
