"""A real Prometheus (built by hack/build-binaries.sh from its Go module) for the monitoring tests:
its scrape configuration is what the Prometheus Operator makes of kubeckpt's ServiceMonitor.

There is no operator here, so `scrape_config` translates the ServiceMonitor itself, the way the
operator does for the fields kubeckpt's uses (endpointslice discovery in the selected namespaces,
a keep rule per selector label and for the port name, the target labels namespace, service, pod,
endpoint and job). A field it does not know fails the test instead of being dropped silently.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localcluster import free_port

_KNOWN_ENDPOINT_KEYS = {
    "port",
    "scheme",
    "path",
    "interval",
    "honorLabels",
    "bearerTokenFile",
    "tlsConfig",
}


def _label(name: str) -> str:
    """A Kubernetes label name as Prometheus's discovery meta label suffix."""
    return "".join(c if c.isalnum() else "_" for c in name)


def scrape_config(
    monitor: dict[str, Any], *, kubeconfig: Path, token_file: Path, interval: str | None = None
) -> dict[str, Any]:
    """The scrape config of the ServiceMonitor's (only) endpoint. `token_file` stands for the
    Prometheus pod's ServiceAccount token; `interval` overrides the endpoint's (tests wait
    seconds, not the 30 s a cluster scrapes at)."""
    md, spec = monitor["metadata"], monitor["spec"]
    (ep,) = spec["endpoints"]
    unknown = set(ep) - _KNOWN_ENDPOINT_KEYS
    assert not unknown, f"the test's ServiceMonitor translation does not know {sorted(unknown)}"
    assert set(ep.get("tlsConfig") or {}) <= {"insecureSkipVerify"}, ep["tlsConfig"]
    assert set(spec["selector"]) == {"matchLabels"}, spec["selector"]
    relabel: list[dict[str, Any]] = []
    for key, value in spec["selector"]["matchLabels"].items():
        relabel.append(
            {
                "action": "keep",
                "source_labels": [
                    f"__meta_kubernetes_service_label_{_label(key)}",
                    f"__meta_kubernetes_service_labelpresent_{_label(key)}",
                ],
                "regex": f"({value});true",
            }
        )
    relabel += [
        {
            "action": "keep",
            "source_labels": ["__meta_kubernetes_endpointslice_port_name"],
            "regex": ep["port"],
        },
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
        {"target_label": "endpoint", "replacement": ep["port"]},
    ]
    config: dict[str, Any] = {
        "job_name": f"serviceMonitor/{md['namespace']}/{md['name']}/0",
        "honor_labels": bool(ep.get("honorLabels")),
        "scheme": ep.get("scheme", "http"),
        "metrics_path": ep.get("path", "/metrics"),
        "scrape_interval": interval or ep.get("interval", "30s"),
        "kubernetes_sd_configs": [
            {
                "role": "endpointslice",
                "kubeconfig_file": str(kubeconfig),
                "namespaces": {"names": spec["namespaceSelector"]["matchNames"]},
            }
        ],
        "relabel_configs": relabel,
    }
    if ep.get("bearerTokenFile"):
        config["authorization"] = {"type": "Bearer", "credentials_file": str(token_file)}
    if (ep.get("tlsConfig") or {}).get("insecureSkipVerify"):
        config["tls_config"] = {"insecure_skip_verify": True}
    return config


@dataclass
class Prometheus:
    binary: Path
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0

    def start(self, scrape_configs: list[dict[str, Any]], interval: str = "2s") -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg = self.workdir / "prometheus.yml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": interval, "evaluation_interval": interval},
                    "scrape_configs": scrape_configs,
                }
            )
        )
        self.port = free_port()
        self.log = (self.workdir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                str(self.binary),
                f"--config.file={cfg}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited {self.proc.returncode}:\n{self.logs()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"prometheus not ready in 60 s:\n{self.logs()}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        return (self.workdir / "prometheus.log").read_text(errors="replace")[-6000:]

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; the `data` of a success, an AssertionError with Prometheus's own
        message otherwise (a PromQL error included)."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            body = json.load(e)
        assert body.get("status") == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's vector (or [] when nothing matched)."""
        data = self.api("query", query=promql)
        assert data["resultType"] == "vector", data
        return list(data["result"])

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets")["activeTargets"])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "log", None):
            self.log.close()
