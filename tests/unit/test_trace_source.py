"""The ``trace`` source: Mooncake JSONL and BurstGPT CSV rows become token-exact prompts whose blocks
are shared exactly where the trace's hash ids say, made lazily from one table; and the generator."""

import json
import math

import pytest

from vllm_locust.backend.tokencount import WordCounter
from vllm_locust.core import tracegen
from vllm_locust.core.sources import exact
from vllm_locust.core.sources.datafiles import DataFileError
from vllm_locust.core.sources.records import MESSAGES, TEXT
from vllm_locust.core.sources.trace import BlockTable, layout, own_block_id
from vllm_locust.core.sources.tracefiles import load_trace, read_trace
from vllm_locust.core.workloads import WorkloadSpec, build_workload, load_or_build

TEMPLATE, START = 7, 1  # the fake chat template's tokens; the fake tokenizer's start token


class TemplateCounter(WordCounter):
    """One token a word, plus a chat template's or a start token's fixed cost."""

    exact = True
    fingerprint = "template-words"

    def __init__(self):
        self.calls = 0

    def count_messages(self, messages, add_generation_prompt=True):
        self.calls += 1
        return TEMPLATE + sum(len(m["content"].split()) for m in messages)

    def count_text(self, text):
        self.calls += 1
        return START + len(text.split())


class DriftCounter(TemplateCounter):
    """A tokenizer that is not additive over words: one token more for every 100 characters."""

    def count_messages(self, messages, add_generation_prompt=True):
        return super().count_messages(messages) + sum(len(m["content"]) for m in messages) // 100


class EvenCounter(TemplateCounter):
    """A tokenizer that only ever counts an even number: no odd length can be built."""

    def count_messages(self, messages, add_generation_prompt=True):
        n = super().count_messages(messages)
        return n + n % 2


