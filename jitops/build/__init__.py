"""The build stage: from a plan to a verified, published cache entry.

Owns: ``entry`` (what ``get`` does with a plan: hit, remote tier, or build; ``ensure_entry``), ``publish``
(one build in private staging, published atomically), ``runner`` (ninja, the fake builder and the stable
builder under ``_supervise``; ``run_supervised``), ``job`` (``BuildJob``, the value every builder takes),
``ninja`` (the ninja file), ``tubuild`` (file by file, with cached objects and PCHs), ``pch`` / ``pch_bg``
(precompiled headers, beside or after a build), ``build_errors`` (the one-screen failure),
``selfcheck`` / ``selfprobe`` (the toolchain self-check that gates a publish), ``stable`` (kernels on
torch's stable C ABI: detection, include checks, target version, the one-command builder).

May import: ``jitops.remote`` (lazily, from ``entry``), ``jitops.plan``, ``jitops.store``, ``jitops.key``,
``jitops.target``, ``jitops.spec``, ``jitops.base``, ``jitops.errors``.
"""
