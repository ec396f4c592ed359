"""Check a vLLM command line against the installed vLLM's own argument parser.

Run with the server's Python: ``python launch/check_flags.py --profile P -- --model ... --flag v``.
Prints one line per refused flag, naming it, and exits 1; exits 0 when vLLM accepts them all.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import sys


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


def main() -> None:
    cli = argparse.ArgumentParser()
    cli.add_argument("--profile", default="?")
    cli.add_argument("argv", nargs=argparse.REMAINDER)
    args = cli.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    import vllm

    problems = refused(vllm_parser(), argv)
    for line in problems:
        print(f"launch: profile '{args.profile}': vLLM {vllm.__version__} refuses {line}", file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
