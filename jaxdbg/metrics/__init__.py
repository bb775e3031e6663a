"""Prometheus metrics of jaxdbg's reports: families from a finished report (:mod:`.families`), written to a
text file or pushed to a Pushgateway (:mod:`.export`), and pipeline-bench's live endpoint (:mod:`.live`); every
family's name, type, help and labels come from one table (:mod:`.table`), which jaxdbg.watch serves too.
docs/metrics.md lists every name, its type and labels, and alerting rules that use them."""

from jaxdbg.metrics.export import export, text_of
from jaxdbg.metrics.families import families

__all__ = ["export", "families", "text_of"]
