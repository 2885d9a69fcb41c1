"""A ``tokenizer.json`` rebuilt from a GGUF file's byte-level BPE vocabulary (``tokenizer.ggml.*``).

The pre-tokenizer is not stored in a GGUF file, only its name (``tokenizer.ggml.pre``), which names
one of llama.cpp's known regex sets; each name we support maps to the Hugging Face pre-tokenizer that
produces the same splits.
"""

from __future__ import annotations

from pathlib import Path

CONTROL, USER_DEFINED = 3, 4
"""llama.cpp token types that are added (special) tokens rather than BPE pieces."""

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")
"""Qwen2's split: Llama 3's with digits one at a time."""


def _pre_tokenizer(pre: str):
    from tokenizers import Regex, pre_tokenizers

    if pre in ("default", "gpt2"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":  # llama.cpp: "\p{N}" then GPT-2's regex == HF Digits(individual) + ByteLevel
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    if pre in ("llama-bpe", "qwen2"):
        regex = LLAMA3_REGEX if pre == "llama-bpe" else QWEN2_REGEX
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated"),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return None


SUPPORTED_PRE = ("default", "gpt2", "smollm", "llama-bpe", "qwen2")
"""(Qwen2's own tokenizer.json NFC-normalises text first; llama.cpp and transformers' GGUF conversion do not,
and neither do we: text already in NFC, most text, splits the same either way.)"""


def tokenizer_json(path: Path, model: str | None, pre: str, tokens: list[str], token_types: list[int] | None,
                   merges: list[str] | None) -> str:
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    if model != "gpt2":
        raise ValueError(f"{path}: tokenizer model {model!r} is not supported from GGUF (byte-level BPE, 'gpt2', "
                         f"only); import the model's Hugging Face directory instead")
    pre_tok = _pre_tokenizer(pre)
    if pre_tok is None:
        raise ValueError(f"{path}: pre-tokenizer {pre!r} is not supported (supported: {', '.join(SUPPORTED_PRE)}); "
                         f"import the model's Hugging Face directory instead")
    if not merges:
        raise ValueError(f"{path}: the GGUF file has no BPE merges (tokenizer.ggml.merges)")
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], fuse_unk=False,
                     byte_fallback=False)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tok
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    types = token_types or []
    added = [AddedToken(t, special=True, normalized=False) for i, t in enumerate(tokens)
             if i < len(types) and types[i] in (CONTROL, USER_DEFINED)]
    tok.add_special_tokens(added)
    return tok.to_str(pretty=False)
