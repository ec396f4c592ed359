"""LoRA adapters: the adapter launch/make_lora.py writes (read back, shapes against the base config),
the mock server listing and serving adapters as vLLM does, and a persona naming an adapter the
server does not serve refused at start with one line naming what it serves."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from locust.env import Environment
from locust.event import Events

from launch import make_lora
from launch.make_tiny_model import model_config
from vllm_locust.plugin.options import defaults
from vllm_locust.plugin.personas import PersonaStart, install
from vllm_locust.plugin.user import ChatStreamUser

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture
def base(tmp_path):
    """A tiny model's directory: its config.json is all an adapter needs of it."""
    path = tmp_path / "tiny"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(model_config(4096, 4096, "tiny")))
    return path


def test_the_adapter_has_peft_config_and_a_tensor_pair_per_layer_and_target_shaped_by_the_base(base, tmp_path):
    out = make_lora.write_lora(tmp_path / "lora", base, rank=4, targets=ALL, seed=1)
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["peft_type"], config["task_type"], config["r"]) == ("LORA", "CAUSAL_LM", 4)
    assert config["target_modules"] == list(ALL) and config["base_model_name_or_path"] == str(base)
    tensors = make_lora.read_safetensors(out / "adapter_model.safetensors")
    assert len(tensors) == 2 * 2 * len(ALL), "lora_A and lora_B for each target of each of the 2 layers"
    # tiny: hidden 128, 2 heads of 64, 1 KV head, intermediate 256; lora_A (r, in), lora_B (out, r)
    want = {"self_attn.q_proj": (128, 128), "self_attn.k_proj": (128, 64), "self_attn.v_proj": (128, 64),
            "self_attn.o_proj": (128, 128), "mlp.gate_proj": (128, 256), "mlp.up_proj": (128, 256),
            "mlp.down_proj": (256, 128)}
    for layer in (0, 1):
        for module, (fan_in, fan_out) in want.items():
            stem = f"base_model.model.model.layers.{layer}.{module}"
            shape_a, values_a = tensors[f"{stem}.lora_A.weight"]
            shape_b, values_b = tensors[f"{stem}.lora_B.weight"]
            assert (shape_a, shape_b) == ([4, fan_in], [fan_out, 4]), stem
            assert len(values_a) == 4 * fan_in and any(values_a) and any(values_b), "small random weights, not zeros"
            assert max(abs(v) for v in values_a) < 1.0


def test_the_header_is_what_safetensors_expects(base, tmp_path):
    """u64 header length, JSON header padded to 8 bytes, offsets that tile the data exactly."""
    out = make_lora.write_lora(tmp_path / "lora", base, rank=8, seed=3)
    blob = (out / "adapter_model.safetensors").read_bytes()
    size = int.from_bytes(blob[:8], "little")
    assert size % 8 == 0
    header = json.loads(blob[8:8 + size])
    assert header.pop("__metadata__") == {"format": "pt"}
    spans = sorted(meta["data_offsets"] for meta in header.values())
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert spans[-1][1] == len(blob) - 8 - size
    assert all(meta["dtype"] == "F32" for meta in header.values())


def test_seeds_make_different_adapters_and_the_same_seed_the_same(base, tmp_path):
    def weights(name, seed):
        return (make_lora.write_lora(tmp_path / name, base, seed=seed) / "adapter_model.safetensors").read_bytes()

    assert weights("a", 1) == weights("a2", 1)
    assert weights("a", 1) != weights("b", 2)


def test_a_large_base_shape_gives_its_own_shapes():
    shapes = make_lora.tensor_shapes(model_config(152064, 8192, "qwen2.5-7b"), ["q_proj", "k_proj"], 16)
    assert len(shapes) == 28 * 2 * 2
    assert shapes["base_model.model.model.layers.27.self_attn.k_proj.lora_B.weight"] == [4 * 128, 16]


@pytest.mark.parametrize("argv, words", [
    (["--targets", "q_proj,wq"], "--targets: unknown module 'wq'"),
    (["--rank", "0"], "--rank must be at least 1"),
    (["--base", "/no/such/model"], "no /no/such/model/config.json"),
])
def test_bad_arguments_are_one_line_and_exit_2(base, tmp_path, monkeypatch, capsys, argv, words):
    args = ["make_lora.py", str(tmp_path / "out"), "--base", str(base), *argv]
    monkeypatch.setattr("sys.argv", args)
    with pytest.raises(SystemExit) as exit_:
        make_lora.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and words in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists(), "nothing written on a bad argument"


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def chat(url: str, model: str) -> int:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                       "stream": True}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def test_the_mock_lists_adapters_with_the_model_as_parent_and_serves_them(fake_server):
    fake_server.configure(ttft_ms=1, itl_ms=1, adapters=["lora-a", "lora-b"])
    data = get(fake_server.url + "/v1/models")["data"]
    assert [m["id"] for m in data] == ["fake-model", "lora-a", "lora-b"]
    assert [m.get("parent") for m in data[1:]] == ["fake-model"] * 2 and all(m["root"] for m in data[1:])
    assert [chat(fake_server.url, m) for m in ("lora-b", "fake-model", "lora-c")] == [200, 200, 404]
    assert [r["model"] for r in fake_server.log()] == ["lora-b", "fake-model"], "the log keeps each request's model"
    fake_server.configure()
    assert [m["id"] for m in get(fake_server.url + "/v1/models")["data"]] == ["fake-model"], "none by default"


class Concrete(ChatStreamUser):
    """A locustfile's concrete user."""


def test_a_persona_naming_an_adapter_the_server_lacks_is_one_line_naming_what_it_serves(fake_server, tmp_path):
    fake_server.configure(adapters=["lora-a", "lora-b"])
    path = tmp_path / "personas.toml"
    path.write_text('[[persona]]\nname = "a"\nweight = 3\nmodel = "lora-a"\n'
                    '[[persona]]\nname = "c"\nmodel = "lora-c"\n')
    options = defaults(personas=str(path), model="fake-model", prompt_tokens=20, prompt_pool=4,
                       prompt_cache_dir="", samples_dir=str(tmp_path))
    env = Environment(user_classes=[Concrete], available_user_classes={"Concrete": Concrete}, events=Events(),
                      parsed_options=options)
    env.host = fake_server.url
    start = PersonaStart(env, None, None, install(env))
    error = start.check(env)
    assert error == (f'--personas {path}: persona "c": model \'lora-c\' is not served by {fake_server.url}; '
                     "it serves: fake-model, lora-a, lora-b"), error
    path.write_text('[[persona]]\nname = "a"\nmodel = "lora-a"\n[[persona]]\nname = "b"\nmodel = "lora-b"\n')
    assert PersonaStart(env, None, None, install(env)).check(env) is None, "adapters the server lists are accepted"
