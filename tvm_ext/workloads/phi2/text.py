"""Text generation with a loaded checkpoint: the prompt tokenized, run through the compiled decoder
(``model.Decoder.generate``: the prompt token by token through the decode step, then greedy decoding), the
continuation streamed as text.

    ckpt = tvm_ext.workloads.phi2.load("phi-2/")          # config.json + safetensors, quantized to q4f16_1
    gen = ckpt.generator(capacity=256)                    # compiled (dlight), weights uploaded
    out = gen.generate("def fibonacci(n):", tokens=32, on_text=print)
    out.text, out.prompt_tok_s, out.decode_tok_s
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Generated:
    text: str
    ids: list
    prompt_ids: list
    prompt_s: float  # the prompt's steps, up to the first generated token's logits
    decode_s: float  # the steps after (tokens - 1 of them)
    logits: list = field(default_factory=list, repr=False)

    @property
    def prompt_tok_s(self):
        return len(self.prompt_ids) / self.prompt_s if self.prompt_s > 0 else float("nan")

    @property
    def decode_tok_s(self):
        return (len(self.ids) - 1) / self.decode_s if len(self.ids) > 1 and self.decode_s > 0 else float("nan")


class Generator:
    """A checkpoint's compiled decoder with its tokenizer (``checkpoint.Checkpoint.generator``)."""

    def __init__(self, checkpoint, capacity=None, schedule="dlight", target="llvm", log=None):
        from tvm_ext.workloads.phi2.compiled import decoder

        log = log or (lambda msg: None)
        self.checkpoint, self.tokenizer = checkpoint, checkpoint.tokenizer
        capacity = int(capacity or min(512, checkpoint.cfg["max_positions"]))
        t0 = time.perf_counter()
        self.model = checkpoint.build(capacity)
        self.decoder = decoder(self.model, target, schedule, log=log)
        self.load_s = time.perf_counter() - t0  # build, compile, and the weights read, converted, uploaded

    def encode(self, text):
        if self.tokenizer is None:
            raise ValueError(f"{self.checkpoint.path} has no tokenizer (tokenizer.json beside the weights, or a "
                             f"vocabulary in the GGUF): give token ids instead of text")
        return self.tokenizer.encode(text)

    def generate(self, prompt, tokens=32, on_text=None) -> Generated:
        """Greedy continuation of ``prompt`` (text, or a list of token ids) by ``tokens`` tokens; ``on_text(str)``
        gets each piece of text as its token is generated (ids where there is no tokenizer)."""
        ids = self.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        push = self.tokenizer.stream() if self.tokenizer is not None else (lambda t: f"{t} ")

        def on_id(token):
            if on_text is not None:
                piece = push(token)
                if piece:
                    on_text(piece)

        out = timed_generate(self.decoder, ids, tokens, on_id)
        out.text = self.tokenizer.decode(out.ids) if self.tokenizer is not None else " ".join(map(str, out.ids))
        return out


def timed_generate(decoder, ids, tokens, on_id=None) -> Generated:
    """``decoder.generate`` from an empty cache, timed: the prompt's steps up to the first generated token,
    then the decode steps after it (``Generated`` without text)."""
    decoder.fill_past(0)
    marks = []

    def mark(token):
        marks.append(time.perf_counter())
        if on_id is not None:
            on_id(token)

    t0 = time.perf_counter()
    got, logits = decoder.generate(ids, tokens, on_id=mark)
    return Generated("", got, list(ids), marks[0] - t0, marks[-1] - marks[0], logits)
