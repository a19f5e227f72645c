"""Target presets and host detection (tvm_ext.targets)."""
import json

import pytest
import tvm
from tvm.target import codegen

from tvm_ext import targets as T


def test_llvm_host_preset_matches_llvm_and_os():
    t = T.resolve_target("llvm")
    assert t.kind.name == "llvm"
    host = T.describe_host()
    known = codegen.llvm_get_cpu_archlist(tvm.target.Target({"kind": "llvm"}))
    # the mcpu used is one this LLVM knows; LLVM's own host name when it knows it
    assert host["mcpu"] is None or host["mcpu"] in known
    if host["llvm_host_cpu"] in known:
        assert host["mcpu"] == host["llvm_host_cpu"]
    if host["mcpu"]:
        assert str(t.attrs["mcpu"]) == host["mcpu"]
    assert int(t.attrs["num-cores"]) == host["physical_cores"] >= 1


def test_host_features_agree_with_cpuinfo():
    flags = T._cpuinfo().get("flags")
    if not flags:
        pytest.skip("no /proc/cpuinfo flags")
    host = T.describe_host()
    assert host["avx512vnni"] == ("avx512_vnni" in flags)
    # AVX-VNNI may be under-claimed, never over-claimed: a VM that hides the CPU model makes
    # LLVM pick an older name (rocketlake on a Xeon whose OS flags show AMX and avx_vnni), and
    # the preset then has that CPU's features; AVX-512 VNNI is the one the rule prefers anyway
    assert host["avxvnni"] <= ("avx_vnni" in flags)
    # every feature the preset claims is really exposed by the OS
    for llvm_name, os_name in T._LLVM_TO_CPUINFO.items():
        if llvm_name in host["features"]:
            assert os_name in flags, llvm_name
    assert T.has_vnni("llvm") == (host["avx512vnni"] or host["avxvnni"])


def test_nearest_known_cpu_fallback():
    known = T._known_cpus()
    # a host with AVX-512 VNNI but no AMX: an Intel model with VNNI and nothing it lacks
    flags = {"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq",
             "avx512vl", "avx512cd", "avx512_vnni"}
    cpu = T._nearest_known_cpu(flags, known, "intel")
    assert cpu in known
    feats = T._llvm_features(cpu)
    assert "avx512vnni" in feats and "amx-tile" not in feats
    # AVX2 only: no AVX-512 model is picked
    cpu2 = T._nearest_known_cpu({"sse4_2", "avx", "avx2", "fma", "f16c"}, known, "intel")
    assert "avx512f" not in T._llvm_features(cpu2) and "avx2" in T._llvm_features(cpu2)
    assert T._nearest_known_cpu(set(), known) is None


def test_generic_and_vnni_detection():
    g = T.resolve_target("llvm-generic")
    assert g.kind.name == "llvm" and "mcpu" not in g.attrs
    # MetaSchedule needs num-cores to tune for it: this machine's physical cores
    assert int(g.attrs["num-cores"]) == T.physical_cores()
    assert int(T.resolve_target('{"kind": "llvm"}').attrs["num-cores"]) == T.physical_cores()
    assert not T.has_vnni("llvm-generic")
    assert T.vnni_kinds({"kind": "llvm", "mcpu": "cascadelake"}) == ["avx512vnni"]
    assert T.vnni_kinds({"kind": "llvm", "mcpu": "alderlake"}) == ["avxvnni"]
    assert T.vnni_kinds({"kind": "llvm", "mcpu": "sapphirerapids"}) == ["avx512vnni", "avxvnni"]
    assert not T.has_vnni({"kind": "llvm", "mcpu": "skylake-avx512"})
    assert not T.has_vnni({"kind": "llvm", "mcpu": "cascadelake", "mattr": ["-avx512vnni"]})
    assert not T.has_vnni("cuda-sm80")


