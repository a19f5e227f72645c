"""tvm_ext: MetaSchedule plugin for quantized workloads on pip-installed Apache TVM."""
from setuptools import setup

setup(
    name="tvm_ext",
    version="0.1.0",
    description="MetaSchedule schedule rules, postprocessors and tuning drivers for quantized models",
    python_requires=">=3.9",
    packages=["tvm_ext", "tvm_ext.intrinsics", "tvm_ext.tune", "tvm_ext.workloads", "tvm_ext.workloads.phi2",
              "tvm_ext.bench", "tvm_ext.bench.phi2",
              "tvm_ext.check", "tvm_ext.cli", "tvm_ext.testing", "tvm_ext.rules", "tvm_ext.postprocs",
              "tvm_ext.frontend", "tvm_ext.cluster", "tvm_ext.analysis", "tvm_ext.report"],
    package_dir={
        "tvm_ext": "tvm_ext",
        "tvm_ext.rules": "rules",
        "tvm_ext.postprocs": "postprocs",
    },
    install_requires=[
        # 0.27.0.post1 needs tvm-ffi 0.1.14.post1: with 0.1.15.x tvm.ir.save_json segfaults,
        # i.e. every MetaSchedule database write crashes. Pin both.
        "apache-tvm==0.27.0.post1",
        "apache-tvm-ffi==0.1.14.post1",
        "numpy",
        # MetaSchedule's cost model. On Linux the "xgboost" wheel pulls nvidia-nccl-cu12 (~350 MB)
        # for multi-GPU training it never does here; "xgboost-cpu" is the same module without it.
        "xgboost-cpu; platform_system == 'Linux'",
        "xgboost; platform_system != 'Linux'",
        "psutil",
        "cloudpickle",
        "tornado",
    ],
    extras_require={
        "test": ["pytest", "pytest-timeout", "hypothesis", "onnx>=1.16", "onnxruntime>=1.17", "openvino", "ruff",
                 # the default run on one worker per core (pytest.ini: -n auto); most tests are compiles
                 "pytest-xdist",
                 # the cluster tests start a real Dask scheduler and workers on loopback
                 "dask[distributed]", "cryptography",
                 # the Phi-2 checkpoint tests write safetensors, GGUF and a tokenizer ([models] reads them)
                 "safetensors", "tokenizers", "gguf",
                 # the report pages' tests draw figures and read their points back
                 "matplotlib"],
        # ONNX Runtime and OpenVINO as the peers of the int8 benchmarks (--peers ort,ov)
        "bench": ["onnx>=1.16", "onnxruntime>=1.17", "openvino"],
        # tvm-ext tune --cluster: tasks tuned on a Dask-distributed cluster over mutual TLS
        "cluster": ["dask[distributed]", "cryptography"],
        # tvm-ext generate --model: a user's Phi-2 checkpoint (tokenizer.json via tokenizers, GGUF via gguf;
        # safetensors files are memory-mapped directly, the package writes them in tests and helpers)
        "models": ["safetensors", "tokenizers", "gguf"],
        # the reference's numbers (tests/test_phi2_reference.py, -m slow): transformers' PhiForCausalLM in float32.
        # Apart from [test] because torch is large: pinned to 2.13.0, the CPU build pip finds on the project's
        # machines (an unpinned torch pulls a multi-GB CUDA build); transformers 4.48+ has PhiForCausalLM as
        # Phi-2 ships it (config.json's partial_rotary_factor; 5.x writes rope_parameters, both read)
        "reference": ["torch==2.13.0", "transformers>=4.48", "safetensors", "tokenizers", "gguf"],
        # generate --prompt N --peers openvino: OpenVINO's int4 LLM path, the model exported by optimum-intel with
        # NNCF's int4 compression (bench/phi2/openvino_llm.py). optimum-intel needs torch and torchvision: no pin,
        # pip takes the newest pair (a CUDA build of torch, several GB). Not beside [reference]'s torch==2.13.0 CPU
        # pin: PyPI's torchvision is built against PyPI's torch and fails to import beside that file
        "openvino-llm": ["openvino", "optimum-intel[openvino]", "nncf"],
        # tvm-ext report DIR|FILE.json --html/--png: figures drawn with matplotlib (Agg, no display)
        "report": ["matplotlib"],
    },
    entry_points={
        "console_scripts": ["tvm-ext=tvm_ext.cli:main"],
        # makes ms.tune_tir safe in several tests of one session (pytest >= 9.2); -p no:tvm_ext
        "pytest11": ["tvm_ext = tvm_ext.testing.pytest_plugin"],
    },
)
