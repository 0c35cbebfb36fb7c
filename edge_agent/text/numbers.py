"""English number words: cardinals, ordinals, years, decimals."""

from __future__ import annotations

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen "
    "fourteen fifteen sixteen seventeen eighteen nineteen"
).split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand"))
_ORDINAL_WORDS = {
    "one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth",
    "nine": "ninth", "twelve": "twelfth",
}


def _below_thousand(n: int) -> str:
    words = []
    if n >= 100:
        words.append(f"{_ONES[n // 100]} hundred")
        n %= 100
    if n >= 20:
        words.append(_TENS[n // 10] + (f"-{_ONES[n % 10]}" if n % 10 else ""))
    elif n or not words:
        words.append(_ONES[n])
    return " ".join(words)


def cardinal(n: int) -> str:
    """`cardinal(1234)` -> 'one thousand two hundred thirty-four'."""
    if n < 0:
        return f"minus {cardinal(-n)}"
    if n >= 10**15:
        return digits(str(n))
    words = []
    for scale, name in _SCALES:
        if n >= scale:
            words.append(f"{_below_thousand(n // scale)} {name}")
            n %= scale
    if n or not words:
        words.append(_below_thousand(n))
    return " ".join(words)


def ordinal(n: int) -> str:
    """`ordinal(21)` -> 'twenty-first'."""
    words = cardinal(n)
    head, sep, last = words.rpartition("-" if "-" in words.split(" ")[-1] else " ")
    if last in _ORDINAL_WORDS:
        last = _ORDINAL_WORDS[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return f"{head}{sep}{last}"


def year(n: int) -> str:
    """Years as people say them: 1984 -> 'nineteen eighty-four', 2005 -> 'two thousand five'."""
    if 1100 <= n <= 1999 or 2010 <= n <= 2099:
        hi, lo = divmod(n, 100)
        if lo == 0:
            return f"{cardinal(hi)} hundred"
        return f"{cardinal(hi)} {'oh ' if lo < 10 else ''}{cardinal(lo)}"
    return cardinal(n)


def digits(text: str) -> str:
    """Digit by digit: '0042' -> 'zero zero four two'."""
    return " ".join(_ONES[int(c)] for c in text if c.isdigit())


def decimal(text: str) -> str:
    """'3.14' -> 'three point one four'; '-0.5' -> 'minus zero point five'."""
    sign = ""
    if text.startswith("-"):
        sign, text = "minus ", text[1:]
    whole, _, frac = text.partition(".")
    spoken = cardinal(int(whole.replace(",", "") or "0"))
    if frac:
        spoken += " point " + digits(frac)
    return sign + spoken
