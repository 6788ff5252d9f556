"""Arm: ``ArmInductorQuantizer``, as the atlas makes it. Nothing runs its int8 graph on an x86
machine, so the course reads only what it annotates."""


def quantizer():
    """A new ``ArmInductorQuantizer`` with its default (static, per-channel) config."""
    from torchao.quantization.pt2e.quantizer.arm_inductor_quantizer import (
        ArmInductorQuantizer,
        get_default_arm_inductor_quantization_config,
    )

    return ArmInductorQuantizer().set_global(get_default_arm_inductor_quantization_config())
