"""System audit stage: collect host, GPU, PCIe, topology and software facts (each with its source) and findings.

Entry points: `collect.collect_audit(params)` -> the audit.json body; `findings.sort_findings(findings)` and
`fields.field_text(field)` for the report.
"""

from .fields import field_text
from .findings import sort_findings, summarize

__all__ = ["field_text", "sort_findings", "summarize"]
