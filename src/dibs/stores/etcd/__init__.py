"""``etcd://``: the claim store on an etcd v3 cluster; see docs/stores.md."""

from dibs.stores.etcd._store import EtcdStore

EtcdStore.__module__ = __name__  # the public path, in reprs, docs and its logger's name

__all__ = ["AsyncEtcdStore", "EtcdStore"]


def __getattr__(name: str) -> object:
    if name == "AsyncEtcdStore":  # imported on demand: only the async face needs it
        from dibs.stores.etcd._aio import AsyncEtcdStore  # noqa: PLC0415

        return AsyncEtcdStore
    raise AttributeError(name)
