"""The upstream the proxy's tests put behind it: a Python service (http.server) that
writes to PostgreSQL, with no fencing of its own.

    python3 upstream.py DATABASE

DATABASE is a libpq connection string. The first line on stdout is `listening PORT`.

PUT or POST /orders/<id>   reads the body in 64 KiB pieces (never whole), inserts a
                           row into orders_log (id, fencing_token, bytes, sha256) and
                           answers JSON with the same fields
GET /headers               answers the request's headers as JSON
GET /slow?ms=N             answers after N milliseconds
GET /trailers              a chunked answer with an X-Checksum trailer
GET /ws                    `Connection: upgrade`, `Upgrade: websocket`: answers 101,
                           then echoes every byte back until the client closes
"""

import base64
import hashlib
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import psycopg

DATABASE = sys.argv[1]
LOCAL = threading.local()


def db():
    if getattr(LOCAL, "conn", None) is None:
        LOCAL.conn = psycopg.connect(DATABASE, autocommit=True)
    return LOCAL.conn


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, doc):
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def read_body(self):
        digest = hashlib.sha256()
        total = 0
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                left = size
                while left:
                    piece = self.rfile.read(min(left, 65536))
                    digest.update(piece)
                    total += len(piece)
                    left -= len(piece)
                self.rfile.readline()
        else:
            left = int(self.headers.get("Content-Length", "0"))
            while left:
                piece = self.rfile.read(min(left, 65536))
                if not piece:
                    break
                digest.update(piece)
                total += len(piece)
                left -= len(piece)
        return total, digest.hexdigest()

    def write_order(self):
        parts = urlsplit(self.path).path.split("/")
        if len(parts) != 3 or parts[1] != "orders":
            self.answer(404, {"error": "no such path"})
            return
        total, sha = self.read_body()
        token = self.headers.get("Fencing-Token")
        db().execute(
            "INSERT INTO orders_log (id, fencing_token, bytes, sha256) VALUES (%s, %s, %s, %s)",
            (parts[2], token, total, sha),
        )
        self.answer(200, {"id": parts[2], "fencing_token": token, "bytes": total, "sha256": sha})

    do_PUT = write_order
    do_POST = write_order

    def do_GET(self):
        url = urlsplit(self.path)
        if url.path == "/headers":
            self.answer(200, {k.lower(): v for k, v in self.headers.items()})
        elif url.path == "/slow":
            time.sleep(int(parse_qs(url.query)["ms"][0]) / 1000)
            self.answer(200, {"slept": True})
        elif url.path == "/trailers":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Trailer", "X-Checksum")
            self.end_headers()
            for piece in (b"hello ", b"trailers"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\nX-Checksum: abc123\r\n\r\n")
        elif url.path == "/ws":
            key = self.headers.get("Sec-WebSocket-Key", "")
            accept = base64.b64encode(
                hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()
            ).decode()
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", accept)
            self.end_headers()
            self.wfile.flush()
            while True:
                data = self.connection.recv(65536)
                if not data:
                    break
                self.connection.sendall(data)
            self.close_connection = True
        else:
            self.answer(404, {"error": "no such path"})


def main():
    with psycopg.connect(DATABASE, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS orders_log (n bigserial PRIMARY KEY, id text NOT NULL,"
            " fencing_token text, bytes bigint NOT NULL, sha256 text NOT NULL)"
        )
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(f"listening {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
