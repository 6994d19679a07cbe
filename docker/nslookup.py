#!/usr/bin/env python3
"""`nslookup NAME`: exit 0 once NAME resolves through the system resolver (search domains and
all), print its addresses; exit 1 otherwise. The training-operator's worker init container loops
on this until the master's Service resolves. busybox's nslookup (1.35) exits 1 when any search
domain answers NXDOMAIN, even when another one resolves the name, and its shell runs the applet
before anything on PATH: so this image has dash and this script instead."""

import socket
import sys

if len(sys.argv) != 2:
    print("usage: nslookup NAME", file=sys.stderr)
    sys.exit(2)
name = sys.argv[1]
try:
    infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
except OSError as e:
    print(f"{name}: {e}", file=sys.stderr)
    sys.exit(1)
for address in sorted({info[4][0] for info in infos}):
    print(f"Name: {name}\nAddress: {address}")
