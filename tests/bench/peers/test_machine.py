"""The machine record names the CPU by family and model too: a virtual machine may call very different
hosts by one name ("AMD EPYC")."""

from __future__ import annotations

from recguide_trt.bench.peers.machine import FLAGS, cpu_flags, cpu_model, describe_cpu, first_processor

ZEN1 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 23
model\t\t: 1
model name\t: AMD EPYC
flags\t\t: fpu avx2 fma

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: not the first processor
"""


def test_family_model_and_core_of_the_first_processor():
    assert describe_cpu(ZEN1) == "AMD EPYC [family 23 model 1: Zen 1]"
    intel = ZEN1.replace("AuthenticAMD", "GenuineIntel").replace("23", "6").replace("model\t\t: 1", "model\t\t: 143")
    assert describe_cpu(intel) == "AMD EPYC [family 6 model 143: Sapphire Rapids]"


def test_unknown_cores_and_missing_fields():
    assert describe_cpu(ZEN1.replace("model\t\t: 1\n", "model\t\t: 250\n", 1)) == "AMD EPYC [family 23 model 250]"
    assert describe_cpu(ZEN1.replace("cpu family\t: 23\n", "", 1)) == "AMD EPYC"
    assert describe_cpu("processor\t: 0\nflags\t: fpu\n") is None
    assert describe_cpu("") is None


def test_the_first_processors_fields():
    fields = first_processor(ZEN1)
    assert fields["flags"] == "fpu avx2 fma" and fields["cpu family"] == "23" and fields["model name"] == "AMD EPYC"


def test_this_machine_has_a_name_and_flags():
    assert cpu_model().strip()
    assert set(cpu_flags()) <= set(FLAGS)
