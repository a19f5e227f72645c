"""Text in and out of Phi-2: the ``tokenizers`` library on the checkpoint's ``tokenizer.json``, or on the
vocabulary and merges a GGUF holds (llama.cpp's "gpt2" tokenizer model: byte-level BPE, as Phi-2's
CodeGen tokenizer is).

``Tokenizer.stream()`` gives a function that takes one generated id and returns the text it completes
(possibly ""): a byte-level token may hold part of a UTF-8 character, so text is released only once the
bytes decode.
"""
from __future__ import annotations

import os

from .tensors import import_optional


class Tokenizer:
    def __init__(self, tok, source: str):
        self.tok, self.source = tok, source

    def encode(self, text):
        ids = self.tok.encode(text, add_special_tokens=False).ids
        if not ids:
            raise ValueError("the prompt is empty after tokenizing: give some text")
        return ids

    def decode(self, ids):
        return self.tok.decode(list(ids), skip_special_tokens=False)

    def stream(self):
        """``push(id) -> new text``: what the ids so far decode to beyond what earlier calls returned."""
        ids, said = [], [""]

        def push(token):
            ids.append(int(token))
            text = self.decode(ids)
            if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for its other bytes
                return ""
            new = text[len(said[0]):] if text.startswith(said[0]) else text
            said[0] = text
            return new

        return push


def from_file(path) -> Tokenizer:
    tokenizers = import_optional("tokenizers", "reading tokenizer.json")
    try:
        return Tokenizer(tokenizers.Tokenizer.from_file(str(path)), str(path))
    except Exception as err:  # noqa: BLE001 -- the library's parse error, in one line
        raise ValueError(f"{path}: not a tokenizer.json the tokenizers library reads "
                         f"({str(err).splitlines()[0] if str(err) else type(err).__name__})") from None


def beside(directory):
    """The tokenizer.json in ``directory``, else None (the checkpoint then generates ids, not text)."""
    path = os.path.join(directory, "tokenizer.json")
    return from_file(path) if os.path.isfile(path) else None


def from_gguf(tokens, merges, model: str, source: str):
    """A byte-level BPE tokenizer from a GGUF's ``tokenizer.ggml.tokens`` / ``.merges`` (model "gpt2"), else
    None (a GGUF without a tokenizer, e.g. "none"); one line for a tokenizer model we do not read."""
    if model in (None, "none") or not tokens:
        return None
    if model != "gpt2":
        raise ValueError(f"{source}: tokenizer model {model!r}; this reader takes gpt2 (byte-level BPE, Phi-2's)")
    tokenizers = import_optional("tokenizers", "a GGUF's tokenizer")
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in (merges or [])]
    tok = tokenizers.Tokenizer(models.BPE(vocab, pairs))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return Tokenizer(tok, source)
