"""PyTorch as the peer a GPU user would pick: ResNet-50 (torchvision) and Phi-2 decode (transformers).

``resnet50(batch, image, device)``: torchvision's ResNet-50 with random weights (a speed peer: its
outputs are not ours), on CUDA in float16, channels_last, cuDNN autotuned (``cudnn.benchmark``) and
the forward captured once as a CUDA graph that each call replays; on a CPU float32 channels_last,
eager.  PyTorch offers no int8 convolution on CUDA (``torch.ao``'s quantized convs are CPU
backends; ``torch._int_mm`` is a matrix product), so fp16 is its fastest ResNet-50 there.

``phi2_decode(context, device, config)``: transformers' ``PhiForCausalLM`` with Phi-2's shapes (a
``PhiConfig``, random weights), float16 on CUDA (float32 on a CPU), a static KV cache holding
``context`` positions of a random prompt; one call is one decode step at position ``context``
(written to the same slot each time), captured as a CUDA graph where capture works, else eager
(``info["cuda_graph"]`` says which and why).

Each returns (callable, info): the callable runs once and waits for the device, as the bench's other
runtimes do.  ``python -m tvm_ext.bench.torch_peers {resnet50,phi2} ...`` times one alone and
writes JSON (the lent-GPU command runs it beside our rows).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

PHI2 = {"full": dict(vocab_size=51200, hidden_size=2560, intermediate_size=10240, num_hidden_layers=32,
                     num_attention_heads=32, partial_rotary_factor=0.4),
        "reduced": dict(vocab_size=1024, hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
                        num_attention_heads=4, partial_rotary_factor=0.5)}  # tvm_ext.workloads.phi2's configs
# (rotary dims 32 of a head of 80 / 64)


def _torch():
    try:
        import torch
    except ImportError:
        raise ValueError("peer 'torch' needs PyTorch (pip install torch; torchvision for ResNet-50, "
                         "transformers for Phi-2)") from None
    return torch


def check_available(*packages: str) -> None:
    """ValueError (one line) where PyTorch or one of ``packages`` (torchvision, transformers) is not importable."""
    import importlib.util

    _torch()
    for name in packages:
        if importlib.util.find_spec(name) is None:
            raise ValueError(f"the torch peer needs {name} (pip install {name})")


def _synced(torch, device, fn):
    if device.type != "cuda":
        return fn
    return lambda: (fn(), torch.cuda.synchronize(device))


def _graph(torch, device, fn, warmup: int = 3):
    """``fn`` captured as a CUDA graph (warm-up on a side stream first, as PyTorch asks): the replay
    callable, or (None, reason) where capture fails."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except Exception as err:  # noqa: BLE001 -- a model whose step syncs with the host: eager instead
        return None, str(err).splitlines()[0][:200] if str(err) else type(err).__name__
    return graph.replay, None


def resnet50(batch: int = 1, image: int = 224, device: str = "cuda"):
    torch = _torch()
    try:
        from torchvision.models import resnet50 as build
    except ImportError:
        raise ValueError("the torch ResNet-50 peer needs torchvision") from None
    dev = torch.device(device)
    dtype = torch.float16 if dev.type == "cuda" else torch.float32
    torch.backends.cudnn.benchmark = True
    model = build(weights=None).to(dev, dtype).to(memory_format=torch.channels_last).eval()
    x = torch.randn(batch, 3, image, image, device=dev, dtype=dtype).to(memory_format=torch.channels_last)

    def forward():
        with torch.inference_mode():
            return model(x)

    info = {"peer": "torch", "model": "torchvision resnet50 (random weights)", "dtype": str(dtype).split(".")[-1],
            "layout": "channels_last", "batch": batch, "torch": torch.__version__, "device": _device_name(torch, dev),
            "int8": "none: PyTorch has no int8 convolution on CUDA"}
    return _runner(torch, dev, forward, info)


def _device_name(torch, dev) -> str:
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def _runner(torch, dev, fn, info):
    if dev.type == "cuda":
        replay, why = _graph(torch, dev, fn)
        info["cuda_graph"] = True if replay is not None else f"no: {why}"
        return _synced(torch, dev, replay or fn), info
    fn()
    info["cuda_graph"] = "no: not a CUDA device"
    return fn, info


