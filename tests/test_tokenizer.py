"""Tokenizer: SmolLM2's GGUF tokenizer vs transformers' GGUF tokenizer, llama.cpp's digit split,
chat templates vs transformers' rendering, streaming detokenization, HF-folder tokenizers."""

from __future__ import annotations

import json
import os

import pytest

from kvpack.models import Detokenizer, Tokenizer, byte_tokenizer, default_model_path
from kvpack.models.gguf_loader import GGUFFile

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces,\ttabs\tand\n\nnewlines\r\n end  ",
    "Don't you're we'll I'd they've SHOUTING MiXeD",
    "naïve café résumé — “quotes” … ¿qué? ß Ω",
    "日本語のテキストと中文文本, 한국어",
    "emoji 🙂🚀👩‍👩‍👧 and symbols ©®™ ±×÷",
    "def f(x):\n    return x ** two  # comment\n",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text after a special token",
    "",
]
DIGIT_TEXTS = ["12345", "in 2024, 3.14159 and 1,000,000", "x1y22z333 abc 7", "call 555-0199 now",
               "E = mc², ½ cup, x ³"]


@pytest.fixture(scope="module")
def ours() -> Tokenizer:
    return GGUFFile(default_model_path()).tokenizer()


@pytest.fixture(scope="module")
def theirs():
    from transformers import AutoTokenizer

    p = default_model_path()
    return AutoTokenizer.from_pretrained(os.path.dirname(p), gguf_file=os.path.basename(p))


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_equal_transformers_gguf_tokenizer(ours, theirs, text):
    ids = ours.encode(text)
    assert ids == theirs(text)["input_ids"]
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    assert ours.decode(ids, skip_special_tokens=False) == theirs.decode(ids)


def test_special_ids(ours):
    assert ours.bos_token_id == 1 and ours.eos_token_ids == (2,)
    assert ours.encode("hi") == ours.encode("hi", add_special_tokens=False)  # add_bos_token is false
    assert ours.encode("<|im_end|>") == [2]


def _split_numeric(text: str) -> list[str]:
    """Runs of non-numeric characters, and every numeric character (\\p{N}) alone."""
    pieces, run = [], ""
    for c in text:
        if c.isnumeric():
            pieces += [run, c] if run else [c]
            run = ""
        else:
            run += c
    return pieces + ([run] if run else [])


@pytest.mark.parametrize("text", DIGIT_TEXTS)
def test_digits_split_one_per_token(ours, theirs, text):
    """llama.cpp's `smollm` pre-tokenizer isolates every digit before the GPT-2 split; the oracle
    is transformers' tokenizer applied to the pieces between digits and to each digit alone."""
    ids = ours.encode(text)
    assert ids == [i for p in _split_numeric(text) for i in theirs(p)["input_ids"]]
    numeric = [ours.decode([i]) for i in ids if any(c.isnumeric() for c in ours.decode([i]))]
    assert all(len(t) == 1 for t in numeric)  # no space or letter glued to a digit
    assert len(numeric) == sum(c.isnumeric() for c in text)
    assert ours.decode(ids) == text


def test_digit_split_differs_from_plain_gpt2_split(ours, theirs):
    """The control: a space before a numeric character merges into one token without the digit
    step (transformers' GGUF tokenizer) and stays apart with it (llama.cpp)."""
    for text in (" ²", " ½"):
        assert ours.encode(text) != theirs(text)["input_ids"]
        assert ours.encode(text)[0] == ours.encode(" ")[0]


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}],
])
@pytest.mark.parametrize("gen", [True, False])
def test_chat_template_equals_transformers(ours, theirs, messages, gen):
    expected = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
    assert ours.apply_chat_template(messages, add_generation_prompt=gen) == expected


def test_detokenizer_streams_whole_characters(ours):
    text = "Olá 🙂 世界! émoji 👩‍👩‍👧 end"
    ids = ours.encode(text)
    assert any("\ufffd" in ours.decode([i]) for i in ids), "no token splits a character"
    d = Detokenizer(ours)
    deltas = [d.add([i]) for i in ids]
    assert all("\ufffd" not in x for x in deltas)
    assert "".join(deltas) + d.flush() == text


def test_detokenizer_with_prompt_context_and_chunks(ours):
    prompt = ours.encode("<|im_start|>assistant\n")
    out = ours.encode("Paris est la capitale. 東京")
    d = Detokenizer(ours, prompt_ids=prompt)
    text = d.add(out[:3]) + d.add(out[3:4]) + d.add(out[4:]) + d.flush()
    assert text == ours.decode(out)


