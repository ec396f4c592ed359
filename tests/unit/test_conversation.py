"""Conversations: the ``conversation`` source's pool entries, a ``Session``'s turns (history with the
server's own replies, one tag, trimming to the context, think time), the stream's opt-in reply text,
the options a session workload refuses, and users playing sessions against the recording mock."""

import json
import random
import statistics

import pytest

from vllm_locust.backend.tokencount import WordCounter
from vllm_locust.core import sources
from vllm_locust.core.session import SLACK_TOKENS, Session, think_s
from vllm_locust.core.sources.conversation import as_text, shape
from vllm_locust.core.sources.datafiles import DataFileError
from vllm_locust.core.sources.records import TEXT, Prompt
from vllm_locust.core.stream import StreamResult, consume
from vllm_locust.core.workloads import WorkloadSpec, build_workload, load_or_build
from vllm_locust.plugin.options import defaults
from vllm_locust.plugin.loads.sessions import plays_sessions, session_option_errors

from .test_user import make_env, read_csv


class Template(WordCounter):
    """Words, with a chat template's cost: 1 token before everything, 3 around each message, 2 for
    the generation prompt (so a turn's cost is not its words, as with a real template)."""

    def __init__(self):
        self.calls = 0

    def count_messages(self, messages, add_generation_prompt=True):
        self.calls += 1
        return 1 + sum(len(m["content"].split()) + 3 for m in messages) + (2 if add_generation_prompt else 0)

    def count_text(self, text):
        self.calls += 1
        return len(text.split())


def turns(n, conv=0, user_words=10, reply_words=lambda t: 3 + t, system=None, trailing=False):
    """A ShareGPT entry of ``n`` exchanges (and a trailing user turn without a reply)."""
    out = [{"from": "system", "value": system}] if system else []
    for t in range(n):
        out.append({"from": "human", "value": f"c{conv}u{t} " + "w " * (user_words - 1)})
        out.append({"from": "gpt", "value": " ".join(["a"] * reply_words(t))})
    if trailing:
        out.append({"from": "human", "value": f"c{conv}last " + "w " * 4})
    return {"conversations": out}


def dataset(tmp_path, entries):
    path = tmp_path / "chats.json"
    path.write_text(json.dumps(entries))
    return str(path)


def build(path, counter=None, **kw):
    kw = {"unique": False, "max_tokens_set": False, **kw}
    return build_workload(WorkloadSpec(name="conversation", dataset_path=path, **kw), counter or Template())


def session(entry, tag="", max_tokens_set=False, max_tokens=128, max_model_len=None, form="messages", **kw):
    return Session(entry, "w:1", tag, max_tokens_set, max_tokens, max_model_len, form, **kw)


def play(s, counter=None, reply=lambda turn: f" r{turn}t0 r{turn}t1 r{turn}t2"):
    """Every turn of ``s`` answered with ``reply(turn)``; the server's counts by ``counter``."""
    counter = counter or Template()
    sent = []
    while (prompt := s.next_turn()) is not None:
        rendered = prompt.render("")
        actual = counter.count_text(rendered) if isinstance(rendered, str) else counter.count_messages(rendered)
        sent.append((prompt, actual))
        text = reply(prompt.turn)
        s.replied(text, actual, len(text.split()))
    return sent


# -- the source --------------------------------------------------------------------------------
def test_one_entry_per_conversation_with_reply_lengths_and_turn_costs(tmp_path):
    path = dataset(tmp_path, [turns(3, 0), turns(2, 1, system="be brief"), turns(1, 2, trailing=True)])
    workload = build(path, pool=256, seed=0)
    assert plays_sessions("conversation") and not plays_sessions("fixed")
    assert sources.source("conversation").cacheable
    by_index = {p.index: p for p in workload.prompts}
    assert sorted(by_index) == [0, 1, 2], "index: the entry's number in the file"
    first = by_index[0]
    assert first.kind == "conversation" and first.reply_tokens == (3, 4, 5)
    assert first.prompt_tokens == 1 + (10 + 3) + 2, "turn 1 by the counter, template included"
    assert first.turn_tokens == (16, 10 + 6, 10 + 6), "a later turn: its message and the previous reply's end"
    assert first.max_tokens == 3 and len(first.messages) == 6
    with_system = by_index[1]
    assert with_system.messages[0] == ("system", "be brief")
    assert with_system.prompt_tokens == 1 + (2 + 3) + (10 + 3) + 2
    assert with_system.turn_tokens[0] == 10 + 3 + 2, "turn 1's own cost leaves the system prompt out"
    trailing = by_index[2]
    assert [r for r, _ in trailing.messages] == ["user", "assistant", "user"] and trailing.reply_tokens == (3,)
    assert len(trailing.turn_tokens) == 2, "a trailing user turn without a reply is still a turn"
    assert "3 conversations (7 user turns) used, of 3" in workload.note


