"""``trace``: replay a Mooncake JSONL or BurstGPT CSV trace, each row's lengths, time and shared blocks.

Every row of the trace (``tracefiles.py``, sorted by time) is one prompt, in order: ``index`` is
the row's place, ``send_at_s`` its time after the first row's (seconds, not scaled by
``--trace-speed``: the replay schedule scales), ``prompt_tokens`` its ``input_length`` and
``max_tokens`` its ``output_length`` (``--max-tokens``, when given, for every row). The whole
trace is the pool: ``--prompt-pool`` is ignored, and prompts are sent untagged
(``--no-unique-prompts`` changes nothing): the hash ids decide what requests share.

**Blocks.** A Mooncake row's ``hash_ids`` name its prompt's blocks of ``--trace-block-tokens``
tokens (512 in the published traces); rows with the same id share that block. Here every id
stands for the same ``--trace-block-tokens`` one-token words in every row, run and process (for
one seed and tokenizer; ``BlockTable``), so a server's prefix cache sees exactly the trace's
sharing. The user text is a fixed lead word, then the blocks' words: every block whole but the
last, which gives its first words up to the row's exact ``input_length`` (the chat template's
tokens and the lead are measured once). A BurstGPT row, or the part of a Mooncake row its
``hash_ids`` do not cover, gets blocks of its own (negative ids, which no trace uses). A row
shorter than the chat template and the lead is one line naming it (Mooncake), or left out and
counted (BurstGPT, a log of every request, tiny ones too).

**Cheap to build.** No ``/tokenize`` call per row: a block's words follow from its id, so a
prompt holds its ids and the table makes its text when it is sent (``Prompt.render``), and a
10,000-row Mooncake trace (about 7,600 tokens a prompt) costs about 10 MB, not the 217 MB its
texts would; the source is not disk-cached. A sample of rows (the first three, eight more at
random) is counted once: a tokenizer that does not count block words additively makes every row
counted and closed to its length (``ExactBuilder``'s fillers), or one line naming the row.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Callable

from . import Source, register
from .exact import FILLERS, MIN_ATOMS, PromptLengthError, one_token_words
from .records import TEXT, Prompt, Workload
from .tracefiles import DataFileError, TraceRow, load_trace

if TYPE_CHECKING:
    from ..tokens import TokenCounter
    from ..workloads import WorkloadSpec

__all__ = ["BlockTable", "TracePrompts", "TraceSource", "block_atoms", "layout", "own_block_id"]

WANT_BLOCK_ATOMS = 64  # one-token words asked for: more atoms, shorter block headers (ids in fewer words)
POOL_WORDS = 1 << 18  # the seeded word stream blocks are cut from (about 1 MB of text)
CHECKED_FIRST, CHECKED_RANDOM = 3, 8  # rows counted once to confirm the lengths
_M64 = (1 << 64) - 1
_USER = (("user", ""),)  # a trace prompt's one message, its words all in blocks: one tuple for every prompt
_OWN_SHIFT = 24  # own block ids: row << 24 | position (a prompt of up to 16M blocks)


def _mix(x: int) -> int:
    """SplitMix64's finaliser: a bijection on 64-bit integers, so distinct ids stay distinct."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def own_block_id(row: int, position: int) -> int:
    """The id of block ``position`` of row ``row`` where no hash id covers it: negative, so no
    trace's id (>= 0) meets it, and no other row's."""
    return -1 - ((row << _OWN_SHIFT) | position)


def block_atoms(counter: TokenCounter) -> list[str]:
    """One-token words of one length (the largest such group), so a block's words are a slice of a
    stream at a computed offset."""
    by_length: dict[int, list[str]] = {}
    for word in one_token_words(counter, want=WANT_BLOCK_ATOMS):
        by_length.setdefault(len(word), []).append(word)
    atoms = max(by_length.values(), key=len, default=[])
    if len(atoms) < MIN_ATOMS:
        raise PromptLengthError(f"--workload trace: this tokenizer has too few one-token words of one length "
                                f"({len(atoms)} of {MIN_ATOMS}) to build blocks from")
    return atoms


