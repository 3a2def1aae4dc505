"""gRPC credentials and channels from a `TlsConfig`: the one place that reads certificate files.

Plaintext when the config names no file (the default: internal services bind to loopback). Servers
with a CA require and verify client certificates (mutual TLS). Clients verify the server against the
CA (system roots without one) and present their own certificate when they have one. Certificates
must name the address the client dials (`127.0.0.1`, `localhost`, a compose service name) in their
subject alternative names: hostname checks stay on.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import grpc

from services.common.config import TlsConfig

ChannelOptions = Sequence[tuple[str, object]]
# A channel dials its target directly, never through an http_proxy from the environment.
NO_PROXY = (("grpc.enable_http_proxy", 0),)


def _read(path: Optional[Path]) -> Optional[bytes]:
    return path.read_bytes() if path is not None else None


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    """TLS server credentials; mutual (client certificate required) when a CA is configured."""
    assert tls.cert_file is not None and tls.key_file is not None, "a TLS server needs cert and key"
    return grpc.ssl_server_credentials([(tls.key_file.read_bytes(), tls.cert_file.read_bytes())],
                                       root_certificates=_read(tls.ca_file),
                                       require_client_auth=tls.ca_file is not None)


def channel_credentials(tls: TlsConfig) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=_read(tls.ca_file),
                                        private_key=_read(tls.key_file),
                                        certificate_chain=_read(tls.cert_file))


def aio_channel(address: str, tls: TlsConfig, options: ChannelOptions = ()) -> grpc.aio.Channel:
    """An asyncio channel to `address`: TLS when `tls` names any file, plaintext otherwise."""
    options = [*NO_PROXY, *options]
    if tls.dials_tls:
        return grpc.aio.secure_channel(address, channel_credentials(tls), options=options)
    return grpc.aio.insecure_channel(address, options=options)


def blocking_channel(address: str, tls: TlsConfig, options: ChannelOptions = ()) -> grpc.Channel:
    """The blocking form of `aio_channel` (probes, tests, tools)."""
    options = [*NO_PROXY, *options]
    if tls.dials_tls:
        return grpc.secure_channel(address, channel_credentials(tls), options=options)
    return grpc.insecure_channel(address, options=options)