def test_conversations_that_cannot_be_played_are_skipped_and_counted(tmp_path):
    bad = [{"conversations": [{"from": "gpt", "value": "hi"}, {"from": "human", "value": "x"}]},
           {"conversations": [{"from": "human", "value": "x"}, {"from": "human", "value": "y"}]},
           {"conversations": []}]
    path = dataset(tmp_path, [turns(2), *bad])
    workload = build(path)
    assert [p.index for p in workload.prompts] == [0]
    for reason in ("1 opening with a reply", "1 not alternating user and assistant", "1 empty"):
        assert reason in workload.note, workload.note
    with pytest.raises(DataFileError, match=r"chats\.json: no conversation to play \(of 3: "):
        build(dataset(tmp_path, bad))
    with pytest.raises(DataFileError, match="--workload conversation needs --dataset-path FILE"):
        build("")


def test_max_turns_caps_each_conversation_and_max_tokens_overrides_reply_lengths(tmp_path):
    path = dataset(tmp_path, [turns(4)])
    entry = build(path, max_turns=2).prompts[0]
    assert len(entry.turn_tokens) == 2 and entry.reply_tokens == (3, 4) and len(entry.messages) == 4
    assert [p.turn for p, _ in play(session(entry))] == [1, 2], "--max-turns 2: two turns sent"
    every = build(path).prompts[0]
    assert [p.max_tokens for p, _ in play(session(every))] == [3, 4, 5, 6], "each reply's length in the data set"
    assert [p.max_tokens for p, _ in play(session(every, max_tokens_set=True, max_tokens=7))] == [7] * 4
    last = build(dataset(tmp_path, [turns(1, trailing=True)])).prompts[0]
    assert [p.max_tokens for p, _ in play(session(last, max_tokens=9))] == [3, 9], "no reply: --max-tokens' default"


def test_unique_prompts_measure_the_first_turn_with_the_tag(tmp_path):
    path = dataset(tmp_path, [turns(2), turns(2, 1)])
    workload = build(path, unique=True)
    assert len(workload.atoms) >= 8
    entry = workload.prompts[0]
    untagged = build(path).prompts[0]
    assert entry.prompt_tokens == untagged.prompt_tokens + 8, "the tag's eight one-token words"
    tag = workload.tag(3, 0, 1)
    sent = play(session(entry, tag=tag))
    assert [p.prompt_tokens for p, _ in sent] == [actual for _, actual in sent], "estimates exact with this template"


def test_the_pool_is_cached_and_read_back_as_built(tmp_path):
    path = dataset(tmp_path, [turns(3), turns(2, 1, system="s")])
    spec = WorkloadSpec(name="conversation", dataset_path=path, max_tokens_set=False)
    counter = Template()
    built = load_or_build(spec, counter, tmp_path / "cache")
    calls = counter.calls
    again = load_or_build(spec, counter, tmp_path / "cache")
    assert again == built and counter.calls == calls, "read back from the cache: no counting"
    assert isinstance(again.prompts[0].turn_tokens, tuple) and isinstance(again.prompts[0].reply_tokens, tuple)


def test_shape_reads_system_pairs_and_a_trailing_turn():
    conversation = (("system", "s"), ("user", "a"), ("assistant", "b"), ("user", "c"))
    assert shape(conversation) == ("s", [("a", "b"), ("c", None)])
    assert shape((("user", "a"), ("assistant", "b"), ("user", "c")), max_turns=1) == (None, [("a", "b")])
    assert shape((("assistant", "b"),)) == "opening with a reply"


