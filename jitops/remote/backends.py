"""URL -> store. Imports ``.config``, ``.store`` and, for the URL's scheme only, its backend module."""

from __future__ import annotations

from .config import RemoteSettings
from .store import Store, StoreError


def open_store(settings: RemoteSettings) -> Store:
    url = settings.url
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("redis", "rediss", "unix"):
        try:
            from .redis_store import RedisStore
        except ImportError as e:
            raise StoreError(
                f"{url} needs redis-py, which is not installed ({e}). Fix: pip install 'jitops[redis]'"
            ) from e
        return RedisStore(url, settings.connect_timeout, settings.op_timeout)
    if scheme == "file":
        from .fs_store import FileStore

        return FileStore(url)
    if not scheme:
        raise StoreError(
            f"JITOPS_REMOTE_CACHE={url!r} is not a URL. Fix: use redis://host:port/db, "
            "file:///shared/dir or s3://bucket/prefix"
        )
    try:
        from .object_store import ObjectStore
    except ImportError as e:
        raise StoreError(
            f"{url} needs fsspec, which is not installed ({e}). Fix: pip install 'jitops[s3]'"
        ) from e
    return ObjectStore(url, settings.connect_timeout, settings.op_timeout)
