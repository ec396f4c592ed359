"""Synthetic multi-turn conversations in ShareGPT format, for ``--workload conversation``.

    python -m vllm_locust.core.conversationgen --out conversations.json --conversations 200 --turns 5 \
        --turn-words 512 --reply-words 128 [--system-words 0] [--seed 0]

Every conversation alternates a user turn of about ``--turn-words`` pseudo-words with a reply of
``--reply-words`` (the reply's length becomes that turn's output length when the suite counts it
with the server's tokenizer; the replies themselves are not sent: a session sends the server's own).
``--turns-min`` lets conversations end early (uniform between it and ``--turns``), as real ones do.
Words are seeded pseudo-words, no language (as the synthetic sources use); how many tokens a word
costs is the tokenizer's affair, so the run's request rows, not this file, say the token counts.
"""

from __future__ import annotations

import argparse
import json
import random
import sys

from .sources.exact import word_stream


def conversations(count: int, turns: int, turn_words: int, reply_words: int, system_words: int = 0,
                  turns_min: int | None = None, seed: int = 0) -> list[dict]:
    """``count`` ShareGPT entries (``{"id", "conversations": [{"from", "value"}, ...]}``), seeded."""
    if min(count, turns, turn_words, reply_words) < 1 or system_words < 0:
        raise ValueError("--conversations, --turns, --turn-words and --reply-words must be at least 1")
    low = turns if turns_min is None else turns_min
    if not 1 <= low <= turns:
        raise ValueError(f"--turns-min {turns_min}: between 1 and --turns {turns}")
    rng = random.Random(seed)
    words = word_stream(rng)

    def text(n: int) -> str:
        return " ".join(next(words) for _ in range(n))

    out = []
    for i in range(count):
        turns_here = rng.randint(low, turns)
        messages = [{"from": "system", "value": text(system_words)}] if system_words else []
        for _ in range(turns_here):
            messages.append({"from": "human", "value": text(turn_words)})
            messages.append({"from": "gpt", "value": text(reply_words)})
        out.append({"id": f"synthetic-{seed}-{i}", "conversations": messages})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the ShareGPT JSON file to write")
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--turns", type=int, default=5, help="user turns per conversation (the most)")
    parser.add_argument("--turns-min", type=int, default=None, help="fewest user turns (default: --turns)")
    parser.add_argument("--turn-words", type=int, default=512)
    parser.add_argument("--reply-words", type=int, default=128)
    parser.add_argument("--system-words", type=int, default=0, help="a system prompt of this many words (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        data = conversations(args.conversations, args.turns, args.turn_words, args.reply_words, args.system_words,
                             args.turns_min, args.seed)
        with open(args.out, "w") as f:
            json.dump(data, f)
    except (ValueError, OSError) as err:
        print(f"conversationgen: {err}", file=sys.stderr)
        return 2
    turns = sum(sum(m["from"] == "human" for m in c["conversations"]) for c in data)
    print(f"conversationgen: {len(data)} conversations, {turns} user turns, written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
