"""Support for the tests, the benchmarks and the demo: the 135M test model (``tiny_model``), shared data
(``data``), the vLLM engine harness (``engine``) and helpers (``vllm_tools``), running as on a CPU
without AVX-512 (``cpu_isa``), a fixed-draft proposer for step costs (``engine_cost``) and the
decode-against-verify precision check (``precision``). Nothing here imports ``benchmarks`` or ``evals``."""
