"""Seeded workloads with token-exact prompts that never repeat within a run.

- ``fixed``: every prompt ``prompt_tokens`` long (the seed's 512 in, 128 out).
- ``mixed``: short prompts of ``prompt_tokens`` and, with probability ``long_fraction``, long ones of
  ``long_prompt_tokens``: long prefills that stall short decodes, which chunked prefill addresses.
- ``shared-prefix``: one fixed system prompt of ``prefix_tokens`` before a unique user part, so the
  whole prompt is ``prefix_tokens + prompt_tokens``: what prefix caching addresses.

**Unique prompts.** A pool of ``pool`` bodies is built once, token-exact, and cached on disk (exact
lengths cost several ``/tokenize`` calls each; on the H200 5,109 prompts took 80 s). Each request
then starts its user text with a *tag*: a fixed lead word and ``TAG_WORDS`` pseudo-words, each
one token, spelling the run, the worker and the request number in base ``len(atoms)``. The body
was built with a tag in place, and every atom was checked to cost exactly one token in a digit
position (and a sample of whole tags to keep the length), so any tag gives the same exact length; since the tag comes first, two requests share no prompt
prefix (beyond ``shared-prefix``'s system prompt) and vLLM's prefix cache never hits. Building a
tag costs a string join: a run of any length never recycles a prompt.
Why not vLLM's ``cache_salt``: it only works on vLLM, and the prompts would still repeat for
any other cache (a proxy's, another engine's).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from ..backend.tokencount import TokenCounter

WORKLOADS = ("fixed", "mixed", "shared-prefix")
FILLERS = (" a", " x", " the", " of", " 1", ".", ",", "a")
SYLLABLES = tuple(c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou")
# Tag atoms: candidates, and how many a tag uses (run 1, worker 2, request number 4 digits).
ATOM_CANDIDATES = SYLLABLES + tuple(c + v + c2 for c in "bdfgklmnprstvz" for v in "aeiou" for c2 in "nrst")
MIN_ATOMS, WANT_ATOMS = 8, 32
RUN_DIGITS, WORKER_DIGITS, SEQUENCE_DIGITS = 1, 2, 4
TAG_WORDS = RUN_DIGITS + WORKER_DIGITS + SEQUENCE_DIGITS
CACHE_VERSION = 2


@dataclass(frozen=True)
class WorkloadSpec:
    """Everything that decides a workload's prompts; part of the cache key."""

    name: str = "fixed"
    prompt_tokens: int = 512
    max_tokens: int = 128
    long_prompt_tokens: int = 2048
    long_fraction: float = 0.1
    prefix_tokens: int = 256
    pool: int = 256
    seed: int = 0
    endpoint: str = "chat"
    unique: bool = True

    def __post_init__(self):
        if self.name not in WORKLOADS:
            raise ValueError(f"--workload {self.name!r}: choose one of {', '.join(WORKLOADS)}")
        if self.prompt_tokens < 1 or self.max_tokens < 1 or self.pool < 1:
            raise ValueError("--prompt-tokens, --max-tokens and --prompt-pool must be at least 1")


@dataclass(frozen=True)
class Prompt:
    """One pool entry: chat ``messages`` or completions ``prefix`` + ``text``, its exact token count.

    ``render(tag)`` puts a request's tag at the start of the user text (after the shared system
    prompt): the tag's words replace the placeholder the body was measured with.
    """

    index: int
    kind: str
    prompt_tokens: int
    messages: tuple[tuple[str, str], ...] = ()
    text: str = ""
    prefix: str = ""

    def render(self, tag: str = ""):
        """Chat messages (a list of dicts) or the completions prompt (a string)."""
        lead = tag + " " if tag else ""
        if not self.messages:
            return self.prefix + lead + self.text
        out = [{"role": role, "content": content} for role, content in self.messages]
        out[-1]["content"] = lead + out[-1]["content"]
        return out


