"""The dataset sources: ``sharegpt`` samples a ShareGPT file as vLLM's ``bench serve`` does and
``custom`` sends a JSONL file's rows; a bad file is one line naming the file, the row and the field."""

import json

import pytest

from launch.make_tiny_model import write_model
from vllm_locust.backend.tokencount import LocalTokenCounter, WordCounter
from vllm_locust.core import sources
from vllm_locust.core.sources.datafiles import DataFileError, read_custom, read_sharegpt
from vllm_locust.core.sources.records import TAG_WORDS, TEXT
from vllm_locust.core.workloads import WorkloadSpec, build_workload, load_or_build


class Recording(WordCounter):
    """Counts words, and keeps every text it was asked to count (each costs a /tokenize call)."""

    def __init__(self):
        self.texts = []

    def count_text(self, text):
        self.texts.append(text)
        return super().count_text(text)


def words(n, word="w"):
    return " ".join(f"{word}{i}" for i in range(n))


def conv(user, reply=None, system=None):
    turns = ([{"from": "system", "value": system}] if system else []) + [{"from": "human", "value": user}]
    return {"conversations": turns + ([{"from": "gpt", "value": reply}] if reply is not None else [])}


def sharegpt(tmp_path, entries, name="sg.json"):
    path = tmp_path / name
    path.write_text(json.dumps(entries))
    return str(path)


