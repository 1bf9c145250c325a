"""cupy.cuda.runtime in the stand-in: one device with 16 GiB (CUPY_STANDIN_DEVICES: more)."""

import os

DEVICE_MEMORY = 16 << 30


def getDeviceCount() -> int:
    return int(os.environ.get("CUPY_STANDIN_DEVICES", "1"))


def memGetInfo() -> tuple[int, int]:
    return DEVICE_MEMORY, DEVICE_MEMORY


def getDeviceProperties(device: int) -> dict:
    return {"name": b"magmadnn stand-in (numpy)", "totalGlobalMem": DEVICE_MEMORY, "major": 9, "minor": 0}


def deviceSynchronize() -> None:
    pass


def runtimeGetVersion() -> int:
    return 13000