def _static_cache(transformers, cfg, length: int, dev, dtype):
    """transformers' StaticCache for ``length`` positions (its signature changed between 4.x and 5.x)."""
    try:
        return transformers.StaticCache(config=cfg, max_cache_len=length)
    except TypeError:
        return transformers.StaticCache(config=cfg, max_batch_size=1, max_cache_len=length, device=dev, dtype=dtype)


def _rewind(cache, positions: int) -> None:
    """Make the next write of a static cache land at slot ``positions`` again: transformers 5.x's layers
    count their length in a tensor (reset in place, so a CUDA graph replays it); 4.x writes where
    ``cache_position`` says."""
    for layer in getattr(cache, "layers", ()):
        length = getattr(layer, "cumulative_length", None)
        if length is not None and hasattr(length, "fill_"):
            length.fill_(positions)


def phi2_decode(context: int = 512, device: str = "cuda", config: str = "full", seed: int = 0):
    torch = _torch()
    try:
        import transformers
    except ImportError:
        raise ValueError("the torch Phi-2 peer needs transformers") from None
    if config not in PHI2:
        raise ValueError(f"config must be one of {', '.join(PHI2)}, not {config!r}")
    dev = torch.device(device)
    dtype = torch.float16 if dev.type == "cuda" else torch.float32
    torch.manual_seed(seed)
    cfg = transformers.PhiConfig(max_position_embeddings=2048, **PHI2[config])
    with torch.device(dev):
        model = transformers.PhiForCausalLM(cfg).to(dtype).eval()
    cache = _static_cache(transformers, cfg, context + 1, dev, dtype)
    prompt = torch.randint(0, cfg.vocab_size, (1, context), device=dev)
    with torch.inference_mode():
        model(input_ids=prompt, past_key_values=cache, cache_position=torch.arange(context, device=dev),
              use_cache=True)
    token = torch.zeros((1, 1), dtype=torch.long, device=dev)
    position = torch.tensor([context], device=dev)

    def step():
        with torch.inference_mode():
            _rewind(cache, context)
            return model(input_ids=token, past_key_values=cache, cache_position=position, use_cache=True).logits

    params = sum(p.numel() for p in model.parameters())
    info = {"peer": "torch", "model": f"transformers PhiForCausalLM ({config} Phi-2 shapes, random weights)",
            "dtype": str(dtype).split(".")[-1], "context": context, "kv_cache": "static", "parameters": params,
            "torch": torch.__version__, "transformers": transformers.__version__, "device": _device_name(torch, dev)}
    return _runner(torch, dev, step, info)


def time_calls(fn, calls: int = 50, rounds: int = 5) -> float:
    """Median over ``rounds`` of the mean seconds per call of ``calls`` calls (after one warm-up call)."""
    fn()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tvm_ext.bench.torch_peers",
                                description="Time a PyTorch peer alone (median of rounds) and write JSON.")
    p.add_argument("model", choices=("resnet50", "phi2"))
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--batch", type=int, default=1, help="resnet50: images per call (default 1)")
    p.add_argument("--context", type=int, default=512, help="phi2: cached positions (default 512)")
    p.add_argument("--config", default="full", choices=tuple(PHI2), help="phi2: shapes (default full)")
    p.add_argument("--calls", type=int, default=50, help="calls per round (default 50)")
    p.add_argument("--out", metavar="FILE", help="write the result as JSON")
    args = p.parse_args(argv)
    try:
        if args.model == "resnet50":
            fn, info = resnet50(args.batch, device=args.device)
        else:
            fn, info = phi2_decode(args.context, device=args.device, config=args.config)
    except (ValueError, RuntimeError) as err:
        print(f"torch_peers: {err}", file=sys.stderr)
        return 2
    seconds = time_calls(fn, args.calls)
    info["ms"] = seconds * 1e3
    if args.model == "phi2":
        info["tok_s"] = 1.0 / seconds
    print(json.dumps(info))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(info, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
