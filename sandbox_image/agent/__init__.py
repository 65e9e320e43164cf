"""The Stockade agent: runs inside the sandbox container and executes tools there.

It imports only the standard library and protobuf; grpcio too when it serves TCP (a pod's).
"""

__version__ = "0.1.0"
PROTOCOL_VERSION = 4
"""2: exec and process start take shell, login and session; the session tool. 3: InvokeStream
over the framed socket too (frames.py). 4: every call framed on a unix socket (Hello, Inspect,
Upload, Download, WatchFiles as typed frames), and no gRPC socket beside it."""
