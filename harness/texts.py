"""Sentences for tokenizer and BERT parity checks: punctuation, accents,
CJK characters, case, spacing (checked against Hugging Face's tokenizer and
model by `benchmarks/hf_parity.py`, and by the tests that compare with it)."""

SENTENCES = [
    "Hello, world!",
    "an overwrought , overlong mess that's never as funny as it thinks .",
    "Café déjà vu: Über-cool 東京 — naïve \"quotes\" & ampersands…",
    "A gripping, FUNNY and moving film; 10/10, would watch again!!!",
    "   leading and trailing spaces\tand\ttabs\n",
]