@dataclass(frozen=True)
class Workload:
    """The built pool and the tag alphabet (empty when prompts may repeat)."""

    prompts: list[Prompt]
    atoms: tuple[str, ...] = ()

    def tag(self, run: int, worker: int, sequence: int) -> str:
        """The words that make request ``sequence`` of ``worker`` in run ``run`` unique: a fixed lead
        word (the first atom), then the digits of sequence, worker and run in base ``len(atoms)``,
        least significant first, so consecutive requests differ from the second word on."""
        if not self.atoms:
            return ""
        base = len(self.atoms)
        digits = (_digits(sequence, base, SEQUENCE_DIGITS) + _digits(worker, base, WORKER_DIGITS)
                  + _digits(run, base, RUN_DIGITS))
        return " ".join([self.atoms[0]] + [self.atoms[d] for d in digits])

    @property
    def unique_requests_per_worker(self) -> int:
        return len(self.atoms) ** SEQUENCE_DIGITS if self.atoms else 0


def _digits(value: int, base: int, width: int) -> list[int]:
    """The ``width`` lowest digits of ``value`` in ``base``, least significant first."""
    out = []
    for _ in range(width):
        value, d = divmod(value, base)
        out.append(d)
    return out


class PromptLengthError(ValueError):
    pass


def word_stream(rng: random.Random):
    """Endless seeded pseudo-words: no language, so no tokenizer favours a workload."""
    while True:
        yield "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3)))


class ExactBuilder:
    """Finds the number of words (plus filler) that makes a rendered prompt exactly N tokens."""

    def __init__(self, counter: TokenCounter, endpoint: str, lead: str = ""):
        self.counter = counter
        self.endpoint = endpoint
        self.lead = lead + " " if lead else ""  # the tag placeholder the body is measured with

    def count(self, system: str | None, body: str) -> int:
        if self.endpoint == "completions":
            return self.counter.count_text((system + " " if system else "") + self.lead + body)
        return self.counter.count_messages(self.messages(system, self.lead + body))

    @staticmethod
    def messages(system: str | None, body: str) -> list[dict]:
        msgs = [{"role": "system", "content": system}] if system else []
        return msgs + [{"role": "user", "content": body}]

    def build(self, words: list[str], target: int, system: str | None = None) -> tuple[str, int]:
        """Body text from a prefix of ``words`` whose rendered prompt has exactly ``target`` tokens."""
        counted: dict[int, int] = {}

        def f(k: int) -> int:
            if k not in counted:
                counted[k] = self.count(system, " ".join(words[:k]))
            return counted[k]

        base = f(0)
        if base > target:
            what = "the chat template and the request tag" if self.lead else "the chat template alone"
            raise PromptLengthError(f"{what} take {base} tokens, more than the {target} asked for"
                                    + ("; use a longer --prompt-tokens or --no-unique-prompts" if self.lead else ""))
        lo, hi = 0, len(words)
        if f(hi) < target:
            raise PromptLengthError(f"{len(words)} words give only {f(hi)} tokens, fewer than {target}")
        step = 0
        while hi - lo > 1:  # invariant: f(lo) <= target < f(hi), or hi is the end and f(hi) == target
            # Interpolate: token counts grow about linearly with words, so this takes 2-4 counts;
            # every third step bisects, so an odd tokenizer cannot make it crawl.
            span = f(hi) - f(lo)
            step += 1
            if span > 0 and step % 3:
                mid = lo + round((target - f(lo)) * (hi - lo) / span)
            else:
                mid = (lo + hi) // 2
            mid = min(hi - 1, max(lo + 1, mid))
            if f(mid) <= target:
                lo = mid
            else:
                hi = mid
            if f(lo) == target:
                break
        if f(hi) == target:
            lo = hi
        body, have = " ".join(words[:lo]), f(lo)
        for _ in range(4 * len(FILLERS)):  # close the last gap of a token or two with short fillers
            if have == target:
                return body, have
            for filler in FILLERS:
                trial_count = self.count(system, body + filler)
                if trial_count <= target:
                    body, have = body + filler, trial_count
                    break
            else:
                break
        raise PromptLengthError(f"could not build an exact {target}-token prompt (closest {have})")


def one_token_words(counter: TokenCounter, want: int = WANT_ATOMS) -> list[str]:
    """Candidate tag atoms that cost one token each after a space (``w w w`` is one token more than
    ``w w``, which is one more than ``w``): no count of a special token or a start matters."""
    found = []
    for word in ATOM_CANDIDATES:
        one, two, three = (counter.count_text(" ".join([word] * n)) for n in (1, 2, 3))
        if two - one == 1 and three - two == 1:
            found.append(word)
            if len(found) == want:
                break
    return found


