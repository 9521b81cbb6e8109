"""Names of the structured log events that one package writes and another reads back.

The runtime writes its logs as JSON lines (``event`` plus fields); the launcher's report reads some of them again
to time what happened. Both use these constants, so an event renamed on one side cannot silently vanish from the
other. Each constant's docstring names the fields its readers rely on.
"""

from __future__ import annotations

from typing import Final

SERVING_READY: Final = "serving.ready"
"""The controller: every replica and proxy of the allocation answers (written to the job's Slurm log);
``timestamp``."""
BATCH_COMPLETE: Final = "batch.complete"
"""The client: Data Designer finished a batch (``client.log``); ``timestamp`` and ``rows`` (the attempt's rows so
far, resumed rows included)."""
FILL_DONE: Final = "fill.done"
"""The client: a fill generated rows a shard was missing (``client.log``); ``timestamp`` and ``added``."""