@pytest.mark.parametrize("name,arch,gpu", [("cuda-sm75", "sm_75", "nvidia/nvidia-t4"),
                                           ("cuda-sm80", "sm_80", "nvidia/nvidia-a100"),
                                           ("cuda-sm90", "sm_90", "nvidia/nvidia-h100")])
def test_cuda_presets(name, arch, gpu):
    """The limits VerifyGPUCode checks are those TVM's own tag gives a GPU of that arch."""
    from tvm.target import tag

    from tvm_ext.postprocs.verify_gpu_code import REQUIRED_TARGET_ATTRS, target_limits

    t = T.resolve_target(name)
    assert t.kind.name == "cuda"
    assert str(t.attrs["arch"]) == arch
    reference = tag.list_tags()[gpu].attrs
    assert str(reference["arch"]).startswith(arch)  # sm_90a for the H100
    assert target_limits(t) == {attr: int(reference[attr]) for attr in REQUIRED_TARGET_ATTRS}
    assert T.target_key(t) == "cuda"


def test_cuda_default_arch(monkeypatch):
    monkeypatch.setattr(T, "_nvidia_smi_arch", lambda: None)
    assert str(T.resolve_target("cuda").attrs["arch"]) == "sm_80"
    monkeypatch.setattr(T, "_nvidia_smi_arch", lambda: "sm_90")
    assert str(T.resolve_target("cuda").attrs["arch"]) == "sm_90"


def test_json_specs():
    t = T.resolve_target('{"kind": "llvm", "mcpu": "cascadelake", "num-cores": 4}')
    assert str(t.attrs["mcpu"]) == "cascadelake" and int(t.attrs["num-cores"]) == 4
    t2 = T.resolve_target({"kind": "cuda", "arch": "sm_86"})
    assert str(t2.attrs["arch"]) == "sm_86"
    assert T.resolve_target(t2) is t2
    assert T.target_key('{"kind": "llvm"}') == "llvm-generic"
    assert T.target_key("llvm-generic") == "llvm-generic"
    assert T.target_key('{"kind": "llvm", "mcpu": "znver4"}') == "llvm"


@pytest.mark.parametrize(
    "spec", ['{"kind": "llvm",', "{kind: llvm}", "[1, 2]", '{"mcpu": "x"}', '{"kind": "llvm", "bogus": 1}', "tpu"]
)
def test_bad_specs_give_one_line_value_error(spec):
    with pytest.raises(ValueError) as info:
        T.resolve_target(spec)
    msg = str(info.value)
    assert msg and "\n" not in msg and len(msg) < 400


def test_target_mismatch():
    assert T.target_mismatch("llvm", "llvm") is None
    w = T.target_mismatch({"kind": "llvm", "mcpu": "znver4"}, {"kind": "llvm", "mcpu": "cascadelake"})
    assert "znver4" in w and "cascadelake" in w
    assert "kind" in T.target_mismatch("cuda-sm80", "llvm-generic")


def test_print_targets(capsys):
    from tvm_ext.cli import main

    assert main(["targets"]) == 0
    out = capsys.readouterr().out
    host = T.describe_host()
    assert "avx512vnni" in out and str(host["physical_cores"]) in out
    assert "cuda-sm80" in out
    json.dumps(host)  # JSON-able for --json style output


# A Sapphire Rapids guest whose CPU model LLVM cannot see: LLVM says rocketlake (no AMX)
# while the OS flags show AMX (the machines issue 17 was measured on).
_SPR_GUEST_FLAGS = ("fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma f16c avx512f avx512dq avx512cd "
                    "avx512bw avx512vl avx512ifma avx512vbmi avx512_vbmi2 avx512_vnni avx512_bf16 "
                    "avx_vnni amx_bf16 avx512_fp16 amx_tile amx_int8")
_SPR_GUEST = (f"processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
              f"flags\t\t: {_SPR_GUEST_FLAGS}\n\nprocessor\t: 1\nflags\t\t: fpu\n")


