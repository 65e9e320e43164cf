"""`python -m bench.grpc_floor [--n N]`: what grpc.aio itself costs per call, the floor under
the supervisor's CPU per warm `exec true` (bench/cpu.py).

A server process like the supervisor (grpc.aio on asyncio, TCP on 127.0.0.1) answers a
sync client's unary calls with handlers that do nothing of Stockade's:
- `empty`: the handler returns its request at once;
- `relay`: the handler makes one unary grpc.aio call to a second such server on a unix
  socket (the agent link's shape: the supervisor is a gRPC server and a gRPC client per call);
- `framed`: the same relay over a plain unix socket instead, each message a 4-byte length and
  its bytes, read with asyncio streams (what an agent link without gRPC would cost).

Reported per handler: the server process's CPU time per call (all its threads, from /proc),
of the relay's second server apart. No engine, no container."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from bench.cpu import TICK, cpu_ticks
from bench.served import free_port

METHOD = "/floor.Floor/Call"
_IDENTITY = (lambda b: b, lambda b: b)
PAYLOAD = b"x" * 64
KINDS = ("empty", "relay", "framed")


def _handler(relay_to: str | None) -> grpc.GenericRpcHandler:
    stub: list[Any] = []

    async def call(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        if relay_to is None:
            return request
        if relay_to.startswith("framed:"):
            if not stub:
                stub.append(await asyncio.open_unix_connection(relay_to.removeprefix("framed:")))
            reader, writer = stub[0]
            writer.write(len(request).to_bytes(4, "big") + request)
            size = int.from_bytes(await reader.readexactly(4), "big")
            return bytes(await reader.readexactly(size))
        if not stub:
            channel = grpc.aio.insecure_channel(relay_to)
            stub.append(channel.unary_unary(METHOD, *_IDENTITY))
        reply: bytes = await stub[0](request)
        return reply

    handler = grpc.unary_unary_rpc_method_handler(
        call, request_deserializer=None, response_serializer=None
    )
    return grpc.method_handlers_generic_handler("floor.Floor", {"Call": handler})


async def _echo_frames(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
        while True:
            size = int.from_bytes(await reader.readexactly(4), "big")
            message = await reader.readexactly(size)
            writer.write(size.to_bytes(4, "big") + message)


async def _serve(listen: str, relay_to: str | None) -> None:
    if listen.startswith("framed:"):
        framed = await asyncio.start_unix_server(_echo_frames, listen.removeprefix("framed:"))
        print("ready", flush=True)
        async with framed:
            await framed.serve_forever()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((_handler(relay_to),))
    server.add_insecure_port(listen)
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


def _start(listen: str, relay_to: str | None) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "bench.grpc_floor", "--serve", listen]
    if relay_to:
        argv += ["--relay-to", relay_to]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        process.kill()
        process.wait()
        process.stdout.close()
        raise RuntimeError(f"the floor server {listen} did not start")
    return process


def measure(kind: str, n: int) -> dict[str, Any]:
    """Server CPU per call (µs) with the `empty`, `relay` or `framed` handler, n calls after
    a warm-up."""
    with tempfile.TemporaryDirectory(prefix="stkf") as folder:
        inner = None
        relay_to = None
        if kind != "empty":
            scheme = "unix" if kind == "relay" else "framed"
            relay_to = f"{scheme}:{Path(folder) / 'agent.sock'}"
            inner = _start(relay_to, None)
        target = f"127.0.0.1:{free_port()}"
        outer = _start(target, relay_to)
        try:
            with grpc.insecure_channel(target) as channel:
                call = channel.unary_unary(METHOD, *_IDENTITY)
                for _ in range(200):
                    call(PAYLOAD)
                before = cpu_ticks(outer.pid)[0], cpu_ticks(inner.pid)[0] if inner else 0
                started = time.perf_counter()
                for _ in range(n):
                    call(PAYLOAD)
                wall = time.perf_counter() - started
                after = cpu_ticks(outer.pid)[0], cpu_ticks(inner.pid)[0] if inner else 0
        finally:
            for process in (outer, inner):
                if process is not None:
                    process.kill()
                    process.wait()
                    if process.stdout is not None:
                        process.stdout.close()

    def per_call_us(ticks: int) -> float:
        return round(ticks / TICK / n * 1e6, 1)

    return {
        "handler": kind,
        "n": n,
        "server_cpu_us_per_call": per_call_us(after[0] - before[0]),
        "relayed_server_cpu_us_per_call": per_call_us(after[1] - before[1]),
        "wall_ms_per_call": round(wall / n * 1e3, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.grpc_floor", description=__doc__)
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--relay-to", help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.serve:
        asyncio.run(_serve(ns.serve, ns.relay_to))
        return 0
    print(json.dumps([measure(kind, ns.n) for kind in KINDS], indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    sys.exit(main())
