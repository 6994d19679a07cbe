"""kubeckpt's webhook certificates: the names reconciler.admission's certificate management is
given (config/webhook's Secret and MutatingWebhookConfiguration, the CA's name, the labels and
field manager the Secret is written with)."""

from __future__ import annotations

from reconciler.admission import CertConfig

SECRET_NAME = "kubeckpt-webhook-certs"
WEBHOOK_CONFIGURATION = "kubeckpt-webhook"
CA_NAME = "kubeckpt-webhook-ca"
SECRET_LABELS = (("app.kubernetes.io/name", "kubeckpt"), ("app.kubernetes.io/component", "webhook"))
FIELD_MANAGER = "kubeckpt-webhook"


def cert_config(
    *,
    service: str,
    namespace: str,
    secret_name: str = SECRET_NAME,
    webhook_config_name: str | None = WEBHOOK_CONFIGURATION,
    extra_dns_names: tuple[str, ...] = (),
    extra_ip_addresses: tuple[str, ...] = (),
) -> CertConfig:
    """The self-managed certificate settings of kubeckpt-webhook (the library's defaults for
    validity, renewal and resync)."""
    return CertConfig(
        service=service,
        namespace=namespace,
        secret_name=secret_name,
        webhook_config_name=webhook_config_name,
        extra_dns_names=extra_dns_names,
        extra_ip_addresses=extra_ip_addresses,
        ca_name=CA_NAME,
        secret_labels=SECRET_LABELS,
    )
