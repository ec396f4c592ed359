"""launch/check_flags.py's own logic (no vLLM needed): several command lines in one call, and the
cache key that lets a server start skip the vLLM import for a command line already accepted."""

from __future__ import annotations

from launch.check_flags import cache_key, command_lines

ARGV = ["--model", "/m", "--host", "127.0.0.1", "--port", "8000", "--max-model-len", "4096"]


def test_one_command_line_the_way_serve_sh_passes_it():
    assert command_lines(["--profile", "p", "--", *ARGV]) == [("p", ARGV)]


def test_several_command_lines_each_after_its_profile_mark():
    lines = command_lines(["::profile=a", "--model", "/m", "::profile=b", "--model", "/n", "--enforce-eager"])
    assert lines == [("a", ["--model", "/m"]), ("b", ["--model", "/n", "--enforce-eager"])]


def test_the_same_profile_on_another_host_or_port_has_the_same_key():
    moved = ["--model", "/m", "--host=0.0.0.0", "--port", "9123", "--max-model-len", "4096"]
    assert cache_key("0.32.0|/site/vllm", ARGV) == cache_key("0.32.0|/site/vllm", moved)


def test_any_other_flag_value_or_another_vllm_changes_the_key():
    key = cache_key("0.32.0|/site/vllm", ARGV)
    assert cache_key("0.32.0|/site/vllm", [*ARGV[:-1], "2048"]) != key
    assert cache_key("0.32.0|/site/vllm", [*ARGV, "--enforce-eager"]) != key
    assert cache_key("0.33.0|/site/vllm", ARGV) != key
    assert cache_key("0.32.0|/other/vllm", ARGV) != key
