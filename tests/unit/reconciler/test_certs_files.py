"""cert-manager mode: the mounted Secret volume is followed through the kubelet's `..data` swaps."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import shutil
from pathlib import Path

from reconciler import pki
from reconciler.admission.mounted_files import FileCertSource
from reconciler.admission.serving_tls import ServingTLS

NOW = dt.datetime.now(dt.UTC)


def ca_and_leaf() -> tuple[pki.KeyPair, pki.KeyPair]:
    ca = pki.make_ca("cm-ca", now=NOW, validity=dt.timedelta(days=2), backdate=dt.timedelta(0))
    leaf = pki.issue_serving(
        ca,
        dns_names=("svc.ns.svc",),
        now=NOW,
        validity=dt.timedelta(days=1),
        backdate=dt.timedelta(0),
    )
    return ca, leaf


def kubelet_write(volume: Path, files: dict[str, bytes], generation: int) -> None:
    """What the kubelet's AtomicWriter does: a new timestamped directory, a `..data_tmp` symlink
    to it renamed over `..data`, per-file symlinks through `..data`, the old directory removed."""
    volume.mkdir(exist_ok=True)
    gen = volume / f"..2024_01_15_10_30_{generation:02d}.{generation:09d}"
    gen.mkdir()
    for name, data in files.items():
        (gen / name).write_bytes(data)
    old = os.readlink(volume / "..data") if (volume / "..data").is_symlink() else None
    os.symlink(gen.name, volume / "..data_tmp")
    os.rename(volume / "..data_tmp", volume / "..data")
    for name in files:
        if not (volume / name).is_symlink():
            os.symlink(f"..data/{name}", volume / name)
    if old is not None:
        shutil.rmtree(volume / old)


def files_of(ca: pki.KeyPair, leaf: pki.KeyPair) -> dict[str, bytes]:
    return {"tls.crt": leaf.cert_pem, "tls.key": leaf.key_pem, "ca.crt": ca.cert_pem}


def test_loads_the_mounted_files_and_follows_a_data_symlink_swap(tmp_path: Path) -> None:
    vol = tmp_path / "certs"
    ca, a = ca_and_leaf()
    kubelet_write(vol, files_of(ca, a), 1)
    src = FileCertSource(vol)
    assert not src.tls.ready
    assert src.load_once() is True
    assert src.tls.ready and src.tls.info is not None
    assert src.tls.info.serial == a.cert.serial_number and src.tls.ca_bundle == ca.cert_pem
    assert src.load_once() is False, "no change, no reload"

    ca2, b = ca_and_leaf()
    kubelet_write(vol, files_of(ca2, b), 2)
    assert src.load_once() is True
    assert src.tls.info.serial == b.cert.serial_number and src.tls.ca_bundle == ca2.cert_pem
    assert src.tls.generation == 2
    # A rewrite with the same bytes (a kubelet resync) is no reload.
    kubelet_write(vol, files_of(ca2, b), 3)
    assert src.load_once() is False and src.tls.generation == 2


def test_a_half_copied_pair_is_skipped_and_the_old_certificate_stays(tmp_path: Path) -> None:
    """Without `..data` (a plain directory) a read can catch a new certificate with the old key."""
    _, a = ca_and_leaf()
    _, b = ca_and_leaf()
    (tmp_path / "tls.crt").write_bytes(a.cert_pem)
    (tmp_path / "tls.key").write_bytes(a.key_pem)
    tls = ServingTLS()
    src = FileCertSource(tmp_path, tls)
    assert src.load_once() and src.last_error is None
    (tmp_path / "tls.crt").write_bytes(b.cert_pem)  # the key has not been written yet
    assert src.load_once() is False
    assert src.last_error is not None and "does not match" in src.last_error
    assert tls.info is not None and tls.info.serial == a.cert.serial_number
    (tmp_path / "tls.key").write_bytes(b.key_pem)
    assert src.load_once() is True and src.last_error is None
    assert tls.info.serial == b.cert.serial_number and tls.ca_bundle is None


def test_a_missing_directory_is_reported_not_raised(tmp_path: Path) -> None:
    src = FileCertSource(tmp_path / "absent")
    assert src.load_once() is False
    assert src.last_error is not None and "cannot read" in src.last_error
    assert not src.tls.has_certificate()


async def test_run_polls_and_reloads_after_a_swap(tmp_path: Path) -> None:
    vol = tmp_path / "certs"
    ca, a = ca_and_leaf()
    kubelet_write(vol, files_of(ca, a), 1)
    src = FileCertSource(vol, poll_interval=0.02)
    task = asyncio.create_task(src.run())
    try:
        first = await asyncio.wait_for(src.tls.wait_ready(), 2)
        assert first.serial == a.cert.serial_number
        changed = asyncio.create_task(src.tls.wait_changed())
        await asyncio.sleep(0.05)
        _, b = ca_and_leaf()
        kubelet_write(vol, files_of(ca, b), 2)
        assert (await asyncio.wait_for(changed, 2)).serial == b.cert.serial_number
    finally:
        task.cancel()


def test_a_swap_between_reading_the_certificate_and_the_key_never_mixes_generations(
    tmp_path: Path, monkeypatch
) -> None:
    vol = tmp_path / "certs"
    ca, a = ca_and_leaf()
    kubelet_write(vol, files_of(ca, a), 1)
    src = FileCertSource(vol)
    assert src.load_once()
    _, b = ca_and_leaf()
    real_read = Path.read_bytes
    swapped = []

    def read_bytes(self: Path) -> bytes:
        data = real_read(self)
        if self.name == "tls.crt" and not swapped:
            swapped.append(True)
            kubelet_write(vol, files_of(ca, b), 2)  # lands right after the certificate was read
        return data

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    src.load_once()  # the old generation's key is gone: skipped, or the old pair again
    assert src.tls.info is not None and src.tls.info.serial == a.cert.serial_number
    assert src.load_once() is True
    assert src.tls.info.serial == b.cert.serial_number
