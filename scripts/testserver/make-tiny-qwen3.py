"""Make the test server's model: a tiny Qwen3 with random weights and a locally trained tokenizer.

Usage: python make-tiny-qwen3.py OUT_DIR TEXT_DIR
Runs with the test image's vLLM venv (torch, transformers and tokenizers come with vLLM). The model
answers nonsense, which is all the tests need: a real vLLM loads it, schedules it, fills its KV cache
and streams its tokens. 2 layers, hidden 128, 4 attention heads of size 32 (vLLM's CPU attention needs
a head size of at least 32). The tokenizer is byte-level BPE trained on the Python files under
TEXT_DIR, with Qwen's special tokens and a Qwen-shaped chat template that renders tools and
hermes-style <tool_call> blocks, so the hermes tool parser can run on it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

VOCAB_SIZE = 4096
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Not "special": they must survive skip_special_tokens so that the tool and reasoning parsers see them.
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

CHAT_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'user' or message.role == 'system' %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{{ message.content or '' }}
{%- for call in message.tool_calls or [] %}
{%- set f = call.function if call.function is defined else call %}
<tool_call>
{"name": "{{ f.name }}", "arguments": {{ f.arguments if f.arguments is string else f.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def train_tokenizer(text_dir: Path) -> Tokenizer:
    files = sorted(str(p) for p in text_dir.rglob("*.py") if p.stat().st_size < 200_000)[:400]
    if not files:
        raise SystemExit(f"no Python files under {text_dir} to train the tokenizer on")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(SPECIAL) - len(ADDED),
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(files, trainer)
    return tok


def main(out: Path, text_dir: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(text_dir),
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=[],
        chat_template=CHAT_TEMPLATE,
        model_max_length=32768,
    )
    fast.add_tokens(ADDED, special_tokens=False)
    fast.save_pretrained(out)

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=32,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=fast.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=fast.convert_tokens_to_ids("<|endoftext|>"),
        torch_dtype="bfloat16",
    )
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(json.dumps({
        "eos_token_id": [config.eos_token_id], "pad_token_id": config.pad_token_id, "do_sample": False,
    }, indent=2) + "\n")
    print(f"tiny Qwen3 in {out}: vocab {len(fast)}, {sum(p.numel() for p in model.parameters()):,} parameters")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]))
