#!/usr/bin/env python3
"""A git smart-HTTP remote for tests: `git http-backend` (the real one)
behind a small HTTPS server on 127.0.0.x that demands HTTP basic with the
token as the password. Usage:

    git_https.py ROOT CERT KEY TOKEN ADDR PORT_FILE LOG

ROOT holds the bare repositories; the port it listens on is written to
PORT_FILE once it listens; each request is a JSON line in LOG (method,
path, whether its credentials were the token, and the user it named).
With ROOT `-` it is a fake API instead: every request is answered 200 with
its method and path, no credentials asked.
"""
import base64
import http.server
import json
import os
import ssl
import subprocess
import sys

root, cert, key, token, addr, port_file, log_path = sys.argv[1:8]


def log(entry):
    with open(log_path, "a") as f:
        f.write(json.dumps(entry) + "\n")


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def answer(self, status, headers, body):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def serve(self):
        body = self.body()
        auth = self.headers.get("Authorization", "")
        user, password = "", None
        if auth.startswith("Basic "):
            user, _, password = base64.b64decode(auth[6:]).decode(errors="replace").partition(":")
        ok = password == token
        log({"method": self.command, "path": self.path, "authorized": ok, "user": user,
             "sent_credentials": bool(auth)})
        if root == "-":
            self.answer(200, [("Content-Type", "text/plain")], f"{self.command} {self.path}".encode())
            return
        if not ok:
            self.answer(401, [("WWW-Authenticate", 'Basic realm="git"')], b"the token is required\n")
            return
        path, _, query = self.path.partition("?")
        env = dict(os.environ, GIT_PROJECT_ROOT=root, GIT_HTTP_EXPORT_ALL="1", PATH_INFO=path,
                   QUERY_STRING=query, REQUEST_METHOD=self.command, REMOTE_USER=user or "git",
                   REMOTE_ADDR="127.0.0.1", CONTENT_TYPE=self.headers.get("Content-Type", ""),
                   CONTENT_LENGTH=str(len(body)),
                   HTTP_CONTENT_ENCODING=self.headers.get("Content-Encoding", ""),
                   GIT_PROTOCOL=self.headers.get("Git-Protocol", ""))
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True).stdout
        sep = b"\r\n\r\n" if b"\r\n\r\n" in out else b"\n\n"
        head, _, rest = out.partition(sep)
        status, headers = 200, []
        for line in head.decode().splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.strip().split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.answer(status, headers, rest)

    do_GET = serve
    do_POST = serve
    do_PUT = serve
    do_DELETE = serve


server = http.server.ThreadingHTTPServer((addr, 0), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
with open(port_file + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(port_file + ".tmp", port_file)
server.serve_forever()
