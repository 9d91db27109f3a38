"""A character-level tokenizer for the embedded default model.

Design: one token per character of a fixed alphabet (the embedded task's ``EMBEDDED_ALPHABET``)
plus ``<pad>``, ``<bos>``, ``<eos>`` and ``<unk>``, built with the ``tokenizers`` library and wrapped
in a ``PreTrainedTokenizerFast`` so it saves and loads with ``save_pretrained`` /
``AutoTokenizer.from_pretrained`` next to the model like any hub tokenizer. Encoding prepends
``<bos>``; padding is on the left (generation); decoding joins characters without spaces. Ids are
stable: specials first (pad 0, bos 1, eos 2, unk 3), then the alphabet in sorted order.

    from runners.models.tokenizer import build_char_tokenizer
    tok = build_char_tokenizer("0123456789+-*=?\\n")
    tok("12+3=?\\n").input_ids      # [1, ...]
"""

from __future__ import annotations

SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>"}


def build_char_tokenizer(alphabet: str, *, model_max_length: int = 2048):
    """A ``PreTrainedTokenizerFast`` with one id per character of ``alphabet`` (deduplicated, sorted).

    Vocabulary size = 4 specials + number of distinct characters. Characters outside the alphabet
    map to ``<unk>``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set(alphabet))
    if not chars:
        raise ValueError("build_char_tokenizer needs a non-empty alphabet")
    specials = list(SPECIAL_TOKENS.values())
    clash = [c for c in chars if c in specials]
    if clash:
        raise ValueError(f"alphabet characters {clash!r} collide with special tokens {specials!r}")
    vocab = {token: i for i, token in enumerate(specials + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL_TOKENS["unk_token"]))
    # every character is its own pre-token ("[\\s\\S]" also matches newlines)
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    bos = SPECIAL_TOKENS["bos_token"]
    core.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, vocab[bos])]
    )
    core.add_special_tokens(specials)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        **SPECIAL_TOKENS,
    )
