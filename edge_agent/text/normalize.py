"""Text normalisation for announcements: what is written becomes what is said.

Announcements are full of things a phonemizer reads badly or inconsistently:
times (`7:30 pm`), dates (`2026-12-02`), units (`21°C`, `5 km/h`), money,
percentages, ordinals and abbreviations. Each rule below rewrites one kind
into words; rules run in order, most specific first.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable

from edge_agent.text.numbers import cardinal, decimal, digits, ordinal, year

_MONTHS = (
    "January February March April May June July August September October November December"
).split()
_MONTH_ABBR = {m[:3].lower(): m for m in _MONTHS}

_UNITS = {
    "km/h": ("kilometer per hour", "kilometers per hour"),
    "kph": ("kilometer per hour", "kilometers per hour"),
    "mph": ("mile per hour", "miles per hour"),
    "m/s": ("meter per second", "meters per second"),
    "kwh": ("kilowatt hour", "kilowatt hours"),
    "kw": ("kilowatt", "kilowatts"),
    "mw": ("milliwatt", "milliwatts"),
    "w": ("watt", "watts"),
    "mah": ("milliamp hour", "milliamp hours"),
    "v": ("volt", "volts"),
    "a": ("amp", "amps"),
    "km": ("kilometer", "kilometers"),
    "cm": ("centimeter", "centimeters"),
    "mm": ("millimeter", "millimeters"),
    "m": ("meter", "meters"),
    "mi": ("mile", "miles"),
    "ft": ("foot", "feet"),
    "in": ("inch", "inches"),
    "kg": ("kilogram", "kilograms"),
    "g": ("gram", "grams"),
    "mg": ("milligram", "milligrams"),
    "lb": ("pound", "pounds"),
    "lbs": ("pound", "pounds"),
    "oz": ("ounce", "ounces"),
    "l": ("liter", "liters"),
    "ml": ("milliliter", "milliliters"),
    "gb": ("gigabyte", "gigabytes"),
    "mb": ("megabyte", "megabytes"),
    "kb": ("kilobyte", "kilobytes"),
    "tb": ("terabyte", "terabytes"),
    "hz": ("hertz", "hertz"),
    "khz": ("kilohertz", "kilohertz"),
    "db": ("decibel", "decibels"),
    "h": ("hour", "hours"),
    "hr": ("hour", "hours"),
    "hrs": ("hour", "hours"),
    "min": ("minute", "minutes"),
    "mins": ("minute", "minutes"),
    "s": ("second", "seconds"),
    "sec": ("second", "seconds"),
    "ms": ("millisecond", "milliseconds"),
    "hpa": ("hectopascal", "hectopascals"),
    "ppm": ("part per million", "parts per million"),
}

_ABBREVIATIONS = {
    "dr.": "Doctor", "mr.": "Mister", "mrs.": "Missus", "ms.": "Miz", "prof.": "Professor",
    "st.": "Street", "ave.": "Avenue", "rd.": "Road", "blvd.": "Boulevard", "apt.": "Apartment",
    "approx.": "approximately", "etc.": "et cetera", "e.g.": "for example", "i.e.": "that is",
    "vs.": "versus", "dept.": "department", "min.": "minimum", "max.": "maximum",
    "temp.": "temperature", "no.": "number", "tel.": "telephone", "jr.": "Junior", "sr.": "Senior",
}

_CURRENCIES = {"$": ("dollar", "dollars", "cent", "cents"), "€": ("euro", "euros", "cent", "cents"),
               "£": ("pound", "pounds", "penny", "pence")}

_NUM = r"\d{1,3}(?:,\d{3})+|\d+"
"""An integer, optionally with thousands separators."""

Rule = tuple[re.Pattern[str], Callable[[re.Match[str]], str]]

_LONG_DIGITS = re.compile(r"\d{16,}")


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _plural(value: str, one: str, many: str) -> str:
    return one if value in ("1", "1.0", "-1") else many


def _number(text: str) -> str:
    return decimal(text) if "." in text else cardinal(_int(text))


def _time(m: re.Match[str]) -> str:
    hour, minute, suffix = int(m["h"]), int(m["m"] or 0), (m["ampm"] or "").lower()
    if hour > 24 or minute > 59:
        return m[0]
    if suffix:
        ampm = "a m" if suffix.startswith("a") else "p m"
        if suffix.endswith(".") and _ends_sentence(m):
            ampm += "."  # "at 7 p.m. Then ..." keeps its sentence boundary
        if minute == 0:
            return f"{cardinal(hour)} {ampm}"
        return f"{cardinal(hour)} {_minutes(minute)} {ampm}"
    if minute == 0:
        return f"{cardinal(hour)} hundred" if hour > 12 or m["h"].startswith("0") else (
            f"{cardinal(hour)} o'clock"
        )
    return f"{cardinal(hour)} {_minutes(minute)}"


def _ends_sentence(m: re.Match[str]) -> bool:
    rest = m.string[m.end():]
    return not rest.strip() or (rest[:1].isspace() and rest.lstrip()[:1].isupper())


def _minutes(minute: int) -> str:
    return f"oh {cardinal(minute)}" if minute < 10 else cardinal(minute)


def _iso_date(m: re.Match[str]) -> str:
    y, mo, d = int(m["y"]), int(m["mo"]), int(m["d"])
    if not (1 <= mo <= 12 and 1 <= d <= 31):
        return m[0]
    return f"{_MONTHS[mo - 1]} {ordinal(d)}, {year(y)}"


def _named_date(m: re.Match[str]) -> str:
    """'Dec 2nd, 2026' -> 'December second, ...'; '2 Dec 2026' -> 'the second of December ...'."""
    month = _MONTH_ABBR[m["mon"][:3].lower()]
    day = int(m["d"])
    if not 1 <= day <= 31:
        return m[0]
    day_first = m.start("d") < m.start("mon")
    spoken = f"the {ordinal(day)} of {month}" if day_first else f"{month} {ordinal(day)}"
    if m["y"]:
        spoken += f"{'' if day_first else ','} {year(int(m['y']))}"
    return spoken


def _money(m: re.Match[str]) -> str:
    one, many, sub_one, sub_many = _CURRENCIES[m["cur"]]
    whole = _int(m["whole"])
    spoken = f"{cardinal(whole)} {one if whole == 1 else many}"
    if m["scale"]:
        return f"{cardinal(whole)} {m['scale'].lower()} {many}"
    if m["cents"] and int(m["cents"]):
        cents = int(m["cents"].ljust(2, "0")[:2])
        spoken += f" and {cardinal(cents)} {sub_one if cents == 1 else sub_many}"
    return spoken


def _temperature(m: re.Match[str]) -> str:
    unit = {"c": " Celsius", "f": " Fahrenheit", "": ""}[(m["unit"] or "").lower()]
    return f"{_number(m['n'])} {_plural(m['n'], 'degree', 'degrees')}{unit}"


def _unit(m: re.Match[str]) -> str:
    one, many = _UNITS[m["unit"].lower()]
    return f"{_number(m['n'])} {_plural(m['n'], one, many)}"


def _abbreviation(m: re.Match[str]) -> str:
    return _ABBREVIATIONS[m[0].lower()]


def _range(m: re.Match[str]) -> str:
    spoken = f"{cardinal(_int(m['a']))} to {cardinal(_int(m['b']))}"
    if m["unit"]:
        spoken += " " + _UNITS[m["unit"].lower()][1]
    return spoken


def _saint_or_street(m: re.Match[str]) -> str:
    prev = m["prev"]
    if prev and prev[0].isupper():
        return f"{prev} Street"
    return f"{prev} Saint" if prev else "Saint"


def _year_after_word(m: re.Match[str]) -> str:
    return f"{m['w']} {year(int(m['y']))}"


_AMPM = r"(?P<ampm>[ap]m\b|[ap]\.m\.)"
_UNIT_ALT = "|".join(sorted((re.escape(u) for u in _UNITS), key=len, reverse=True))
_ABBR_ALT = "|".join(re.escape(a) for a in sorted(_ABBREVIATIONS, key=len, reverse=True))
_MON_ALT = r"Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|Jun(?:e)?|Jul(?:y)?|" \
    r"Aug(?:ust)?|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?"

_RULES: list[Rule] = [
    (re.compile(r"\b(?P<y>\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})\b"), _iso_date),
    (re.compile(rf"\b(?P<mon>{_MON_ALT})\.? (?P<d>\d{{1,2}})(?:st|nd|rd|th)?\b"
                r"(?:,? (?P<y>\d{4})\b)?"), _named_date),
    (re.compile(rf"\b(?P<d>\d{{1,2}})(?:st|nd|rd|th)? (?:of )?(?P<mon>{_MON_ALT})\b\.?"
                r"(?: (?P<y>\d{4})\b)?"), _named_date),
    (re.compile(rf"\b(?P<h>\d{{1,2}}):(?P<m>\d{{2}})(?::\d{{2}})?(?:\s*{_AMPM})?", re.I), _time),
    (re.compile(rf"\b(?P<h>\d{{1,2}})(?P<m>)\s*{_AMPM}", re.I), _time),
    (re.compile(rf"(?P<cur>[$€£])(?P<whole>{_NUM})(?:\.(?P<cents>\d{{1,2}}))?"
                r"(?:\s?(?P<scale>million|billion|thousand)\b)?", re.I), _money),
    (re.compile(r"(?P<n>-?\d+(?:\.\d+)?)\s?°\s?(?P<unit>[CF])?(?![A-Za-z])"), _temperature),
    (re.compile(r"(?P<n>-?\d+(?:\.\d+)?)\s?%"), lambda m: f"{_number(m['n'])} percent"),
    (re.compile(rf"(?<![\w.-])(?P<a>\d+)\s?[-–]\s?(?P<b>\d+)(?:\s?(?P<unit>{_UNIT_ALT})(?![\w/]))?"
                r"(?![\w.])", re.I), _range),
    (re.compile(rf"(?<![\w.])(?P<n>-?(?:{_NUM})(?:\.\d+)?)\s?(?P<unit>{_UNIT_ALT})(?![\w/])", re.I),
     _unit),
    (re.compile(r"\b(?P<n>\d+)(?:st|nd|rd|th)\b", re.I), lambda m: ordinal(int(m["n"]))),
    (re.compile(r"\b(?P<w>in|since|until|by|from|year|of|before|after)\s(?P<y>1[1-9]\d\d|20\d\d)\b",
                re.I), _year_after_word),
    (re.compile(r"(?:\b(?P<prev>\w+) )?\bSt\.(?= [A-Z])"), _saint_or_street),
    (re.compile(rf"(?<!\w)(?:{_ABBR_ALT})(?=\s|$)", re.I), _abbreviation),
    (re.compile(r"(?<![\w.])-(?P<n>\d+(?:\.\d+)?)\b"), lambda m: "minus " + _number(m["n"])),
    (re.compile(r"\b\d+\.\d+\b"), lambda m: decimal(m[0])),
    (re.compile(r"\b0\d+\b"), lambda m: digits(m[0])),
    (re.compile(rf"\b(?:{_NUM})\b"), lambda m: cardinal(_int(m[0]))),
    (re.compile(r"\s*&\s*"), lambda m: " and "),
    (re.compile(r"(?<=\w)\s*\+\s*(?=\w)"), lambda m: " plus "),
    (re.compile(r"(?<=\s)@(?=\s)"), lambda m: "at"),
]

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_SPACE = re.compile(r"[ \t\u00a0]+")


def normalize(text: str) -> str:
    """Rewrite `text` so that every number, time, date, unit and abbreviation is in words."""
    text = unicodedata.normalize("NFKC", text)
    text = _CONTROL.sub(" ", text).replace("\r\n", "\n")
    text = _SPACE.sub(" ", text)
    # Runs of 16+ digits are read digit by digit (as `cardinal` would); doing it first keeps
    # every rule below from converting thousands of digits to an int (which Python refuses).
    text = _LONG_DIGITS.sub(lambda m: f" {digits(m[0])} ", text)
    for pattern, replace in _RULES:
        text = pattern.sub(replace, text)
    return _SPACE.sub(" ", text).strip()
