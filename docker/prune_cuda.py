"""Drop the CUDA libraries a CPU run of torch never loads (run in the training image's build).

torch's own shared libraries name some CUDA libraries as DT_NEEDED (libcudart, cuBLAS, cuFFT,
NCCL, ...): the dynamic loader needs those files to import torch at all, GPU or not, so they stay.
Everything else under site-packages/nvidia (cuDNN's engine libraries, cuSOLVER, static archives,
headers) is only ever opened on demand by GPU code, and triton only by torch.compile's GPU
backend: about 2.5 GB that a CPU image does not need.

Standard library only (the image has no readelf): the ELF dynamic section is read directly.
Usage: prune_cuda.py SITE_PACKAGES
"""

from __future__ import annotations

import shutil
import struct
import sys
from pathlib import Path

PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_NEEDED, DT_STRTAB = 0, 1, 5


def needed(path: Path) -> list[str]:
    """The DT_NEEDED names of a 64-bit little-endian ELF shared library ([] if not one)."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from(
            "<IIQQQQQQ", data, phoff + i * phentsize
        )
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return []

    def file_offset(vaddr: int) -> int:
        for start, offset, size in loads:
            if start <= vaddr < start + size:
                return offset + vaddr - start
        raise ValueError(f"{path}: address {vaddr:#x} in no PT_LOAD segment")

    entries, strtab = [], 0
    for off in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, val = struct.unpack_from("<qQ", data, off)
        if tag == DT_NULL:
            break
        if tag == DT_NEEDED:
            entries.append(val)
        elif tag == DT_STRTAB:
            strtab = file_offset(val)
    return [data[strtab + e : data.index(b"\0", strtab + e)].decode() for e in entries]


def prune(site: Path) -> tuple[int, int]:
    """Delete what torch cannot need on CPU; returns (bytes kept, bytes removed) under nvidia/."""
    cuda = {p.name: p for p in (site / "nvidia").rglob("*.so*") if p.is_file()}
    keep: set[Path] = set()
    todo = [lib for lib in (site / "torch" / "lib").glob("*.so*") if lib.is_file()]
    seen: set[Path] = set()
    while todo:
        lib = todo.pop()
        if lib in seen:
            continue
        seen.add(lib)
        for name in needed(lib):
            if name in cuda:
                keep.add(cuda[name])
                todo.append(cuda[name])
    kept = removed = 0
    for p in sorted((site / "nvidia").rglob("*")):
        if p.is_file() and not p.is_symlink():
            size = p.stat().st_size
            if p in keep:
                kept += size
            else:
                removed += size
                p.unlink()
    shutil.rmtree(site / "triton", ignore_errors=True)
    return kept, removed


def main() -> int:
    site = Path(sys.argv[1])
    if not (site / "torch" / "lib").is_dir():
        print(f"prune_cuda: no torch under {site}", file=sys.stderr)
        return 2
    kept, removed = prune(site)
    mib = 2**20
    print(f"prune_cuda: kept {kept / mib:.0f} MiB of CUDA libraries, removed {removed / mib:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
