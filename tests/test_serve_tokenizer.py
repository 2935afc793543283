"""Byte-level and HF tokenizers, incremental UTF-8-safe decoding, stop strings, chat templates (no torch)."""

from __future__ import annotations

import json

import pytest

from executor.serve.textstream import TextStream
from executor.serve.tokenizer import (ByteTokenizer, _OffsetDecoder, builtin_chat_text, load_tokenizer,
                                      render_jinja_template)
from twinfer.errors import TwinferError


def test_byte_roundtrip_and_specials_fit_the_vocab():
    tok = ByteTokenizer(512)
    ids = tok.encode("héllo ✓")
    assert ids[0] == tok.bos_token_id and max(ids[1:]) < 256
    assert {tok.bos_token_id, tok.eos_token_id, tok.pad_token_id} <= set(range(256, 512))
    assert len({tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}) == 3
    assert tok.decode(ids) == "héllo ✓"
    assert tok.decode([104, tok.eos_token_id, 400, 105]) == "hi"  # specials and ids > 258 print nothing


def test_byte_tokenizer_takes_the_engines_eos():
    tok = ByteTokenizer(512, eos_token_id=300)
    assert tok.eos_token_id == 300 and tok.bos_token_id == 256
    with pytest.raises(TwinferError, match="259"):
        ByteTokenizer(200)


def test_incremental_decode_never_splits_a_character():
    tok = ByteTokenizer()
    text = "añ€😀z"
    dec = tok.decoder()
    pieces = [dec.step([b]) for b in text.encode("utf-8")] + [dec.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_incremental_decode_replaces_invalid_bytes_at_the_end():
    dec = ByteTokenizer().decoder()
    assert dec.step([0xE2, 0x82]) == ""      # an unfinished 3-byte sequence is held
    assert dec.flush() == "\ufffd"           # ... and replaced once the stream ends


def test_offset_decoder_waits_for_complete_characters():
    # a toy tokenizer whose tokens are bytes: decode like HF does with errors="replace"
    def decode(ids):
        return bytes(ids).decode("utf-8", errors="replace")

    data = "ab€c".encode("utf-8")
    dec = _OffsetDecoder(decode, prompt_ids=list(b"xyz"))
    out = [dec.step([b]) for b in data] + [dec.flush()]
    assert "".join(out) == "ab€c" and all("\ufffd" not in p for p in out)


@pytest.mark.parametrize("stop, expected", [
    (["lazy"], "the "), (["e l", "zz"], "th"), (["q"], "the lazy dog"), (["dog"], "the lazy "),
])
def test_text_stream_cuts_at_the_first_stop_string(stop, expected):
    s = TextStream(ByteTokenizer().decoder(), stop)
    sent = "".join(s.add([b]) for b in b"the lazy dog") + s.finish()
    assert sent == expected
    assert s.stopped == (expected != "the lazy dog")


def test_text_stream_holds_back_a_possible_stop_prefix():
    s = TextStream(ByteTokenizer().decoder(), ["xyz"])
    assert s.add(list(b"abx")) == "a"   # the last len("xyz") - 1 characters could start a stop string
    assert s.add(list(b"y")) == "b"
    assert s.add(list(b"q")) == "x"
    assert s.finish() == "yq"


def test_builtin_chat_template():
    text = builtin_chat_text([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    assert text == "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
    tok = ByteTokenizer()
    assert tok.encode_chat([{"role": "user", "content": "hi"}])[0] == tok.bos_token_id


def test_jinja_chat_template_renders_with_specials():
    pytest.importorskip("jinja2")
    tmpl = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{{ eos_token }}{% endfor %}"
            "{% if add_generation_prompt %}[assistant]{% endif %}")
    out = render_jinja_template(tmpl, [{"role": "user", "content": "hi"}], bos_token="<s>", eos_token="</s>")
    assert out == "<s>[user]hi</s>[assistant]"
    with pytest.raises(ValueError, match="only users"):
        render_jinja_template("{{ raise_exception('only users') }}", [])


def test_load_tokenizer_falls_back_to_bytes_without_tokenizer_json(tmp_path):
    assert isinstance(load_tokenizer(str(tmp_path), vocab_size=512), ByteTokenizer)
    assert isinstance(load_tokenizer("tiny", vocab_size=512, eos_token_id=257), ByteTokenizer)


def test_hf_tokenizer_from_a_tokenizer_json(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4}
    t = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.add_special_tokens(["<s>", "</s>"])
    t.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": {"content": "</s>"},
        "chat_template": "{{ bos_token }}{% for m in messages %}{{ m['content'] }} {% endfor %}"}))
    tok = load_tokenizer(str(tmp_path), vocab_size=8)
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)
    assert tok.encode("hello world") == [3, 4]
    assert tok.encode_chat([{"role": "user", "content": "hello"}]) == [1, 3]


def test_hf_byte_level_bpe_streams_multibyte_text_whole(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    t = tokenizers.Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<s>", "</s>"])
    t.train_from_iterator(["hello world, the quick brown fox"] * 20, trainer)
    t.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(str(tmp_path), vocab_size=300)
    text = "hello wörld 😀 – fox"
    ids = tok.encode(text)
    dec = tok.decoder(tok.encode("prompt: "))
    pieces = [dec.step([i]) for i in ids] + [dec.flush()]
    assert "".join(pieces) == text and all("\ufffd" not in p for p in pieces)
