"""Subpackage ``jitops.store`` (stage 8): the cache on disk and everything that reads, writes, checks or trims it.

Owns: ``cache`` (the layout, the only builder of cache paths; ``Cache.lookup`` / ``publish_entry`` /
``verify``), ``manifest`` (entry data types), ``lock`` (one builder per key), ``obstruct`` (the wrong kind of
thing on a build's way: ``heal``), ``repair`` (``scan`` / ``repair`` of a whole cache for doctor and ``jitops
cache repair``), ``roots`` (which cache root), ``stamps`` (verified stamps), ``verdicts`` (self-check
verdicts), ``objcache`` (objects per translation unit), ``parts`` (the rebuildable caches as prune sees them),
``admin`` (list, verify, prune, cap, clear), ``archive`` / ``archive_reader`` (export and import, archives read
as hostile input). Never runs a compiler.

Public names (from their modules): ``cache.Cache``; ``manifest.Manifest`` / ``Address`` / ``Hit`` / ``Miss`` /
``EntryProblem``; ``lock.key_lock``; ``obstruct.heal``; ``repair.scan`` / ``repair``; ``roots.writable_cache``
/ ``cache_for_reading``; ``stamps.Stamps``; ``admin.prune`` / ``cap_parts`` / ``clear``;
``archive.export`` / ``import_archive`` / ``import_entry``.

May import (tests/test_layout.py): ``jitops.key`` and every stage below it (target, registry, kernels, spec,
base, errors, _version). Today it imports only ``key``, ``base``, ``errors`` and ``_version``.
"""
