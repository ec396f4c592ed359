import pytest

from launch.make_tiny_model import write_model
from vllm_locust.tokencount import LocalTokenCounter, WordCounter
from vllm_locust.workloads import ExactBuilder, PromptLengthError, WorkloadSpec, build_prompts, load_or_build


@pytest.fixture(scope="module")
def counter(tmp_path_factory):
    return LocalTokenCounter(write_model(tmp_path_factory.mktemp("tiny")))


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_fixed_prompts_have_the_exact_token_count(counter, endpoint):
    prompts = build_prompts(WorkloadSpec(name="fixed", prompt_tokens=97, pool=12, endpoint=endpoint), counter)
    counts = [counter.count_text(p.text) if endpoint == "completions" else counter.count_messages(p.chat_messages())
              for p in prompts]
    assert counts == [97] * 12, "every prompt is exactly --prompt-tokens by the tokenizer"
    assert len({p.text or p.messages for p in prompts}) == 12, "prompts in the pool are distinct"


def test_mixed_has_short_and_long_in_the_seeded_share(counter):
    spec = WorkloadSpec(name="mixed", prompt_tokens=40, long_prompt_tokens=400, long_fraction=0.25, pool=80)
    prompts = build_prompts(spec, counter)
    kinds = {p.kind: 0 for p in prompts}
    for p in prompts:
        kinds[p.kind] += 1
        assert counter.count_messages(p.chat_messages()) == (400 if p.kind == "long" else 40)
    assert 8 <= kinds["long"] <= 32, f"about a quarter long: {kinds}"


def test_shared_prefix_shares_the_system_prompt(counter):
    spec = WorkloadSpec(name="shared-prefix", prompt_tokens=30, prefix_tokens=64, pool=6)
    prompts = build_prompts(spec, counter)
    systems = {p.messages[0] for p in prompts}
    assert len(systems) == 1 and systems.pop()[0] == "system", "one system prompt for all"
    assert counter.count_text(prompts[0].messages[0][1]) == 64, "the shared part is --prefix-tokens"
    assert all(counter.count_messages(p.chat_messages()) == 94 for p in prompts), "whole prompt = prefix + prompt"
    assert len({p.messages[1] for p in prompts}) == 6, "user parts differ"


def test_same_seed_same_prompts_other_seed_other_prompts(counter):
    a = build_prompts(WorkloadSpec(prompt_tokens=20, pool=4, seed=1), counter)
    b = build_prompts(WorkloadSpec(prompt_tokens=20, pool=4, seed=1), counter)
    c = build_prompts(WorkloadSpec(prompt_tokens=20, pool=4, seed=2), counter)
    assert a == b and a != c


def test_cache_round_trip(counter, tmp_path):
    spec = WorkloadSpec(prompt_tokens=25, pool=3)
    built = load_or_build(spec, counter, tmp_path)
    assert len(list(tmp_path.glob("prompts-fixed-*.json"))) == 1
    assert load_or_build(spec, counter, tmp_path) == built, "the cached pool is the built pool"


def test_filler_reaches_targets_words_cannot():
    class Pairs:
        """Every word costs two tokens; one filler costs one: odd targets need the filler."""
        exact, fingerprint = True, "pairs"

        def count_text(self, text):
            return sum(1 if w in ("a", "x") else 2 for w in text.split())

        def count_messages(self, messages, add_generation_prompt=True):
            return sum(self.count_text(m["content"]) for m in messages)

    body, n = ExactBuilder(Pairs(), "completions").build(["bo"] * 50, 7)
    assert n == 7 and Pairs().count_text(body) == 7


def test_impossible_lengths_say_why():
    with pytest.raises(PromptLengthError, match="fewer than 500"):
        ExactBuilder(WordCounter(), "completions").build(["w"] * 10, 500)
    with pytest.raises(ValueError, match="--workload"):
        WorkloadSpec(name="bursty")
