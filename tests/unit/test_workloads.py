import pytest

from launch.make_tiny_model import write_model
from vllm_locust.backend.tokencount import LocalTokenCounter, WordCounter
from vllm_locust.backend.endpoints import endpoint as registered
from vllm_locust.core.sources.exact import ExactBuilder, PromptLengthError
from vllm_locust.core.sources.records import TEXT
from vllm_locust.core.workloads import WorkloadSpec, build_prompts, build_workload, load_or_build


@pytest.fixture(scope="module")
def counter(tmp_path_factory):
    return LocalTokenCounter(write_model(tmp_path_factory.mktemp("tiny")))


def count(counter, rendered):
    return counter.count_text(rendered) if isinstance(rendered, str) else counter.count_messages(rendered)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_fixed_prompts_have_the_exact_token_count(counter, endpoint):
    spec = WorkloadSpec(name="fixed", prompt_tokens=97, pool=12, endpoint=endpoint, unique=False,
                        prompt_form=registered(endpoint).prompt_form)
    prompts = build_prompts(spec, counter)
    assert [count(counter, p.render()) for p in prompts] == [97] * 12, "every prompt is exactly --prompt-tokens"
    assert len({p.text or p.messages for p in prompts}) == 12, "prompts in the pool are distinct"


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_tagged_prompts_never_repeat_and_stay_exact(counter, endpoint):
    workload = build_workload(WorkloadSpec(name="fixed", prompt_tokens=60, pool=4, endpoint=endpoint,
                                           prompt_form=registered(endpoint).prompt_form), counter)
    assert len(workload.atoms) >= 8
    seen, lengths = set(), set()
    # Several workers and runs, and sequences past the pool size and past the first digits' carry.
    for run in (0, 7):
        for worker in (0, 1, 33):
            for sequence in (0, 1, 3, 4, 5, 31, 32, 33, 1023, 1024, 40000):
                rendered = workload.prompts[sequence % 4].render(workload.tag(run, worker, sequence))
                seen.add(str(rendered))
                lengths.add(count(counter, rendered))
    assert len(seen) == 2 * 3 * 11, "no two requests of a run carry the same prompt"
    assert lengths == {60}, "a tag never changes the exact length"


def test_tags_lead_the_user_text_so_no_prefix_is_shared(counter):
    spec = WorkloadSpec(name="shared-prefix", prompt_tokens=30, prefix_tokens=64, pool=2)
    workload = build_workload(spec, counter)
    a = workload.prompts[0].render(workload.tag(0, 0, 0))
    b = workload.prompts[0].render(workload.tag(0, 0, 2))  # the same body two pool cycles later
    assert a[0] == b[0] and a[0]["role"] == "system", "the shared system prompt stays shared"
    words_a, words_b = a[1]["content"].split(), b[1]["content"].split()
    assert words_a[1] != words_b[1], "the request number's fastest digit comes right after the lead word"
    assert words_a[8:] == words_b[8:], "the body after the tag is the pool entry"
    assert count(counter, a) == count(counter, b) == 94


def test_no_unique_prompts_recycles_the_pool(counter):
    workload = build_workload(WorkloadSpec(prompt_tokens=40, pool=3, unique=False), counter)
    assert workload.atoms == () and workload.tag(0, 0, 5) == ""
    assert workload.prompts[0].render(workload.tag(0, 0, 3)) == workload.prompts[0].render()


def test_mixed_has_short_and_long_in_the_seeded_share(counter):
    spec = WorkloadSpec(name="mixed", prompt_tokens=40, long_prompt_tokens=400, long_fraction=0.25, pool=80)
    prompts = build_prompts(spec, counter)
    kinds = {p.kind: 0 for p in prompts}
    for p in prompts:
        kinds[p.kind] += 1
        assert count(counter, p.render("ba ba ba ba ba ba ba ba")) == (400 if p.kind == "long" else 40)
    assert 8 <= kinds["long"] <= 32, f"about a quarter long: {kinds}"


def test_shared_prefix_shares_the_system_prompt(counter):
    spec = WorkloadSpec(name="shared-prefix", prompt_tokens=30, prefix_tokens=64, pool=6)
    prompts = build_prompts(spec, counter)
    systems = {p.messages[0] for p in prompts}
    assert len(systems) == 1 and systems.pop()[0] == "system", "one system prompt for all"
    assert counter.count_text(prompts[0].messages[0][1]) == 64, "the shared part is --prefix-tokens"
    assert all(counter.count_messages(p.render("ba ba ba ba ba ba ba ba")) == 94 for p in prompts), "prefix + prompt"
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

    body, n = ExactBuilder(Pairs(), TEXT).build(["bo"] * 50, 7)
    assert n == 7 and Pairs().count_text(body) == 7


def test_impossible_lengths_say_why():
    with pytest.raises(PromptLengthError, match="fewer than 500"):
        ExactBuilder(WordCounter(), TEXT).build(["w"] * 10, 500)
    with pytest.raises(ValueError, match="--workload"):
        WorkloadSpec(name="bursty")


def test_a_tag_is_its_digits_in_the_atoms_whatever_was_made_before(counter):
    """``Workload.tag`` keeps the worker's and run's words per process: every tag is still the lead
    atom, then the sequence's, worker's and run's digits in base ``len(atoms)``, least significant first."""
    from vllm_locust.core.sources.records import RUN_DIGITS, SEQUENCE_DIGITS, WORKER_DIGITS, _TAG_TAILS

    workload = build_workload(WorkloadSpec(name="fixed", prompt_tokens=60, pool=2), counter)
    atoms, base = workload.atoms, len(workload.atoms)

    def digits(value, width):
        return [(value // base ** i) % base for i in range(width)]

    _TAG_TAILS.clear()
    for run, worker, sequence in [(0, 0, 0), (5, 1, 1), (5, 1, 2), (5, 2, 2), (9, 1, 2), (3, 40, 12345), (3, 40, base ** 4 + 1)]:
        expected = [atoms[0]] + [atoms[d] for d in digits(sequence, SEQUENCE_DIGITS) + digits(worker, WORKER_DIGITS)
                                 + digits(run, RUN_DIGITS)]
        assert workload.tag(run, worker, sequence) == " ".join(expected)
    for i in range(70):  # more processes' tails than it keeps: it starts again, still right
        assert workload.tag(i, i, 3).split()[-3:] == [atoms[d] for d in digits(i, WORKER_DIGITS) + digits(i, RUN_DIGITS)]
    assert len(_TAG_TAILS) <= 64