def checked_atoms(counter: TokenCounter, endpoint: str, candidates: list[str], system: str | None, body: str,
                  target: int) -> tuple[str, ...]:
    """The candidates that keep a built prompt at ``target`` tokens in a tag's digit positions, and
    only if a sample of whole tags does too (the tag's lead word is fixed, so only digits vary)."""
    probe = ExactBuilder(counter, endpoint)
    lead = candidates[0]
    keep = tuple(atom for atom in candidates
                 if probe.count(system, f"{lead} {' '.join([atom] * TAG_WORDS)} {body}") == target)
    sample = random.Random(len(body))
    for _ in range(8):
        tag = Workload([], keep).tag(sample.randrange(1 << 16), sample.randrange(1 << 16), sample.randrange(1 << 30))
        if keep and probe.count(system, f"{tag} {body}") != target:
            return ()
    return keep


def build_workload(spec: WorkloadSpec, counter: TokenCounter) -> Workload:
    """The workload's prompt pool, in a fixed order, and its tag atoms."""
    rng = random.Random(spec.seed)
    words = word_stream(rng)
    candidates: list[str] = []
    if spec.unique:
        candidates = one_token_words(counter)
        if len(candidates) < MIN_ATOMS:
            raise PromptLengthError(f"this tokenizer has too few one-token words for unique prompts "
                                    f"({len(candidates)} of {MIN_ATOMS}); pass --no-unique-prompts")
    placeholder = " ".join([candidates[0]] * (TAG_WORDS + 1)) if candidates else ""
    builder = ExactBuilder(counter, spec.endpoint, placeholder)
    system = None
    if spec.name == "shared-prefix":
        system_words = [next(words) for _ in range(spec.prefix_tokens * 2 + 16)]
        system, _ = ExactBuilder(counter, "completions").build(system_words, spec.prefix_tokens)
    prompts = []
    atoms: tuple[str, ...] = ()
    for index in range(spec.pool):
        kind, target = "short" if spec.name == "mixed" else spec.name, spec.prompt_tokens
        if spec.name == "mixed" and rng.random() < spec.long_fraction:
            kind, target = "long", spec.long_prompt_tokens
        if spec.name == "shared-prefix":
            target = spec.prefix_tokens + spec.prompt_tokens
        body_words = [next(words) for _ in range(target * 2 + 16)]
        body, tokens = builder.build(body_words, target, system)
        if candidates and not atoms:
            atoms = checked_atoms(counter, spec.endpoint, candidates, system, body, target)
            if len(atoms) < MIN_ATOMS:
                raise PromptLengthError(f"only {len(atoms)} tag words keep prompts token-exact with this "
                                        f"tokenizer and template; pass --no-unique-prompts")
        if spec.endpoint == "completions":
            prompts.append(Prompt(index, kind, tokens, text=body, prefix=(system + " " if system else "")))
        else:
            pairs = tuple((m["role"], m["content"]) for m in builder.messages(system, body))
            prompts.append(Prompt(index, kind, tokens, messages=pairs))
    return Workload(prompts, atoms)


def build_prompts(spec: WorkloadSpec, counter: TokenCounter) -> list[Prompt]:
    """The pool alone (for callers that do not tag)."""
    return build_workload(spec, counter).prompts


def cache_path(cache_dir: str | Path, spec: WorkloadSpec, fingerprint: str) -> Path:
    key = json.dumps({"spec": asdict(spec), "tokenizer": fingerprint, "v": CACHE_VERSION}, sort_keys=True)
    return Path(cache_dir) / f"prompts-{spec.name}-{hashlib.sha1(key.encode()).hexdigest()[:16]}.json"


def load_or_build(spec: WorkloadSpec, counter: TokenCounter, cache_dir: str | Path | None) -> Workload:
    """The workload from the disk cache, or built and then cached (written atomically: workers race)."""
    path = cache_path(cache_dir, spec, counter.fingerprint) if cache_dir else None
    if path is not None and path.exists():
        data = json.loads(path.read_text())
        prompts = [Prompt(r["index"], r["kind"], r["prompt_tokens"], tuple(map(tuple, r["messages"])), r["text"],
                          r.get("prefix", "")) for r in data["prompts"]]
        return Workload(prompts, tuple(data["atoms"]))
    workload = build_workload(spec, counter)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"atoms": list(workload.atoms), "prompts": [asdict(p) for p in workload.prompts]}))
        os.replace(tmp, path)
    return workload
