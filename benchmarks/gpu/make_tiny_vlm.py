"""Make a tiny dummy-weight vision-language model for vLLM ``--load-format dummy`` on the lent GPU:
PaliGemma's architecture at its smallest (a one-layer SigLIP tower on 56x56 images, a one-layer
Gemma), SigLIP's image processor, and a byte-level BPE tokenizer trained here as
``launch/make_tiny_model``'s is, with ``<image>`` and a chat template. No model hub is needed.
Every image becomes 16 tokens (56/14 squared) whatever its size: the processor resizes it first.

Not for vLLM's CPU build: docs/results/vlm-cpu.md says why (torchvision). transformers loads the
config and the processor from this folder (checked on the CPU build's venv).

Usage: python benchmarks/gpu/make_tiny_vlm.py OUT_DIR [--vocab-size 4096]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from launch.make_tiny_model import PRINTABLE, pseudo_corpus  # noqa: E402

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<image>"]
# vLLM renders an image part as "<image>" before the text when the template takes string content
CHAT_TEMPLATE = ("{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def tokenizer(vocab_size: int, seed: int) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=list(PRINTABLE))
    tok.train_from_iterator(pseudo_corpus(seed), trainer=trainer)
    return tok


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tok = tokenizer(a.vocab_size, a.seed)
    tok.save(str(out / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    vision_side, patch = 56, 14
    vocab = 8192  # room for the <loc>/<seg> tokens PaliGemma's processor adds to the tokenizer
    config = {
        "architectures": ["PaliGemmaForConditionalGeneration"], "model_type": "paligemma", "torch_dtype": "float32",
        "image_token_index": ids["<image>"], "projection_dim": 64, "hidden_size": 64, "vocab_size": vocab,
        "bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"], "pad_token_id": ids["<unk>"],
        "text_config": {
            "model_type": "gemma", "vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
            "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0, "torch_dtype": "float32", "bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"],
            "pad_token_id": ids["<unk>"]},
        "vision_config": {
            "model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 2, "image_size": vision_side, "patch_size": patch, "projection_dim": 64,
            "num_image_tokens": (vision_side // patch) ** 2},
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"]}) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "pad_token": "<unk>", "model_max_length": 4096, "chat_template": CHAT_TEMPLATE,
        "extra_special_tokens": {"image_token": "<image>"}}, indent=2) + "\n")
    (out / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "SiglipImageProcessor", "processor_class": "PaliGemmaProcessor", "do_resize": True,
        "size": {"height": vision_side, "width": vision_side}, "resample": 3, "do_rescale": True,
        "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "do_convert_rgb": True, "image_seq_length": (vision_side // patch) ** 2}, indent=2) + "\n")
    (out / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}) + "\n")
    print(f"{out}: PaliGemma, vocabulary {tok.get_vocab_size()}, image token {ids['<image>']}")


if __name__ == "__main__":
    main()
