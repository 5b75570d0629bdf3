"""A model's tokenizer, built from its GGUF metadata with the `tokenizers` package.

GGUF stores a byte-level BPE tokenizer (`tokenizer.ggml.model` = "gpt2") as its vocabulary (token strings in
GPT-2's byte-to-unicode alphabet, so " the" is "Ġthe"), its merges ("Ġ t", in priority order), a type per token
(3 = control, 4 = user-defined) and the name of the pre-tokenizer its converter recognised
(`tokenizer.ggml.pre`). We rebuild exactly that: a BPE model over the vocabulary and merges, the named
pre-tokenizer, a byte-level decoder, and the control tokens as special added tokens (so "<|im_start|>" in a
chat prompt is one token, never split into pieces).
"""
from __future__ import annotations

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

from kfactory.models.errors import ModelError

#: GGUF token types (llama.cpp's llama_token_type)
CONTROL, USER_DEFINED = 3, 4


def _pre_tokenizer(name: str):
    """The pre-tokenizer a GGUF names. "smollm" splits every digit on its own, then applies GPT-2's regex
    ('s|'t|...| ?letters| ?digits| ?other|spaces), which is what SmolLM2's own tokenizer.json declares;
    "gpt2" is the regex alone."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    known = {"smollm": lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                         byte_level]),
             "gpt2": lambda: byte_level}
    if name not in known:
        raise ModelError(f"pre-tokenizer {name!r} is not supported (known: {sorted(known)})")
    return known[name]()


class Tokenizer:
    """Text to token ids and back, plus the model's chat template.

    `encode` adds the BOS token only where the file asks for it (`tokenizer.ggml.add_bos_token`); `decode`
    keeps special tokens unless told to skip them."""

    def __init__(self, hf: HFTokenizer, bos_id: int | None, eos_id: int | None, add_bos: bool,
                 chat_template: str | None):
        self.hf = hf
        self.bos_id, self.eos_id, self.add_bos = bos_id, eos_id, add_bos
        self.chat_template = chat_template

    @classmethod
    def from_metadata(cls, meta: dict) -> "Tokenizer":
        """Build from GGUF metadata (the `tokenizer.ggml.*` keys)."""
        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ModelError(f"tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2')")
        tokens = meta["tokenizer.ggml.tokens"]
        types = meta.get("tokenizer.ggml.token_type", [1] * len(tokens))
        # a merge is "left right"; split on the first space only (byte-level tokens never contain a raw space)
        merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
        hf = HFTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
        hf.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre", "gpt2"))
        hf.decoder = decoders.ByteLevel()
        added = [AddedToken(t, special=ty == CONTROL, normalized=False)
                 for t, ty in zip(tokens, types) if ty in (CONTROL, USER_DEFINED)]
        if added:
            hf.add_tokens(added)
        if hf.get_vocab_size() != len(tokens):
            raise ModelError(f"tokenizer has {hf.get_vocab_size()} tokens, the file lists {len(tokens)} "
                             "(duplicate token strings?)")
        return cls(hf, meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id"),
                   bool(meta.get("tokenizer.ggml.add_bos_token", False)), meta.get("tokenizer.chat_template"))

    def to_json(self) -> dict:
        """Everything from_json needs to rebuild this tokenizer without the GGUF metadata."""
        return {"hf": self.hf.to_str(), "bos_id": self.bos_id, "eos_id": self.eos_id, "add_bos": self.add_bos,
                "chat_template": self.chat_template}

    @classmethod
    def from_json(cls, doc: dict) -> "Tokenizer":
        """The tokenizer to_json described (KeyError, TypeError or ValueError where `doc` is not one)."""
        try:
            hf = HFTokenizer.from_str(doc["hf"])
        except Exception as e:   # the tokenizers binding raises its own untyped error on bad JSON
            raise ValueError(f"not a serialised tokenizer: {e}") from e
        return cls(hf, doc["bos_id"], doc["eos_id"], bool(doc["add_bos"]), doc["chat_template"])

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens written in the text (e.g. "<|im_start|>") are recognised."""
        ids = self.hf.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if self.add_bos and self.bos_id is not None else ids

    def decode(self, ids, skip_special: bool = False) -> str:
        """The text of `ids` (bytes joined before decoding, so a character split across tokens comes out
        whole; an incomplete UTF-8 sequence at the end decodes to U+FFFD)."""
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size()

    def chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The prompt text for a conversation ([{"role": "user", "content": ...}]) through the model's own chat
        template (Jinja2, sandboxed: the template comes from a downloaded file)."""
        if not self.chat_template:
            raise ModelError("this model has no chat template")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        special = {t: self.hf.id_to_token(i) for t, i in (("bos_token", self.bos_id), ("eos_token", self.eos_id))
                   if i is not None}
        return env.from_string(self.chat_template).render(messages=messages,
                                                          add_generation_prompt=add_generation_prompt, **special)
