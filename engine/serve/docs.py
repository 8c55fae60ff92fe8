"""``GET /docs``: the API as one HTML page, rendered by the server from its own OpenAPI schema.

FastAPI's ``/docs`` loads Swagger UI's scripts and styles from a CDN, so it leaks every visit to a
third party and is blank on a machine without internet access. This page has no script and loads
nothing: each operation with its summary, the fields of its request body (type, default, limits,
description) and its answers. ``/openapi.json`` is the machine-readable schema for tools
(Swagger UI, schemathesis, client generators).
"""

from __future__ import annotations

import html
import json

STYLE = """body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;line-height:1.45}
code,pre{font-family:ui-monospace,monospace;font-size:.9em}pre{background:#f4f4f4;padding:.6rem;white-space:pre-wrap}
table{border-collapse:collapse;width:100%;margin:.5rem 0}td,th{border:1px solid #ccc;padding:.25rem .5rem;
vertical-align:top;text-align:left}h2{border-top:2px solid #333;padding-top:.8rem}.m{font-weight:bold;color:#fff;
background:#333;padding:0 .4rem;border-radius:3px}"""


def _type(prop: dict) -> str:
    if "anyOf" in prop:
        return " | ".join(_type(p) for p in prop["anyOf"])
    if "enum" in prop:
        return " | ".join(json.dumps(v) for v in prop["enum"])
    if "const" in prop:
        return json.dumps(prop["const"])
    t = prop.get("type", "any")
    if t == "array":
        return f"array of {_type(prop.get('items', {}))}"
    return str(t)


def _limits(prop: dict) -> str:
    out = []
    for p in [prop, *prop.get("anyOf", [])]:
        for key, word in (("minLength", "min length"), ("maxLength", "max length"), ("minimum", ">="),
                          ("maximum", "<="), ("minItems", "min items"), ("maxItems", "max items"),
                          ("pattern", "pattern")):
            if key in p:
                out.append(f"{word} {p[key]:,}" if isinstance(p[key], int) else f"{word} {p[key]}")
        if p.get("type") == "array" and isinstance(p.get("items"), dict):
            inner = _limits(p["items"])
            if inner:
                out.append(f"each: {inner}")
    return ", ".join(out)


def render_docs(schema: dict) -> str:
    """The HTML page of an OpenAPI 3 schema (as produced by FastAPI)."""
    e = html.escape
    info = schema.get("info", {})
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(info.get('title', 'API'))}</title>"
             f"<style>{STYLE}</style></head><body>",
             f"<h1>{e(info.get('title', 'API'))} <small>{e(str(info.get('version', '')))}</small></h1>",
             f"<pre>{e(info.get('description', ''))}</pre>",
             "<p>The machine-readable schema: <a href='/openapi.json'><code>/openapi.json</code></a>.</p>"]
    for path, ops in schema.get("paths", {}).items():
        for method, op in ops.items():
            parts.append(f"<h2><span class='m'>{e(method.upper())}</span> <code>{e(path)}</code></h2>")
            if op.get("description") or op.get("summary"):
                parts.append(f"<p>{e(op.get('description') or op.get('summary'))}</p>")
            if op.get("security"):
                parts.append("<p>Needs the API key (<code>Authorization: Bearer KEY</code> or "
                             "<code>X-API-Key: KEY</code>).</p>")
            body = (op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema"))
            if body and body.get("properties"):
                required = set(body.get("required", []))
                parts.append("<h3>Request body (JSON)</h3><table><tr><th>field</th><th>type</th><th>default</th>"
                             "<th>limits</th><th>description</th></tr>")
                for name, prop in body["properties"].items():
                    default = "required" if name in required else json.dumps(prop.get("default"))
                    parts.append(f"<tr><td><code>{e(name)}</code></td><td>{e(_type(prop))}</td><td>{e(default)}</td>"
                                 f"<td>{e(_limits(prop))}</td><td>{e(prop.get('description', ''))}</td></tr>")
                parts.append("</table>")
            responses = op.get("responses", {})
            if responses:
                parts.append("<h3>Answers</h3><table><tr><th>status</th><th>meaning</th></tr>")
                for code, r in responses.items():
                    parts.append(f"<tr><td>{e(str(code))}</td><td>{e(r.get('description', ''))}</td></tr>")
                parts.append("</table>")
    parts.append("</body></html>")
    return "".join(parts)
