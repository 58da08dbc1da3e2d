"""A generic gRPC client (grpcio + grpcio-reflection, no Sandhold protos)
lists the server's services by reflection and calls them."""

import collections
import time

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from conftest import TENANT, TOKEN


class _CallDetails(
    collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    pass


class _Bearer(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call."""

    def __init__(self, token):
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, d):
        return _CallDetails(
            d.method, d.timeout, list(d.metadata or []) + [self._header], d.credentials,
            getattr(d, "wait_for_ready", None), getattr(d, "compression", None),
        )

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._details(details), requests)


def _channel(addr, token=None):
    channel = grpc.insecure_channel(addr)
    if token is None:
        return channel
    return grpc.intercept_channel(channel, _Bearer(token))


def _unary(channel, pool, service, method_name, request_fields=None):
    """Call a unary method knowing only its name: types come from reflection."""
    method = pool.FindServiceByName(service).FindMethodByName(method_name)
    request_cls = message_factory.GetMessageClass(method.input_type)
    response_cls = message_factory.GetMessageClass(method.output_type)
    call = channel.unary_unary(
        f"/{service}/{method_name}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=response_cls.FromString,
    )
    return call(request_cls(**(request_fields or {})), timeout=10), method


def test_lists_services_by_reflection(server):
    with _channel(server, TOKEN) as channel:
        services = set(ProtoReflectionDescriptorDatabase(channel).get_services())
    assert "sandhold.v1.AdminService" in services, services
    assert "grpc.health.v1.Health" in services, services
    assert not any(s.startswith("sandhold.agent") for s in services), "agent API must not be exposed"


def test_health_check_reaches_serving(server):
    with _channel(server, TOKEN) as channel:
        pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
        deadline = time.monotonic() + 60
        while True:
            response, method = _unary(channel, pool, "grpc.health.v1.Health", "Check", {"service": ""})
            status = method.output_type.fields_by_name["status"].enum_type.values_by_number[response.status].name
            if status == "SERVING" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert status == "SERVING"


def test_health_needs_no_token(server):
    with _channel(server) as channel:
        pool_channel = _channel(server, TOKEN)
        pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(pool_channel))
        response, _ = _unary(channel, pool, "grpc.health.v1.Health", "Check", {"service": ""})
        pool_channel.close()
    assert response.status in (1, 2)  # SERVING or NOT_SERVING, answered without credentials


def test_server_info_reports_the_callers_tenant(server):
    with _channel(server, TOKEN) as channel:
        pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
        deadline = time.monotonic() + 60
        while True:
            try:
                response, _ = _unary(channel, pool, "sandhold.v1.AdminService", "GetServerInfo")
                break
            except grpc.RpcError as e:
                # UNAVAILABLE until the stores are open.
                if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    assert response.tenant == TENANT
    assert response.store_backend == "sqlite"
    assert response.lease_backend == "in-process"
    assert response.server_version


def test_calls_without_a_valid_token_are_refused(server):
    for token in (None, "not-the-token-at-all"):
        with _channel(server, token) as channel:
            with pytest.raises(grpc.RpcError) as err:
                ProtoReflectionDescriptorDatabase(channel).get_services()
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, (token, err.value)