class BlockTable:
    """Every block's words, made from its id when a prompt is sent; shared by all of a run's prompts.

    A block is a header that spells its (mixed) id in base ``len(atoms)`` (so blocks with different
    ids differ within their first ``header`` words, 11 for 64 atoms) and then a slice of one seeded
    word stream at an offset the id picks. The same seed, atoms and block size give the same words for an id in every
    process. Every word is one token after a space: ``n`` words are ``n`` tokens.
    """

    def __init__(self, atoms: list[str], block_tokens: int, seed: int):
        if len({len(a) for a in atoms}) != 1:
            raise ValueError("block atoms must all have one length")
        self.atoms = tuple(atoms)
        self.block_tokens = block_tokens
        self.lead = atoms[0]  # the user text's first word: every block word then follows a space
        self.width = len(atoms[0]) + 1  # a word and its space in the stream
        base = len(atoms)
        self.header = min(block_tokens, next(d for d in range(1, 65) if base ** d >= 1 << 64))
        words = max(POOL_WORDS, 2 * block_tokens)
        self.stream = " ".join(random.Random(f"{seed}:trace-blocks").choices(self.atoms, k=words))
        self.offsets = words - block_tokens + 1
        self.salt = _mix(seed & _M64)

    def __deepcopy__(self, memo):  # immutable and large: ``dataclasses.asdict`` of a prompt shares it
        return self

    def words(self, block: int, count: int) -> str:
        """The first ``count`` words of block ``block`` (``count`` <= the block size)."""
        z = (block << 1 if block >= 0 else (-block << 1) - 1) & _M64  # zigzag: negative ids too
        h = _mix(z ^ self.salt)
        head, base, digits = min(count, self.header), len(self.atoms), []
        value = h
        for _ in range(head):
            value, d = divmod(value, base)
            digits.append(self.atoms[d])
        rest = count - head
        if rest <= 0:
            return " ".join(digits)
        start = (_mix(h) % self.offsets) * self.width
        return " ".join(digits) + " " + self.stream[start:start + rest * self.width - 1]

    def join(self, blocks: tuple[int, ...], last_words: int = 0) -> str:
        """The user text of a prompt: the lead word, every block whole, the last one's first
        ``last_words`` (0: whole)."""
        n = self.block_tokens
        parts = [self.lead]
        parts.extend(self.words(b, n) for b in blocks[:-1])
        parts.append(self.words(blocks[-1], last_words or n))
        return " ".join(parts)


class TracePrompts(Sequence):
    """A trace's pool as columns: per row its send time, lengths, block count and the last block's
    words in arrays, its hash ids in one shared array; each ``Prompt`` is made when it is asked for
    (a few microseconds, when it is sent). A 1 M-row BurstGPT trace held 410 MiB as prompt objects,
    and every garbage collection walked them (``benchmarks/trace_build.py --burstgpt``)."""

    def __init__(self, spec: WorkloadSpec, table: BlockTable):
        self.table = table
        self.max_tokens = spec.max_tokens if spec.max_tokens_set else None  # None: each row's own
        self.text_form = spec.prompt_form == TEXT
        self.times = array("d")  # seconds after the first row
        self.inputs = array("i")  # input_length (the suite's ceiling, 2 Mi, fits)
        self.outputs = array("i")
        self.blocks = array("i")  # how many blocks the user text has
        self.lasts = array("i")  # words of the last block (0: whole)
        self.ids = array("q")  # every row's hash ids, one after another
        self.ids_end = array("q")  # row r's are ids[ids_end[r - 1]:ids_end[r]]
        self.fixed: dict[int, Prompt] = {}  # rows a tokenizer's counts made closed to length (``_close``)
        self.columns = {"send_at_s": self.times, "prompt_tokens": self.inputs}  # ``records.column``

    def add(self, at_s: float, row: TraceRow, blocks: int, last: int) -> None:
        self.times.append(at_s)
        self.inputs.append(row.input_length)
        self.outputs.append(row.output_length)
        self.blocks.append(blocks)
        self.lasts.append(last)
        self.ids.extend(row.hash_ids)
        self.ids_end.append(len(self.ids))

    def __len__(self) -> int:
        return len(self.times)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        fixed = self.fixed.get(index)
        return fixed if fixed is not None else self.prompt(index)

    def __eq__(self, other) -> bool:  # as a list of the same prompts would compare
        return isinstance(other, Sequence) and len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # mutable (``__setitem__``), as a list

    def __setitem__(self, index: int, prompt: Prompt) -> None:
        self.fixed[index] = prompt

    def row_ids(self, index: int) -> tuple[int, ...]:
        return tuple(self.ids[self.ids_end[index - 1] if index else 0:self.ids_end[index]])

    def prompt(self, index: int, blocks: tuple[int, ...] | None = None, last: int | None = None,
               text: str = "") -> Prompt:
        """Row ``index``'s prompt (``blocks``, ``last`` and ``text``: another layout of it)."""
        if blocks is None:
            k, ids = self.blocks[index], self.row_ids(index)
            blocks = ids[:k] if len(ids) >= k else ids + tuple(own_block_id(index, i) for i in range(len(ids), k))
            last = self.lasts[index]
        output = self.max_tokens if self.max_tokens is not None else self.outputs[index]
        shape = dict(text=text) if self.text_form else dict(messages=(("user", text),) if text else _USER)
        return Prompt(index, "trace", self.inputs[index], max_tokens=output, send_at_s=self.times[index],
                      blocks=blocks, block_words=last, block_table=self.table, **shape)

    def uses(self) -> tuple[int, int, int]:
        """Blocks named by hash id, those shared by more than one row, and own blocks: the note's figures."""
        seen: dict[int, int] = {}
        own, start = 0, 0
        for index, end in enumerate(self.ids_end):
            ids = set(self.ids[start:end][:self.blocks[index]])
            for b in ids:
                seen[b] = seen.get(b, 0) + 1
            own += max(0, self.blocks[index] - (end - start))
            start = end
        return len(seen), sum(1 for c in seen.values() if c > 1), own


