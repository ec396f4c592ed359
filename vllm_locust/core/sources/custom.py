"""``custom``: one request per row of a JSONL file, in file order.

A row is vLLM's custom form ``{"prompt": str, "output_tokens": int}`` or OpenAI's chat form
``{"messages": [...], "max_tokens": int}`` (``datafiles.read_custom``); its output length is its
own (``--max-tokens`` when it gives none, or when ``--max-tokens`` is given: that overrides). The
pool is the file's first ``--prompt-pool`` rows; nothing is filtered (the file is the user's choice).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from . import Source, register
from .datafiles import DataFileError, DatasetTags, dataset_file, read_custom
from .records import TEXT, Prompt, Workload

if TYPE_CHECKING:
    from ..tokens import TokenCounter
    from ..workloads import WorkloadSpec


@register("custom")
class Custom(Source):
    help = "prompts of a JSONL file (--dataset-path), each with its own output length"

    def build(self, spec: WorkloadSpec, counter: TokenCounter) -> Workload:
        path = dataset_file(self.name, spec.dataset_path, "JSONL of prompt or messages rows")
        rows = read_custom(path)
        if spec.prompt_form == TEXT:
            chat = next((row for row in rows if row.messages), None)
            if chat is not None:
                raise DataFileError(f'{chat.row}: "messages" needs --endpoint chat '
                                    f'(--endpoint {spec.endpoint} takes "prompt" rows)')
        tags = DatasetTags(spec, counter)
        prompts = []
        for row in rows[: spec.pool]:
            output = spec.max_tokens if spec.max_tokens_set or row.output_tokens is None else row.output_tokens
            if spec.prompt_form == TEXT:
                if row.images:
                    raise DataFileError(f'{row.row}: "images" needs --endpoint chat')
                prompt = Prompt(row.index, self.name, 0, text=row.text, max_tokens=output)
            else:
                prompt = Prompt(row.index, self.name, 0, messages=row.messages or (("user", row.text),),
                                max_tokens=output, images=row.images)
            prompts.append(replace(prompt, prompt_tokens=tags.count(prompt)))
        note = f"{len(prompts)} rows used, of {len(rows):,} in {path}"
        if len(rows) > spec.pool:
            note += f" (--prompt-pool {spec.pool})"
        return Workload(prompts, tags.atoms(prompts[0]), note)
