"""Jinja2 rendering (autoescape on) of the report, the comparison and the archive index.

HTML: self-contained and offline. The Vega, Vega-Lite and vega-embed libraries are inlined from the
vl-convert-python package (`vl_convert.javascript_bundle()`), each chart's Vega-Lite spec sits in a
`<script type="application/json">` block, so the charts are interactive (tooltips, export) without network.
PDF: each chart becomes SVG through vl-convert and is embedded as an image for weasyprint.
Every rendered text is scrubbed of secret values before it is written.
"""

from __future__ import annotations

import base64
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import jinja2
from markupsafe import Markup

from ..errors import describe
from ..io import atomic_write_text
from .data import Fig, fmt_bytes, fmt_num
from ..secrets import scrub_text, secret_values

# Shipped inside the package (pyproject package-data), so an installed decode-gap renders without a checkout.
DEFAULT_TEMPLATES = Path(__file__).resolve().parent / "templates"


def template_dir(candidates: Iterable[str] | None = None) -> Path:
    """The directory of the given template files (render_report's `templates` input), else the package's."""
    for c in candidates or []:
        p = Path(c)
        if p.suffix == ".j2" and p.is_file():
            return p.parent
    return DEFAULT_TEMPLATES


def _json_for_script(obj: Any) -> Markup:
    """JSON that is safe inside <script type="application/json">: no '<', '>' or '&' survives unescaped."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=str)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return Markup(text)


@lru_cache(maxsize=1)
def vega_bundle() -> str:
    import vl_convert

    js = vl_convert.javascript_bundle()
    return js.replace("</script", "<\\/script").replace("<!--", "<\\!--")


def _vl_version(spec: dict[str, Any]) -> str | None:
    import re

    import vl_convert

    m = re.search(r"/v(\d+)\.(\d+)", str(spec.get("$schema", "")))
    if not m:
        return None
    want = f"{m.group(1)}.{m.group(2)}"
    versions = vl_convert.get_vegalite_versions()
    if want in versions:
        return want
    same_major = [v for v in versions if v.split(".")[0] == m.group(1)]
    return same_major[-1] if same_major else None


def chart_svg(spec: dict[str, Any]) -> str:
    import vl_convert

    return vl_convert.vegalite_to_svg(spec, vl_version=_vl_version(spec))


def svg_data_uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def environment(templates: str | os.PathLike | None = None) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates or DEFAULT_TEMPLATES)),
        autoescape=True,  # every value is HTML-escaped unless marked safe (server-supplied text included)
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.ChainableUndefined,
    )
    env.tests["fig"] = lambda x: isinstance(x, Fig)
    env.filters["num"] = lambda v, d=None: fmt_num(v, d)
    env.filters["bytes"] = fmt_bytes
    env.filters["script_json"] = _json_for_script
    return env


def prepare_charts(ctx: dict[str, Any], mode: str) -> None:
    """PDF: render every chart to SVG (a failed conversion becomes a 'not drawn' note, never a crash)."""
    if mode != "pdf":
        return
    for ref in ctx.get("charts", []):
        if "svg_uri" in ref or "why" in ref:
            continue
        try:
            ref["svg_uri"] = svg_data_uri(chart_svg(ref["spec"]))
        except Exception as exc:
            ref["svg_error"] = describe(exc)


def render(template: str, ctx: dict[str, Any], mode: str = "html", templates: str | os.PathLike | None = None,
           secrets: list[str] | None = None, extra_secret_names: Iterable[str] = ()) -> str:
    prepare_charts(ctx, mode)
    env = environment(templates)
    page = env.get_template(template).render(
        **{**ctx, "mode": mode}, vega_js=Markup(vega_bundle()) if mode == "html" and ctx.get("charts") else "")
    text, _ = scrub_text(page, secrets if secrets is not None else secret_values(names=extra_secret_names))
    return text


def write_html(path: str | os.PathLike, html: str) -> None:
    atomic_write_text(path, html)
