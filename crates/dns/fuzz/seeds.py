#!/usr/bin/env python3
"""Writes the seed corpus of the `request` fuzz target: corpus/request/<name>.bin.

Real queries against the fixture of `roadkeeper_dns::wire::fixture` (cluster.local, Services web,
db, ext, alias, Pod 10.244.0.9), and a few malformed requests. Deterministic: rerun after editing.
"""

import pathlib
import struct

OUT = pathlib.Path(__file__).resolve().parent / "corpus" / "request"

A, NS, CNAME, SOA, PTR, TXT, AAAA, SRV, OPT = 1, 2, 5, 6, 12, 16, 28, 33, 41
IN, CH = 1, 3


def name(text):
    out = b""
    for label in text.rstrip(".").split("."):
        if label:
            out += bytes([len(label)]) + label.encode()
    return out + b"\0"


def header(qid=0x1234, flags=0x0100, qd=1, an=0, ns=0, ar=0):
    """Flags 0x0100: a standard query, recursion desired."""
    return struct.pack(">HHHHHH", qid, flags, qd, an, ns, ar)


def opt(payload=1232, do=False, options=b""):
    return b"\0" + struct.pack(">HHIH", OPT, payload, 0x8000 if do else 0, len(options)) + options


def query(qname, qtype, qclass=IN, edns=None, **kw):
    ar = 1 if edns is not None else 0
    return header(ar=ar, **kw) + name(qname) + struct.pack(">HH", qtype, qclass) + (edns or b"")


def ip6_arpa(nibbles_hex):
    return ".".join(reversed(nibbles_hex)) + ".ip6.arpa."


SEEDS = {
    "a-service": query("web.default.svc.cluster.local.", A),
    "aaaa-service-mixed-case": query("Web.Default.SVC.cluster.LOCAL.", AAAA),
    "srv-named-port": query("_http._tcp.web.default.svc.cluster.local.", SRV),
    "srv-headless-edns-4096": query("db.default.svc.cluster.local.", SRV, edns=opt(4096)),
    "srv-headless-no-edns": query("db.default.svc.cluster.local.", SRV),
    "a-headless-endpoint": query("db-7.db.default.svc.cluster.local.", A),
    "a-headless-all-edns-do": query("db.default.svc.cluster.local.", A, edns=opt(1232, do=True)),
    "ptr-v4": query("10.0.96.10.in-addr.arpa.", PTR),
    "ptr-v6": query(ip6_arpa("fd000096000000000000000000000010"), PTR),
    "txt-dns-version": query("dns-version.cluster.local.", TXT),
    "cname-external-name": query("ext.default.svc.cluster.local.", CNAME),
    "a-external-name-in-zone": query("alias.default.svc.cluster.local.", A),
    "a-cluster-ip-endpoint": query("10-244-0-20.web.default.svc.cluster.local.", A),
    "ptr-endpoint-without-hostname": query("20.0.244.10.in-addr.arpa.", PTR),
    "a-server-name": query("ns.dns.cluster.local.", A),
    "a-pod": query("10-244-0-9.default.pod.cluster.local.", A),
    "soa-zone-apex": query("cluster.local.", SOA),
    "ns-zone-apex": query("cluster.local.", NS),
    "a-nxdomain": query("nope.default.svc.cluster.local.", A),
    "a-outside-forwarded": query("example.com.", A, edns=opt(512)),
    "txt-chaos-class": query("version.bind.", TXT, qclass=CH),
    # A query only TCP (or a large EDNS buffer) carries: a 214-byte name and 700 bytes of padding.
    "tcp-size-query": query(
        ".".join(["a" * 61] * 3) + ".default.svc.cluster.local.",
        A,
        edns=opt(65535, options=struct.pack(">HH", 12, 700) + b"\0" * 700),
    ),
    # Malformed.
    "bad-truncated-header": header()[:7],
    "bad-header-only-qd1": header(),
    "bad-compression-loop": header() + b"\xc0\x0c" + struct.pack(">HH", A, IN),
    "bad-forward-pointer": header() + b"\xc0\x20" + struct.pack(">HH", A, IN) + b"\0" * 16,
    "bad-label-64": header() + bytes([64]) + b"a" * 64 + b"\0" + struct.pack(">HH", A, IN),
    "bad-qdcount-2": header(qd=2) + (name("web.default.svc.cluster.local.") + struct.pack(">HH", A, IN)) * 2,
    "bad-opcode-update": query("cluster.local.", SOA, flags=0x2800),
    "bad-tcp-length-prefix": (lambda q: struct.pack(">H", len(q)) + q)(query("web.default.svc.cluster.local.", A)),
    "bad-response-bit": query("web.default.svc.cluster.local.", A, flags=0x8100),
}


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for seed, data in SEEDS.items():
        (OUT / f"{seed}.bin").write_bytes(data)
    print(f"{len(SEEDS)} seeds in {OUT}")


if __name__ == "__main__":
    main()