def layout(index: int, ids: tuple[int, ...], words: int, n: int) -> tuple[tuple[int, ...], int]:
    """The blocks of a user text of ``words`` words: the row's ids as far as they reach, its own
    ids after them; and the words of the last block (0: whole)."""
    k = -(-words // n)
    blocks = ids[:k] if len(ids) >= k else ids + tuple(own_block_id(index, i) for i in range(len(ids), k))
    last = words - n * (k - 1)
    return blocks, (0 if last == n else last)


@register("trace")
class TraceSource(Source):
    shares_prefixes = True
    help = ("timed replay of a Mooncake JSONL or BurstGPT CSV trace (--dataset-path): each row's lengths and "
            "arrival, blocks shared by hash_id; the whole trace is the pool (--prompt-pool ignored)")
    cacheable = False  # building is cheap (no count per row) and a trace's texts are too large to cache

    def build(self, spec: WorkloadSpec, counter: TokenCounter) -> Workload:
        trace = load_trace(spec.dataset_path)
        path, rows, n = spec.dataset_path, trace.rows, spec.trace_block_tokens
        table = BlockTable(block_atoms(counter), n, spec.seed)
        form = "the prompt's start tokens" if spec.prompt_form == TEXT else "the chat template"
        count = self._counter(spec, counter)
        overhead = count(self._prompt(spec, 0, TraceRow(0.0, 2, 1), (-1,), 1, table)) - 1  # the lead word too
        short = 0
        if trace.format == "burstgpt":  # a log of every request, tiny ones too: left out and counted
            kept = [row for row in rows if row.input_length > overhead]
            short, rows = len(rows) - len(kept), kept
            if not rows:
                raise DataFileError(f"{path}: no requests left: every row is shorter than {form} and the lead "
                                    f"word ({overhead} tokens)")
        first = rows[0].time_s
        prompts, padded = TracePrompts(spec, table), 0
        for row in rows:
            where = f"{path} line {row.line}"
            if len(row.hash_ids) > -(-row.input_length // n):
                raise DataFileError(f'{where}: "hash_ids" has {len(row.hash_ids)} blocks, more than input_length '
                                    f'{row.input_length} fills at --trace-block-tokens {n}')
            words = row.input_length - overhead
            if words < 1:
                raise DataFileError(f'{where}: "input_length" {row.input_length} is too short: {form} and the '
                                    f'lead word take {overhead} tokens, leaving none for blocks')
            k = -(-words // n)
            padded += k > len(row.hash_ids) and bool(row.hash_ids)
            prompts.add(row.time_s - first, row, k, words - n * (k - 1) if words % n else 0)
        closed = self._check(spec, prompts, rows, count, overhead, path)
        notes = [f"{short:,} rows shorter than {form} and the lead word ({overhead} tokens) left out"] if short else []
        return Workload(prompts, (), self._note(trace, prompts, n, padded, closed, notes))

    @staticmethod
    def _counter(spec: WorkloadSpec, counter: TokenCounter) -> Callable[[Prompt], int]:
        if spec.prompt_form == TEXT:
            return lambda p: counter.count_text(p.render(""))
        return lambda p: counter.count_messages(p.render(""))

    @staticmethod
    def _prompt(spec: WorkloadSpec, index: int, row: TraceRow, blocks: tuple[int, ...], last: int,
                table: BlockTable, at_s: float = 0.0, text: str = "") -> Prompt:
        output = spec.max_tokens if spec.max_tokens_set else row.output_length
        shape = dict(text=text) if spec.prompt_form == TEXT else dict(messages=(("user", text),) if text else _USER)
        return Prompt(index, "trace", row.input_length, max_tokens=output, send_at_s=at_s, blocks=blocks,
                      block_words=last, block_table=table, **shape)

    def _check(self, spec, prompts: TracePrompts, rows: list[TraceRow], count, overhead: int, path: str) -> int:
        """Count a sample of prompts; if one is off, count every one and close it. Returns how many
        were closed (0 when the sample held)."""
        sample = list(range(min(CHECKED_FIRST, len(prompts))))
        rest = range(len(sample), len(prompts))
        sample += random.Random(spec.seed).sample(rest, min(CHECKED_RANDOM, len(rest)))
        if all(count(prompts[i]) == prompts[i].prompt_tokens for i in sample):
            return 0
        closed = 0
        for i in range(len(prompts)):
            prompt = prompts[i]
            fixed = self._close(spec, prompt, rows[i], count, overhead, f"{path} line {rows[i].line}")
            if fixed is not prompt:
                prompts[i] = fixed
                closed += 1
        return closed

    def _close(self, spec, prompt: Prompt, row: TraceRow, count, overhead: int, where: str) -> Prompt:
        """``prompt`` made exactly ``input_length`` tokens: more or fewer words, then short fillers."""
        target, n = prompt.prompt_tokens, spec.trace_block_tokens

        def made(words: int, text: str = "") -> Prompt:
            blocks, last = layout(prompt.index, row.hash_ids, words, n)
            return self._prompt(spec, prompt.index, row, blocks, last, prompt.block_table, prompt.send_at_s, text)

        words, have = target - overhead, count(prompt)
        best, best_have, seen = None, -1, {words}
        for _ in range(8):  # token counts follow words nearly one for one: a step or two
            if have == target:
                return prompt
            if best_have < have < target:
                best, best_have, best_words = prompt, have, words
            words = max(1, words + target - have)
            if words in seen:
                break
            seen.add(words)
            prompt = made(words)
            have = count(prompt)
        if have == target:
            return prompt
        if best_have < have < target:
            best, best_have, best_words = prompt, have, words
        text = ""
        for _ in range(4 * len(FILLERS) if best is not None else 0):  # the last token or two
            for filler in FILLERS:
                trial = made(best_words, text + filler)
                trial_count = count(trial)
                if trial_count <= target:
                    best, best_have, text = trial, trial_count, text + filler
                    break
            else:
                break
            if best_have == target:
                return best
        raise PromptLengthError(f"{where}: could not build an exact {target}-token prompt with this tokenizer "
                                f"(closest {have if best is None else best_have})")

    @staticmethod
    def _note(trace, prompts: TracePrompts, n: int, padded: int, closed: int, notes: list[str]) -> str:
        named, shared, own = prompts.uses()
        span = prompts.times[-1] - prompts.times[0]
        parts = [f"trace: {len(prompts):,} requests over {span:,.1f} s, {named + own:,} blocks "
                 f"({shared:,} shared by more than one request), block {n} tokens"]
        parts += list(trace.notes) + notes
        if padded:
            parts.append(f"{padded:,} rows' hash_ids cover less than their input_length (own blocks after them; "
                         f"is --trace-block-tokens the trace's block size?)")
        if closed:
            parts.append(f"this tokenizer does not count block words additively: every row counted, "
                         f"{closed:,} closed to length")
        return "; ".join(parts)
