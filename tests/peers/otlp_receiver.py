"""A real OTLP/HTTP trace receiver for tests/telemetry.rs.

It decodes OTLP/HTTP protobuf (gzip or not) and OTLP/JSON with the maintained
`opentelemetry-proto` classes, keeps every span, prints one line per span to stdout
(the format README "Operations" shows), and serves what it holds as JSON:

  POST   /v1/traces   an ExportTraceServiceRequest (answered with --status)
  GET    /spans       [{trace_id, span_id, parent_span_id, name, kind, service,
                        resource, attributes, links, status}]
  DELETE /spans       forget them
  GET    /requests    how many export requests arrived

  python otlp_receiver.py --port-file F [--status 200]
"""

import argparse
import gzip
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

LOCK = threading.Lock()
SPANS = []
REQUESTS = [0]


def value_of(v):
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value_of(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value_of(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def attrs(kvs):
    return {kv.key: value_of(kv.value) for kv in kvs}


def decode(req):
    out = []
    for rs in req.resource_spans:
        resource = attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    {
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex(),
                        "name": s.name,
                        "kind": Span.SpanKind.Name(s.kind).removeprefix("SPAN_KIND_"),
                        "service": resource.get("service.name"),
                        "resource": resource,
                        "attributes": attrs(s.attributes),
                        "links": [
                            {"trace_id": l.trace_id.hex(), "span_id": l.span_id.hex()}
                            for l in s.links
                        ],
                        "status": Status.StatusCode.Name(s.status.code).removeprefix(
                            "STATUS_CODE_"
                        ),
                        "events": [e.name for e in s.events],
                    }
                )
    return out


def line(s):
    shown = " ".join(f"{k}={json.dumps(v)}" for k, v in sorted(s["attributes"].items()))
    links = ",".join(l["span_id"] for l in s["links"]) or "-"
    return (
        f"trace={s['trace_id']} span={s['span_id']} parent={s['parent_span_id'] or '-'} "
        f"service={s['service']} replica={s['resource'].get('taskgate.replica_id', '-')} "
        f"kind={s['kind']} name={json.dumps(s['name'])} status={s['status']} "
        f"links={links} {shown}"
    )


class Handler(BaseHTTPRequestHandler):
    status = 200

    def log_message(self, *args):
        pass

    def answer(self, code, body, ctype="application/json"):
        self.send_response(code)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        n = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(n)
        with LOCK:
            REQUESTS[0] += 1
        if self.path != "/v1/traces":
            return self.answer(404, b"{}")
        if Handler.status != 200:
            return self.answer(Handler.status, b'{"error":"configured to refuse"}')
        if self.headers.get("content-encoding", "") == "gzip":
            body = gzip.decompress(body)
        req = ExportTraceServiceRequest()
        ctype = self.headers.get("content-type", "")
        try:
            if ctype.startswith("application/json"):
                json_format.Parse(body, req)
            else:
                req.ParseFromString(body)
        except Exception as e:  # a malformed export is the exporter's bug: say so
            return self.answer(400, json.dumps({"error": str(e)}).encode())
        spans = decode(req)
        with LOCK:
            SPANS.extend(spans)
        for s in spans:
            print(line(s), flush=True)
        self.answer(
            200,
            ExportTraceServiceResponse().SerializeToString(),
            "application/x-protobuf",
        )

    def do_GET(self):
        with LOCK:
            if self.path == "/spans":
                body = json.dumps(SPANS).encode()
            elif self.path == "/requests":
                body = json.dumps({"requests": REQUESTS[0]}).encode()
            else:
                return self.answer(404, b"{}")
        self.answer(200, body)

    def do_DELETE(self):
        with LOCK:
            SPANS.clear()
        self.answer(200, b"{}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--status", type=int, default=200)
    a = ap.parse_args()
    Handler.status = a.status
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(a.port_file + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    import os

    os.replace(a.port_file + ".tmp", a.port_file)
    print(f"otlp receiver on 127.0.0.1:{srv.server_address[1]}", file=sys.stderr, flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
