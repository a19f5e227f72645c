"""The PyTorch peers (tvm_ext.bench.torch_peers): bad input refused in one line; where PyTorch (with
torchvision / transformers) is installed, each peer runs on the CPU at small shapes (on a GPU the same
code runs in fp16 under a CUDA graph: the lent-machine command)."""
import importlib.util

import pytest

from tvm_ext.bench import peers, torch_peers

HAS_TORCH = importlib.util.find_spec("torch") is not None


class _Workload:
    def __init__(self, name, **options):
        self.name, self.options = name, options


def test_the_torch_peer_is_resnet50_only(capsys):
    from tvm_ext.cli.main import main

    with pytest.raises(ValueError, match="not a peer of phi2-decode"):
        peers.torch_network(_Workload("phi2-decode"), target=None)
    assert "torch" in peers.parse_peers("ort,torch")
    # the bench refuses before it tunes anything: one line, no work dir
    assert main(["bench", "conv2d-int8", "--peers", "torch", "--image", "8", "--trials", "1"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == ("tvm-ext bench: error: peer 'torch' times torchvision's ResNet-50: "
                                            "not a peer of conv2d-int8")
    assert "tuning" not in err and "Traceback" not in err


def test_an_unknown_phi2_config_is_refused():
    with pytest.raises(ValueError, match="config must be one of|needs PyTorch"):
        torch_peers.phi2_decode(8, device="cpu", config="huge")


@pytest.mark.skipif(HAS_TORCH, reason="PyTorch is installed here")
def test_without_torch_the_command_says_so_in_one_line(capsys):
    assert torch_peers.main(["resnet50", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs PyTorch" in err


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None, reason="torchvision not installed")
def test_resnet50_runs_on_the_cpu():
    fn, info = torch_peers.resnet50(batch=1, image=64, device="cpu")
    out = fn()
    assert tuple(out.shape) == (1, 1000)
    assert info["dtype"] == "float32" and info["cuda_graph"].startswith("no")


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
def test_phi2_decode_step_runs_on_the_cpu_and_repeats():
    fn, info = torch_peers.phi2_decode(context=8, device="cpu", config="reduced")
    first = fn().clone()
    assert tuple(first.shape) == (1, 1, torch_peers.PHI2["reduced"]["vocab_size"])
    assert (fn() == first).all()  # the same token at the same position: the same logits
    assert info["context"] == 8 and info["parameters"] > 0


def test_time_calls_is_the_median_of_rounds():
    calls = []
    assert torch_peers.time_calls(lambda: calls.append(1), calls=3, rounds=2) >= 0
    assert len(calls) == 1 + 3 * 2
