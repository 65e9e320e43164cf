"""grpcurl's `list` and unary and server-streaming calls, in Python through server reflection:
no .proto files and no generated code, only what the supervisor describes about itself.
(grpcurl is not packaged in Debian 12; where it is installed, it works the same way.)

    python examples/reflection/reflect.py ADDR list [SERVICE]
    python examples/reflection/reflect.py ADDR call SERVICE/METHOD [-d JSON]

Requests are JSON (protobuf's JSON mapping: field names as in the .proto or lowerCamelCase);
replies are printed as JSON with the .proto's field names, one object per message. Exit 1,
with the reason on stderr, on a gRPC status or a request that does not fit the method.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import MethodDescriptor
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

TIMEOUT_S = 120.0


class UsageError(Exception):
    pass


def find_method(pool: descriptor_pool.DescriptorPool, name: str) -> MethodDescriptor:
    """SERVICE/METHOD or SERVICE.METHOD, as grpcurl takes them."""
    service_name, sep, method_name = name.replace("/", ".").rpartition(".")
    if not sep:
        raise UsageError(f"{name!r} is not SERVICE/METHOD")
    try:
        service = pool.FindServiceByName(service_name)
    except KeyError:
        raise UsageError(f"the server has no service {service_name!r}") from None
    method = service.methods_by_name.get(method_name)
    if method is None:
        raise UsageError(f"service {service_name!r} has no method {method_name!r}")
    return method


def call(channel: grpc.Channel, pool: descriptor_pool.DescriptorPool, name: str, data: str) -> None:
    method = find_method(pool, name)
    if method.client_streaming:
        raise UsageError(f"{method.full_name} takes a stream of requests: not supported here")
    request_class = message_factory.GetMessageClass(method.input_type)
    reply_class = message_factory.GetMessageClass(method.output_type)
    try:
        request = json_format.Parse(data or "{}", request_class())
    except json_format.ParseError as exc:
        raise UsageError(f"the request does not fit {method.input_type.full_name}: {exc}") from None
    path = f"/{method.containing_service.full_name}/{method.name}"
    encode, decode = request_class.SerializeToString, reply_class.FromString
    if method.server_streaming:
        stream = channel.unary_stream(path, request_serializer=encode, response_deserializer=decode)
        for reply in stream(request, timeout=TIMEOUT_S):
            show(reply)
    else:
        unary = channel.unary_unary(path, request_serializer=encode, response_deserializer=decode)
        show(unary(request, timeout=TIMEOUT_S))


def show(reply: Any) -> None:
    as_dict = json_format.MessageToDict(reply, preserving_proto_field_name=True)
    print(json.dumps(as_dict, indent=2, ensure_ascii=False), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("address", help="host:port of the supervisor")
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="the services, or a service's methods")
    listing.add_argument("service", nargs="?")
    calling = sub.add_parser("call", help="call a unary or server-streaming method")
    calling.add_argument("method", help="SERVICE/METHOD, e.g. stockade.v1.ToolService/CallTool")
    calling.add_argument("-d", "--data", default="{}", help="the request as JSON")
    ns = parser.parse_args()
    with grpc.insecure_channel(ns.address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        pool = descriptor_pool.DescriptorPool(database)
        try:
            if ns.command == "list" and ns.service is None:
                print("\n".join(sorted(database.get_services())))
            elif ns.command == "list":
                try:
                    service = pool.FindServiceByName(ns.service)
                except KeyError:
                    raise UsageError(f"the server has no service {ns.service!r}") from None
                print("\n".join(m.full_name for m in service.methods))
            else:
                call(channel, pool, ns.method, ns.data)
        except UsageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except grpc.RpcError as exc:
            print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
