"""The benchmark pages under ``docs/benchmarks/``, one module per page (or pair of pages): what
result files it reads, its table and its plot. ``common`` holds what every page shares: finding
the result files, a folder's machine sentence, a run's conditions, the page's head and foot.

``docs/gen_bench.py`` runs every module's ``render(results, out)``; each writes its page even when
no result file exists yet, and then says so on the page instead of showing figures.
"""

from __future__ import annotations

from . import cluster, cuda_edit_loop, edit_loop, kernels, loader, per_call, warm_load

PAGES = (edit_loop, cuda_edit_loop, loader, warm_load, per_call, kernels, cluster)
