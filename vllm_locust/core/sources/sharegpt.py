"""``sharegpt``: real prompts from a ShareGPT JSON file, each conversation's first exchange.

As vLLM's ``bench serve`` samples ShareGPT: a request is a conversation's first user turn (with
its system turn, if it opens with one), its output length the first reply's token count by the
server's tokenizer (or ``--max-tokens`` when given), and rows are filtered by vLLM's rule
(``is_valid_sequence``: prompt and reply at least 4 tokens, the prompt at most 1,024, both at most
2,048; the reply's own minimum is skipped when the output length is fixed; conversations without
a reply are dropped). Rows are visited in a seeded shuffle until ``--prompt-pool`` fit, so a
600 MB file costs only the ``/tokenize`` calls the pool needs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from . import Source, register
from .datafiles import DataFileError, DatasetTags, sharegpt_in_seeded_order
from .records import TEXT, Prompt, Workload

if TYPE_CHECKING:
    from ..tokens import TokenCounter
    from ..workloads import WorkloadSpec

# vLLM's is_valid_sequence defaults (vllm/benchmarks/datasets).
MIN_LEN, MAX_PROMPT_LEN, MAX_TOTAL_LEN = 4, 1024, 2048


def first_exchange(turns: tuple[tuple[str, str], ...]) -> tuple[str | None, str, str] | None:
    """(system text or None, first user text, the reply right after it); None without such a reply."""
    system = turns[0][1] if turns and turns[0][0] == "system" else None
    for i, (role, text) in enumerate(turns):
        if role == "user":
            if i + 1 < len(turns) and turns[i + 1][0] == "assistant":
                return system, text, turns[i + 1][1]
            return None
    return None


@register("sharegpt")
class ShareGPT(Source):
    help = "first turns of a ShareGPT JSON file (--dataset-path), replies' lengths as output lengths"

    def build(self, spec: WorkloadSpec, counter: TokenCounter) -> Workload:
        images: dict[int, tuple[str, ...]] = {}  # vLLM's "image" field (or "images"), by entry
        path, conversations, order = sharegpt_in_seeded_order(self.name, spec, images)
        tags = DatasetTags(spec, counter)
        prompts: list[Prompt] = []
        short = long = no_reply = 0
        for index in order:
            if len(prompts) == spec.pool:
                break
            exchange = first_exchange(conversations[index])
            if exchange is None:
                no_reply += 1
                continue
            system, user, reply = exchange
            plain = (system + " " if system else "") + user  # the prompt as vLLM measures it
            prompt_len = counter.count_text(plain)
            if prompt_len < MIN_LEN:
                short += 1
                continue
            if prompt_len > MAX_PROMPT_LEN:
                long += 1
                continue
            output = spec.max_tokens if spec.max_tokens_set else counter.count_text(reply)
            if output < MIN_LEN and not spec.max_tokens_set:
                short += 1
                continue
            if prompt_len + output > MAX_TOTAL_LEN:
                long += 1
                continue
            if spec.prompt_form == TEXT:
                if images.get(index):
                    raise DataFileError(f'{path} entry {index}: "image" needs --endpoint chat')
                prompt = Prompt(index, self.name, prompt_len, text=user, prefix=(system + " " if system else ""),
                                max_tokens=output)
                if not tags.placeholder:  # sent as measured: no second count
                    prompts.append(prompt)
                    continue
            else:
                turns = ((("system", system),) if system else ()) + (("user", user),)
                prompt = Prompt(index, self.name, 0, messages=turns, max_tokens=output, images=images.get(index, ()))
            prompts.append(replace(prompt, prompt_tokens=tags.count(prompt)))
        dropped = f"{short} too short, {long} too long, {no_reply} without a reply, of {len(conversations):,}"
        if not prompts:
            raise DataFileError(f"--dataset-path {path}: no conversation fits ({dropped})")
        return Workload(prompts, tags.atoms(prompts[0]), f"{len(prompts)} rows used, {dropped} in {path}")
