"""Make a tiny dummy-weight model directory that vLLM serves with ``--load-format dummy``.

No model hub is reachable from CI or from a laptop behind a proxy, so the suite builds its own:
a Llama-shaped ``config.json`` and a byte-level BPE tokenizer trained here on seeded pseudo-words,
with a chat template. The same seed gives the same vocabulary on every machine.

Usage: python launch/make_tiny_model.py OUT_DIR [--vocab-size 4096] [--shape tiny|qwen2.5-7b|qwen2.5-32b]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

PRINTABLE = "".join(chr(c) for c in range(33, 127))  # what JSON and code need, as single tokens

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]


def pseudo_corpus(seed: int, lines: int = 4000) -> list[str]:
    """Seeded lines of syllable words: a corpus that is identical on every machine."""
    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(3000)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 20))) for _ in range(lines)]


def train_tokenizer(vocab_size: int, seed: int) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=list(PRINTABLE),
    )
    # Every printable ASCII character is a token, so structured output (a forced tool call's JSON:
    # braces, quotes, colons) can be written: without them vLLM's grammar allowed no token and the
    # stream ended in HTTP 500. No byte alphabet beyond that: random dummy weights then sample only
    # tokens that decode to whole ASCII text, so nearly every token arrives as its own content chunk.
    tok.train_from_iterator(pseudo_corpus(seed), trainer=trainer)
    return tok


# Shapes: "tiny" for CPU tests; "qwen2.5-7b" and "qwen2.5-32b" are those models' shapes (random weights), for GPU runs.
SHAPES = {
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=64, torch_dtype="float32"),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, head_dim=128, torch_dtype="bfloat16"),
    # for tensor parallelism on several GPUs: 64 GB of bf16 weights, more than one GPU's share at TP 1 leaves for KV
    "qwen2.5-32b": dict(hidden_size=5120, intermediate_size=27648, num_hidden_layers=64, num_attention_heads=40,
                        num_key_value_heads=8, head_dim=128, torch_dtype="bfloat16"),
}


def model_config(vocab_size: int, max_len: int, shape: str = "tiny") -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **SHAPES[shape],
        "hidden_act": "silu",
        "max_position_embeddings": max_len,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": vocab_size,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
    }


def write_model(out: Path, vocab_size: int = 4096, max_len: int = 4096, seed: int = 0, shape: str = "tiny") -> Path:
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(vocab_size, seed)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "</s>",
        "model_max_length": max_len,
        "chat_template": CHAT_TEMPLATE,
    }, indent=2))
    (out / "config.json").write_text(json.dumps(model_config(tok.get_vocab_size(), max_len, shape), indent=2))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    args = parser.parse_args()
    print(write_model(args.out_dir, args.vocab_size, args.max_model_len, args.seed, args.shape))


if __name__ == "__main__":
    main()
