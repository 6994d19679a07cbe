"""SeaweedFS as a local S3 server: `weed server -s3` (master, volume server, filer and S3 gateway in
one process) on free ports, its data in a work directory, one access key.

The S3 tests start one on loopback (tests/conftest.py `seaweedfs`); the local cluster starts one
for its pods (`LocalCluster.start_seaweedfs`): the S3 gateway listens on every address and pods
reach it at the real node's address, where the node's INPUT guard admits only loopback and the
node's bridge (as for Trainer's status server); master, volume server and filer stay on loopback.

What a test relies on is set explicitly rather than left to SeaweedFS's defaults: buckets are not
created on first upload (an unknown bucket is an error, as on AWS), no telemetry leaves the
machine, and the optional listeners (Iceberg, Lance) are off so that no fixed port is taken.
"""

from __future__ import annotations

import json
import secrets
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .processes import Process, free_port, wait_ready

# Small volumes, many allowed: each bucket is a collection that grows volumes of its own, and
# SeaweedFS sizes the volume count from free disk space otherwise (none when the disk is small).
VOLUME_SIZE_MB = 64
MAX_VOLUMES = 100
REGION = "us-east-1"


@dataclass
class SeaweedFS:
    binary: Path
    workdir: Path
    # Where the S3 gateway listens and the address clients are given (pods: the node's address).
    s3_bind: str = "127.0.0.1"
    host: str = "127.0.0.1"
    access_key: str = field(default_factory=lambda: "kubeckpt-" + secrets.token_hex(4))
    secret_key: str = field(default_factory=lambda: secrets.token_hex(20))
    ports: dict[str, int] = field(default_factory=dict)
    proc: Process | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.ports['s3']}"

    def aws_env(self) -> dict[str, str]:
        """The AWS variables s3fs (and any AWS SDK) reads to reach this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL": self.endpoint,
        }

    def argv(self) -> list[str]:
        p = self.ports
        return [
            str(self.binary),
            "server",
            f"-dir={self.workdir / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master_grpc']}",
            "-master.telemetry=false",
            f"-master.volumeSizeLimitMB={VOLUME_SIZE_MB}",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume_grpc']}",
            f"-volume.max={MAX_VOLUMES}",
            "-volume.preStopSeconds=0",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer_grpc']}",
            f"-filer.localSocket={self.workdir / 'filer.sock'}",
            "-s3",
            f"-s3.ip.bind={self.s3_bind}",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3_grpc']}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.localSocket={self.workdir / 's3.sock'}",
            f"-s3.config={self.workdir / 's3.json'}",
            "-s3.autoCreateBucket=false",
        ]

    def reserve_ports(self) -> None:
        """Pick free ports (before `start`, for a caller that guards them first)."""
        names = ("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3")
        self.ports = {name: free_port() for name in (*names, "s3_grpc")}

    def secret(self, name: str) -> dict[str, object]:
        """A Secret with the AWS_* keys a CheckpointPolicy's `storage.secretRef` passes on."""
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name},
            "type": "Opaque",
            "stringData": self.aws_env(),
        }

    def start(self, timeout: float = 60) -> None:
        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        identity = {
            "name": "kubeckpt",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        config = self.workdir / "s3.json"
        config.write_text(json.dumps({"identities": [identity]}))
        config.chmod(0o600)
        if not self.ports:
            self.reserve_ports()
        self.proc = Process("seaweedfs", self.argv(), self.workdir / "seaweedfs.log")
        self.proc.start()
        try:
            wait_ready("SeaweedFS's S3 gateway", self.proc, self._s3_answers, timeout)
            # Writable once the volume server has registered and a volume can be assigned.
            wait_ready("a writable SeaweedFS volume", self.proc, self._assignable, timeout)
        except BaseException:
            self.stop()
            raise

    def _s3_answers(self) -> bool:
        """Whether the gateway answers HTTP (connection refused raises: not yet)."""
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{self.ports['s3']}/", timeout=2).close()
        except urllib.error.HTTPError:
            pass  # an S3 error document (anonymous access is denied): it is up
        return True

    def _assignable(self) -> bool:
        url = f"http://127.0.0.1:{self.ports['master']}/dir/assign"
        with urllib.request.urlopen(url, timeout=5) as r:
            return "fid" in json.load(r)

    def create_bucket(self, name: str) -> None:
        """Create `name` through the S3 API (botocore: what s3fs, the `s3` extra, runs on)."""
        import botocore.session

        client = botocore.session.get_session().create_client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{self.ports['s3']}",
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=REGION,
        )
        client.create_bucket(Bucket=name)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
