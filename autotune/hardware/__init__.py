"""Hardware detection: the one thin layer that touches NVML, psutil and sysfs.

``detect()`` (``detection``) returns a frozen :class:`~autotune.profiles.HardwareProfile`. Every probe fails alone
(``fail_alone.Probes``): a missing NVML library, a GPU that errors on one query or an unreadable cgroup file makes
that field unknown, with the reason in ``profile.unknown``, and the rest still works.

- ``visible``     CUDA_VISIBLE_DEVICES as CUDA applies it (pure);
- ``cgroups``     cgroup v1/v2 parsers (pure) and the tightest-ancestor reader;
- ``nvml``        GPUs, MIG, peer links; ``classify_interconnect`` (pure);
- ``host``        CPU, RAM, InfiniBand, SLURM variables, package versions;
- ``slurm``       the allocation a launch runs in;
- ``pod``         the pod and a training operator's node variables (PET_*, pure).

Never imports torch or deepspeed (2-3 s each). ``python -m autotune.hardware report`` prints the report;
``--json`` the profile.
"""

from autotune.hardware.detection import detect

__all__ = ["detect"]