def _fake_host(text, llvm_cpu):
    return T._describe(T._cpuinfo(text), "x86_64-unknown-linux-gnu", llvm_cpu, T._known_cpus(), "intel")


def test_cpuinfo_text_parsed_first_processor_only():
    info = T._cpuinfo(_SPR_GUEST)
    assert info["model_name"].startswith("Intel(R) Xeon")
    assert {"amx_tile", "amx_int8", "amx_bf16"} <= info["flags"] and "fpu" in info["flags"]
    assert T._cpuinfo("") == {}


def test_amx_guest_named_rocketlake_gets_amx_mattr(monkeypatch):
    """LLVM names the guest rocketlake (no AMX in that model); the OS shows AMX: the preset
    keeps the mcpu and adds +amx-* so that LLVM emits tile instructions."""
    host = _fake_host(_SPR_GUEST, "rocketlake")
    assert host["mcpu"] == "rocketlake"
    assert "amx-tile" not in T._llvm_features("rocketlake")
    assert {"+amx-tile", "+amx-int8", "+amx-bf16"} <= set(host["mattr"])
    assert host["amx_tile"] and host["amx_int8"] and host["amx_bf16"]
    monkeypatch.setattr(T, "_host", lambda: host)
    t = T.resolve_target("llvm")
    assert str(t.attrs["mcpu"]) == "rocketlake"
    assert {"+amx-tile", "+amx-int8", "+amx-bf16"} <= set(str(a) for a in t.attrs["mattr"])
    assert T.has_amx(t) and T.has_amx("llvm")
    # llvm-generic is unchanged on that host
    assert "mattr" not in T.resolve_target("llvm-generic").attrs and not T.has_amx("llvm-generic")


def test_amx_flags_without_int8_and_hosts_without_amx():
    # the OS shows tiles but not the int8 instructions: no AMX int8 path
    host = _fake_host(_SPR_GUEST.replace(" amx_int8", ""), "rocketlake")
    assert host["amx_tile"] and not host["amx_int8"]
    assert not T.has_amx({"kind": "llvm", "mcpu": "rocketlake", "mattr": host["mattr"]})
    # no AMX flags: nothing added, same as before AMX detection existed
    plain = _fake_host(_SPR_GUEST.replace(" amx_bf16", "").replace(" amx_tile", "").replace(" amx_int8", ""),
                       "rocketlake")
    assert not any(m.startswith("+") for m in plain["mattr"])
    assert not (plain["amx_tile"] or plain["amx_int8"] or plain["amx_bf16"])
    # a real Sapphire Rapids model already has AMX: nothing to add, nothing hidden
    spr = _fake_host(_SPR_GUEST, "sapphirerapids")
    assert spr["amx_int8"] and not any(m.startswith("+amx") for m in spr["mattr"])
    # AMX flags on a non-x86 triple are ignored
    arm = T._describe(T._cpuinfo(_SPR_GUEST), "aarch64-unknown-linux-gnu", "generic", [], "")
    assert not arm["amx_tile"] and arm["mattr"] == []


def test_has_amx():
    assert T.has_amx({"kind": "llvm", "mcpu": "sapphirerapids"})
    assert not T.has_amx({"kind": "llvm", "mcpu": "cascadelake"})
    assert not T.has_amx({"kind": "llvm", "mcpu": "sapphirerapids", "mattr": ["-amx-int8"]})
    assert not T.has_amx("cuda-sm80")
    host = T.describe_host()
    assert T.has_amx("llvm") == (host["amx_tile"] and host["amx_int8"])
    flags = T._cpuinfo().get("flags", set())
    assert host["amx_int8"] <= ("amx_int8" in flags)


def test_print_targets_amx_lines():
    from tvm_ext.cli.targets import format_host

    out = format_host(_fake_host(_SPR_GUEST, "rocketlake"))
    assert "amx_tile=yes amx_int8=yes amx_bf16=yes" in out
    assert "+amx-tile" in out and "shown by the OS" in out