def mooncake(tmp_path, rows, name="trace.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def row(t, n, out=10, ids=()):
    return {"timestamp": t, "input_length": n, "output_length": out, "hash_ids": list(ids)}


def build(path, counter=None, **kw):
    spec = WorkloadSpec(name="trace", dataset_path=path, max_tokens_set=kw.pop("max_tokens_set", False), **kw)
    return build_workload(spec, counter or TemplateCounter())


def user_text(prompt):
    rendered = prompt.render("")
    return rendered if isinstance(rendered, str) else rendered[-1]["content"]


def count(prompt, counter=None):
    counter = counter or TemplateCounter()
    rendered = prompt.render("")
    return counter.count_text(rendered) if isinstance(rendered, str) else counter.count_messages(rendered)


@pytest.mark.parametrize("form", [MESSAGES, TEXT])
def test_every_prompt_is_its_rows_input_length_with_its_own_output_and_time(tmp_path, form):
    rows = [row(0, 100, 5, [1, 2, 3, 4]), row(250, 33, 7, [1, 2]), row(1000, 64, 9, [1, 2]), row(1500, 200, 11),
            row(4000, 9, 1, [7])]
    counter = TemplateCounter()
    workload = build(mooncake(tmp_path, rows), counter, trace_block_tokens=32, prompt_form=form)
    prompts = workload.prompts
    assert [p.prompt_tokens for p in prompts] == [100, 33, 64, 200, 9]
    assert [count(p) for p in prompts] == [100, 33, 64, 200, 9], "the rendered prompt is exactly input_length"
    assert [p.max_tokens for p in prompts] == [5, 7, 9, 11, 1], "each row's output_length"
    assert [p.send_at_s for p in prompts] == [0.0, 0.25, 1.0, 1.5, 4.0], "seconds from the first row"
    assert [p.index for p in prompts] == [0, 1, 2, 3, 4] and {p.kind for p in prompts} == {"trace"}
    assert workload.atoms == (), "trace prompts are sent untagged"
    assert isinstance(prompts[0].render(""), str if form == TEXT else list)
    assert counter.calls < 200, "no count per row: the one-token words, the overhead and a sample"
    assert workload.note.startswith("trace: 5 requests over 4.0 s, ")
    assert "block 32 tokens" in workload.note


def test_the_pool_is_the_whole_trace_and_max_tokens_overrides(tmp_path):
    path = mooncake(tmp_path, [row(t * 10, 50, 3 + t, [t]) for t in range(12)])
    prompts = build(path, pool=3, max_tokens=77, max_tokens_set=True, trace_block_tokens=64).prompts
    assert len(prompts) == 12, "--prompt-pool is ignored: every row is a request"
    assert [p.max_tokens for p in prompts] == [77] * 12, "--max-tokens, when given, replaces every output_length"


def test_rows_sharing_hash_ids_share_those_blocks_word_for_word_and_differ_right_after(tmp_path):
    n = 32
    path = mooncake(tmp_path, [row(0, 3 * n + 10, ids=[1, 2, 3, 9]), row(1, 3 * n + 10, ids=[1, 2, 4, 9]),
                               row(2, 3 * n + 10, ids=[5, 2, 3, 9])])
    a, b, c = (user_text(p).split() for p in build(path, trace_block_tokens=n).prompts)
    shared = 1 + 2 * n  # the lead word, then blocks 1 and 2
    assert a[:shared] == b[:shared], "the same hash ids are the same words"
    assert a[shared] != b[shared], "the first different id differs from its first word"
    assert a[1] != c[1], "another first block: no shared prefix beyond the lead word"
    assert a[1 + n:1 + 2 * n] == c[1 + n:1 + 2 * n], "block 2 is the same words wherever it stands"
    assert len(a) == len(b) == len(c) == 3 * n + 10 - TEMPLATE


def test_a_shared_last_block_gives_the_same_first_words(tmp_path):
    n = 32
    path = mooncake(tmp_path, [row(0, 20 + TEMPLATE, ids=[5]), row(1, 2 * n, ids=[5, 6]),
                               row(2, 20 + TEMPLATE, ids=[5]), row(3, 12 + TEMPLATE, ids=[5])])
    short, long_, same, shorter = (user_text(p) for p in build(path, trace_block_tokens=n).prompts)
    assert short == same, "the same last block cut at the same length: the same text"
    assert long_.startswith(short + " "), "a cut block is the start of the whole block"
    assert short.startswith(shorter + " ")
    assert len(short.split()) == 20


def test_hash_ids_beyond_the_user_text_are_left_and_short_ones_padded_with_own_blocks(tmp_path):
    n = 32  # 2n + 3 tokens: three blocks in the trace, but the template's tokens leave two for the user text
    path = mooncake(tmp_path, [row(0, 2 * n + 3, ids=[1, 2, 3]), row(1, 3 * n, ids=[1]), row(2, 3 * n)])
    workload = build(path, trace_block_tokens=n)
    fits, padded, none = workload.prompts
    assert fits.blocks == (1, 2) and count(fits) == 2 * n + 3
    assert padded.blocks[0] == 1 and all(b < 0 for b in padded.blocks[1:]) and count(padded) == 3 * n
    assert all(b < 0 for b in none.blocks) and not set(none.blocks) & set(padded.blocks), "own blocks are a row's own"
    assert "1 rows' hash_ids cover less than their input_length" in workload.note
    assert layout(4, (1, 2), 70, 32) == ((1, 2, own_block_id(4, 2)), 6)
    assert layout(4, (1, 2, 3), 64, 32) == ((1, 2), 0)


def test_render_is_lazy_and_the_block_table_is_shared(tmp_path):
    path = mooncake(tmp_path, [row(i, 7600, ids=range(i, i + 15)) for i in range(4)])
    prompts = build(path).prompts
    for p in prompts:
        own_text = len(p.text) + len(p.prefix) + sum(len(content) for _, content in p.messages)
        assert own_text < 100, "a prompt holds its block ids, not its text"
        assert len(user_text(p)) > 7000 * 2, "the text is made when it is rendered"
    assert len({id(p.block_table) for p in prompts}) == 1, "one table for every prompt"
    assert "block_table" not in repr(prompts[0])


def test_the_same_seed_gives_the_same_texts_and_another_seed_others(tmp_path):
    path = mooncake(tmp_path, [row(0, 300, ids=[1]), row(5, 600, ids=[1, 2])])
    first, again, other = build(path, seed=3).prompts, build(path, seed=3).prompts, build(path, seed=4).prompts
    assert first == again, "the records compare equal (the table is not compared)"
    assert [user_text(p) for p in first] == [user_text(p) for p in again], "a block is the same words in every build"
    assert user_text(first[0]) != user_text(other[0])


def test_block_table_words_are_exactly_counted_and_headers_differ():
    atoms = [a for a in exact.SYLLABLES[:40]]
    table = BlockTable(atoms, 64, seed=0)
    assert len(table.words(12, 64).split()) == 64 and len(table.words(12, 5).split()) == 5
    assert table.words(12, 64).startswith(table.words(12, 30) + " ")
    firsts = {tuple(table.words(b, 64).split()[:table.header]) for b in list(range(500)) + [own_block_id(3, 1)]}
    assert len(firsts) == 501, "distinct ids, distinct headers"
    assert len(table.join((1, 2, 3), 7).split()) == 1 + 64 + 64 + 7
    with pytest.raises(ValueError, match="one length"):
        BlockTable(["ba", "bar"], 8, 0)


def test_unsorted_rows_are_sorted_stably_and_said_to_be(tmp_path):
    path = mooncake(tmp_path, [row(2000, 40, 1), row(0, 40, 2), row(1000, 40, 3), row(1000, 40, 4)])
    trace = load_trace(path)
    assert [r.output_length for r in trace.rows] == [2, 3, 4, 1], "by time; equal times in file order"
    assert [r.line for r in trace.rows] == [2, 3, 4, 1]
    assert trace.notes == ("rows were not in time order: sorted by timestamp",)
    workload = build(path)
    assert [p.max_tokens for p in workload.prompts] == [2, 3, 4, 1] and "sorted by timestamp" in workload.note
    in_order = mooncake(tmp_path, [row(0, 40), row(0, 40), row(7, 40)], "sorted.jsonl")
    assert load_trace(in_order).notes == () and "sorted" not in build(in_order).note


BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,230,1317,Conversation log
46,GPT-4,300,0,300,API log
50,GPT-4,0,12,12,API log

118,GPT-4,417,276,693,Conversation log
60.5,ChatGPT,20,3.0,23,API log
70,GPT-4,8,5,13,API log
"""


def test_burstgpt_rows_are_read_sorted_and_failed_ones_left_out_and_counted(tmp_path):
    path = tmp_path / "burst.csv"
    path.write_text(BURSTGPT)
    trace = load_trace(str(path))
    assert trace.format == "burstgpt"
    assert [(r.time_s, r.input_length, r.output_length, r.line) for r in trace.rows] == [
        (5.0, 472, 18, 2), (45.0, 1087, 230, 3), (60.5, 20, 3, 8), (70.0, 8, 5, 9), (118.0, 417, 276, 7)]
    assert all(r.hash_ids == () for r in trace.rows), "BurstGPT shares no blocks"
    assert trace.notes == ("1 failed requests (Response tokens 0) left out", "1 rows with no Request tokens left out",
                           "rows were not in time order: sorted by timestamp")
    workload = build(str(path), trace_block_tokens=128)
    prompts = workload.prompts
    assert [p.send_at_s for p in prompts] == [0.0, 40.0, 55.5, 113.0], "Timestamp is in seconds"
    assert [count(p) for p in prompts] == [472, 1087, 20, 417]
    own = [b for p in prompts for b in p.blocks]
    assert all(b < 0 for b in own) and len(set(own)) == len(own) == 4 + 9 + 1 + 4, "every row's blocks are its own"
    assert "(0 shared by more than one request)" in workload.note and "1 failed requests" in workload.note
    assert f"1 rows shorter than the chat template and the lead word ({TEMPLATE + 1} tokens) left out" in workload.note


def test_a_tokenizer_that_is_not_additive_gets_every_row_closed(tmp_path):
    path = mooncake(tmp_path, [row(i, 300 + 37 * i, ids=[i % 3, 10 + i]) for i in range(12)])
    counter = DriftCounter()
    workload = build(path, counter, trace_block_tokens=256)
    assert [count(p, counter) for p in workload.prompts] == [300 + 37 * i for i in range(12)]
    assert "does not count block words additively" in workload.note


def test_a_length_no_words_can_reach_is_one_line_naming_the_row(tmp_path):
    path = mooncake(tmp_path, [row(0, 100), row(1, 101)])
    with pytest.raises(exact.PromptLengthError) as err:
        build(path, EvenCounter())
    assert str(err.value).startswith(f"{path} line 2: could not build an exact 101-token prompt")
    assert "\n" not in str(err.value)


def test_the_trace_is_not_disk_cached(tmp_path):
    path = mooncake(tmp_path, [row(0, 40)])
    spec = WorkloadSpec(name="trace", dataset_path=path, max_tokens_set=False)
    assert load_or_build(spec, TemplateCounter(), tmp_path / "cache").prompts[0].prompt_tokens == 40
    assert not (tmp_path / "cache").exists()


def _bad(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


OK = json.dumps(row(0, 40))
BAD_ROWS = [
    ("trace.jsonl", "{nope\n", 'line 1: not JSON'),
    ("trace.jsonl", f"{OK}\n[1, 2]\n", 'line 2: must be an object with "timestamp"'),
    ("trace.jsonl", f'{OK}\n\n{{"timestamp": 1, "input_length": 5, "output_length": 1}}\n',
     'line 3: "hash_ids" is missing'),
    ("trace.jsonl", json.dumps(row(0, 0)), 'line 1: "input_length" must be a positive integer'),
    ("trace.jsonl", json.dumps(row(0, "40")), 'line 1: "input_length" must be a positive integer'),
    ("trace.jsonl", json.dumps(row(0, 40.0)), 'line 1: "input_length" must be a positive integer'),
    ("trace.jsonl", json.dumps(row(0, 40, 0)), 'line 1: "output_length" must be a positive integer'),
    ("trace.jsonl", json.dumps(row(-1, 40)), 'line 1: "timestamp" must be a number >= 0 (milliseconds)'),
    ("trace.jsonl", json.dumps(row(True, 40)), 'line 1: "timestamp" must be a number >= 0 (milliseconds)'),
    ("trace.jsonl", json.dumps(row(0, 40, ids=[1, "a"])), 'line 1: "hash_ids" must be a list of integers >= 0'),
    ("trace.jsonl", json.dumps(row(0, 40, ids=[-1])), 'line 1: "hash_ids" must be a list of integers >= 0'),
    ("trace.jsonl", json.dumps({**row(0, 40), "hash_ids": 3}), 'line 1: "hash_ids" must be a list of integers >= 0'),
    ("trace.jsonl", f"{OK}\n" + json.dumps(row(1, 600, ids=[1, 2, 3])),
     'line 2: "hash_ids" has 3 blocks, more than input_length 600 fills at --trace-block-tokens 512'),
    ("trace.jsonl", f"{OK}\n" + json.dumps(row(1, TEMPLATE + 1)),
     f'line 2: "input_length" {TEMPLATE + 1} is too short: the chat template and the lead word take '
     f'{TEMPLATE + 1} tokens, leaving none for blocks'),
    ("t.csv", "Timestamp,Model,Response tokens\n1,a,2\n", 'line 1: no "Request tokens" column'),
    ("t.csv", BURSTGPT + "x,GPT-4,1,1,2,API log\n", 'line 10: "Timestamp" must be a number >= 0 (seconds)'),
    ("t.csv", BURSTGPT + "9,GPT-4,many,1,2,API log\n", 'line 10: "Request tokens" must be an integer >= 0'),
    ("t.csv", BURSTGPT + "9,GPT-4,1,-3,2,API log\n", 'line 10: "Response tokens" must be an integer >= 0'),
    ("t.csv", BURSTGPT + "9,GPT-4,1.5,3,2,API log\n", 'line 10: "Request tokens" must be an integer >= 0'),
    ("t.csv", BURSTGPT + "9,GPT-4\n", "line 10: 2 columns, the header has 6"),
]


@pytest.mark.parametrize("name,text,message", BAD_ROWS, ids=[m for _, _, m in BAD_ROWS])
def test_a_bad_row_is_one_line_naming_the_file_row_and_field(tmp_path, name, text, message):
    path = _bad(tmp_path, name, text)
    with pytest.raises(DataFileError) as err:
        build(path)
    assert str(err.value) == f"{path} {message}" or str(err.value).startswith(f"{path} {message}")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("make,message", [
    (lambda tmp: "", "--workload trace needs --dataset-path FILE (Mooncake JSONL or BurstGPT CSV)"),
    (lambda tmp: str(tmp / "absent.jsonl"), "--dataset-path {path}: no such file"),
    (lambda tmp: _bad(tmp, "empty.jsonl", "\n\n"), "{path}: no requests"),
    (lambda tmp: _bad(tmp, "empty.csv", ""), "{path}: empty file"),
    (lambda tmp: _bad(tmp, "failed.csv", BURSTGPT.splitlines()[0] + "\n1,GPT-4,5,0,5,API log\n"),
     "{path}: no requests left (1 failed requests (Response tokens 0) left out)"),
    (lambda tmp: _bad(tmp, "huge.csv", BURSTGPT.splitlines()[0] + '\n1,"' + "x" * 200_000 + '",2,3,5,x\n'),
     "{path}: not CSV (field larger than field limit (131072))"),
    (lambda tmp: _bad(tmp, "short.csv", BURSTGPT.splitlines()[0] + "\n1,GPT-4,5,3,8,API log\n"),
     f"{{path}}: no requests left: every row is shorter than the chat template and the lead word "
     f"({TEMPLATE + 1} tokens)"),
])
def test_no_usable_file_is_one_line(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(DataFileError) as err:
        build(path)
    assert str(err.value) == message.format(path=path)


def test_the_generator_writes_a_trace_that_reads_back_with_shared_prefixes(tmp_path, capsys):
    out = tmp_path / "gen.jsonl"
    assert tracegen.main(["--out", str(out), "--requests", "2000", "--rate", "8", "--seed", "1",
                          "--block-tokens", "64", "--prefixes", "4", "--prefix-blocks", "3"]) == 0
    line = capsys.readouterr().out.strip().splitlines()
    assert len(line) == 1 and line[0].startswith(f"wrote {out}: 2,000 requests over ")
    rows = read_trace(str(out))
    assert len(rows) == 2000 and rows[0].time_s == 0.0
    rate = (len(rows) - 1) / rows[-1].time_s
    assert 6.5 < rate < 9.5, f"Poisson arrivals at 8/s, not {rate:.2f}/s"
    assert all(len(r.hash_ids) == math.ceil(r.input_length / 64) for r in rows), "one id per started block"
    firsts = {r.hash_ids[:3] for r in rows}
    assert firsts <= {(0, 1, 2), (3, 4, 5), (6, 7, 8), (9, 10, 11)}, "every request starts with a whole prefix"
    hot = sum(r.hash_ids[:3] == (0, 1, 2) for r in rows)
    cold = sum(r.hash_ids[:3] == (9, 10, 11) for r in rows)
    assert hot > 2 * cold > 0, "Zipf: the first prefix is the hot one"
    own = [h for r in rows for h in r.hash_ids[3:]]
    assert len(own) == len(set(own)), "a request's own blocks are nobody else's"
    assert out.read_text() == _regenerate(tmp_path), "the same arguments write the same file"


def _regenerate(tmp_path):
    again = tmp_path / "again.jsonl"
    tracegen.write_trace(str(again), tracegen.TraceShape(requests=2000, rate=8, seed=1, block_tokens=64,
                                                         prefixes=4, prefix_blocks=3))
    return again.read_text()


def test_the_generator_refuses_bad_options_with_one_line(tmp_path, capsys):
    assert tracegen.main(["--out", str(tmp_path / "x.jsonl"), "--rate", "0"]) == 2
    assert capsys.readouterr().err.strip() == "tracegen: --requests, --rate and --block-tokens must be positive"
    assert not (tmp_path / "x.jsonl").exists()


def test_the_load_context_sends_arrival_k_as_row_k_untagged(tmp_path):
    from types import SimpleNamespace

    from vllm_locust.plugin.context import LoadContext

    path = mooncake(tmp_path, [row(0, 60, ids=[1]), row(10, 70, ids=[1]), row(20, 80, ids=[2])])
    spec = WorkloadSpec(name="trace", dataset_path=path, max_tokens_set=False, trace_block_tokens=32)
    workload = build_workload(spec, TemplateCounter())
    ctx = LoadContext("http://127.0.0.1:1", "m", spec, workload, True, True, ())
    prompt, rendered = ctx.next_request("run", SimpleNamespace(k=2))
    assert prompt == workload.prompts[2] and prompt.index == 2 and prompt.send_at_s == 0.02
    assert rendered == prompt.render("") and TemplateCounter().count_messages(rendered) == 80


def test_a_long_burstgpt_trace_holds_a_few_numbers_a_row_not_a_prompt_each(tmp_path):
    """L14: a 1 M-row BurstGPT trace held 410 MiB a process as prompt objects, and each full garbage
    collection walked them inside the measured window. The pool now keeps columns; a prompt is
    made when it is sent, the same prompt the rows describe."""
    import gc
    import tracemalloc

    from vllm_locust.core.sources.records import column

    rows = 20_000
    path = tmp_path / "burst.csv"
    with open(path, "w") as f:
        f.write("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n")
        for i in range(rows):
            f.write(f"{i / 10:.1f},ChatGPT,{100 + i % 900},{1 + i % 300},0,Conversation log\n")
    spec = WorkloadSpec(name="trace", dataset_path=str(path), max_tokens_set=False, trace_block_tokens=64)
    gc.collect()
    tracemalloc.start()
    workload = build_workload(spec, WordCounter())
    gc.collect()
    held, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    prompts = workload.prompts
    assert len(prompts) == rows
    assert held / rows < 100, f"{held / rows:.0f} bytes a row (prompt objects: about 500)"
    assert list(column(prompts, "send_at_s"))[:3] == [0.0, 0.1, 0.2]
    assert list(column(prompts, "prompt_tokens"))[-1] == 100 + (rows - 1) % 900
    last = prompts[-1]
    assert (last.index, last.prompt_tokens, last.max_tokens) == (rows - 1, 100 + (rows - 1) % 900, 1 + (rows - 1) % 300)
    assert last.blocks == tuple(own_block_id(rows - 1, i) for i in range(len(last.blocks))), "its own blocks"
    assert WordCounter().count_messages(last.render("")) == last.prompt_tokens, "made when asked: exact as before"
