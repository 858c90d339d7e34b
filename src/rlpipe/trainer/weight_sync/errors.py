"""Weight-sync errors: every message names the transport."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


RDT_TIMEOUT_ENV = "RAY_rdt_fetch_fail_timeout_milliseconds"


class WeightSyncError(RuntimeError):
    """A weight sync failed; the message names the transport."""


class WeightSyncTimeout(WeightSyncError, TimeoutError):
    """A weight sync did not finish within ``timeout_s``."""


class BackendUnavailableError(WeightSyncError):
    """The configured transport/backend cannot run here; the message says what to use instead."""
