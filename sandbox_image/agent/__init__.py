"""The Stockade agent: runs inside the sandbox container and executes tools there.

It imports only the standard library, grpcio and protobuf.
"""

__version__ = "0.1.0"
PROTOCOL_VERSION = 3
"""2: exec and process start take shell, login and session; the session tool. 3: InvokeStream
over the framed socket too (frames.py)."""
