"""Building the GPU probe an engine uses: real NVML, or simulated GPUs.

Kept apart from :mod:`.gpus` (the probe interface), which the backends import: this module
sits above both backends, so no import runs in a circle.
"""

from __future__ import annotations

from pathlib import Path

from .gpus import GpuProbe, ProbeStatus
from .nvml import NvmlProbe
from .simulate import SimulatedProbe, parse_simulate_spec


def make_probe(
    simulate: str | None, state_dir: Path, simulate_if_no_gpu: str | None = None
) -> GpuProbe:
    """Build the probe for this engine.

    Args:
        simulate: A simulation spec such as ``2xA100-80GB``; ``None`` for real NVML.
        state_dir: The engine's state dir (the simulated ledger lives there).
        simulate_if_no_gpu: Simulate this spec only if NVML finds no driver (demos).

    Raises:
        ValueError: If ``simulate`` is not a valid spec (the message names the problem).
    """
    if simulate is not None:
        return SimulatedProbe(parse_simulate_spec(simulate), state_dir)
    probe = NvmlProbe()
    if simulate_if_no_gpu is not None:
        gpus = parse_simulate_spec(simulate_if_no_gpu)  # reject a bad spec even with a GPU
        if probe.read().status is ProbeStatus.NO_DRIVER:
            probe.close()
            return SimulatedProbe(gpus, state_dir)
    return probe
