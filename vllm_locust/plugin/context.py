"""Per-process load context: model, workload and request settings, built once and shared.

Every user of a process draws from one context: pool entries of the ``--workload``'s source
(``core/sources/``) in one fixed cycle (the same on every profile), each request tagged so that
its prompt is unique in the run (``Workload.tag``: run, worker index, request number). The plugin
builds it lazily under a lock (the first user waits for it) and rebuilds it when the options
change between web UI runs.
"""

from __future__ import annotations

import itertools
import logging
import zlib
from dataclasses import dataclass, field

from ..backend.client import require_host, resolve_model, serves_continuous_usage
from ..backend.modelfit import model_max_len
from .images import dataset_images, pool_of
from .options import as_bool, workload_spec
from ..backend.tokencount import LocalTokenCounter, WordCounter, server_counter_or_none
from ..core.sources import Prompt, Workload
from ..core.workloads import WorkloadSpec, load_or_build

logger = logging.getLogger(__name__)


@dataclass
class LoadContext:
    host: str
    model: str
    spec: WorkloadSpec
    workload: Workload
    ignore_eos: bool
    exact_lengths: bool
    key: tuple
    continuous_usage: bool = False
    worker_index: int = 0
    max_model_len: int | None = None  # the server's context length (GET /v1/models), when it lists one
    images: object = None  # ``images.ImagePool`` with --images-per-request; None: text only
    image_files: dict = field(default_factory=dict)  # a dataset's images: name -> (data URL or URL, bytes)
    _sequence: itertools.count = field(default_factory=itertools.count, repr=False)

    @property
    def prompts(self) -> list[Prompt]:
        return self.workload.prompts

    def next_request(self, run_id: str = "", arrival=None) -> tuple[Prompt, object]:
        """The next pool entry and its rendering for one request (tagged: unique in the run). The entry
        is the request's record of its source: its own output length (``max_tokens``) among others.
        A timed source (a trace: entries with ``send_at_s``) sends entry ``k`` for the schedule's
        arrival ``k``, as it is, untagged: its hash ids decide what it shares."""
        if arrival is not None and self.prompts and self.prompts[0].send_at_s is not None:
            prompt = self.prompts[arrival.k % len(self.prompts)]
            return prompt, prompt.render("")
        n = next(self._sequence)
        prompt = self.prompts[n % len(self.prompts)]
        if not self.workload.atoms:
            return prompt, prompt.render("")
        if n == self.workload.unique_requests_per_worker:
            logger.warning("this process sent %d requests: prompt tags start to repeat", n)
        run = zlib.crc32(run_id.encode())
        return prompt, prompt.render(self.workload.tag(run, self.worker_index, n))


def context_key(environment, options=None) -> tuple:
    """What the context is built from. ``options``: a persona's view (``personas.OptionsView``);
    the run's options by default."""
    o = environment.parsed_options if options is None else options
    return (environment.host, o.model, workload_spec(o), o.tokenizer, o.endpoint, o.continuous_usage,
            getattr(o, "images_per_request", 0), getattr(o, "image_size", ""), getattr(o, "image_format", ""))


def build_context(environment, options=None) -> LoadContext:
    o = environment.parsed_options if options is None else options
    host = require_host(environment.host)  # the server's root: ``http://h:p/v1`` is ``http://h:p``
    model = o.model or resolve_model(host, "", o.api_key)
    spec = workload_spec(o)
    images = pool_of(o)  # a bad size or format: one line before any request
    counter = server_counter_or_none(host, model, o.api_key)
    if counter is None and o.tokenizer:
        counter = LocalTokenCounter(o.tokenizer)
    if counter is None:
        logger.warning("server has no /tokenize and no --tokenizer was given: prompt lengths are approximate (1 token per word)")
        counter = WordCounter()
    workload = load_or_build(spec, counter, o.prompt_cache_dir or None)
    image_files = dataset_images(workload.prompts)  # a file that is no image: one line before any request
    continuous = {"on": True, "off": False}.get(str(o.continuous_usage))
    if continuous is None:
        continuous = serves_continuous_usage(host, o.api_key)
    index = getattr(environment.runner, "worker_index", 0) or 0
    return LoadContext(host, model, spec, workload, not as_bool(o.no_ignore_eos), counter.exact,
                       context_key(environment, options), continuous_usage=continuous, worker_index=int(index),
                       max_model_len=model_max_len(host, model, o.api_key), images=images,
                       image_files=image_files)
