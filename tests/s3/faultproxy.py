#!/usr/bin/python3
"""A fault-injecting HTTP/1.1 proxy for the object-store tests (loopback only).

    faultproxy.py UPSTREAM_PORT [LISTEN_PORT]

Listens on 127.0.0.1 (LISTEN_PORT, default any free port; the port is printed
as "faultproxy listening on 127.0.0.1:PORT"), forwards every request unchanged
(signatures and the Host header stay valid) to 127.0.0.1:UPSTREAM_PORT over a
fresh connection, and keeps the client's connection alive.

Control: GET /__fault?mode=M&arg=A&count=N&match=S adds a rule that fires on
the next N requests whose "METHOD TARGET" contains S (default: every request;
S ending in "$": ends with the rest of S).  The first rule that matches fires.
Modes:
  delay       sleep A ms, then forward
  status      answer A (e.g. 503:SlowDown) with an S3 error body, no upstream
  truncate    forward, relay the head and A body bytes, then close (FIN)
  reset_mid   forward, relay the head and A body bytes, then reset (RST)
  reset       reset the connection before any response
  etag        forward, rewrite the ETag header to A
  bearer      the request must carry "Authorization: Bearer A" (else 401, no
              upstream); the header is removed before forwarding, so an
              anonymous-friendly server stands in for a bearer-token one
  apply_reset forward (the server applies the request), then reset the
              connection without an answer: an outcome the client cannot know
  cut         forward; answer the body cut off right before the first
              occurrence of A (else at half), as a complete HTTP answer
  html        forward; answer 200 with an HTML page as the body
  random      forward; answer 200 with random bytes as the body
  error200    forward; answer 200 with an S3 <Error> document as the body
  badsize     forward; every <Size>N</Size> of the body becomes <Size>size:N</Size>
  loop        a listing answers IsTruncated true and the next token of the
              cycle A ("t1,t2": no token -> t1 -> t2 -> t1 ...); a request
              with a token is answered with the first page again (not
              forwarded: the server does not know the token)
  notoken     forward; a listing answers IsTruncated true without a token
  badrange    forward; Content-Range shifted by one byte (a whole-object
              answer becomes a 206 with a Content-Range one byte off)
  fullbody    forward without the Range header: a 200 with the whole object
  clear       drop every rule and the request log
GET /__fault (no mode) answers the rules and the request log as JSON.

Conditional writes: a PUT with "If-None-Match: *" (S3) or
"x-goog-if-generation-match: 0" (GCS) of an object that exists upstream is
answered 412 PreconditionFailed (a create-only PUT; s3rver ignores both).  A HEAD is never answered with a body.
"""
import json
import random
import re
import socket
import socketserver
import struct
import sys
import threading
import time
import urllib.parse

LOCK = threading.Lock()
RULES = []  # dicts: mode, arg, count, match
LOG = []  # "METHOD TARGET -> fault"
PAGES = {}  # loop mode: the first page of a listing, by its target without the token
UPSTREAM = 0


def read_head(f):
    lines = []
    while True:
        line = f.readline(65537)
        if not line:
            return None
        if line in (b"\r\n", b"\n"):
            return lines
        lines.append(line.decode("latin-1").rstrip("\r\n"))


def header(lines, name):
    name = name.lower()
    for line in lines[1:]:
        k, _, v = line.partition(":")
        if k.strip().lower() == name:
            return v.strip()
    return None


def take_rule(reqline):
    with LOCK:
        for r in RULES:
            m = r["match"]
            hit = reqline.endswith(m[:-1]) if m.endswith("$") else m in reqline
            if r["count"] > 0 and hit:
                r["count"] -= 1
                return dict(r)
    return None


def rst(sock):
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