# -- the session -------------------------------------------------------------------------------
def test_the_history_carries_the_servers_replies_and_one_tag_in_the_first_user_message(tmp_path):
    entry = build(dataset(tmp_path, [turns(3, system="sys words")])).prompts[0]
    tag = "ta te ti to tu ta te ti"
    sent = play(session(entry, tag=tag))
    assert [p.turn for p, _ in sent] == [1, 2, 3] and all(p.session_id == "w:1" for p, _ in sent)
    assert all(p.kind == "conversation" and p.index == entry.index and p.trimmed_turns == 0 for p, _ in sent)
    third = sent[2][0].messages
    assert [r for r, _ in third] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert third[2][1] == " r1t0 r1t1 r1t2" and third[4][1] == " r2t0 r2t1 r2t2", "the server's replies, verbatim"
    assert third[1][1].startswith(tag + " c0u0") and not third[3][1].startswith(tag), "the tag: first user message only"
    for (earlier, _), (later, _) in zip(sent, sent[1:]):
        assert later.messages[:len(earlier.messages)] == earlier.messages, "each turn extends the previous prompt"
    rendered = sent[2][0].render("")
    assert rendered[1]["content"].count(tag) == 1 and sum(tag in m["content"] for m in rendered) == 1


def test_trimming_drops_the_oldest_pairs_and_every_turn_fits(tmp_path):
    entry = build(dataset(tmp_path, [turns(6, system="keep me", reply_words=lambda t: 8)])).prompts[0]
    limit = 90
    sent = play(session(entry, tag="x1 x2", max_model_len=limit), reply=lambda t: " ".join(["r"] * 8))
    assert len(sent) == 6, "every turn was sent"
    trims = [p.trimmed_turns for p, _ in sent]
    assert trims == sorted(trims) and trims[0] == 0 and trims[-1] > 0, trims
    for prompt, actual in sent:
        assert actual + prompt.max_tokens <= limit, (prompt.turn, actual)
        assert prompt.messages[0] == ("system", "keep me"), "the system message stays"
        users = [c for r, c in prompt.messages if r == "user"]
        assert len(users) == prompt.turn - prompt.trimmed_turns, "the oldest pairs left out"
        assert users[0].startswith("x1 x2 ") and sum(u.startswith("x1 x2") for u in users) == 1
        assert users[0].split()[2] == f"c0u{prompt.trimmed_turns}", "the first kept turn carries the tag"
        assert actual <= prompt.prompt_tokens + SLACK_TOKENS, "the estimate is within the slack"


def test_a_turn_too_long_even_alone_ends_the_session(tmp_path):
    entry = build(dataset(tmp_path, [turns(2, user_words=10), {"conversations": [
        {"from": "human", "value": "short"}, {"from": "gpt", "value": "a"},
        {"from": "human", "value": "long " * 80}, {"from": "gpt", "value": "a"}]}])).prompts
    first = session(entry[0], max_model_len=10)
    assert first.next_turn() is None and first.done and first.too_long and first.turn == 0
    later = session(next(p for p in entry if p.index == 1), max_model_len=40)
    assert [p.turn for p, _ in play(later)] == [1], "turn 2 cannot fit even without turn 1"
    assert later.done and later.too_long


def test_replies_must_alternate_with_turns(tmp_path):
    s = session(build(dataset(tmp_path, [turns(2)])).prompts[0])
    with pytest.raises(RuntimeError, match="no turn awaits a reply"):
        s.replied("x", None, None)
    s.next_turn()
    with pytest.raises(RuntimeError, match="has no reply yet"):
        s.next_turn()


def test_unknown_counts_are_estimated_on_the_safe_side(tmp_path):
    entry = build(dataset(tmp_path, [turns(3)])).prompts[0]
    s = session(entry)
    s.next_turn()
    s.replied("a few words", None, None)  # no usage from the server: the reply counts as max_tokens
    assert s.completion == [3]
    second = s.next_turn()
    s.replied("b", second.prompt_tokens + 5, 1)  # the server counted 5 more than the estimate
    assert s.correction == 5 and s.next_turn().prompt_tokens == s.estimate(3, 0) + 5


