"""Accuracy evaluation: does SAM change what the model answers? Math benchmarks (AIME 2024, MATH-500)
scored with SAM off and on (``eval_math``, its statistics in ``eval_math_stats``, the answer scorer in
``math_answers``). Imports ``testkit`` for the engine; nothing here imports ``benchmarks``."""
