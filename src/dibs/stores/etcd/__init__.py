"""``etcd://``: the claim store on an etcd v3 cluster; see docs/stores.md."""

from dibs.stores.etcd._store import EtcdStore

__all__ = ["AsyncEtcdStore", "EtcdStore"]


def __getattr__(name: str) -> object:
    if name == "AsyncEtcdStore":  # imported on demand: it pulls in dibs.aio
        from dibs.stores.etcd._aio import AsyncEtcdStore  # noqa: PLC0415

        return AsyncEtcdStore
    raise AttributeError(name)
