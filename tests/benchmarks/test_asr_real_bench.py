"""`edge-agent bench asr --real DIR`: our Whisper on recordings of real people, every retry rule
scored from one decode in the bucket window and one in 30 s (`benchmarks.asrreal`)."""

import json
from pathlib import Path

import pytest

from benchmarks.asrreal import RULES, Decoded, in_split, outcome, score
from edge_agent.asr.whisper import Recognition
from tests.conftest import run_cli

REAL = Path(__file__).resolve().parents[1] / "data" / "real" / "commands"


def recognition(text: str, logprob: float, looped: bool = False) -> Recognition:
    return Recognition(text, (1, 2), 0.01, logprob, 600, fallback=looped)


def decoded(short: Recognition, full: Recognition, seconds: float = 2.0) -> Decoded:
    return Decoded("x.flac", "set a timer", seconds, short, 0.1, full, 0.4)


def test_each_rule_gives_what_the_device_would_have_under_it():
    unsure_right = decoded(recognition("Set a timer.", -0.4), recognition("Senate timer.", -0.5))
    assert outcome(unsure_right, "no retry", -0.35) == ("Set a timer.", 0.1, False)
    assert outcome(unsure_right, "retry, keep the retry's", -0.35) == ("Senate timer.", 0.5, True)
    assert outcome(unsure_right, "retry, keep the surer", -0.35) == ("Set a timer.", 0.5, True)
    assert outcome(unsure_right, "30 s always", -0.35) == ("Senate timer.", 0.4, False)
    assert outcome(unsure_right, "retry under 2.5 s", -0.35) == ("Senate timer.", 0.5, True)
    assert outcome(unsure_right, "retry under 1.5 s", -0.35) == ("Set a timer.", 0.1, False)
    surer_retry = decoded(recognition("Senate timer.", -0.5), recognition("Set a timer.", -0.2))
    assert outcome(surer_retry, "retry, keep the surer", -0.35)[0] == "Set a timer."
    sure = decoded(recognition("Set a timer.", -0.2), recognition("Set a timer.", -0.1))
    assert all(outcome(sure, rule, -0.35)[2] is False for rule in RULES)
    # A loop was retried in its first decode already, under every rule but the 30 s window.
    loop = decoded(recognition("Set a timer.", -0.3, looped=True), recognition("Set a timer.", -0.3))
    assert outcome(loop, "no retry", -0.35) == ("Set a timer.", 0.1, True)


def test_scores_count_words_missed_beside_the_wer():
    rows = [decoded(recognition("Set a timer now.", -0.4), recognition("Senate timer.", -0.5))]
    scores = score(rows, -0.35)
    assert set(scores) == set(RULES)
    assert scores["no retry"]["words_missed"] == 0.0 and scores["no retry"]["wer"] == pytest.approx(1 / 3)
    assert scores["retry, keep the retry's"]["words_missed"] == pytest.approx(2 / 3)
    assert scores["retry, keep the retry's"]["decoded_twice"] == 1.0


def test_the_held_out_part_is_a_fixed_quarter_apart_from_the_tune_part():
    names = [f"{i}.wav" for i in range(400)]
    held = [n for n in names if in_split(n, "held-out")]
    tune = [n for n in names if in_split(n, "tune")]
    assert not set(held) & set(tune) and len(held) + len(tune) == len(names)
    assert 70 <= len(held) <= 130
    assert all(in_split(n, "all") for n in names)


@pytest.mark.bench
def test_the_bench_decodes_real_commands_under_every_rule(whisper_dir: Path, shared_cache: Path) -> None:
    result = run_cli("bench", "asr", "--real", str(REAL), "--limit", "3", "--json",
                     "--set", f"asr.model={whisper_dir}", "--set", f"models.cache_dir={shared_cache}",
                     timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["recordings"] == 3 and set(report["rules"]) == set(RULES)
    assert len(report["texts"]) == 3
    for rule in report["rules"].values():
        assert 0.0 <= rule["words_missed"] <= 1.0 and rule["decode_p50_s"] > 0
    assert report["rules"]["30 s always"]["decoded_twice"] == 0.0
