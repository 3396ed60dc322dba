"""The verl plugin (entry point ``verl.plugins``: ``sam_spec_rollout = "sam_rollout.verl.plugin"``).

verl imports every ``verl.plugins`` entry point in every process that imports verl, and swallows their
errors (at debug level), so this module stays small and does only what the environment asks for:
- it registers the "cpu" platform (``sam_rollout.verl.cpu.platform``), which is used only with
  ``VERL_PLATFORM=cpu`` and is never auto-detected;
- it applies the verl patches that fit this process (``sam_rollout.patches``; docs/patches.md): with
  ``VERL_PLATFORM=cpu`` the CPU patches (``sam_rollout.verl.cpu.patches``), with
  ``SAM_PATCH_WEIGHT_CHECKSUMS=1`` the weight-sync checksums (``sam_rollout.verl.runtime.weight_checksums``).
"""

from __future__ import annotations

from sam_rollout.patches import apply_patches
from sam_rollout.verl.cpu import platform as cpu_platform

cpu_platform.register_platform()
apply_patches("verl")
