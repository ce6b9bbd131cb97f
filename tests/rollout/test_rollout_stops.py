"""Stop strings with the real Qwen2.5 BPE: matched on decoded text, tokens kept as sampled.

A stop string can span several tokens ("</", "code", ">"), end inside a token (">\\n\\n",
"></"), sit in the middle of one (" There" holds "The"), or end in the middle of a multi-byte
character split over byte tokens. `StopChecker` must fire exactly at the first token after which
the decoded output contains the stop string, never earlier, never later.
"""

from __future__ import annotations

import random

import pytest

from stare_tir.rollout.backends.base import StopChecker, fast_decoder


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2 / Qwen byte-level alphabet: byte value -> the character its token is spelled with."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def first_stop(tokenizer, ids: list[int], stops: list[str]) -> tuple[int, str] | None:
    """Brute force: first k such that decode(ids[:k+1]) contains a stop string."""
    for k in range(len(ids)):
        text = tokenizer.decode(ids[: k + 1], skip_special_tokens=False)
        hits = [(text.find(s), s) for s in stops if s in text]
        if hits:
            return k, min(hits)[1]
    return None


def feed_all(checker: StopChecker, ids: list[int]) -> tuple[int, str] | None:
    for k in range(len(ids)):
        hit = checker.feed(ids[: k + 1])
        if hit is not None:
            return k, hit
    return None


def ids_of(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize(
    "text,stop,last_piece",
    [
        ("x</code>\n\nThe", "</code>", ">\n\n"),  # stop ends inside a token holding more text
        ("`</code>`", "</code>", ">`"),
        ("</code></code>", "</code>", "></"),  # the completing token already starts the next tag
        ("Hello. There is", "The", " There"),  # stop string strictly inside one token
        ("print(1)\n</code>", "</code>", ">"),  # spread over "</", "code", ">"
    ],
)
def test_qwen_boundaries_stop_at_completing_token(qwen_tok, text, stop, last_piece):
    ids = ids_of(qwen_tok, text)
    checker = StopChecker(fast_decoder(qwen_tok), [stop])
    got = feed_all(checker, ids)
    assert got is not None
    k, hit = got
    assert hit == stop
    assert qwen_tok.decode([ids[k]]) == last_piece  # the completing token is kept whole
    assert stop not in qwen_tok.decode(ids[:k])  # and nothing earlier matched
    assert got == first_stop(qwen_tok, ids, [stop])


def test_multibyte_stop_split_over_byte_tokens(qwen_tok):
    b2u = _bytes_to_unicode()
    emoji = "😀"
    byte_ids = [qwen_tok.convert_tokens_to_ids(b2u[b]) for b in emoji.encode()]
    ids = ids_of(qwen_tok, "ok ") + byte_ids + ids_of(qwen_tok, " done")
    checker = StopChecker(fast_decoder(qwen_tok), [emoji])
    k, hit = feed_all(checker, ids)
    assert hit == emoji
    assert k == len(ids_of(qwen_tok, "ok ")) + 3  # the 4th byte completes the character


def test_no_false_positives(qwen_tok):
    checker = StopChecker(fast_decoder(qwen_tok), ["</code>"])
    for text in ["</cod e>", "</ code>", "<code>print(1)</cod", "code>", "</"]:
        assert feed_all(checker, ids_of(qwen_tok, text)) is None, text
    assert feed_all(StopChecker(fast_decoder(qwen_tok), []), ids_of(qwen_tok, "</code>")) is None


def test_earliest_of_several_stops(qwen_tok):
    checker = StopChecker(fast_decoder(qwen_tok), ["</code>", "\n\n"])
    ids = ids_of(qwen_tok, "a</code>\n\nb")  # ">\n\n" completes both at once
    k, hit = feed_all(checker, ids)
    assert hit == "</code>"  # the one that starts first
    assert feed_all(StopChecker(fast_decoder(qwen_tok), ["\n\n", "</code>"]), ids)[1] == "</code>"


def test_random_texts_and_tokenizations_match_brute_force(qwen_tok):
    """Property test: canonical and random non-canonical tokenizations, random stops."""
    rng = random.Random(0)
    pieces = [
        "</code>",
        "<code>",
        "```",
        "python",
        "\n",
        "\n\n",
        " ",
        "print",
        "(",
        ")",
        "x",
        "=",
        "1",
        "2",
        "é",
        "→",
        "😀",
        "answer",
        "<|im_end|>",
        ">",
        "<",
        "/",
        "co",
        "de",
    ]
    stops_pool = ["</code>", "```", "\n\n", "→", "answer", "<|im_end|>"]
    checked = 0
    for _ in range(150):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(3, 25)))
        # random chunking = a non-canonical tokenization the model could have sampled
        cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(0, 4)))) if len(text) > 1 else []
        chunks = [text[i:j] for i, j in zip([0] + cuts, cuts + [len(text)])]
        ids = [i for c in chunks for i in qwen_tok(c, add_special_tokens=False, split_special_tokens=True)["input_ids"]]
        stops = rng.sample(stops_pool, k=rng.randint(1, 3))
        want = first_stop(qwen_tok, ids, stops)
        got = feed_all(StopChecker(fast_decoder(qwen_tok), stops), ids)
        assert got == want, (text, chunks, stops)
        checked += want is not None
    assert checked > 50  # the property was exercised on many matches
