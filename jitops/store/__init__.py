"""The store: the cache on disk and everything that reads, writes, checks or trims it.

Owns: ``cache`` (the layout, ``Cache.lookup`` / ``publish_entry``, ``verify``), ``manifest`` (``Manifest``,
``Address``, ``Hit``, ``Miss``, ``EntryProblem``), ``lock`` (one builder per key), ``obstruct`` (the wrong
kind of thing on the cache's way: ``heal``), ``repair`` (``scan`` / ``repair`` for doctor and
``jitops cache repair``), ``roots`` (which cache root), ``stamps`` (verified stamps), ``verdicts``
(self-check verdicts), ``objcache`` (objects per translation unit), ``parts`` (the rebuildable caches as
prune sees them), ``admin`` (list, verify, prune, cap), ``archive`` / ``archive_reader`` (export and
import, reading archives as hostile input).

May import: ``jitops.key``, ``jitops.spec``, ``jitops.base``, ``jitops.errors``. Never a compiler.
"""
