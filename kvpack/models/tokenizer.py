"""Tokenizer: a `tokenizers.Tokenizer` plus bos/eos ids and a jinja2 chat template.

Built from a Hugging Face folder (tokenizer.json + tokenizer_config.json), from GGUF metadata
(`kvpack.models.gguf`), or as a byte-level stand-in for random-weight presets (`byte_tokenizer`).
`Detokenizer` turns a growing list of ids into text deltas for streaming, holding back bytes of a
multi-byte character until it is complete.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Any

from tokenizers import AddedToken, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

from kvpack.config import KVPackError

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class Tokenizer:
    """encode/decode text and render chat prompts.

    eos_token_ids: every id that ends generation (tokenizer, config.json and generation_config.json).
    """

    def __init__(self, tokenizer: HFTokenizer, *, bos_token: str | None = None,
                 eos_token: str | None = None, eos_token_ids: tuple[int, ...] = (),
                 chat_template: str | None = None) -> None:
        self.backend = tokenizer
        self.bos_token, self.eos_token = bos_token, eos_token
        self.bos_token_id = tokenizer.token_to_id(bos_token) if bos_token else None
        eos = [tokenizer.token_to_id(eos_token)] if eos_token else []
        self.eos_token_ids = tuple(dict.fromkeys(i for i in [*eos, *eos_token_ids] if i is not None))
        self.chat_template = chat_template
        self._template = None
        self._special = frozenset(t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special)

    def decodes_to_nothing(self, token_id: int, skip_special_tokens: bool = True) -> bool:
        """Whether `decode` leaves `token_id` out whatever surrounds it: an id outside the vocabulary,
        or a special token when those are skipped (the ids `tokenizers` filters before its decoder)."""
        token = self.backend.id_to_token(token_id)
        return token is None or (skip_special_tokens and token in self._special)

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            tokenize: bool = False, **kwargs: Any) -> str | list[int]:
        """Render `messages` ([{"role", "content"}, ...]) with the model's jinja2 template, with the
        variables transformers passes (bos_token, eos_token, add_generation_prompt, extras).
        tokenize=True returns the ids, encoded without adding special tokens (the template writes
        its own BOS; encoding the text with add_special_tokens=True could add a second one)."""
        text = self._render(messages, add_generation_prompt, **kwargs)
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool, **kwargs: Any) -> str:
        if self.chat_template is None:
            raise KVPackError("this model's tokenizer has no chat template; send a plain prompt instead")
        if self._template is None:
            self._template = _compile_template(self.chat_template)
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     bos_token=self.bos_token or "", eos_token=self.eos_token or "",
                                     **kwargs)

    @classmethod
    def from_hf_folder(cls, path: str, eos_token_ids: tuple[int, ...] = ()) -> "Tokenizer":
        """tokenizer.json (required) + tokenizer_config.json and chat_template.jinja (optional)."""
        try:
            backend = HFTokenizer.from_file(os.path.join(path, "tokenizer.json"))
        except Exception as e:  # tokenizers raises a bare Exception on a malformed file
            raise KVPackError(f"cannot read {os.path.join(path, 'tokenizer.json')}: {e}") from None
        cfg = _read_json(os.path.join(path, "tokenizer_config.json"))
        template = cfg.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default") or next(iter(named.values()), None)
        jinja = os.path.join(path, "chat_template.jinja")
        if template is None and os.path.isfile(jinja):
            with open(jinja, encoding="utf-8") as f:
                template = f.read()
        return cls(backend, bos_token=_token_str(cfg.get("bos_token")),
                   eos_token=_token_str(cfg.get("eos_token")), eos_token_ids=eos_token_ids,
                   chat_template=template)


class Detokenizer:
    """Incremental decoding for streaming: `add(new_ids) -> new text`.

    Text is emitted only once it no longer ends in an incomplete UTF-8 sequence (U+FFFD), and each
    delta is decoded together with a few preceding ids so that tokenizers whose decoding depends on
    the neighbour (leading-space stripping) still produce exactly `decode(all_ids)` once joined.
    Ids that `decode` leaves out anyway (`Tokenizer.decodes_to_nothing`) are dropped on arrival: a
    run of them would otherwise keep the held-back window growing, and every step would decode it
    all again (random-weight presets sample such ids almost always).
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int] | None = None,
                 skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        context: list[int] = []
        for i in reversed((prompt_ids or [])[-64:]):  # the prompt's last 6 ids that decode to something
            if len(context) == 6:
                break
            if not tokenizer.decodes_to_nothing(i, skip_special_tokens):
                context.append(i)
        self.ids: list[int] = context[::-1]
        self.read_offset = len(self.ids)
        self.prefix_offset = max(0, self.read_offset - 5)

    def add(self, new_ids: list[int]) -> str:
        new_ids = [i for i in new_ids if not self.tokenizer.decodes_to_nothing(i, self.skip_special_tokens)]
        if not new_ids:
            return ""
        self.ids.extend(new_ids)
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        text = self._decode(self.ids[self.prefix_offset:])
        if len(text) <= len(prefix) or text.endswith("\ufffd"):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return text[len(prefix):]

    def flush(self) -> str:
        """Whatever is held back (an incomplete character at the end of generation)."""
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        text = self._decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.ids)
        return text[len(prefix):]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)


def byte_tokenizer(vocab_size: int) -> Tokenizer:
    """A stand-in for random-weight presets: 256 byte tokens (GPT-2's byte alphabet), no merges,
    then <|endoftext|> (eos), <|im_start|>, <|im_end|> (eos), with a ChatML template.
    Needs vocab_size >= 259; ids past 258 decode to nothing."""
    if vocab_size < 259:
        raise KVPackError(f"a byte-level tokenizer needs a vocabulary of >= 259 tokens, got {vocab_size}")
    vocab = {c: i for i, c in enumerate(byte_alphabet())}
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    eos = (tok.token_to_id("<|im_end|>"),)
    return Tokenizer(tok, eos_token="<|endoftext|>", eos_token_ids=eos, chat_template=CHATML_TEMPLATE)


def byte_alphabet() -> list[str]:
    """GPT-2's byte -> character map (index = byte): printable bytes stand for themselves, the
    others take the characters from U+0100 on, in byte order."""
    printable = {*range(33, 127), *range(161, 173), *range(174, 256)}
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def _compile_template(source: str):
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: Any = None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise KVPackError(f"the chat template does not parse: {e}") from None


def _token_str(tok: Any) -> str | None:
    if isinstance(tok, dict):
        return tok.get("content")
    return tok


def _read_json(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise KVPackError(f"cannot read {path}: {e}") from None
