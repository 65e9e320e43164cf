"""Program families several guard modules look for."""

from __future__ import annotations

import re

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "fish", "csh", "tcsh"})
SHELLS |= {"rbash", "yash", "posh"}
DOWNLOADERS = frozenset({"curl", "wget", "fetch", "http", "https", "xh", "aria2c", "lwp-request"})
DOWNLOADERS |= {"lwp-download"}
NETCATS = frozenset({"nc", "ncat", "netcat", "nc.traditional", "nc.openbsd", "socat", "telnet"})
DEV_NET = re.compile(r"/dev/+(?:\./+)*(?:tcp|udp)/|/inet[46]?/(?:tcp|udp)/", re.IGNORECASE)
