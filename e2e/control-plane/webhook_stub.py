#!/usr/bin/env python3
"""Minimal mutating admission webhook used only by smoke.sh to prove the control
plane calls webhooks: adds the label smoke.sidecar-injector.io/mutated=true.

Usage: webhook_stub.py PORT CERT KEY   (listens on 127.0.0.1 only)
"""
import base64
import json
import ssl
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server naming)
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        review = json.loads(body)
        request = review["request"]
        labels = (request.get("object") or {}).get("metadata", {}).get("labels")
        patch = []
        if labels is None:
            patch.append({"op": "add", "path": "/metadata/labels", "value": {}})
        patch.append(
            {
                "op": "add",
                "path": "/metadata/labels/smoke.sidecar-injector.io~1mutated",
                "value": "true",
            }
        )
        response = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {
                "uid": request["uid"],
                "allowed": True,
                "patchType": "JSONPatch",
                "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
            },
        }
        out = json.dumps(response).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, fmt, *args):
        sys.stderr.write("webhook_stub: " + (fmt % args) + "\n")


def main():
    port, cert, key = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
