"""Make a PEFT LoRA adapter for a local Llama-shaped model (models/tiny), with small random weights.

No hub and no ``peft``: ``adapter_config.json`` as PEFT writes it and ``adapter_model.safetensors``
written by hand (standard library only, so it runs from the suite's venv, which lacks the
``safetensors`` package). vLLM loads it with ``--enable-lora --lora-modules NAME=OUT``; two seeds make
two different adapters. Shapes follow the base ``config.json``: lora_A is (rank, in), lora_B (out, rank).

Usage: python launch/make_lora.py OUT --base models/tiny [--rank 8] [--targets q_proj,v_proj] [--seed N]
"""

from __future__ import annotations

import argparse
import json
import random
import struct
import sys
from pathlib import Path

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def module_shapes(config: dict) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each Llama linear layer a LoRA may target."""
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv = config.get("num_key_value_heads", heads) * head_dim
    inter = config["intermediate_size"]
    return {"q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
            "o_proj": (heads * head_dim, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "down_proj": (inter, hidden)}


def tensor_shapes(config: dict, targets: list[str], rank: int) -> dict[str, list[int]]:
    """Every tensor of the adapter, named as PEFT saves it, with its shape."""
    shapes = module_shapes(config)
    out: dict[str, list[int]] = {}
    for layer in range(config["num_hidden_layers"]):
        for target in targets:
            part = "self_attn" if target in ATTENTION else "mlp"
            stem = f"base_model.model.model.layers.{layer}.{part}.{target}"
            fan_in, fan_out = shapes[target]
            out[f"{stem}.lora_A.weight"] = [rank, fan_in]
            out[f"{stem}.lora_B.weight"] = [fan_out, rank]
    return out


def write_safetensors(path: Path, tensors: dict[str, tuple[list[int], bytes]]) -> None:
    """The safetensors layout: u64 little-endian header size, JSON header (space-padded to 8 bytes), data."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (shape, data) in tensors.items():
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, data in tensors.values():
            f.write(data)


def read_safetensors(path: Path) -> dict[str, tuple[list[int], list[float]]]:
    """Name -> (shape, values) of an F32 safetensors file (the tests read adapters back with it)."""
    blob = path.read_bytes()
    (size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + size])
    header.pop("__metadata__", None)
    data = blob[8 + size:]
    out = {}
    for name, meta in header.items():
        begin, end = meta["data_offsets"]
        out[name] = (meta["shape"], list(struct.unpack(f"<{(end - begin) // 4}f", data[begin:end])))
    return out


def write_lora(out: Path, base: Path, rank: int = 8, targets: tuple[str, ...] = ("q_proj", "v_proj"),
               seed: int = 0, alpha: int | None = None) -> Path:
    config = json.loads((base / "config.json").read_text())
    unknown = [t for t in targets if t not in ATTENTION + MLP]
    if unknown:
        raise ValueError(f"--targets: unknown module {unknown[0]!r}; known: {','.join(ATTENTION + MLP)}")
    rng = random.Random(seed)
    tensors = {}
    for name, shape in tensor_shapes(config, list(targets), rank).items():
        count = shape[0] * shape[1]
        tensors[name] = (shape, struct.pack(f"<{count}f", *(rng.gauss(0.0, 0.02) for _ in range(count))))
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out / "adapter_model.safetensors", tensors)
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base),
        "r": rank,
        "lora_alpha": alpha if alpha is not None else 2 * rank,
        "lora_dropout": 0.0,
        "target_modules": list(targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "modules_to_save": None,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "revision": None,
    }, indent=2))
    return out


def fail(message: str) -> None:
    print(f"make_lora: {message}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--base", type=Path, default=Path("models/tiny"), help="the base model directory (config.json)")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--targets", default="q_proj,v_proj", help="comma-separated module names")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not (args.base / "config.json").is_file():
        fail(f"no {args.base / 'config.json'}: make the base first (launch/make_tiny_model.py)")
    if args.rank < 1:
        fail(f"--rank must be at least 1, got {args.rank}")
    try:
        print(write_lora(args.out_dir, args.base, args.rank, tuple(args.targets.split(",")), args.seed))
    except ValueError as exc:
        fail(str(exc))


if __name__ == "__main__":
    main()
