"""One JSON-RPC POST inside a client span of the OpenTelemetry Python SDK, for
tests/telemetry.rs: the span's W3C context goes out as headers, in `params._meta`
(SEP-414), or both, and the span itself is exported to --otlp.

  python traced_request.py --url URL --body JSON [--header K:V]...
      [--propagate header|meta|both] [--otlp http://127.0.0.1:P/v1/traces]
      [--parent TRACEPARENT]

Prints {"trace_id", "span_id", "traceparent", "status", "headers", "body"}.
"""

import argparse
import json
import sys
import urllib.error
import urllib.request

from opentelemetry import propagate, trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--body", required=True)
    ap.add_argument("--header", action="append", default=[])
    ap.add_argument("--propagate", choices=["header", "meta", "both"], default="header")
    ap.add_argument("--otlp")
    ap.add_argument("--service-name", default="traced-client")
    ap.add_argument("--parent", help="continue this traceparent instead of a new trace")
    a = ap.parse_args()

    provider = TracerProvider(resource=Resource.create({"service.name": a.service_name}))
    if a.otlp:
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=a.otlp)))
    tracer = provider.get_tracer("traced_request")
    parent = propagate.extract({"traceparent": a.parent}) if a.parent else None

    body = json.loads(a.body)
    method = body.get("method", "request")
    with tracer.start_as_current_span(
        method, context=parent, kind=trace.SpanKind.CLIENT
    ) as span:
        span.set_attribute("mcp.method.name", method)
        carrier = {}
        propagate.inject(carrier)
        headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        for h in a.header:
            k, _, v = h.partition(":")
            headers[k.strip()] = v.strip()
        if a.propagate in ("header", "both"):
            headers.update(carrier)
        if a.propagate in ("meta", "both"):
            body.setdefault("params", {}).setdefault("_meta", {}).update(carrier)
        req = urllib.request.Request(
            a.url, data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                status, rheaders, rbody = r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            status, rheaders, rbody = e.code, dict(e.headers), e.read()
        ctx = span.get_span_context()
        out = {
            "trace_id": format(ctx.trace_id, "032x"),
            "span_id": format(ctx.span_id, "016x"),
            "traceparent": carrier.get("traceparent"),
            "status": status,
            "headers": {k.lower(): v for k, v in rheaders.items()},
            "body": rbody.decode("utf-8", "replace"),
        }
    provider.shutdown()
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
