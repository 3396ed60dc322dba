"""Time one decode step verifying q tokens per request, on a reduced-layer decoder with random weights.

GPU and CPU commands: see the module's docstring. The code is ``benchmarks.profile_step_cost``.
"""

from benchmarks.profile_step_cost import main

if __name__ == "__main__":
    main()