def jsonl(tmp_path, rows, name="rows.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


def spec(path, name="sharegpt", **kw):
    kw = {"unique": False, "max_tokens_set": False, "pool": 256, **kw}
    return WorkloadSpec(name=name, dataset_path=path, **kw)


def test_both_sources_are_registered():
    assert {"sharegpt", "custom"} <= set(sources.NAMES)
    assert sources.source("sharegpt").cacheable and sources.source("custom").cacheable


def test_sharegpt_lengths_follow_the_counter(tmp_path):
    path = sharegpt(tmp_path, [conv(words(6), words(9)), conv(words(5), words(20), system=words(3, "s"))])
    workload = build_workload(spec(path), WordCounter())
    by_index = {p.index: p for p in workload.prompts}
    assert sorted(by_index) == [0, 1], "Prompt.index is the entry's position in the file"
    assert (by_index[0].prompt_tokens, by_index[0].max_tokens) == (6, 9), "the output length is the first reply's"
    assert (by_index[1].prompt_tokens, by_index[1].max_tokens) == (8, 20), "the system turn is part of the prompt"
    assert by_index[1].messages == (("system", words(3, "s")), ("user", words(5))), "later turns are not sent"
    assert {p.kind for p in workload.prompts} == {"sharegpt"} and workload.atoms == ()


def test_sharegpt_filters_rows_as_vllm_does(tmp_path):
    entries = [
        conv(words(10), words(10)),      # 0 kept
        conv(words(3), words(10)),       # 1 prompt too short (< 4)
        conv(words(10), words(3)),       # 2 reply too short (< 4)
        conv(words(1025), words(10)),    # 3 prompt too long (> 1024)
        conv(words(1000), words(1049)),  # 4 prompt + reply too long (> 2048)
        conv(words(1000), words(1048)),  # 5 kept: exactly 2048
        {"conversations": []},           # 6 no reply: fewer than two turns
        conv(words(10)),                 # 7 no reply
        {"conversations": [{"from": "gpt", "value": "hello"}, {"from": "human", "value": words(7)},
                           {"from": "gpt", "value": words(5)}]},  # 8 kept: its first human turn and reply
    ]
    workload = build_workload(spec(sharegpt(tmp_path, entries)), WordCounter())
    assert sorted(p.index for p in workload.prompts) == [0, 5, 8]
    assert workload.note == f"3 rows used, 2 too short, 2 too long, 2 without a reply, of 9 in {tmp_path}/sg.json"
    assert {p.index: (p.prompt_tokens, p.max_tokens) for p in workload.prompts}[8] == (7, 5)


def test_max_tokens_overrides_reply_lengths_and_their_counts(tmp_path):
    entries = [conv(words(10), words(3)), conv(words(1000), words(10)), conv(words(8), words(30))]
    counter = Recording()
    workload = build_workload(spec(sharegpt(tmp_path, entries), max_tokens=1100, max_tokens_set=True), counter)
    assert [(p.index, p.max_tokens) for p in workload.prompts] in ([(0, 1100), (2, 1100)], [(2, 1100), (0, 1100)])
    assert "0 too short, 1 too long" in workload.note, "a short reply is no reason to drop a fixed-length row"
    assert not any(t in counter.texts for t in (words(3), words(30))), "a fixed output length counts no reply"


def test_rows_come_in_a_seeded_order_and_only_the_pool_is_counted(tmp_path):
    entries = [conv(words(5 + i), words(6 + i)) for i in range(30)]
    path = sharegpt(tmp_path, entries)
    order = {seed: [p.index for p in build_workload(spec(path, seed=seed, pool=5), WordCounter()).prompts]
             for seed in (0, 1)}
    assert order[0] == [p.index for p in build_workload(spec(path, seed=0, pool=5), WordCounter()).prompts]
    assert order[0] != order[1] and len(set(order[0])) == 5
    counter = Recording()
    workload = build_workload(spec(path, seed=0, pool=5), counter)
    assert len(counter.texts) == 3 * 5, "a prompt, a reply and the chat form's count per used row, no more"
    assert workload.note.startswith("5 rows used, 0 too short, 0 too long, 0 without a reply, of 30 in")


@pytest.mark.parametrize("name", ["sharegpt", "custom"])
def test_unique_tags_go_first_and_keep_the_count(tmp_path, name):
    path = (sharegpt(tmp_path, [conv(words(6), words(9), system="be brief")]) if name == "sharegpt"
            else jsonl(tmp_path, [{"messages": [{"role": "system", "content": "be brief"},
                                                {"role": "user", "content": words(6)}]}]))
    plain = build_workload(spec(path, name), WordCounter())
    tagged = build_workload(spec(path, name, unique=True), WordCounter())
    assert plain.atoms == () and len(tagged.atoms) >= 8
    assert tagged.prompts[0].prompt_tokens == plain.prompts[0].prompt_tokens + TAG_WORDS + 1
    first, second = (tagged.prompts[0].render(tagged.tag(0, 0, n)) for n in (0, 1))
    assert first[-1]["content"].endswith(words(6)) and first[-1]["content"] != second[-1]["content"]
    assert WordCounter().count_messages(first) == tagged.prompts[0].prompt_tokens
    assert plain.prompts[0].render("") == [{"role": "system", "content": "be brief"},
                                           {"role": "user", "content": words(6)}], "verbatim without tags"


def test_tags_stay_token_exact_with_a_real_tokenizer(tmp_path):
    counter = LocalTokenCounter(write_model(tmp_path / "tiny"))
    path = sharegpt(tmp_path, [conv("Why is the sky blue? Explain it simply.", "Because of Rayleigh scattering.")])
    for form in ("messages", TEXT):
        workload = build_workload(spec(path, unique=True, prompt_form=form), counter)
        prompt = workload.prompts[0]
        for run, worker, sequence in ((0, 0, 0), (3, 17, 4097), (7, 33, 40000)):
            rendered = prompt.render(workload.tag(run, worker, sequence))
            count = counter.count_text(rendered) if form == TEXT else counter.count_messages(rendered)
            assert count == prompt.prompt_tokens, (form, run, worker, sequence)


def test_the_completions_form_sends_text(tmp_path):
    path = sharegpt(tmp_path, [conv(words(6), words(9), system="be brief")])
    prompt = build_workload(spec(path, prompt_form=TEXT, endpoint="completions"), WordCounter()).prompts[0]
    assert (prompt.messages, prompt.prefix, prompt.text) == ((), "be brief ", words(6))
    assert prompt.render("") == "be brief " + words(6) and prompt.prompt_tokens == 8
    rows = jsonl(tmp_path, [{"prompt": words(4)}, {"messages": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(DataFileError, match=r'rows.jsonl line 2: "messages" needs --endpoint chat'):
        build_workload(spec(rows, "custom", prompt_form=TEXT, endpoint="completions"), WordCounter())


def test_custom_rows_carry_their_own_output_lengths(tmp_path):
    path = jsonl(tmp_path, [{"prompt": words(5), "output_tokens": 7}, "",
                            {"messages": [{"role": "user", "content": words(4)}], "max_tokens": 9},
                            {"prompt": words(3)}, {"prompt": words(2), "output_tokens": 1}])
    workload = build_workload(spec(path, "custom", max_tokens=50, pool=3), WordCounter())
    assert [(p.index, p.prompt_tokens, p.max_tokens) for p in workload.prompts] == [(0, 5, 7), (2, 4, 9), (3, 3, 50)]
    assert workload.prompts[0].messages == (("user", words(5)),), "a prompt row is a user message on chat"
    assert workload.note == f"3 rows used, of 4 in {path} (--prompt-pool 3)"
    fixed = build_workload(spec(path, "custom", max_tokens=50, max_tokens_set=True), WordCounter())
    assert [p.max_tokens for p in fixed.prompts] == [50] * 4, "--max-tokens overrides the rows' lengths"
    one = jsonl(tmp_path, [{"prompt": "a b c"}], "t.jsonl")
    text = build_workload(spec(one, "custom", prompt_form=TEXT, endpoint="completions"), WordCounter())
    assert text.prompts[0].render("") == "a b c"


def test_readers_take_jsonl_sharegpt_and_a_json_list_of_custom_rows(tmp_path):
    path = tmp_path / "sg.jsonl"
    path.write_text(json.dumps(conv("a\u2028b", "c"), ensure_ascii=False) + "\r\n\n" + '{"conversations": []}')
    assert read_sharegpt(str(path)) == [(("user", "a\u2028b"), ("assistant", "c")), ()], "lines split on newlines"
    rows = read_custom(sharegpt(tmp_path, [{"prompt": "x"}, {"prompt": "y", "max_tokens": 3}], "list.json"))
    assert [(r.index, r.text, r.output_tokens) for r in rows] == [(0, "x", None), (1, "y", 3)]


SHAREGPT_BAD = [
    ('[{"conversations": [}', r"sg\.json: not JSON \(line 1\)"),
    ("42", r"sg\.json: expected a JSON list of entries or JSONL objects"),
    ("[1]", r'sg\.json entry 0: must be an object with a "conversations" list'),
    ('[{"id": 1}, {"id": 2}]', r'sg\.json entry 0: "conversations" must be a list'),
    (json.dumps([conv("a", "b"), {"conversations": [{"from": "robot", "value": "x"}]}]),
     r"""sg\.json entry 1: "conversations\[0\]\.from" is 'robot': one of human, """),
    (json.dumps([{"conversations": [{"from": "human", "value": 3}]}]),
     r'sg\.json entry 0: "conversations\[0\]\.value" must be a string'),
    (json.dumps([conv("a", "b"), conv("a", "b"), {"conversations": [{"from": "gpt", "value": "x"}]}]),
     r'sg\.json entry 2: "conversations" has no human turn'),
    (json.dumps(conv("a", "b")) + "\n{oops\n", r"sg\.json line 2: not JSON"),
    ("", r"sg\.json: empty file"),
]
CUSTOM_BAD = [
    ('{"prompt": "a"}\n\n{"prompt": "b", "output_tokens": 0}', r'sg\.json line 3: "output_tokens" must be a positive'),
    ('{"prompt": "a", "output_tokens": true}', r'sg\.json line 1: "output_tokens" must be a positive integer'),
    ('{"prompt": "a", "output_tokens": 3, "max_tokens": 4}', r'line 1: give one of "output_tokens" and "max_tokens"'),
    ('{"text": "a"}', r'sg\.json line 1: needs one of "prompt" \(text\) or "messages" \(chat\), not neither'),
    ('{"prompt": ""}', r'sg\.json line 1: "prompt" must be a non-empty string'),
    ('{"messages": [{"role": "bot", "content": "a"}]}', r'line 1: "messages\[0\]\.role" must be one of system'),
    ('{"messages": [{"role": "system", "content": "a"}]}', r'sg\.json line 1: "messages" has no "user" message'),
    ('{"messages": []}', r'sg\.json line 1: "messages" must be a non-empty list'),
    ("[]", r"sg\.json: no rows"),
    ("\n \n", r"sg\.json: empty file"),
]


@pytest.mark.parametrize("text,message", SHAREGPT_BAD + CUSTOM_BAD)
def test_a_bad_file_is_one_line_naming_file_row_and_field(tmp_path, text, message):
    (tmp_path / "sg.json").write_text(text)
    name = "sharegpt" if (text, message) in SHAREGPT_BAD else "custom"
    with pytest.raises(DataFileError, match=message) as err:
        build_workload(spec(str(tmp_path / "sg.json"), name), WordCounter())
    assert "\n" not in str(err.value) and str(tmp_path / "sg.json") in str(err.value)


@pytest.mark.parametrize("name,what", [("sharegpt", "ShareGPT JSON"), ("custom", "JSONL")])
def test_a_missing_file_or_path_is_one_line(tmp_path, name, what):
    with pytest.raises(DataFileError, match=rf"^--workload {name} needs --dataset-path FILE \({what}"):
        build_workload(spec("", name), WordCounter())
    with pytest.raises(DataFileError, match=r"^--dataset-path x\.json: no such file$"):
        build_workload(spec("x.json", name), WordCounter())


def test_no_fitting_row_is_one_line(tmp_path):
    path = sharegpt(tmp_path, [conv("a b", "c d e f"), {"conversations": []}])
    with pytest.raises(DataFileError, match=r"fits \(1 too short, 0 too long, 1 without a reply, of 2\)$"):
        build_workload(spec(path), WordCounter())


def test_a_cached_pool_is_rebuilt_when_the_file_changes(tmp_path):
    entries = [conv(words(5), words(6)), conv(words(7), words(8))]
    path = sharegpt(tmp_path, entries)
    run = spec(path, unique=True)
    built = load_or_build(run, WordCounter(), tmp_path / "cache")
    counter = Recording()
    cached = load_or_build(run, counter, tmp_path / "cache")
    assert counter.texts == [], "served from the cache: no count"
    assert (cached.atoms, cached.note) == (built.atoms, built.note)
    assert [(p.index, p.prompt_tokens, p.messages, p.max_tokens) for p in cached.prompts] == \
        [(p.index, p.prompt_tokens, p.messages, p.max_tokens) for p in built.prompts]
    assert built.note.startswith("2 rows used") and len(built.atoms) >= 8
    sharegpt(tmp_path, entries + [conv(words(9), words(10))])  # a different size
    rebuilt = load_or_build(run, counter, tmp_path / "cache")
    assert sorted(p.index for p in rebuilt.prompts) == [0, 1, 2] and counter.texts, "built again, not stale"
    assert rebuilt.note.startswith("3 rows used")
    assert len(list((tmp_path / "cache").glob("prompts-sharegpt-*.json"))) == 2
