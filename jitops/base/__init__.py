"""The ground floor: what every stage uses, nothing specific to ops.

Owns: ``settings`` (``Settings.from_env``: every ``JITOPS_*`` variable parsed once), ``fsutil`` (modes,
atomic writes, walks and removals that never follow a link, ``read_record``), ``progress`` (the live
build line), ``torchcompat`` (the supported torch range) and ``_supervise`` (the build supervisor,
run as a script).

May import: ``jitops.errors``. Public names are imported from their modules (this file imports nothing,
so importing a subpackage costs nothing until a module of it is used).
"""