def test_completions_get_the_history_as_plain_text(tmp_path):
    entry = build(dataset(tmp_path, [turns(2, system="sys")]), prompt_form=TEXT, endpoint="completions").prompts[0]
    sent = play(session(entry, tag="tg", form=TEXT))
    second = sent[1][0].render("")
    assert second == as_text([("system", "sys"), ("user", "tg " + entry.messages[1][1]),
                              ("assistant", " r1t0 r1t1 r1t2"), ("user", entry.messages[3][1])])
    assert second.startswith("System: sys\nUser: tg c0u0") and second.endswith("\nAssistant:")
    assert "\nAssistant: r1t0 r1t1 r1t2\nUser: c0u1" in second, "the reply as the model continued the prompt"
    assert as_text([("user", "u"), ("assistant", "No space")]) == "User: u\nAssistant:No space\nAssistant:", \
        "a reply that does not start with a space is sent back as the model wrote it (issue 39)"
    untagged = play(session(entry, form=TEXT))
    assert [p.prompt_tokens for p, _ in untagged] == [n for _, n in untagged], "measured in the text form"


def test_think_time_is_constant_or_exponential_with_that_mean():
    rng = random.Random(1)
    assert think_s(rng, 0.3) == 0.3 and think_s(rng, 0.0, "exponential") == 0.0
    draws = [think_s(rng, 0.5, "exponential") for _ in range(4000)]
    assert 0.45 < statistics.mean(draws) < 0.55 and min(draws) >= 0
    assert statistics.pstdev(draws) > 0.4, "exponential: spread about its mean, not constant"
    with pytest.raises(ValueError, match="--think-time-dist 'gamma'"):
        think_s(rng, 1.0, "gamma")
    a, b = (Session(build_entry(), "w:1", "", False, 8, None, "messages", think_time_s=1.0, think_dist="exponential",
                    seed=seed) for seed in (7, 7))
    assert [a.think_s() for _ in range(3)] == [b.think_s() for _ in range(3)], "seeded per session"


def build_entry():
    return Prompt(0, "conversation", 5, messages=(("user", "a"), ("assistant", "b")), reply_tokens=(1,),
                  turn_tokens=(5,))


# -- the stream's reply text -------------------------------------------------------------------
def test_the_reply_text_is_collected_only_when_asked():
    def chunk(content=None, reasoning=None, finish=None):
        delta = {"content": content} if reasoning is None else {"reasoning_content": reasoning}
        return json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode()

    payloads = [(1.0, chunk(reasoning="hmm")), (2.0, chunk(" Hello")), (3.0, chunk(" world", finish="stop"))]
    plain = consume(payloads)
    assert plain.text is None and plain.content_chunks == 3
    collected = consume(payloads, result=StreamResult(text=[]))
    assert "".join(collected.text) == " Hello world", "the answer, without the reasoning"
    text = consume([(1.0, json.dumps({"choices": [{"index": 0, "text": " abc", "finish_reason": "length"}]}).encode())],
                   result=StreamResult(text=[]))
    assert text.text == [" abc"]


# -- the options -------------------------------------------------------------------------------
def test_a_session_workload_refuses_open_loop_and_paired_mode_with_one_line():
    ok = defaults(workload="conversation")
    assert session_option_errors(ok) is None
    assert session_option_errors(defaults(workload="fixed", request_rate="4")) is None
    assert session_option_errors(defaults(workload="conversation", request_rate="4")) == (
        "--workload conversation with --request-rate: conversations are closed loop: users are sessions; use -u")
    assert "--paired-host" in session_option_errors(defaults(workload="conversation", paired_host="http://b"))
    assert session_option_errors(defaults(think_time=-1.0)) == "--think-time -1: zero or more seconds"
    assert "expected a number" in session_option_errors(defaults(think_time="soon"))