def upstream_exchange(head_lines, body):
    """Send the request upstream with Connection: close; return (status line,
    header lines, body bytes) of the answer."""
    out = [head_lines[0]]
    for line in head_lines[1:]:
        if line.split(":", 1)[0].strip().lower() in ("connection", "keep-alive"):
            continue
        out.append(line)
    out.append("Connection: close")
    data = ("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + body
    s = socket.create_connection(("127.0.0.1", UPSTREAM), timeout=60)
    try:
        s.sendall(data)
        f = s.makefile("rb")
        resp = read_head(f)
        if resp is None:
            raise OSError("no answer upstream")
        method = head_lines[0].split(" ", 1)[0]
        status = int(resp[0].split(" ")[1])
        cl = header(resp, "content-length")
        if method == "HEAD" or status in (204, 304) or (100 <= status < 200):
            rbody = b""
        elif cl is not None:
            rbody = f.read(int(cl))
        else:
            rbody = f.read()  # until close
        return resp, rbody
    finally:
        s.close()


def exists_upstream(head_lines):
    """HEAD of the request's object upstream: does it exist?"""
    method, target, ver = head_lines[0].split(" ", 2)
    path = target.split("?", 1)[0]
    hl = ["HEAD %s %s" % (path, ver)] + [
        x for x in head_lines[1:] if x.split(":", 1)[0].strip().lower() not in ("content-length", "if-none-match")
    ]
    resp, _ = upstream_exchange(hl, b"")
    return int(resp[0].split(" ")[1]) == 200


def rewrite_body(mode, arg, target, rbody):
    if mode == "cut":
        i = rbody.find(arg.encode()) if arg else -1
        return rbody[: i if i > 0 else len(rbody) // 2]
    if mode == "html":
        return b"<html><head><title>503 Service Unavailable</title></head><body><h1>busy</h1></body></html>\n"
    if mode == "random":
        r = random.Random(len(rbody))
        return bytes(r.randrange(256) for _ in range(max(64, len(rbody))))
    if mode == "error200":
        return (
            b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
            b"<Message>We encountered an internal error. Please try again.</Message></Error>"
        )
    if mode == "badsize":
        return re.sub(rb"<Size>(\d+)</Size>", rb"<Size>size:\1</Size>", rbody)
    if mode in ("loop", "notoken"):
        body = re.sub(rb"<NextContinuationToken>[^<]*</NextContinuationToken>", b"", rbody)
        body = re.sub(rb"<IsTruncated>[^<]*</IsTruncated>", b"<IsTruncated>true</IsTruncated>", body)
        if mode == "loop":
            cycle = (arg or "t1,t2").split(",")
            q = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query)
            cur = q.get("continuation-token", [""])[0]
            nxt = cycle[(cycle.index(cur) + 1) % len(cycle)] if cur in cycle else cycle[0]
            body = body.replace(
                b"</IsTruncated>", b"</IsTruncated><NextContinuationToken>%s</NextContinuationToken>" % nxt.encode(), 1
            )
        return body
    return rbody


def error_answer(arg, method="GET"):
    code, _, name = (arg or "503:SlowDown").partition(":")
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>%s</Code><Message>injected by faultproxy'
        "</Message></Error>" % (name or "InjectedError")
    ).encode()
    head = "HTTP/1.1 %s %s\r\nContent-Type: application/xml\r\nContent-Length: %d\r\nConnection: keep-alive\r\n\r\n" % (
        code,
        name or "Error",
        len(body),
    )
    return head.encode("latin-1") + (b"" if method == "HEAD" else body)


def control(target):
    q = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query)
    mode = q.get("mode", [""])[0]
    with LOCK:
        if mode == "clear":
            RULES.clear()
            LOG.clear()
            PAGES.clear()
        elif mode:
            RULES.append(
                {
                    "mode": mode,
                    "arg": q.get("arg", [""])[0],
                    "count": int(q.get("count", ["1"])[0]),
                    "match": q.get("match", [""])[0],
                }
            )
        body = json.dumps({"rules": RULES, "log": LOG}).encode()
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    ) + body


