import json

import pytest

from edge_agent.asr.tokenizer import Tokenizer
from edge_agent.errors import ModelError

TEXTS = [" Turn on the kitchen lights.", " Grüße aus Köln, 東京は晴れ — 42°C!", " emoji 🙂 ok", " don't"]


@pytest.fixture(scope="module")
def tokenizer_file(shared_cache):
    from edge_agent.models import ModelStore, load_catalog

    return ModelStore(shared_cache, load_catalog()).fetch("whisper-tiny.en").path("tokenizer.json")


def test_decoding_matches_hugging_face_tokenizers(tokenizer_file):
    tokenizers = pytest.importorskip("tokenizers")
    reference = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    ours = Tokenizer.load(tokenizer_file)
    for text in TEXTS:
        ids = reference.encode(text, add_special_tokens=False).ids
        assert ours.decode(ids) == reference.decode(ids) == text


def test_special_tokens_and_unknown_ids_are_skipped(tokenizer_file):
    tok = Tokenizer.load(tokenizer_file)
    sot, eot = tok.token_id("<|startoftranscript|>"), tok.token_id("<|endoftext|>")
    hello = [tok.token_id("Ġhello")]
    assert tok.decode([sot, *hello, eot, 50400]) == " hello"
    assert tok.decode([sot, *hello], skip_special=False) == "<|startoftranscript|> hello"


def test_a_split_multibyte_character_becomes_a_replacement_mark(tokenizer_file):
    tok = Tokenizer.load(tokenizer_file)
    euro = "€".encode()  # three bytes, each its own byte-level token
    from edge_agent.asr.tokenizer import byte_decoder

    chars = {b: c for c, b in byte_decoder().items()}
    ids = [tok.token_id(chars[b]) for b in euro]
    assert tok.decode(ids) == "€"
    assert tok.decode(ids[:2]) == "\ufffd"


@pytest.mark.parametrize(("doc", "message"), [
    ("not json", "not a usable tokenizer.json"),
    (json.dumps({"model": {"type": "WordPiece", "vocab": {}}}), "expected BPE"),
    (json.dumps({"model": {"type": "BPE", "vocab": {}}, "decoder": {"type": "Metaspace"}}), "not ByteLevel"),
    (json.dumps({"model": {"type": "BPE"}, "decoder": {"type": "ByteLevel"}}), "not a usable"),
    # The tables are indexed by id: an id of a billion must not size them.
    (json.dumps({"model": {"type": "BPE", "vocab": {"a": 10**9}}, "decoder": {"type": "ByteLevel"}}),
     "token ids must lie in"),
    (json.dumps({"model": {"type": "BPE", "vocab": {"a": -1}}, "decoder": {"type": "ByteLevel"}}),
     "token ids must lie in"),
])
def test_unusable_tokenizer_files_are_model_errors(tmp_path, doc, message):
    path = tmp_path / "tokenizer.json"
    path.write_text(doc)
    with pytest.raises(ModelError, match=message):
        Tokenizer.load(path)
    with pytest.raises(ModelError, match="no such tokenizer"):
        Tokenizer.load(tmp_path / "missing.json")
