"""The workload-source registry: a new source is one class that registers itself, and the user
sends its prompts with their own output lengths, through the production path."""

import csv

import pytest
from locust.argument_parser import get_parser

from vllm_locust.backend.modelfit import too_long
from vllm_locust.backend.tokencount import WordCounter
from vllm_locust.core import sources
from vllm_locust.core.sources import Prompt, Source, Workload, register, unregister
from vllm_locust.core.workloads import WorkloadSpec, build_prompts, load_or_build
from vllm_locust.plugin.options import OPTIONS, add_options

from .test_user import make_env, run_requests

TINY = "tiny-test"
QUESTIONS = (("say three", 3), ("say seven", 7), ("say as the run says", None))


@pytest.fixture
def tiny_source():
    """A throw-away source: three fixed chat prompts, two with their own output length."""

    @register(TINY)
    class Tiny(Source):
        help = "three fixed questions"

        def build(self, spec, counter):
            return Workload([Prompt(i, "question", counter.count_text(text), messages=(("user", text),),
                                    max_tokens=max_tokens) for i, (text, max_tokens) in enumerate(QUESTIONS)])

    yield Tiny
    unregister(TINY)
    assert TINY not in sources.NAMES and TINY not in sources.SOURCES


def test_the_built_in_sources_are_registered_in_order():
    assert sources.NAMES == ["fixed", "mixed", "shared-prefix", "sharegpt", "custom", "trace", "conversation"], \
        "the --workload choices, in their order"
    assert list(sources.SOURCES) == sources.NAMES


def test_the_workload_option_comes_from_the_registry(tiny_source):
    kwargs = dict(OPTIONS)["--workload"]
    assert kwargs["choices"] is sources.NAMES, "--workload's choices are the registry's own list"
    assert kwargs["help"].startswith("fixed: one prompt length; mixed: short and long prompts; shared-prefix:")
    parser = get_parser()
    add_options(parser)
    assert parser.parse_args(["--workload", TINY]).workload == TINY, "a source registered later is a choice too"
    assert f"{TINY}: three fixed questions" in sources.describe()


def test_an_unknown_or_doubled_name_is_one_line():
    with pytest.raises(ValueError, match=r"--workload 'bursty': choose one of fixed, mixed, shared-prefix, sharegpt, custom, trace, conversation$"):
        WorkloadSpec(name="bursty")
    with pytest.raises(ValueError, match="registered twice"):
        register("fixed")(type("Again", (Source,), {}))
    assert sources.NAMES.count("fixed") == 1, "a refused registration leaves the registry as it was"


@pytest.mark.parametrize("name", ["fixed", "mixed", "shared-prefix"])
def test_synthetic_prompts_carry_the_runs_max_tokens(name):
    spec = WorkloadSpec(name=name, prompt_tokens=12, long_prompt_tokens=30, long_fraction=0.5, prefix_tokens=8,
                        max_tokens=21, pool=6, unique=False)
    prompts = build_prompts(spec, WordCounter())
    assert [p.max_tokens for p in prompts] == [21] * 6, "a synthetic source's output length is --max-tokens"
    assert {(p.send_at_s, p.session_id, p.turn) for p in prompts} == {(None, None, None)}


def test_the_cache_keeps_a_sources_own_fields(tiny_source, tmp_path):
    spec = WorkloadSpec(name=TINY, prompt_tokens=5, pool=3)
    built = load_or_build(spec, WordCounter(), tmp_path)
    assert [p.max_tokens for p in built.prompts] == [3, 7, None]
    assert len(list(tmp_path.glob(f"prompts-{TINY}-*.json"))) == 1
    assert load_or_build(spec, WordCounter(), tmp_path) == built, "read back, the records are the built ones"


def test_a_registered_source_runs_through_the_user(tiny_source, fake_server, tmp_path):
    fake_server.configure(ttft_ms=2, itl_ms=1)
    env, fired = make_env(fake_server.url, tmp_path, workload=TINY, max_tokens=4)
    run_requests(env, n=6)
    with open(tmp_path / "requests-r1-w1.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["workload"] for r in rows] == [TINY] * 6
    assert [r["prompt_index"] for r in rows] == ["0", "1", "2"] * 2, "the pool is cycled in its order"
    assert [r["completion_tokens"] for r in rows] == ["3", "7", "4"] * 2, \
        "each request asks for its prompt's own max_tokens; a prompt without one asks for --max-tokens"
    assert all(r["error"] == "" for r in rows), [r["error"] for r in rows]


def test_the_model_check_asks_the_source_for_its_longest_prompt(tiny_source):
    mixed = WorkloadSpec(name="mixed", prompt_tokens=10, long_prompt_tokens=100, max_tokens=5)
    assert "--long-prompt-tokens 100 with --max-tokens 5 needs 105" in too_long(mixed, "m", 50)
    shared = WorkloadSpec(name="shared-prefix", prompt_tokens=10, prefix_tokens=45, max_tokens=5)
    assert too_long(shared, "m", 59).startswith("--prefix-tokens 45 + --prompt-tokens 10 with --max-tokens 5")
    assert too_long(shared, "m", 60) is None
    assert too_long(WorkloadSpec(name=TINY, max_tokens=5), "m", 8) is None, "a source that cannot know is not checked"


def test_an_embedding_needs_no_room_for_output():
    """Seen: --endpoint embeddings was refused for prompts within max_model_len, counting --max-tokens
    of output an embedding never generates."""
    embed = WorkloadSpec(name="fixed", prompt_tokens=100, max_tokens=128, endpoint="embeddings", prompt_form="text")
    assert too_long(embed, "m", 100) is None
    assert too_long(embed, "m", 99).startswith("--prompt-tokens 100 needs 100 tokens of context")
