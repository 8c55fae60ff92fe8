"""``GET /docs``: the API as one HTML page, rendered by the server from its own OpenAPI schema.

FastAPI's ``/docs`` loads Swagger UI's scripts and styles from a CDN, so it leaks every visit to a
third party and is blank on a machine without internet access. This page has no script and loads
nothing: the API's description (its markdown rendered by :func:`markdown`, a small renderer of
the subset the descriptions use), each operation with its summary, the fields of its request body (type, default, limits,
description) and its answers. ``/openapi.json`` is the machine-readable schema for tools
(Swagger UI, schemathesis, client generators).
"""

from __future__ import annotations

import html
import json
import re

STYLE = """body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;line-height:1.45}
code,pre{font-family:ui-monospace,monospace;font-size:.9em}pre{background:#f4f4f4;padding:.6rem;white-space:pre-wrap}
table{border-collapse:collapse;width:100%;margin:.5rem 0}td,th{border:1px solid #ccc;padding:.25rem .5rem;
vertical-align:top;text-align:left}h2{border-top:2px solid #333;padding-top:.8rem}.m{font-weight:bold;color:#fff;
background:#333;padding:0 .4rem;border-radius:3px}"""


_INLINE = re.compile(r"`([^`]+)`|\*\*(.+?)\*\*|(?<![\w*])\*([^*\s](?:[^*]*[^*\s])?)\*(?![\w*])")


def _inline(text: str) -> str:
    """One line or paragraph of markdown as HTML: `code`, **strong**, *em*; everything else escaped
    (links are shown as their text: the page loads and links to nothing)."""
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out.append(_plain(text[pos:m.start()]))
        if m.group(1) is not None:
            out.append(f"<code>{html.escape(m.group(1))}</code>")
        elif m.group(2) is not None:
            out.append(f"<strong>{_inline(m.group(2))}</strong>")
        else:
            out.append(f"<em>{_inline(m.group(3))}</em>")
        pos = m.end()
    out.append(_plain(text[pos:]))
    return "".join(out)


def _plain(text: str) -> str:
    text = re.sub(r"\[([^\]]+)\]\((?:[^()]|\([^()]*\))*\)", r"\1", text)  # [text](url) -> text
    return html.escape(text)


def markdown(text: str) -> str:
    """The subset of markdown the API's descriptions use, as HTML, without any library: paragraphs
    (blank lines), lists (``- `` or ``* `` items), fenced code, `code`, **strong** and *em*. All
    text is HTML-escaped; no raw HTML, images or links pass through."""
    blocks: list[str] = []
    para: list[str] = []
    items: list[str] = []
    code: list[str] | None = None

    def flush() -> None:
        if para:
            blocks.append(f"<p>{_inline(' '.join(para))}</p>")
            para.clear()
        if items:
            blocks.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in items) + "</ul>")
            items.clear()

    for line in text.splitlines():
        stripped = line.strip()
        if code is not None:
            if stripped.startswith("```"):
                blocks.append(f"<pre><code>{html.escape(chr(10).join(code))}</code></pre>")
                code = None
            else:
                code.append(line)
            continue
        if stripped.startswith("```"):
            flush()
            code = []
        elif not stripped:
            flush()
        elif stripped[:2] in ("- ", "* "):
            if para:
                flush()
            items.append(stripped[2:])
        elif items and line[:1] == " ":  # a list item's continuation line
            items[-1] += " " + stripped
        else:
            if items:
                flush()
            para.append(stripped)
    if code is not None:
        blocks.append(f"<pre><code>{html.escape(chr(10).join(code))}</code></pre>")
    flush()
    return "".join(blocks)


def _compact(schema: dict) -> str:
    return f"<code>{html.escape(json.dumps(schema, ensure_ascii=False, separators=(', ', ': ')))}</code>"


def _rule(rule: dict) -> str:
    """One cross-field rule of a request body (``if``/``then``, ``not``) as HTML."""
    if "if" in rule:
        return f"if the body matches {_compact(rule['if'])}, it must match {_compact(rule.get('then', {}))}"
    if "not" in rule:
        return f"the body must not match {_compact(rule['not'])}"
    return _compact(rule)


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
             markdown(info.get("description", "")),
             "<p>The machine-readable schema: <a href='/openapi.json'><code>/openapi.json</code></a>.</p>"]
    for path, ops in schema.get("paths", {}).items():
        for method, op in ops.items():
            parts.append(f"<h2><span class='m'>{e(method.upper())}</span> <code>{e(path)}</code></h2>")
            if op.get("description") or op.get("summary"):
                parts.append(markdown(op.get("description") or op.get("summary")))
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
                                 f"<td>{e(_limits(prop))}</td><td>{_inline(prop.get('description', ''))}</td></tr>")
                parts.append("</table>")
                rules = [_rule(r) for r in body.get("allOf", [])]
                if rules:
                    parts.append("<p>And (the schema's <code>allOf</code>):</p><ul>"
                                 + "".join(f"<li>{r}</li>" for r in rules) + "</ul>")
            responses = op.get("responses", {})
            if responses:
                parts.append("<h3>Answers</h3><table><tr><th>status</th><th>meaning</th></tr>")
                for code, r in responses.items():
                    parts.append(f"<tr><td>{e(str(code))}</td><td>{_inline(r.get('description', ''))}</td></tr>")
                parts.append("</table>")
    parts.append("</body></html>")
    return "".join(parts)
