import re

import pytest

from edge_agent.text.normalize import normalize
from edge_agent.text.numbers import cardinal, decimal, ordinal, year

CASES = [
    ("It is 7:30 pm.", "It is seven thirty p m."),
    ("Wake up at 7am", "Wake up at seven a m"),
    ("Leave at 7 p.m. Then rest.", "Leave at seven p m. Then rest."),
    ("Leave at 7 p.m. and rest.", "Leave at seven p m and rest."),
    ("Open 9 AM to 5 PM", "Open nine a m to five p m"),
    ("Lunch at 12:00", "Lunch at twelve o'clock"),
    ("Departure 14:05", "Departure fourteen oh five"),
    ("Meeting on 2026-12-02.", "Meeting on December second, twenty twenty-six."),
    ("Due Dec 2nd, 2026", "Due December second, twenty twenty-six"),
    ("On 3 March 1999", "On the third of March nineteen ninety-nine"),
    ("It is 21°C outside", "It is twenty-one degrees Celsius outside"),
    ("Oven at 350 °F", "Oven at three hundred fifty degrees Fahrenheit"),
    ("Humidity 45%", "Humidity forty-five percent"),
    ("Speed 50 km/h", "Speed fifty kilometers per hour"),
    ("Battery 1 kWh", "Battery one kilowatt hour"),
    ("Weight 2.5 kg", "Weight two point five kilograms"),
    ("Costs $5.20", "Costs five dollars and twenty cents"),
    ("Costs $1", "Costs one dollar"),
    ("€3 million", "three million euros"),
    ("1,234 visitors", "one thousand two hundred thirty-four visitors"),
    ("The 3rd floor", "The third floor"),
    ("Wait 10-20 mins", "Wait ten to twenty minutes"),
    ("Call Dr. Smith", "Call Doctor Smith"),
    ("Meet at Main St. now", "Meet at Main Street now"),
    ("Fly to St. Louis", "Fly to Saint Louis"),
    ("Minus -5 now", "Minus minus five now"),
    ("Code 0042", "Code zero zero four two"),
    ("Since 1984 & more", "Since nineteen eighty-four and more"),
]


@pytest.mark.parametrize(("text", "spoken"), CASES)
def test_announcement_text_is_spoken_in_words(text, spoken):
    assert normalize(text) == spoken


@pytest.mark.parametrize("text", [t for t, _ in CASES])
def test_no_digits_survive_normalisation(text):
    assert not re.search(r"\d", normalize(text))


def test_control_characters_and_odd_spacing_are_cleaned():
    assert normalize("Hello\x00\x07  world\t!") == "Hello world !"


def test_impossible_times_and_dates_are_left_for_the_number_rules():
    assert normalize("Score 99:99") == "Score ninety-nine:ninety-nine"
    assert "December" not in normalize("2026-13-45")


@pytest.mark.parametrize(("n", "words"), [
    (0, "zero"), (13, "thirteen"), (40, "forty"), (99, "ninety-nine"), (100, "one hundred"),
    (101, "one hundred one"), (1000, "one thousand"), (1_000_001, "one million one"),
    (-7, "minus seven"), (2_000_000_000, "two billion"),
])
def test_cardinals(n, words):
    assert cardinal(n) == words


@pytest.mark.parametrize(("n", "words"), [
    (1, "first"), (2, "second"), (3, "third"), (5, "fifth"), (12, "twelfth"), (20, "twentieth"),
    (21, "twenty-first"), (100, "one hundredth"), (103, "one hundred third"),
])
def test_ordinals(n, words):
    assert ordinal(n) == words


@pytest.mark.parametrize(("n", "words"), [
    (1984, "nineteen eighty-four"), (1900, "nineteen hundred"), (2005, "two thousand five"),
    (2026, "twenty twenty-six"), (1905, "nineteen oh five"),
])
def test_years(n, words):
    assert year(n) == words


def test_decimals():
    assert decimal("3.14") == "three point one four"
    assert decimal("-0.5") == "minus zero point five"


def test_thousands_of_digits_are_read_digit_by_digit_instead_of_failing():
    spoken = normalize("Code " + "7" * 5000 + ".")  # int() refuses strings over 4300 digits
    assert spoken.startswith("Code seven seven") and spoken.count("seven") == 5000
    assert normalize("0000000000000042") == "zero " * 14 + "four two"
