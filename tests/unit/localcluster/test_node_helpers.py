"""Pure helpers of the real node and its images (no cluster, no root)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from localcluster.addon import real_node_placement
from localcluster.local_webhook import ADDON_ONLY_LABEL, local_webhook_configuration
from localcluster.node import REAL_NODE_TAINT, _split_rule
from localcluster.pods import pod_problem

REPO = Path(__file__).resolve().parents[3]


def _prune_cuda():
    spec = importlib.util.spec_from_file_location("prune_cuda", REPO / "docker" / "prune_cuda.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def waiting(reason: str, message: str = "") -> dict:
    return {
        "metadata": {"name": "p"},
        "status": {
            "containerStatuses": [
                {
                    "name": "main",
                    "image": "kubeckpt.local/x:1",
                    "state": {"waiting": {"reason": reason, "message": message}},
                }
            ]
        },
    }


@pytest.mark.parametrize("reason", ["ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff"])
def test_a_missing_image_is_named_with_how_to_build_it(reason: str) -> None:
    problem = pod_problem(waiting(reason))
    assert problem is not None
    assert "kubeckpt.local/x:1" in problem and "make images" in problem and reason in problem


def test_a_config_error_is_reported_with_its_message() -> None:
    problem = pod_problem(waiting("CreateContainerConfigError", 'secret "s" not found'))
    assert problem is not None and 'secret "s" not found' in problem


def test_a_starting_or_running_pod_has_no_problem() -> None:
    assert pod_problem(waiting("ContainerCreating")) is None
    assert (
        pod_problem({"status": {"containerStatuses": [{"name": "m", "state": {"running": {}}}]}})
        is None
    )
    assert pod_problem({}) is None


def test_iptables_rules_split_keeps_quoted_comments_whole() -> None:
    rule = '-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS'
    parts = _split_rule(rule)
    assert '"kubernetes health check service ports"' in parts
    assert parts[-2:] == ["-j", "KUBE-NODEPORTS"]


def test_real_node_placement_selects_and_tolerates_once() -> None:
    spec = real_node_placement(real_node_placement({"tolerations": [{"key": "other"}]}))
    assert spec["nodeSelector"] == {"kubeckpt.io/real-node": "true"}
    ours = [t for t in spec["tolerations"] if t.get("key") == REAL_NODE_TAINT["key"]]
    assert len(ours) == 1 and {"key": "other"} in spec["tolerations"]


def test_local_test_webhook_stays_out_of_addon_only_namespaces() -> None:
    mwc = local_webhook_configuration(8443)
    for w in mwc["webhooks"]:
        assert w["clientConfig"]["url"].startswith("https://127.0.0.1:8443/")
        exprs = w["namespaceSelector"]["matchExpressions"]
        assert {"key": ADDON_ONLY_LABEL, "operator": "DoesNotExist"} in exprs


def test_prune_cuda_reads_dt_needed_like_readelf() -> None:
    prune = _prune_cuda()
    binary = Path(sys.executable).resolve()
    libs = [p for p in Path("/usr/lib/x86_64-linux-gnu").glob("libssl.so*") if p.is_file()]
    target = libs[0] if libs else binary
    ours = prune.needed(target)
    readelf = shutil.which("readelf")
    if readelf is None:  # binutils absent: the C library is needed by anything dynamic
        assert any(n.startswith("libc.so") for n in ours), ours
        return
    out = subprocess.run([readelf, "-d", str(target)], capture_output=True, text=True).stdout
    theirs = [ln.split("[")[1].split("]")[0] for ln in out.splitlines() if "(NEEDED)" in ln]
    assert ours == theirs and ours


def test_prune_cuda_ignores_files_that_are_not_elf(tmp_path: Path) -> None:
    f = tmp_path / "x.so"
    f.write_bytes(b"not an ELF file at all")
    assert _prune_cuda().needed(f) == []


def test_prune_cuda_keeps_only_the_linked_closure(tmp_path: Path) -> None:
    """A fake site-packages: torch's library links one CUDA library (a copy of a real ELF whose
    DT_NEEDED we know); an unlinked one and triton go."""
    prune = _prune_cuda()
    libs = [p for p in Path("/usr/lib/x86_64-linux-gnu").glob("libssl.so.3") if p.is_file()]
    if not libs:
        pytest.fail(
            "this test needs /usr/lib/x86_64-linux-gnu/libssl.so.3 (apt-get install libssl3)"
        )
    site = tmp_path / "site-packages"
    (site / "torch" / "lib").mkdir(parents=True)
    (site / "nvidia" / "a" / "lib").mkdir(parents=True)
    (site / "triton").mkdir()
    (site / "triton" / "x.py").write_text("")
    # libssl.so.3 needs libcrypto.so.3: named here as if it were torch's and a CUDA library.
    shutil.copy(libs[0], site / "torch" / "lib" / "libtorch.so")
    crypto = Path("/usr/lib/x86_64-linux-gnu/libcrypto.so.3")
    shutil.copy(crypto, site / "nvidia" / "a" / "lib" / "libcrypto.so.3")
    (site / "nvidia" / "a" / "lib" / "libunused.so.1").write_bytes(b"\0" * 1000)
    kept, removed = prune.prune(site)
    assert (site / "nvidia" / "a" / "lib" / "libcrypto.so.3").exists()
    assert not (site / "nvidia" / "a" / "lib" / "libunused.so.1").exists()
    assert not (site / "triton").exists()
    assert kept == crypto.stat().st_size and removed == 1000
