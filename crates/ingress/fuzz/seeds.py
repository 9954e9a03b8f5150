#!/usr/bin/env python3
"""Writes the seeds of corpus/path, corpus/host, corpus/frames, corpus/duration and corpus/h1 (see README.md)."""

import pathlib
import struct

HERE = pathlib.Path(__file__).parent

PATHS = {
    "root": "/",
    "plain": "/public/index.html",
    "trailing-slash": "/a/b/",
    "utf8": "/caf\u00e9/\u00fc",
    "merge-slashes": "//a///b//",
    "dot-segments": "/a/./b/../c/.",
    "climb": "/public/../secret",
    "climb-encoded": "/public/%2e%2e/secret",
    "climb-mixed-case": "/public/%2E%2e/secret",
    "climb-encoded-slash": "/public%2F..%2Fsecret",
    "above-root": "/a/../..",
    "encoded-reserved": "/a%3Fb%23c%25d%2Be",
    "double-encoded": "/%252e%252e/x",
    "not-utf8": "/%FF%FE",
    "nul": "/a%00b",
    "bad-escape": "/a%zz",
    "truncated-escape": "/a%2",
    "asterisk": "*",
    "dots-not-segments": "/a./..b/.../c.",
}

HOSTS = {
    "name": "a.example",
    "name-port": "A.Example:8080",
    "trailing-dot": "a.example.",
    "empty": "",
    "empty-port": "a.example:",
    "ipv4": "127.0.0.1:80",
    "ipv6": "[::1]:8443",
    "ipv6-mapped": "[::ffff:127.0.0.1]",
    "bad-port": "a.example:abc",
    "big-port": "a.example:65536",
    "two-ports": "a.example:80:90",
    "double-dot": "a..example",
    "userinfo": "user@a.example",
    "slash": "a.example/x",
    "open-bracket": "[::1",
    "latin1": "caf\xe9",
}

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def frame(kind, flags, payload, stream=0):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


FRAMES = {
    "http1": b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n",
    "preface-only": PREFACE,
    "preface-partial": PREFACE[:10],
    "settings-and-request": PREFACE + frame(4, 0, b"") + frame(1, 5, b"\x82\x86\x84", 1),
    "data-split": PREFACE + frame(0, 0, frame(6, 0, b"\0" * 8) * 4, 1) + frame(0, 1, b"", 1),
    "ping-flood": PREFACE + frame(6, 0, b"\0" * 8) * 1001,
    "window-update-flood": PREFACE + frame(8, 0, b"\0\0\0\1") * 1001,
    "empty-data-flood": PREFACE + frame(0, 0, b"", 1) * 1001,
    "headers-earn-credit": PREFACE + (frame(1, 5, b"\x82", 1) + frame(6, 0, b"\0" * 8)) * 600,
    "truncated-header": PREFACE + frame(6, 0, b"\0" * 8)[:5],
    "huge-length": PREFACE + b"\xff\xff\xff\x00\x00\x00\x00\x00\x01" + b"x" * 100,
}

DURATIONS = {
    "seconds": "10s",
    "hours-minutes": "1h30m",
    "milliseconds": "500ms",
    "four-parts": "1h2m3s4ms",
    "largest": "99999h99999m99999s99999ms",
    "zero": "0s",
    "five-parts": "1h1m1s1ms1h",
    "six-digits": "100000s",
    "huge-number": "99999999999999999999999h",
    "no-unit": "10",
    "fraction": "1.5s",
    "negative": "-1s",
    "space": "1 s",
    "day": "1d",
    "empty": "",
    "unit-only": "ms",
    "arabic-digit": "\u0661s",
}


H1 = {
    "get": b"GET /a?b=c HTTP/1.1\r\nHost: a.example\r\nAccept: */*\r\n\r\n",
    "pipelined": b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n",
    "post-empty": b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    "post-body": b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
    "smuggle-te-cl": b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "bare-lf": b"GET / HTTP/1.1\nHost: a\n\n",
    "response-length": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nDate: x\r\n\r\nhello",
    "response-chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive, X-A\r\n\r\n",
    "response-interim": b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
    "reason-not-utf8": b"HTTP/1.1 200 keepP-aliv\xff\xffe, X-A\r\n\r\n",
    "response-conflict": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
    "chunks": b"\x055;a=b\r\nhello\r\n6 ; x\r\n world\r\n0\r\nX-T: t\r\n\r\nNEXT",
    "chunk-huge-size": b"\x02ffffffffffffffff\r\n",
    "chunk-bare-lf": b"\x035\nhello\n0\n\n",
    "chunk-trailers": b"\x040\r\nA: 1\r\nB: 2\r\n\r\n",
}


def write(folder, seeds, encode):
    target = HERE / "corpus" / folder
    target.mkdir(parents=True, exist_ok=True)
    for name, seed in seeds.items():
        (target / name).write_bytes(encode(seed))


write("path", PATHS, lambda s: s.encode())
write("host", HOSTS, lambda s: s.encode("latin-1") if s == "caf\xe9" else s.encode())
write("frames", FRAMES, lambda b: b)
write("duration", DURATIONS, lambda s: s.encode())
write("h1", H1, lambda b: b)