def test_detokenizer_flush_gives_incomplete_tail(ours):
    ids = ours.encode("🙂")
    d = Detokenizer(ours)
    assert d.add(ids[:-1]) == ""
    assert d.flush() == ours.decode(ids[:-1])


@pytest.mark.parametrize("skip", [True, False])
def test_detokenizer_drops_ids_decode_leaves_out(ours, skip):
    """Special tokens (when skipped) and ids outside the vocabulary: the joined deltas still equal
    `decode(all ids)`, and a long run of such ids does not grow the window decoded each step."""
    specials = ours.encode("<|im_start|><|im_end|>", add_special_tokens=False)
    assert len(specials) == 2 and all(ours.decodes_to_nothing(i, True) for i in specials)
    assert not any(ours.decodes_to_nothing(i, False) for i in specials)
    unknown = ours.vocab_size + 7
    assert ours.decodes_to_nothing(unknown, skip)
    text_ids = ours.encode("Olá 🙂 world, then more text", add_special_tokens=False)
    ids = text_ids[:4] + [specials[0]] + [unknown] * 3 + text_ids[4:7] + [specials[1]] + text_ids[7:]
    d = Detokenizer(ours, skip_special_tokens=skip)
    out = "".join(d.add([i]) for i in ids) + d.flush()
    assert out == ours.decode([i for i in ids if i != unknown], skip_special_tokens=skip)
    d = Detokenizer(ours, prompt_ids=text_ids, skip_special_tokens=skip)
    for _ in range(500):
        assert d.add([unknown]) == ""
    assert len(d.ids) <= 6
    assert d.add(text_ids[:2]) == ours.decode(text_ids + text_ids[:2])[len(ours.decode(text_ids)):]


def test_byte_tokenizer_round_trip():
    tok = byte_tokenizer(300)
    text = "any text ✓ 🙂\n"
    ids = tok.encode(text)
    assert len(ids) == len(text.encode("utf-8")) and max(ids) < 256
    assert tok.decode(ids) == text
    assert tok.encode("<|im_end|>") == [258] and 258 in tok.eos_token_ids
    with pytest.raises(Exception, match="259"):
        byte_tokenizer(100)


def test_hf_folder_tokenizer_template_sources(tmp_path):
    """chat_template as a string, as a named list, or in chat_template.jinja; bos/eos as dicts."""
    tok = byte_tokenizer(300)
    tok.backend.save(str(tmp_path / "tokenizer.json"))
    template = "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] | tojson }}" \
               "{% endfor %}{% if add_generation_prompt %}>{% endif %}"
    cfg = {"bos_token": {"content": "<|im_start|>"}, "eos_token": "<|endoftext|>",
           "chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": template}]}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    t = Tokenizer.from_hf_folder(str(tmp_path), eos_token_ids=(258,))
    msgs = [{"role": "user", "content": "ü"}]
    assert t.apply_chat_template(msgs) == '<|im_start|>[user]"ü">'
    assert t.bos_token_id == 257 and t.eos_token_ids == (256, 258)
    del cfg["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert Tokenizer.from_hf_folder(str(tmp_path)).apply_chat_template(msgs) == "ü"


def test_template_raise_exception_and_missing_template():
    from kvpack.config import KVPackError

    tok = byte_tokenizer(300)
    tok.chat_template = "{{ raise_exception('only user messages') }}"
    with pytest.raises(Exception, match="only user messages"):
        tok.apply_chat_template([{"role": "system", "content": ""}])
    tok2 = byte_tokenizer(300)
    tok2.chat_template = None
    with pytest.raises(KVPackError, match="no chat template"):
        tok2.apply_chat_template([])


def test_chat_template_tokenize_adds_no_second_bos(tmp_path):
    """With a post-processor that prepends BOS (Llama 3 style) and a template that writes BOS,
    tokenize=True yields exactly one BOS, as transformers' apply_chat_template(tokenize=True)."""
    from tokenizers import processors

    tok = byte_tokenizer(300)
    tok.backend.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", 257)])
    tok.chat_template = "<|im_start|>{{ messages[0]['content'] }}"
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True)
    assert ids == [257, ord("h"), ord("i")]
    assert tok.encode("<|im_start|>hi") == [257, 257, ord("h"), ord("i")]
