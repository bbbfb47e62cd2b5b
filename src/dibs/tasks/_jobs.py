"""The job table durable mode runs on: the one its store offers.

The rows and the interface are the store's (:mod:`dibs.stores.jobs`); this
module only asks the store for them.
"""

from __future__ import annotations

from dibs.exceptions import InvalidInput, StoreClosed
from dibs.stores.base import Store
from dibs.stores.jobs import Decide, Job, JobTable

__all__ = ["Decide", "Job", "JobTable", "job_table"]


def job_table(store: Store) -> JobTable:
    """The job table that lives next to ``store``.

    Raises :class:`~dibs.InvalidInput` for a store that offers none, and
    :class:`~dibs.StoreClosed` for a closed store (as every call on it does).
    """
    if store.closed:
        raise StoreClosed(f"this {type(store).__name__} is closed")
    table = store.job_table()
    if table is None:
        raise InvalidInput(
            f"durable tasks need a store with a job table; {type(store).__name__} has none",
            field="store",
            value=store,
        )
    return table