# -- users playing sessions (the mock in its own process: real SDK, real sockets) ---------------
def test_users_play_sessions_with_the_servers_replies(fake_server, tmp_path):
    from vllm_locust.plugin.user import ChatStreamUser
    from vllm_locust.plugin.vllm_plugin import VllmPlugin

    fake_server.configure(ttft_ms=2, itl_ms=1, tokens=4, log_bodies=True, distinct_replies=True)
    path = dataset(tmp_path, [turns(3, c) for c in range(2)])
    env, fired = make_env(fake_server.url, tmp_path, workload="conversation", dataset_path=path, max_tokens=None)
    users = [ChatStreamUser(env), ChatStreamUser(env)]
    for user in users:
        user.on_start()
        user.stream_completion()  # one whole session each
    VllmPlugin.of(env).recording.close()
    rows = read_csv(tmp_path / "requests-r1-w1.csv")
    assert sorted((r["session_id"], r["turn"]) for r in rows) == [
        ("w1:1", "1"), ("w1:1", "2"), ("w1:1", "3"), ("w1:2", "1"), ("w1:2", "2"), ("w1:2", "3")]
    assert {r["prompt_kind"] for r in rows} == {"conversation"} and {r["trimmed_turns"] for r in rows} == {"0"}
    assert {r["prompt_index"] for r in rows} == {"0", "1"}, "the two users played different conversations"
    log = fake_server.log()
    assert len(log) == 6
    replies = [r["reply"] for r in log]
    for record in log:
        history = record["body"]["messages"]
        for message in history[1:-1:2]:
            assert message["role"] == "assistant" and message["content"] in replies, "a reply this server sent"
    third = [r["body"]["max_tokens"] for r in log if len(r["body"]["messages"]) == 5]
    assert third == [5, 5], "turn 3: the data set's reply length"
    assert {e["request_type"] for e in fired} == {"chat"}, "one stats row: the endpoint's"


def test_a_completions_session_sends_the_history_as_text(fake_server, tmp_path):
    from vllm_locust.plugin.user import ChatStreamUser
    from vllm_locust.plugin.vllm_plugin import VllmPlugin

    fake_server.configure(ttft_ms=2, itl_ms=1, tokens=4, log_bodies=True, distinct_replies=True)
    path = dataset(tmp_path, [turns(2)])
    env, _fired = make_env(fake_server.url, tmp_path, workload="conversation", dataset_path=path, max_tokens=None,
                           endpoint="completions")
    user = ChatStreamUser(env)
    user.on_start()
    user.stream_completion()
    VllmPlugin.of(env).recording.close()
    first, second = fake_server.log()
    assert first["body"]["prompt"].endswith("\nAssistant:") and first["body"]["prompt"].startswith("User: ")
    assert second["body"]["prompt"].startswith(first["body"]["prompt"] + first["reply"] + "\nUser: c0u1"), \
        "turn 2: turn 1's prompt, the reply as the server sent it, the next user turn"
    assert [r["turn"] for r in read_csv(tmp_path / "requests-r1-w1.csv")] == ["1", "2"]


def test_a_conversation_run_with_a_request_rate_stops_before_any_request(fake_server, tmp_path):
    from locust.exception import StopUser

    from vllm_locust.plugin.user import ChatStreamUser

    fake_server.configure(ttft_ms=2, itl_ms=1, tokens=4)
    path = dataset(tmp_path, [turns(2)])
    env, fired = make_env(fake_server.url, tmp_path, workload="conversation", dataset_path=path, request_rate="2")
    user = ChatStreamUser(env)
    user.on_start()
    with pytest.raises(StopUser):
        user.stream_completion()
    assert env.process_exit_code == 2 and fake_server.log() == [] and fired == []


def test_without_a_listed_context_the_ceiling_bounds_the_history(tmp_path, monkeypatch):
    """Seen (L1): no max_model_len listed, so no cap: turn-6 prompts of 18 M tokens."""
    import vllm_locust.core.session as session_module

    entry = build(dataset(tmp_path, [turns(6, reply_words=lambda t: 8)])).prompts[0]
    monkeypatch.setattr(session_module, "MAX_PROMPT_TOKENS", 60)
    sent = play(session(entry, max_model_len=None), reply=lambda t: " ".join(["r"] * 8))
    assert len(sent) == 6 and sent[-1][0].trimmed_turns > 0, [p.trimmed_turns for p, _ in sent]
    assert all(actual <= 60 + SLACK_TOKENS for _, actual in sent), [a for _, a in sent]
