"""Subpackage ``jitops.build`` (stage 11): from a plan to a verified, published cache entry.

Owns: ``entry`` (what ``get`` does with a plan: hit, remote tier, or build), ``publish`` (one build in private
staging, published atomically), ``job`` (``BuildJob`` / ``BuildResult``, the values every builder reads),
``runner`` (ninja, the fake builder and the stable builder under ``base/_supervise``), ``ninja`` (the ninja
file), ``tubuild`` (file by file, with cached objects and PCHs), ``pch`` / ``pch_bg`` (precompiled headers,
beside or after a build), ``build_errors`` (the one-screen failure), ``selfcheck`` / ``selfprobe`` (the
toolchain self-check that gates a publish), ``stable`` (kernels on torch's stable C ABI: detection, include
checks, target version, the one-command builder).

Public names (from their modules): ``entry.entry_status`` / ``ensure_entry`` / ``before_first_build`` (and
``Compatible`` / ``Damaged`` / ``Miss``); ``publish.build_and_publish``; ``job.BuildJob`` / ``BuildResult``;
``runner.build`` / ``run_supervised`` / ``default_jobs`` / ``BUILDERS`` / ``LIVE``; ``tubuild.summary``;
``selfcheck.start`` / ``ensure_sound`` / ``doctor``; ``stable.is_stable``.

May import (tests/test_layout.py): ``jitops.remote`` (lazily, from ``entry`` only: nothing imports it at module
level) and every stage below it (plan, store, key, target, registry, kernels, spec, base, errors, _version).
"""