class Handler(socketserver.StreamRequestHandler):
    def handle(self):
        sock = self.connection
        f = self.rfile
        while True:
            try:
                head = read_head(f)
            except OSError:
                return
            if not head:
                return
            cl = header(head, "content-length")
            body = f.read(int(cl)) if cl else b""
            parts = head[0].split(" ")
            if len(parts) < 3:
                return
            method, target = parts[0], parts[1]
            if target.startswith("/__fault"):
                sock.sendall(control(target))
                continue
            reqline = "%s %s" % (method, target)
            rule = take_rule(reqline)
            mode = rule["mode"] if rule else ""
            with LOCK:
                LOG.append("%s -> %s" % (reqline, mode or "ok"))
                del LOG[:-500]
            if mode == "reset":
                rst(sock)
                return
            if mode == "status":
                sock.sendall(error_answer(rule["arg"], method))
                continue
            if mode == "bearer":
                if header(head, "authorization") != "Bearer " + rule["arg"]:
                    with LOCK:
                        LOG[-1] += " (bad or missing bearer token)"
                    sock.sendall(error_answer("401:Unauthorized"))
                    continue
                head = [x for x in head if x.split(":", 1)[0].strip().lower() != "authorization"]
            if mode == "delay":
                time.sleep(min(float(rule["arg"] or 0), 30000) / 1000.0)
            if mode == "loop":
                qs = urllib.parse.urlsplit(target)
                key = qs.path + "?" + "&".join(
                    x for x in qs.query.split("&") if not x.startswith("continuation-token=")
                )
                with LOCK:
                    page = PAGES.get(key)
                if page is not None and "continuation-token=" in target:
                    rb = rewrite_body(mode, rule["arg"], target, page[1])
                    out = [page[0][0]] + [
                        x
                        for x in page[0][1:]
                        if x.split(":", 1)[0].strip().lower()
                        not in ("connection", "keep-alive", "transfer-encoding", "content-length")
                    ]
                    out += ["Content-Length: %d" % len(rb), "Connection: keep-alive"]
                    sock.sendall(("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + rb)
                    continue
            if mode == "fullbody":
                head = [x for x in head if x.split(":", 1)[0].strip().lower() != "range"]
            try:
                create_only = header(head, "if-none-match") == "*" or header(head, "x-goog-if-generation-match") == "0"
                if method == "PUT" and create_only and exists_upstream(head):
                    with LOCK:
                        LOG[-1] += " (412: exists)"
                    if mode == "apply_reset":
                        rst(sock)
                        return
                    sock.sendall(error_answer("412:PreconditionFailed", method))
                    continue
                resp, rbody = upstream_exchange(head, body)
            except OSError:
                sock.sendall(error_answer("502:BadGateway", method))
                continue
            if mode == "apply_reset":
                rst(sock)
                return
            if mode == "loop":
                with LOCK:
                    PAGES[key] = (resp, rbody)
            if mode in ("cut", "html", "random", "error200", "badsize", "loop", "notoken"):
                rbody = rewrite_body(mode, rule["arg"], target, rbody)
            out = [resp[0]]
            if mode == "badrange" and header(resp, "content-range") is None and resp[0].split(" ")[1] == "200":
                # a whole-object answer: a 206 whose Content-Range is not the object's
                out = ["HTTP/1.1 206 Partial Content", "Content-Range: bytes 1-%d/%d" % (len(rbody), len(rbody))]
            for line in resp[1:]:
                k = line.split(":", 1)[0].strip().lower()
                if k in ("connection", "keep-alive", "transfer-encoding"):
                    continue
                if k == "etag" and mode == "etag":
                    line = "ETag: %s" % rule["arg"]
                if k == "content-range" and mode == "badrange":
                    m = re.match(r"bytes (\d+)-(\d+)/(\d+)", line.split(":", 1)[1].strip())
                    if m:
                        f, l, t = (int(x) for x in m.groups())
                        line = "Content-Range: bytes %d-%d/%d" % (f + 1, l + 1, t)
                if k == "content-length":
                    continue
                out.append(line)
            if not (method == "HEAD" and header(resp, "content-length") is not None):
                out.append("Content-Length: %d" % len(rbody))
            else:
                out.append("Content-Length: %s" % header(resp, "content-length"))
            out.append("Connection: keep-alive")
            data = ("\r\n".join(out) + "\r\n\r\n").encode("latin-1")
            if mode in ("truncate", "reset_mid"):
                n = int(rule["arg"] or 0)
                sock.sendall(data + rbody[:n])
                if mode == "reset_mid":
                    rst(sock)
                else:
                    sock.shutdown(socket.SHUT_RDWR)
                    sock.close()
                return
            sock.sendall(data + rbody)


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    global UPSTREAM
    UPSTREAM = int(sys.argv[1])
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    srv = Server(("127.0.0.1", port), Handler)
    print("faultproxy listening on 127.0.0.1:%d" % srv.server_address[1], flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
