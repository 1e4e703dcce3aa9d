"""Subpackage ``jitops.base``, the ground floor (stage 2 of ``STAGES`` in tests/test_layout.py): what every
stage uses, nothing specific to ops.

Owns: ``settings`` (every ``JITOPS_*`` variable parsed once; the only reader of them), ``fsutil``
(modes, atomic writes, walks and removals that never follow a link, the checked record readers),
``progress`` (the live build line, the warm display), ``record`` (``@record``: a frozen dataclass,
cheaper to create), ``units`` (sizes and ages as people write them: ``5GB``, ``30d``),
``torchcompat`` (the supported torch range) and ``_supervise`` (the build supervisor, run as a
script).

Public names: ``settings.Settings`` / ``RemoteSettings`` / ``DistributedSettings`` / ``VARIABLES``;
``fsutil.atomic_write`` / ``makedirs`` / ``children`` / ``remove_path`` / ``read_record`` /
``read_private_record``; ``progress.BuildProgress`` / ``WarmDisplay``; ``torchcompat.check_version``.
They are imported from their modules: this file imports nothing, so importing a subpackage costs nothing
until a module of it is used (the same holds for every subpackage whose ``__init__`` holds no code).

May import: ``jitops.errors`` and ``jitops._version`` only (``settings`` imports ``errors``; the rest nothing).
"""
