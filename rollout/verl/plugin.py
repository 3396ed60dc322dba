"""The verl plugin (entry point ``verl.plugins``: ``sam_spec_rollout = "rollout.verl.plugin"``).

verl imports every ``verl.plugins`` entry point in every process that imports verl, and swallows their
errors (at debug level), so this module stays small and does only what the environment asks for:
- it registers the "cpu" platform (``rollout.verl.cpu_platform``), which is used only with
  ``VERL_PLATFORM=cpu`` and is never auto-detected;
- with ``VERL_PLATFORM=cpu`` it applies the CPU patches (``rollout.verl.cpu_patches``);
- with ``SAM_WEIGHT_CHECKSUMS=1`` both ends of verl's weight sync log checksums
  (``rollout.verl.weight_checksums``).
"""

from __future__ import annotations

from rollout.verl import cpu_patches, cpu_platform, weight_checksums

cpu_platform.register_platform()
if cpu_platform.cpu_requested():
    cpu_patches.apply()
if weight_checksums.enabled():
    weight_checksums.apply()
