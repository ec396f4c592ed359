"""Token-exact synthetic prompts: the machinery the built-in sources share.

A ``SyntheticSource`` says only what differs between ``fixed``, ``mixed`` and ``shared-prefix``
(each entry's kind and length, an optional shared system prompt); ``build`` here makes every
entry exactly that many tokens long with the run's own tokenizer and checks the tag words.
Pseudo-words from a seeded stream, no language, so no tokenizer favours a workload.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Iterator

from . import Source
from .records import TAG_WORDS, TEXT, Prompt, Workload

if TYPE_CHECKING:
    from ..tokens import TokenCounter
    from ..workloads import WorkloadSpec

FILLERS = (" a", " x", " the", " of", " 1", ".", ",", "a")
SYLLABLES = tuple(c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou")
# Tag atoms: candidates, and how many a tag needs at least and at most.
ATOM_CANDIDATES = SYLLABLES + tuple(c + v + c2 for c in "bdfgklmnprstvz" for v in "aeiou" for c2 in "nrst")
MIN_ATOMS, WANT_ATOMS = 8, 32


class PromptLengthError(ValueError):
    pass


def word_stream(rng: random.Random) -> Iterator[str]:
    """Endless seeded pseudo-words: no language, so no tokenizer favours a workload."""
    while True:
        yield "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3)))


class ExactBuilder:
    """Finds the number of words (plus filler) that makes a rendered prompt exactly N tokens."""

    def __init__(self, counter: TokenCounter, prompt_form: str, lead: str = ""):
        self.counter = counter
        self.prompt_form = prompt_form
        self.lead = lead + " " if lead else ""  # the tag placeholder the body is measured with

    def count(self, system: str | None, body: str) -> int:
        if self.prompt_form == TEXT:
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


def checked_atoms(counter: TokenCounter, prompt_form: str, candidates: list[str], system: str | None, body: str,
                  target: int) -> tuple[str, ...]:
    """The candidates that keep a built prompt at ``target`` tokens in a tag's digit positions, and
    only if a sample of whole tags does too (the tag's lead word is fixed, so only digits vary)."""
    probe = ExactBuilder(counter, prompt_form)
    lead = candidates[0]
    keep = tuple(atom for atom in candidates
                 if probe.count(system, f"{lead} {' '.join([atom] * TAG_WORDS)} {body}") == target)
    sample = random.Random(len(body))
    for _ in range(8):
        tag = Workload([], keep).tag(sample.randrange(1 << 16), sample.randrange(1 << 16), sample.randrange(1 << 30))
        if keep and probe.count(system, f"{tag} {body}") != target:
            return ()
    return keep


class SyntheticSource(Source):
    """Seeded pseudo-word prompts, each exactly as long as ``entry`` says; every output ``--max-tokens``."""

    def system_prompt(self, spec: WorkloadSpec, words: Iterator[str], counter: TokenCounter) -> str | None:
        """The system prompt every entry shares (None: none), built from the seeded ``words``."""
        return None

    def entry(self, spec: WorkloadSpec, rng: random.Random) -> tuple[str, int]:
        """The next pool entry's kind and exact length in tokens (system prompt included)."""
        raise NotImplementedError

    def build(self, spec: WorkloadSpec, counter: TokenCounter) -> Workload:
        """The pool, in a fixed order, and its tag atoms."""
        rng = random.Random(spec.seed)
        words = word_stream(rng)
        candidates: list[str] = []
        if spec.unique:
            candidates = one_token_words(counter)
            if len(candidates) < MIN_ATOMS:
                raise PromptLengthError(f"this tokenizer has too few one-token words for unique prompts "
                                        f"({len(candidates)} of {MIN_ATOMS}); pass --no-unique-prompts")
        placeholder = " ".join([candidates[0]] * (TAG_WORDS + 1)) if candidates else ""
        builder = ExactBuilder(counter, spec.prompt_form, placeholder)
        system = self.system_prompt(spec, words, counter)
        prompts = []
        atoms: tuple[str, ...] = ()
        for index in range(spec.pool):
            kind, target = self.entry(spec, rng)
            body_words = [next(words) for _ in range(target * 2 + 16)]
            body, tokens = builder.build(body_words, target, system)
            if candidates and not atoms:
                atoms = checked_atoms(counter, spec.prompt_form, candidates, system, body, target)
                if len(atoms) < MIN_ATOMS:
                    raise PromptLengthError(f"only {len(atoms)} tag words keep prompts token-exact with this "
                                            f"tokenizer and template; pass --no-unique-prompts")
            if spec.prompt_form == TEXT:
                prompts.append(Prompt(index, kind, tokens, text=body, prefix=(system + " " if system else ""),
                                      max_tokens=spec.max_tokens))
            else:
                pairs = tuple((m["role"], m["content"]) for m in builder.messages(system, body))
                prompts.append(Prompt(index, kind, tokens, messages=pairs, max_tokens=spec.max_tokens))
        return Workload(prompts, atoms)
