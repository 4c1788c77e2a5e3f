"""The HTML+PDF report: read the stage files, build the sections, draw the charts, render and print.

- `data`: reads every stage file tolerantly (missing, skipped, partial or malformed files become
  "not measured: <why>"), and labels each figure measured / modelled / unavailable.
- `sections/`: builds the template context, one module per section (headline, audit, roofline, microbench,
  simulation, live, since, appendix), `context` (the whole report) and `compare`.
- `charts`: altair charts (inline Vega-Lite for the HTML, SVG through vl-convert for the PDF).
- `render`: the Jinja2 environment (autoescape on), secret scrubbing, HTML assembly.
- `pdf`: weasyprint.
"""

from __future__ import annotations

from .data import STAGE_FILES, Bundle, Fig, headline, load_bundle  # noqa: F401
